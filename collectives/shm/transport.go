package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/collectives"
)

// Config configures a Transport. Start from DefaultConfig and set Rank,
// Size and Store.
type Config struct {
	// Rank is this process's rank in the world, 0..Size-1.
	Rank int
	// Size is the number of ranks, all on this host.
	Size int
	// Store is the rendezvous.
	Store collectives.Store
	// Prefix namespaces this world's keys in Store.
	Prefix string
	// Dir is where the ring files are created (a tmpfs).
	Dir string
	// RingBytes is the capacity of each ring, a power of two. A world of n
	// ranks maps n(n-1) rings.
	RingBytes int
	// ConnectTimeout bounds the rendezvous.
	ConnectTimeout time.Duration
	// WriteTimeout is how long a send may wait on a full ring before it
	// fails with collectives.ErrTimeout.
	WriteTimeout time.Duration
	// LivenessInterval is how often a waiting side checks that its peer's
	// process is still alive.
	LivenessInterval time.Duration
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger

	// inProcess (NewLocal) keeps the rings in this process's heap instead
	// of files: the ranks share them anyway, and the race detector tracks
	// the atomics that order them only in Go memory.
	inProcess bool
}

// DefaultConfig returns settings for one host.
func DefaultConfig() *Config {
	return &Config{Prefix: "github.com/gpucoord/gpucoord/shm/", Dir: "/dev/shm", RingBytes: 1 << 20, ConnectTimeout: 60 * time.Second,
		WriteTimeout: 60 * time.Second, LivenessInterval: 100 * time.Millisecond}
}

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: nil shm.Config", collectives.ErrInvalid)
	case c.Size < 1:
		return fmt.Errorf("%w: Size %d must be at least 1", collectives.ErrInvalid, c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("%w: Rank %d is outside [0,%d)", collectives.ErrInvalid, c.Rank, c.Size)
	case c.Store == nil && c.Size > 1:
		return fmt.Errorf("%w: Store is not set", collectives.ErrInvalid)
	case c.RingBytes < 4096 || c.RingBytes&(c.RingBytes-1) != 0 || c.RingBytes > 1<<30:
		return fmt.Errorf("%w: RingBytes %d is not a power of two in [4KiB, 1GiB]", collectives.ErrInvalid, c.RingBytes)
	case c.Dir == "":
		return fmt.Errorf("%w: Dir is empty", collectives.ErrInvalid)
	case c.ConnectTimeout < time.Millisecond || c.WriteTimeout < time.Millisecond || c.LivenessInterval < time.Millisecond:
		return fmt.Errorf("%w: ConnectTimeout, WriteTimeout and LivenessInterval must be at least 1ms", collectives.ErrInvalid)
	}
	return nil
}

// Transport is one rank's end of a shared-memory world; it implements
// collectives.Transport. Send is safe for concurrent use.
type Transport struct {
	cfg     Config
	log     *slog.Logger
	mb      *collectives.Mailbox
	in      []*ring // from each peer
	out     []*ring // to each peer
	outMu   []sync.Mutex
	pids    []int
	intr    []atomic.Bool // interrupt the reader of a peer
	closing atomic.Bool
	wg      sync.WaitGroup
	hdr     [][collectives.HeaderSize]byte // per peer, under outMu
}

var _ collectives.Transport = (*Transport)(nil)

// New maps the rings of rank cfg.Rank and returns once every rank has.
func New(ctx context.Context, cfg *Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	n := cfg.Size
	t := &Transport{cfg: *cfg, log: log.With("component", "shm", "rank", cfg.Rank), in: make([]*ring, n), out: make([]*ring, n),
		outMu: make([]sync.Mutex, n), pids: make([]int, n), intr: make([]atomic.Bool, n), hdr: make([][collectives.HeaderSize]byte, n)}
	t.mb = collectives.NewMailbox(n, func(src int) { t.intr[src].Store(true); wakeAll(t.in[src]) })
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	if err := t.connect(ctx); err != nil {
		t.unmap()
		return nil, fmt.Errorf("shm: rank %d of %d: rendezvous: %w", cfg.Rank, n, err)
	}
	for src, r := range t.in {
		if r != nil {
			t.wg.Go(func() { t.read(src, r) })
		}
	}
	return t, nil
}

func (t *Transport) path(session string, src, dst int) string {
	return filepath.Join(t.cfg.Dir, fmt.Sprintf("gpucoord-%s-%d-%d", session, src, dst))
}

func (t *Transport) connect(ctx context.Context) error {
	cfg, me := &t.cfg, t.cfg.Rank
	if cfg.Size == 1 {
		return nil
	}
	key := func(k string, r int) string { return cfg.Prefix + k + "/" + strconv.Itoa(r) }
	if me == 0 {
		var b [8]byte
		rand.Read(b[:])
		if err := cfg.Store.Set(ctx, cfg.Prefix+"session", []byte(hex.EncodeToString(b[:]))); err != nil {
			return err
		}
	}
	sb, err := cfg.Store.Get(ctx, cfg.Prefix+"session")
	if err != nil {
		return err
	}
	session := string(sb)
	// Create and map the rings this rank reads.
	var created []string
	defer func() {
		for _, p := range created {
			os.Remove(p)
		}
	}()
	for src := range cfg.Size {
		if src == me {
			continue
		}
		p := t.path(session, src, me)
		mem, err := mapFile(p, ctrlSize+cfg.RingBytes, true, cfg.inProcess)
		if err != nil {
			return err
		}
		if !cfg.inProcess {
			created = append(created, p)
		}
		t.in[src] = newRing(mem, p)
	}
	pid := binary.LittleEndian.AppendUint64(nil, uint64(os.Getpid()))
	if err := cfg.Store.Set(ctx, key("ready", me), pid); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	for dst := range cfg.Size {
		if dst == me {
			continue
		}
		g.Go(func() error {
			v, err := cfg.Store.Get(gctx, key("ready", dst))
			if err != nil {
				return err
			}
			if len(v) != 8 {
				return fmt.Errorf("%w: rank %d published a bad pid", collectives.ErrInvalid, dst)
			}
			p := t.path(session, me, dst)
			mem, err := mapFile(p, ctrlSize+cfg.RingBytes, false, cfg.inProcess)
			if err != nil {
				return err
			}
			mu.Lock()
			t.pids[dst] = int(binary.LittleEndian.Uint64(v))
			t.out[dst] = newRing(mem, p)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	// Once every rank has mapped its rings, the files can go (deferred).
	if err := cfg.Store.Set(ctx, key("mapped", me), nil); err != nil {
		return err
	}
	for r := range cfg.Size {
		if _, err := cfg.Store.Get(ctx, key("mapped", r)); err != nil {
			return err
		}
	}
	return nil
}

// mappings shares one mapping per ring within a process, so that two ranks
// of one process use the same memory for a ring whichever end they are.
var mappings = struct {
	sync.Mutex
	m map[string]*mapping
}{m: map[string]*mapping{}}

type mapping struct {
	mem  []byte
	refs int
	heap bool
}

func mapFile(path string, size int, create, inProcess bool) ([]byte, error) {
	mappings.Lock()
	defer mappings.Unlock()
	if m := mappings.m[path]; m != nil && !create {
		m.refs++
		return m.mem, nil
	}
	var mem []byte
	if inProcess {
		if create {
			mem = make([]byte, size) // a large object: page-aligned
		} else {
			return nil, fmt.Errorf("shm: ring %s not found in this process", path)
		}
	} else {
		var err error
		if mem, err = mmapFile(path, size, create); err != nil {
			return nil, err
		}
	}
	mappings.m[path] = &mapping{mem: mem, refs: 1, heap: inProcess}
	return mem, nil
}

func unmapFile(path string) {
	mappings.Lock()
	defer mappings.Unlock()
	m := mappings.m[path]
	if m == nil {
		return
	}
	if m.refs--; m.refs == 0 {
		if !m.heap {
			syscall.Munmap(m.mem)
		}
		delete(mappings.m, path)
	}
}

func mmapFile(path string, size int, create bool) ([]byte, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if create {
		if err := f.Truncate(int64(size)); err != nil {
			os.Remove(path)
			return nil, err
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		if create {
			os.Remove(path)
		}
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return mem, nil
}

// alive reports whether peer's process still exists. Ranks of one process
// (NewLocal) share a pid and rely on the closed flags.
func (t *Transport) alive(peer int) bool {
	pid := t.pids[peer]
	return pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH
}

// ringReader is the io.Reader over an inbound ring that Deliver pulls a
// payload through.
type ringReader struct {
	t    *Transport
	src  int
	r    *ring
	stop func() error
}

func (rr *ringReader) Read(p []byte) (int, error) { return rr.r.read(p, rr.stop) }

var errPeerClosed = errors.New("peer closed")

func (t *Transport) read(src int, r *ring) {
	last := time.Now()
	stop := func() error {
		switch {
		case t.closing.Load():
			return collectives.ErrClosed
		case t.intr[src].Load():
			return errors.New("receive abandoned")
		case r.prodDone.Load() != 0 && r.tail.Load() == r.head.Load():
			return errPeerClosed
		}
		if time.Since(last) >= t.cfg.LivenessInterval {
			last = time.Now()
			if !t.alive(src) {
				return fmt.Errorf("process %d is gone", t.pids[src])
			}
		}
		return nil
	}
	rr := &ringReader{t: t, src: src, r: r, stop: stop}
	hb := make([]byte, collectives.HeaderSize)
	var h collectives.Header
	var err error
	for {
		if err = readFull(rr, hb); err != nil {
			break
		}
		if err = h.Parse(hb); err != nil {
			break
		}
		if err = t.mb.Deliver(src, &h, rr); err != nil {
			break
		}
	}
	switch {
	case t.closing.Load():
		err = collectives.ErrClosed
	case errors.Is(err, errPeerClosed):
		err = fmt.Errorf("%w: world rank %d closed its transport", collectives.ErrPeerLost, src)
	default:
		t.log.Warn("peer lost", "peer", src, "err", err)
		err = fmt.Errorf("%w: world rank %d: %v", collectives.ErrPeerLost, src, err)
	}
	t.mb.Fail(src, err)
}

func readFull(rr *ringReader, p []byte) error {
	for len(p) > 0 {
		n, err := rr.Read(p)
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// Rank implements collectives.Transport.
func (t *Transport) Rank() int { return t.cfg.Rank }

// Size implements collectives.Transport.
func (t *Transport) Size() int { return t.cfg.Size }

// Mailbox implements collectives.Transport.
func (t *Transport) Mailbox() *collectives.Mailbox { return t.mb }

// Send implements collectives.Transport: the header and payload are copied
// into the ring to peer.
func (t *Transport) Send(ctx context.Context, peer int, h collectives.Header, payload []byte) error {
	if peer < 0 || peer >= len(t.out) || peer == t.cfg.Rank {
		return fmt.Errorf("%w: no ring %d->%d", collectives.ErrUnreachable, t.cfg.Rank, peer)
	}
	if int(h.Len) != len(payload) {
		return fmt.Errorf("%w: header says %d bytes, payload has %d", collectives.ErrInvalid, h.Len, len(payload))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t.outMu[peer].Lock()
	defer t.outMu[peer].Unlock()
	r := t.out[peer]
	if r == nil {
		return collectives.ErrClosed
	}
	if r.prodDone.Load() != 0 {
		return fmt.Errorf("%w: the ring to world rank %d broke earlier", collectives.ErrPeerLost, peer)
	}
	start, last := time.Now(), time.Now()
	var why error
	stop := func() error {
		switch {
		case t.closing.Load():
			why = collectives.ErrClosed
		case r.consDone.Load() != 0:
			why = fmt.Errorf("%w: world rank %d closed its transport", collectives.ErrPeerLost, peer)
		case ctx.Err() != nil:
			why = ctx.Err()
		case time.Since(start) > t.cfg.WriteTimeout:
			why = fmt.Errorf("%w: send to world rank %d blocked for %s", collectives.ErrTimeout, peer, t.cfg.WriteTimeout)
		case time.Since(last) >= t.cfg.LivenessInterval:
			last = time.Now()
			if !t.alive(peer) {
				why = fmt.Errorf("%w: world rank %d (process %d) is gone", collectives.ErrPeerLost, peer, t.pids[peer])
			}
		}
		return why
	}
	hb := t.hdr[peer][:]
	h.Put(hb)
	if r.write(hb, stop) != nil || r.write(payload, stop) != nil {
		// A partial frame may be in the ring: nothing more can go through it.
		r.prodDone.Store(1)
		wakeAll(r)
		return why
	}
	return nil
}

func wakeAll(r *ring) {
	if r == nil {
		return
	}
	r.tailSeq.Add(1)
	futex(r.tailSeq, futexWake, 1<<30, nil)
	r.headSeq.Add(1)
	futex(r.headSeq, futexWake, 1<<30, nil)
}

// Close marks this rank's rings closed (peers see it at once), stops the
// readers and unmaps the rings. Receives still pending fail with
// collectives.ErrClosed.
func (t *Transport) Close() error {
	if t.closing.Swap(true) {
		return nil
	}
	for _, r := range t.out {
		if r != nil {
			r.prodDone.Store(1)
			wakeAll(r)
		}
	}
	for _, r := range t.in {
		if r != nil {
			r.consDone.Store(1)
			wakeAll(r)
		}
	}
	t.wg.Wait()
	for i := range t.out {
		t.outMu[i].Lock() // no send is using the ring any more
	}
	t.unmap()
	for i := range t.out {
		t.outMu[i].Unlock()
	}
	return nil
}

func (t *Transport) unmap() {
	for i, r := range t.in {
		if r != nil {
			unmapFile(r.path)
			t.in[i] = nil
		}
	}
	for i, r := range t.out {
		if r != nil {
			unmapFile(r.path)
			t.out[i] = nil
		}
	}
}

// NewLocal returns a whole world of n transports inside this process,
// through an in-process store, with the rings in Go memory rather than
// files. cfg supplies everything but Rank, Size and Store. Close each.
func NewLocal(ctx context.Context, n int, cfg *Config) ([]*Transport, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	st := collectives.NewMemStore()
	ts := make([]*Transport, n)
	g, gctx := errgroup.WithContext(ctx)
	for r := range n {
		c := *cfg
		c.Rank, c.Size, c.Store, c.inProcess = r, n, st, true
		g.Go(func() error {
			t, err := New(gctx, &c)
			ts[r] = t
			return err
		})
	}
	if err := g.Wait(); err != nil {
		for _, t := range ts {
			if t != nil {
				t.Close()
			}
		}
		return nil, err
	}
	return ts, nil
}
