package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/collectives"
)

// Config configures a Transport. Start from DefaultConfig and set Rank,
// Size and either Addrs or Store.
type Config struct {
	// Rank is this process's rank in the world, 0..Size-1.
	Rank int
	// Size is the number of ranks.
	Size int
	// Addrs, if set, lists every rank's listen address (host:port), in rank
	// order; this rank listens on Addrs[Rank]. Otherwise Store is used.
	Addrs []string
	// Store is the rendezvous used when Addrs is empty.
	Store collectives.Store
	// Prefix namespaces this world's keys in Store.
	Prefix string
	// ListenAddr is where to listen when using Store; port 0 picks a free
	// port.
	ListenAddr string
	// Advertise is the host published to the store for peers to dial, with
	// the port the listener got; empty publishes the listener's own
	// address, which must then not be unspecified (0.0.0.0, ::).
	Advertise string
	// ConnectTimeout bounds the whole rendezvous: listening, publishing,
	// dialling (with retries while peers start) and handshakes.
	ConnectTimeout time.Duration
	// WriteTimeout is how long one send may block on a peer that does not
	// read before it fails with collectives.ErrTimeout.
	WriteTimeout time.Duration
	// SocketBuffer sets SO_SNDBUF and SO_RCVBUF in bytes; 0 keeps the
	// kernel's autotuning.
	SocketBuffer int
	// PollSpin is how long a reader that finds its socket empty, while a
	// receive from that peer is being waited for, keeps polling it
	// (yielding to other goroutines and processes between tries) before it
	// sleeps in the poller. Polling trades CPU for latency, as OpenMPI's TCP
	// transport does; 0 sleeps at once.
	PollSpin time.Duration
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger

	// dialFailed, if set, is called after each failed dial to a peer,
	// before the retry. It is a test hook (export_test.go): it lets a test
	// start the next rank only once this one has found a peer not yet
	// listening.
	dialFailed func(addr string, err error)
}

// DefaultConfig returns settings for local process groups and small
// clusters.
func DefaultConfig() *Config {
	return &Config{ListenAddr: "127.0.0.1:0", Prefix: "github.com/gpucoord/gpucoord/tcp/", ConnectTimeout: 60 * time.Second, WriteTimeout: 60 * time.Second,
		PollSpin: 50 * time.Microsecond}
}

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: nil tcp.Config", collectives.ErrInvalid)
	case c.Size < 1:
		return fmt.Errorf("%w: Size %d must be at least 1", collectives.ErrInvalid, c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("%w: Rank %d is outside [0,%d)", collectives.ErrInvalid, c.Rank, c.Size)
	case len(c.Addrs) != 0 && len(c.Addrs) != c.Size:
		return fmt.Errorf("%w: %d Addrs for Size %d", collectives.ErrInvalid, len(c.Addrs), c.Size)
	case len(c.Addrs) == 0 && c.Store == nil && c.Size > 1:
		return fmt.Errorf("%w: neither Addrs nor Store is set", collectives.ErrInvalid)
	case len(c.Addrs) == 0 && c.ListenAddr == "":
		return fmt.Errorf("%w: ListenAddr is empty", collectives.ErrInvalid)
	case c.ConnectTimeout < time.Millisecond:
		return fmt.Errorf("%w: ConnectTimeout %s is below 1ms", collectives.ErrInvalid, c.ConnectTimeout)
	case c.WriteTimeout < time.Millisecond:
		return fmt.Errorf("%w: WriteTimeout %s is below 1ms", collectives.ErrInvalid, c.WriteTimeout)
	case c.PollSpin < 0:
		return fmt.Errorf("%w: PollSpin %s is negative", collectives.ErrInvalid, c.PollSpin)
	case c.SocketBuffer < 0:
		return fmt.Errorf("%w: SocketBuffer %d is negative", collectives.ErrInvalid, c.SocketBuffer)
	}
	return nil
}

// Transport is one rank's end of a TCP mesh; it implements
// collectives.Transport. Send is safe for concurrent use.
type Transport struct {
	cfg     Config
	log     *slog.Logger
	ln      net.Listener
	links   []*link
	mb      *collectives.Mailbox
	wg      sync.WaitGroup
	closing atomic.Bool
}

var _ collectives.Transport = (*Transport)(nil)

type link struct {
	peer int
	conn *net.TCPConn
	wmu  sync.Mutex
	err  error // sticky write error; the stream may hold a partial frame
	hdr  [collectives.HeaderSize]byte
	wbuf []byte
	iov0 [2][]byte
	iov  net.Buffers
}

const (
	magic        = 0x43435047 // "GPCC"
	version      = 1
	helloSize    = 16
	smallWrite   = 32 << 10
	readerBuffer = 16 << 10 // small: what a header read pulls in beyond the header is copied twice
)

// New connects rank cfg.Rank to every other rank and returns when the mesh
// is up, ctx ends, or ConnectTimeout passes.
func New(ctx context.Context, cfg *Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	t := &Transport{cfg: *cfg, log: log.With("component", "tcp", "rank", cfg.Rank), links: make([]*link, cfg.Size)}
	t.mb = collectives.NewMailbox(cfg.Size, t.interrupt)
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	if err := t.connect(ctx); err != nil {
		t.Close()
		return nil, fmt.Errorf("tcp: rank %d of %d: rendezvous: %w", cfg.Rank, cfg.Size, err)
	}
	for _, l := range t.links {
		if l != nil {
			t.wg.Go(func() { t.read(l) })
		}
	}
	return t, nil
}

func (t *Transport) connect(ctx context.Context) error {
	cfg := &t.cfg
	if cfg.Size == 1 {
		return nil
	}
	listen := cfg.ListenAddr
	if len(cfg.Addrs) > 0 {
		listen = cfg.Addrs[cfg.Rank]
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", listen)
	if err != nil {
		return err
	}
	t.ln = ln
	addrs := cfg.Addrs
	if len(addrs) == 0 {
		addrs = make([]string, cfg.Size)
		addrs[cfg.Rank] = ln.Addr().String()
		if port := ln.Addr().(*net.TCPAddr).Port; cfg.Advertise != "" {
			addrs[cfg.Rank] = net.JoinHostPort(cfg.Advertise, strconv.Itoa(port))
		} else if ln.Addr().(*net.TCPAddr).IP.IsUnspecified() {
			return fmt.Errorf("%w: listening on %s, which peers cannot dial: set Advertise", collectives.ErrInvalid, ln.Addr())
		}
		if err := cfg.Store.Set(ctx, cfg.Prefix+"addr/"+strconv.Itoa(cfg.Rank), []byte(addrs[cfg.Rank])); err != nil {
			return err
		}
		for r := range cfg.Size {
			if r != cfg.Rank {
				v, err := cfg.Store.Get(ctx, cfg.Prefix+"addr/"+strconv.Itoa(r))
				if err != nil {
					return err
				}
				addrs[r] = string(v)
			}
		}
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	// Higher ranks dial lower ones; each connection opens with a hello
	// naming the dialler and is answered by one naming the listener.
	g.Go(func() error {
		for range cfg.Size - 1 - cfg.Rank {
			c, err := ln.Accept()
			if err != nil {
				return fmt.Errorf("accept: %w", err)
			}
			peer, err := t.handshake(gctx, c, -1)
			if err != nil {
				c.Close()
				return err
			}
			mu.Lock()
			if t.links[peer] != nil {
				mu.Unlock()
				c.Close()
				return fmt.Errorf("%w: rank %d connected twice", collectives.ErrInvalid, peer)
			}
			t.links[peer] = t.newLink(peer, c)
			mu.Unlock()
		}
		return nil
	})
	for peer := range cfg.Rank {
		g.Go(func() error {
			c, err := dial(gctx, addrs[peer], cfg.dialFailed)
			if err != nil {
				return fmt.Errorf("dial rank %d at %s: %w", peer, addrs[peer], err)
			}
			if _, err := t.handshake(gctx, c, peer); err != nil {
				c.Close()
				return err
			}
			mu.Lock()
			t.links[peer] = t.newLink(peer, c)
			mu.Unlock()
			return nil
		})
	}
	return g.Wait()
}

// dial retries while the peer is not listening yet, calling failed (if not
// nil) after each attempt that fails.
func dial(ctx context.Context, addr string, failed func(addr string, err error)) (net.Conn, error) {
	var d net.Dialer
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if failed != nil {
			failed(addr, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// handshake exchanges hellos. want is the peer's rank when dialling, -1
// when accepting; it returns the peer's rank.
func (t *Transport) handshake(ctx context.Context, c net.Conn, want int) (int, error) {
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	defer c.SetDeadline(time.Time{})
	var out, in [helloSize]byte
	binary.LittleEndian.PutUint32(out[0:], magic)
	binary.LittleEndian.PutUint16(out[4:], version)
	binary.LittleEndian.PutUint32(out[8:], uint32(t.cfg.Size))
	binary.LittleEndian.PutUint32(out[12:], uint32(t.cfg.Rank))
	if want >= 0 {
		if _, err := c.Write(out[:]); err != nil {
			return 0, fmt.Errorf("hello to rank %d: %w", want, err)
		}
	}
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return 0, fmt.Errorf("hello from %s: %w", c.RemoteAddr(), err)
	}
	size, peer := int(binary.LittleEndian.Uint32(in[8:])), int(binary.LittleEndian.Uint32(in[12:]))
	switch {
	case binary.LittleEndian.Uint32(in[0:]) != magic || binary.LittleEndian.Uint16(in[4:]) != version:
		return 0, fmt.Errorf("%w: %s is not a gpucoord tcp peer of version %d", collectives.ErrInvalid, c.RemoteAddr(), version)
	case size != t.cfg.Size:
		return 0, fmt.Errorf("%w: %s belongs to a world of %d, this one has %d", collectives.ErrMismatch, c.RemoteAddr(), size, t.cfg.Size)
	case want >= 0 && peer != want, want < 0 && (peer <= t.cfg.Rank || peer >= size):
		return 0, fmt.Errorf("%w: %s says it is rank %d", collectives.ErrInvalid, c.RemoteAddr(), peer)
	}
	if want < 0 {
		if _, err := c.Write(out[:]); err != nil {
			return 0, fmt.Errorf("hello to rank %d: %w", peer, err)
		}
	}
	return peer, nil
}

func (t *Transport) newLink(peer int, c net.Conn) *link {
	tc := c.(*net.TCPConn)
	tc.SetNoDelay(true)
	if b := t.cfg.SocketBuffer; b > 0 {
		tc.SetReadBuffer(b)
		tc.SetWriteBuffer(b)
	}
	return &link{peer: peer, conn: tc, wbuf: make([]byte, 0, collectives.HeaderSize+smallWrite)}
}

// read delivers every frame from l's peer until the connection fails.
func (t *Transport) read(l *link) {
	var src io.Reader = l.conn
	if t.cfg.PollSpin > 0 {
		if rc, err := l.conn.SyscallConn(); err == nil {
			src = &pollReader{rc: rc, spin: t.cfg.PollSpin, mb: t.mb, peer: l.peer}
		}
	}
	br := bufio.NewReaderSize(src, readerBuffer)
	hb := make([]byte, collectives.HeaderSize)
	var h collectives.Header
	var err error
	for {
		if _, err = io.ReadFull(br, hb); err != nil {
			break
		}
		if err = h.Parse(hb); err != nil {
			break
		}
		if err = t.mb.Deliver(l.peer, &h, br); err != nil {
			break
		}
	}
	switch {
	case t.closing.Load():
		err = collectives.ErrClosed
	case errors.Is(err, io.EOF):
		// Between frames: the peer closed, or its process died.
		t.log.Debug("peer closed the connection", "peer", l.peer)
		err = fmt.Errorf("%w: world rank %d closed the connection", collectives.ErrPeerLost, l.peer)
	default:
		t.log.Warn("connection lost", "peer", l.peer, "err", err)
		err = fmt.Errorf("%w: connection from world rank %d: %v", collectives.ErrPeerLost, l.peer, err)
	}
	t.mb.Fail(l.peer, err)
	l.conn.Close()
}

// pollReader reads a socket, polling it for a while when it is empty before
// letting the runtime's poller park the goroutine. Deadlines still apply:
// the poller enforces them once the callback gives up.
type pollReader struct {
	rc   syscall.RawConn
	spin time.Duration
	mb   *collectives.Mailbox
	peer int
	p    []byte
	n    int
	err  error
	fn   func(fd uintptr) bool
}

func (r *pollReader) Read(p []byte) (int, error) {
	if r.fn == nil {
		r.fn = r.try
	}
	r.p, r.n, r.err = p, 0, nil
	if err := r.rc.Read(r.fn); err != nil {
		return 0, err
	}
	if r.n == 0 && r.err == nil && len(p) > 0 {
		return 0, io.EOF
	}
	return r.n, r.err
}

func (r *pollReader) try(fd uintptr) bool {
	var until time.Time
	for {
		n, err := syscall.Read(int(fd), r.p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			if !r.mb.Waiting(r.peer) {
				return false // nobody is waiting for this peer: sleep
			}
			if until.IsZero() {
				until = time.Now().Add(r.spin)
			} else if time.Now().After(until) {
				return false // sleep in the poller
			}
			runtime.Gosched()
			syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		case err != nil:
			r.err = err
		default:
			r.n = n
		}
		return true
	}
}

// interrupt makes the reader of src fail now (see collectives.NewMailbox).
func (t *Transport) interrupt(src int) {
	if l := t.links[src]; l != nil {
		l.conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// Rank implements collectives.Transport.
func (t *Transport) Rank() int { return t.cfg.Rank }

// Size implements collectives.Transport.
func (t *Transport) Size() int { return t.cfg.Size }

// Mailbox implements collectives.Transport.
func (t *Transport) Mailbox() *collectives.Mailbox { return t.mb }

// Addr returns the address this rank listens on (nil in a world of one).
func (t *Transport) Addr() net.Addr {
	if t.ln == nil {
		return nil
	}
	return t.ln.Addr()
}

// Send implements collectives.Transport: one write (small frames) or one
// writev (header and payload), under the link's lock.
func (t *Transport) Send(ctx context.Context, peer int, h collectives.Header, payload []byte) error {
	if peer < 0 || peer >= len(t.links) || t.links[peer] == nil {
		return fmt.Errorf("%w: no link %d->%d", collectives.ErrUnreachable, t.cfg.Rank, peer)
	}
	if int(h.Len) != len(payload) {
		return fmt.Errorf("%w: header says %d bytes, payload has %d", collectives.ErrInvalid, h.Len, len(payload))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l := t.links[peer]
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.err != nil {
		return l.err
	}
	deadline := time.Now().Add(t.cfg.WriteTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	l.conn.SetWriteDeadline(deadline)
	h.Put(l.hdr[:])
	var err error
	if len(payload) <= smallWrite {
		l.wbuf = append(append(l.wbuf[:0], l.hdr[:]...), payload...)
		_, err = l.conn.Write(l.wbuf)
	} else {
		l.iov0[0], l.iov0[1] = l.hdr[:], payload
		l.iov = l.iov0[:]
		_, err = l.iov.WriteTo(l.conn)
		l.iov0[1] = nil
	}
	if err != nil {
		var ne net.Error
		switch {
		case t.closing.Load():
			err = collectives.ErrClosed
		case errors.As(err, &ne) && ne.Timeout():
			if ctx.Err() != nil {
				err = ctx.Err()
			} else {
				err = fmt.Errorf("%w: send to world rank %d blocked for %s", collectives.ErrTimeout, peer, t.cfg.WriteTimeout)
			}
		default:
			err = fmt.Errorf("%w: send to world rank %d: %v", collectives.ErrPeerLost, peer, err)
		}
		l.err = err
		l.conn.Close() // a partial frame may be on the wire
	}
	return err
}

// Close closes every connection and the listener and waits for the
// readers to exit. Receives still pending fail with collectives.ErrClosed.
func (t *Transport) Close() error {
	t.closing.Store(true)
	if t.ln != nil {
		t.ln.Close()
	}
	for _, l := range t.links {
		if l != nil {
			l.conn.Close()
		}
	}
	t.wg.Wait()
	return nil
}

// NewLocal returns a whole world of n transports connected over loopback
// inside this process, through an in-process store. cfg supplies the
// timeouts; its Rank, Size, Addrs and Store are ignored. Close each.
func NewLocal(ctx context.Context, n int, cfg *Config) ([]*Transport, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	st := collectives.NewMemStore()
	ts := make([]*Transport, n)
	g, gctx := errgroup.WithContext(ctx)
	for r := range n {
		c := *cfg
		c.Rank, c.Size, c.Addrs, c.Store = r, n, nil, st
		if c.ListenAddr == "" {
			c.ListenAddr = "127.0.0.1:0"
		}
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
