package collectives

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Mailbox matches incoming frames with posted receives. A Transport owns one
// and delivers every frame it receives into it; Communicators post receives
// and wait on them. Frames from one source with one tag are matched in
// order, first frame to first receive.
//
// A frame whose receive is already posted is read straight into the
// receiver's memory (or reduced into it on the fly); one that arrives early
// is held in a pooled buffer until its receive is posted. Nothing allocates
// in steady state.
//
// # Concurrency
//
// All methods are safe for concurrent use, with one rule for transports:
// frames from one source are delivered one at a time and in order (one
// reader per connection does this naturally).
type Mailbox struct {
	mu        sync.Mutex
	peers     []mbPeer
	interrupt func(src int)
	pool      bufPool
	groups    map[uint64]bool
}

type mbPeer struct {
	waiters atomic.Int32 // goroutines blocked in wait on a receive from this source
	slots   map[slotKey]*slot
	err     error  // the link from this source failed
	scratch []byte // for reduce-on-receive from a stream; one deliverer per source
}

type slotKey struct {
	tag uint64
	p2p bool
}

// slot is the queue of one (source, tag, class).
type slot struct {
	src     int
	posts   []posting
	head    int
	unexp   []frame
	uhead   int
	filling bool // someone is writing into a posted receive outside the lock
	posted  uint64
	done    uint64
	err     error
	notify  chan struct{}
	timer   *time.Timer
}

type posting struct {
	want     Header
	dst, acc []byte
}

type frame struct {
	h   Header
	buf []byte
}

const streamScratch = 64 << 10

// NewMailbox returns a Mailbox for a world of size ranks. interrupt, if not
// nil, is called when a receive is abandoned while a frame is being read
// into it; the transport must then fail the stream from src promptly (for
// TCP, a read deadline in the past), so that the caller's memory is
// released.
func NewMailbox(size int, interrupt func(src int)) *Mailbox {
	m := &Mailbox{peers: make([]mbPeer, size), interrupt: interrupt, groups: map[uint64]bool{}}
	for i := range m.peers {
		m.peers[i].slots = map[slotKey]*slot{}
	}
	return m
}

func (m *Mailbox) slotLocked(src int, key slotKey) *slot {
	p := &m.peers[src]
	s := p.slots[key]
	if s == nil {
		t := time.NewTimer(time.Hour)
		t.Stop()
		s = &slot{src: src, notify: make(chan struct{}, 1), timer: t}
		p.slots[key] = s
	}
	return s
}

func (s *slot) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// register claims a group tag; it fails if a live group already uses it.
func (m *Mailbox) register(tag uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.groups[tag] {
		return fmt.Errorf("%w: group tag %#x already in use on this transport", ErrInvalid, tag)
	}
	m.groups[tag] = true
	return nil
}

// release drops a group's tag and everything queued for it.
func (m *Mailbox) release(tag uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.groups, tag)
	for i := range m.peers {
		for _, p2p := range []bool{false, true} {
			k := slotKey{tag, p2p}
			if s := m.peers[i].slots[k]; s != nil && !s.filling {
				for j := s.uhead; j < len(s.unexp); j++ {
					m.pool.put(s.unexp[j].buf)
				}
				delete(m.peers[i].slots, k)
			}
		}
	}
}

func (m *Mailbox) slot(src int, tag uint64, p2p bool) *slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.slotLocked(src, slotKey{tag, p2p})
}

// Deliver hands the mailbox one frame from src whose payload, h.Len bytes,
// is read from r. It returns an error only when reading r fails; the
// transport must then call Fail for src. A frame that does not match its
// receive fails that receive with ErrMismatch; the stream stays usable.
func (m *Mailbox) Deliver(src int, h *Header, r io.Reader) error {
	return m.deliver(src, h, r, nil)
}

// DeliverBytes is Deliver for a payload already in memory. The mailbox
// copies what it keeps; payload may be reused when it returns.
func (m *Mailbox) DeliverBytes(src int, h *Header, payload []byte) error {
	return m.deliver(src, h, nil, payload[:h.Len])
}

func (m *Mailbox) deliver(src int, h *Header, r io.Reader, b []byte) error {
	m.mu.Lock()
	if h.Kind == KindAbort {
		m.abortLocked(src, h)
		m.mu.Unlock()
		return m.discard(src, r, int(h.Len))
	}
	s := m.slotLocked(src, slotKey{h.Tag, h.p2p()})
	if s.err != nil {
		m.mu.Unlock()
		return m.discard(src, r, int(h.Len))
	}
	if s.head < len(s.posts) && s.uhead == len(s.unexp) && !s.filling {
		// The receive is posted: fill the caller's memory directly.
		p := s.posts[s.head]
		s.filling = true
		m.mu.Unlock()
		ioErr, matchErr := m.fill(src, h, &p, r, b)
		m.mu.Lock()
		s.filling = false
		m.completeLocked(s, matchErr)
		m.mu.Unlock()
		return ioErr
	}
	buf := m.pool.get(int(h.Len))
	m.mu.Unlock()
	if r != nil {
		if _, err := io.ReadFull(r, buf); err != nil {
			m.mu.Lock()
			m.pool.put(buf)
			m.mu.Unlock()
			return err
		}
	} else {
		copy(buf, b)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s.unexp = append(s.unexp, frame{h: *h, buf: buf})
	// A receive may have been posted while we were reading.
	for s.err == nil && s.head < len(s.posts) && s.uhead < len(s.unexp) && !s.filling {
		f := s.unexp[s.uhead]
		s.uhead++
		p := s.posts[s.head]
		s.filling = true
		m.mu.Unlock()
		_, matchErr := m.fill(src, &f.h, &p, nil, f.buf)
		m.mu.Lock()
		s.filling = false
		m.pool.put(f.buf)
		m.completeLocked(s, matchErr)
	}
	s.compact()
	s.signal()
	return nil
}

// completeLocked finishes the receive at the head of s.
func (m *Mailbox) completeLocked(s *slot, matchErr error) {
	if s.err == nil {
		if matchErr != nil {
			s.err = matchErr
		} else {
			s.head++
			s.done++
		}
	}
	s.compact()
	s.signal()
}

func (s *slot) compact() {
	if s.head == len(s.posts) {
		s.posts, s.head = s.posts[:0], 0
	}
	if s.uhead == len(s.unexp) {
		clear(s.unexp)
		s.unexp, s.uhead = s.unexp[:0], 0
	}
}

// fill moves one frame's payload into a posted receive: copied, or reduced
// with the posting's accumulator. A mismatched frame is consumed and
// reported as matchErr.
func (m *Mailbox) fill(src int, h *Header, p *posting, r io.Reader, b []byte) (ioErr, matchErr error) {
	if matchErr = p.want.check(h); matchErr != nil {
		return m.discard(src, r, int(h.Len)), matchErr
	}
	if p.acc == nil {
		if r == nil {
			copy(p.dst, b)
			return nil, nil
		}
		_, err := io.ReadFull(r, p.dst)
		return err, nil
	}
	if r == nil {
		Reduce(h.DType, h.Op, p.dst, p.acc, b)
		return nil, nil
	}
	sc := m.peers[src].scratch
	if sc == nil {
		sc = make([]byte, streamScratch)
		m.peers[src].scratch = sc // only this source's deliverer touches it
	}
	for off := 0; off < len(p.dst); off += len(sc) {
		n := min(len(sc), len(p.dst)-off)
		if _, err := io.ReadFull(r, sc[:n]); err != nil {
			return err, nil
		}
		Reduce(h.DType, h.Op, p.dst[off:off+n], p.acc[off:off+n], sc[:n])
	}
	return nil, nil
}

func (m *Mailbox) discard(src int, r io.Reader, n int) error {
	if r == nil || n == 0 {
		return nil
	}
	sc := make([]byte, min(n, streamScratch)) // error path only
	for n > 0 {
		k, err := io.ReadFull(r, sc[:min(n, len(sc))])
		if err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// abortLocked fails every queue of the frame's group: a member gave up.
func (m *Mailbox) abortLocked(src int, h *Header) {
	err := fmt.Errorf("%w: world rank %d failed the operation (%s)", ErrAborted, src, abortCode(h.Arg))
	for i := range m.peers {
		for _, p2p := range []bool{false, true} {
			s := m.slotLocked(i, slotKey{h.Tag, p2p})
			if s.err == nil {
				s.err = err
			}
			s.signal()
		}
	}
}

// Waiting reports whether a goroutine is blocked waiting for a frame from
// src. A transport may poll src's link harder while it is (see
// tcp.Config.PollSpin).
func (m *Mailbox) Waiting(src int) bool { return m.peers[src].waiters.Load() > 0 }

// Fail records that the link from src is gone: every receive from src,
// pending or future, fails with err (which should wrap ErrPeerLost).
func (m *Mailbox) Fail(src int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.peers[src].err == nil {
		m.peers[src].err = err
	}
	for _, s := range m.peers[src].slots {
		s.signal()
	}
}

// post queues a receive of one frame matching want into dst (or, with acc,
// reduced as dst = acc op payload) and returns its ticket.
func (m *Mailbox) post(s *slot, want Header, dst, acc []byte) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	// A peer that sent its last frames and left: what it sent still counts.
	if err := m.peers[s.src].err; err != nil && len(s.unexp)-s.uhead <= len(s.posts)-s.head {
		return 0, err
	}
	t := s.posted
	s.posted++
	s.posts = append(s.posts, posting{want: want, dst: dst, acc: acc})
	for s.err == nil && s.head < len(s.posts) && s.uhead < len(s.unexp) && !s.filling {
		// The frame came first: take it from the early queue.
		f := s.unexp[s.uhead]
		s.uhead++
		p := s.posts[s.head]
		s.filling = true
		m.mu.Unlock()
		_, matchErr := m.fill(s.src, &f.h, &p, nil, f.buf)
		m.mu.Lock()
		s.filling = false
		m.pool.put(f.buf)
		m.completeLocked(s, matchErr)
	}
	return t, nil
}

func (m *Mailbox) errLocked(s *slot) error {
	if s.err != nil {
		return s.err
	}
	return m.peers[s.src].err
}

// wait blocks until the receive with ticket t on s is complete, s fails, ctx
// ends, or timeout passes with the receive still pending.
func (m *Mailbox) wait(ctx context.Context, s *slot, t uint64, timeout time.Duration) error {
	w := &m.peers[s.src].waiters
	w.Add(1)
	defer w.Add(-1)
	armed := false
	defer func() {
		if armed {
			s.timer.Stop()
		}
	}()
	for {
		m.mu.Lock()
		if s.done > t {
			m.mu.Unlock()
			return nil
		}
		err := m.errLocked(s)
		m.mu.Unlock()
		if err != nil {
			return err
		}
		if !armed && timeout > 0 {
			s.timer.Reset(timeout)
			armed = true
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.timer.C:
			return fmt.Errorf("%w: nothing received for %s", ErrTimeout, timeout)
		}
	}
}

// cancel abandons every receive posted on s, failing it with err. If a frame
// is being written into one of them, cancel asks the transport to interrupt
// that stream and returns only once the caller's memory is released.
func (m *Mailbox) cancel(s *slot, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	for s.filling {
		m.mu.Unlock()
		if m.interrupt != nil {
			m.interrupt(s.src)
		}
		select {
		case <-s.notify:
		case <-time.After(10 * time.Millisecond):
		}
		m.mu.Lock()
	}
	clear(s.posts)
	s.posts, s.head = s.posts[:0], 0
}

// bufPool keeps early-frame buffers by power-of-two size class, up to a cap
// in bytes, so that steady-state traffic does not allocate.
type bufPool struct {
	free  [40][][]byte
	bytes int
}

const poolCap = 256 << 20

func (p *bufPool) get(n int) []byte {
	if n == 0 {
		return nil
	}
	c := bits.Len(uint(n - 1))
	if l := len(p.free[c]); l > 0 {
		b := p.free[c][l-1]
		p.free[c][l-1] = nil
		p.free[c] = p.free[c][:l-1]
		p.bytes -= cap(b)
		return b[:n]
	}
	return make([]byte, n, 1<<c)
}

func (p *bufPool) put(b []byte) {
	c := cap(b)
	if c == 0 || c&(c-1) != 0 || p.bytes+c > poolCap {
		return
	}
	p.bytes += c
	k := bits.Len(uint(c - 1))
	p.free[k] = append(p.free[k], b[:c])
}
