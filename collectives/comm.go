package collectives

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"
)

// Config configures a Comm. Start from DefaultConfig and override fields.
// Every member of a group must use the same ChunkBytes, DirectBytes and
// SmallBytes: they
// decide how an operation is cut into frames, and a difference is reported
// as ErrMismatch.
type Config struct {
	// Timeout is how long an operation waits for a silent peer before it
	// fails with ErrTimeout naming that peer. A dead peer whose connection
	// closes is reported at once, without waiting for Timeout.
	Timeout time.Duration
	// ChunkBytes is the size of the pieces a large operation is cut into.
	// Pieces are pipelined: a rank forwards piece k while piece k+1 arrives
	// and is reduced.
	ChunkBytes int
	// DirectBytes is the largest AllReduce, in bytes, done in one round:
	// every rank sends its buffer to every other and reduces all n in rank
	// order. It trades (n-1) sends for the fewest round trips. 0 (the
	// default: on two shared cores it measured no faster than recursive
	// doubling) disables it.
	DirectBytes int
	// SmallBytes is the largest AllReduce or Broadcast, in bytes, that uses
	// the latency-bound algorithms (recursive doubling, binomial tree)
	// instead of the bandwidth-bound ring and chain. 0 always uses the ring.
	SmallBytes int
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns settings for CPU hosts over TCP.
func DefaultConfig() *Config {
	return &Config{Timeout: 60 * time.Second, ChunkBytes: 1 << 20, SmallBytes: 64 << 10}
}

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: nil Config", ErrInvalid)
	case c.Timeout < time.Millisecond:
		return fmt.Errorf("%w: Timeout %s is below the 1ms minimum", ErrInvalid, c.Timeout)
	case c.ChunkBytes < 64 || c.ChunkBytes > 1<<30:
		return fmt.Errorf("%w: ChunkBytes %d is outside [64, 1GiB]", ErrInvalid, c.ChunkBytes)
	case c.DirectBytes < 0 || c.DirectBytes > 1<<20:
		return fmt.Errorf("%w: DirectBytes %d is outside [0, 1MiB]", ErrInvalid, c.DirectBytes)
	case c.SmallBytes < 0 || c.SmallBytes > 1<<30:
		return fmt.Errorf("%w: SmallBytes %d is outside [0, 1GiB]", ErrInvalid, c.SmallBytes)
	}
	return nil
}

// worldTag is the tag of the group made by New.
const worldTag uint64 = 0x67707563_6f6f7264

// Comm is a Communicator over a Transport: the world made by New, or a
// sub-group made by Group. It also implements Grouper.
//
// # Concurrency
//
// Calls on one Comm must not be concurrent. Different Comms over the same
// Transport (sub-groups) may be used from different goroutines at once:
// each has its own tag, and their frames never mix.
//
// # Errors
//
// An operation that fails (a peer lost, timed out or disagreeing, a
// cancelled ctx, a bad argument) tells the other members with an abort
// frame, so that they fail at once rather than at their timeout, and leaves
// the Comm broken: later calls return ErrBroken. Recovery is a new world
// (a new generation), as with NCCL's ncclCommAbort.
type Comm struct {
	cfg   Config
	log   *slog.Logger
	t     Transport
	mb    *Mailbox
	tag   uint64
	world []int // group rank -> world rank
	rank  int
	coll  []*slot // per group rank: collective frames from that member
	p2p   []*slot // per group rank: Send frames from that member
	seq   uint32
	sseq  []uint32 // Send messages to each member
	rseq  []uint32 // Recv messages from each member
	tmp   []byte   // scratch, grown on demand
	tix   []uint64 // receive tickets, one per member
	err   error
	subMu sync.Mutex
	subs  map[string]int
	shut  bool
}

var _ Communicator = (*Comm)(nil)

// New returns the world communicator over t: group rank i is world rank i.
// Each rank calls New once per Transport; the result is ready at once (the
// transport is already connected).
func New(t Transport, cfg *Config) (*Comm, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: nil Transport", ErrInvalid)
	}
	world := make([]int, t.Size())
	for i := range world {
		world[i] = i
	}
	return newComm(t, cfg, worldTag, world, t.Rank())
}

func newComm(t Transport, cfg *Config, tag uint64, world []int, rank int) (*Comm, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	mb := t.Mailbox()
	if err := mb.register(tag); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	n := len(world)
	c := &Comm{
		cfg: *cfg, t: t, mb: mb, tag: tag, world: world, rank: rank,
		log:  log.With("component", "collectives", "group", fmt.Sprintf("%#x", tag), "rank", rank, "size", n),
		coll: make([]*slot, n), p2p: make([]*slot, n), sseq: make([]uint32, n), rseq: make([]uint32, n), tix: make([]uint64, n),
		subs: map[string]int{},
	}
	for i, w := range world {
		if i != rank {
			c.coll[i] = mb.slot(w, tag, false)
			c.p2p[i] = mb.slot(w, tag, true)
		}
	}
	return c, nil
}

// Rank implements Communicator.
func (c *Comm) Rank() int { return c.rank }

// Size implements Communicator.
func (c *Comm) Size() int { return len(c.world) }

// WorldRank returns the transport (world) rank of group rank r.
func (c *Comm) WorldRank(r int) int { return c.world[r] }

// Transport returns the Transport c runs over, shared by every group formed
// from the same world. Its Mailbox tells whether this rank is blocked in a
// receive (Mailbox.Waiting), which is how tests see that an operation is
// in progress.
func (c *Comm) Transport() Transport { return c.t }

// Grouper is implemented by Communicators that can form sub-groups.
type Grouper interface {
	// NewGroup returns a Communicator for the members listed by their ranks
	// in this group; member i of the result is ranks[i]. Every listed member
	// calls NewGroup with the same list, in the same order relative to its
	// other NewGroup calls on this Communicator; others need not call it.
	// The caller must be listed (else ErrNotMember).
	NewGroup(ctx context.Context, ranks []int) (Communicator, error)
}

// MemberIndex checks the member list of a sub-group of a group of size
// members, as Grouper.NewGroup receives it, and returns the index of rank in
// it. A rank out of range or repeated is ErrInvalid; a list without rank is
// ErrNotMember.
func MemberIndex(ranks []int, size, rank int) (int, error) {
	seen := make(map[int]bool, len(ranks))
	me := -1
	for i, r := range ranks {
		if r < 0 || r >= size || seen[r] {
			return -1, fmt.Errorf("%w: group ranks %v: rank %d is out of range [0,%d) or repeated", ErrInvalid, ranks, r, size)
		}
		seen[r] = true
		if r == rank {
			me = i
		}
	}
	if me < 0 {
		return -1, fmt.Errorf("%w: rank %d not in %v", ErrNotMember, rank, ranks)
	}
	return me, nil
}

// NewGroup forms a sub-group of parent; see Grouper.
func NewGroup(ctx context.Context, parent Communicator, ranks []int) (Communicator, error) {
	g, ok := parent.(Grouper)
	if !ok {
		return nil, fmt.Errorf("%w: %T cannot form sub-groups", ErrInvalid, parent)
	}
	return g.NewGroup(ctx, ranks)
}

// NewGroup implements Grouper.
func (c *Comm) NewGroup(ctx context.Context, ranks []int) (Communicator, error) {
	g, err := c.Group(ctx, ranks)
	if err != nil {
		return nil, err // not a nil *Comm in a non-nil Communicator
	}
	return g, nil
}

// Group is NewGroup returning the concrete type. The sub-group shares c's
// transport and gets its own tag, derived from c's tag, the member list and
// how many groups with that list this member made before, so members agree
// on it without talking. It may be used concurrently with c and with other
// groups. Close it when done.
func (c *Comm) Group(ctx context.Context, ranks []int) (*Comm, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	me, err := MemberIndex(ranks, len(c.world), c.rank)
	if err != nil {
		return nil, err
	}
	world := make([]int, len(ranks))
	for i, r := range ranks {
		world[i] = c.world[r]
	}
	key := fmt.Sprint(world)
	c.subMu.Lock()
	k := c.subs[key]
	c.subs[key]++
	c.subMu.Unlock()
	h := fnv.New64a()
	fmt.Fprintf(h, "%x/%d/%s", c.tag, k, key)
	return newComm(c.t, &c.cfg, h.Sum64(), world, me)
}

// Close releases the group's tag and anything queued for it. It does not
// close the Transport. Close is idempotent.
func (c *Comm) Close() error {
	if !c.shut {
		c.shut = true
		c.mb.release(c.tag)
	}
	return nil
}

// begin refuses calls on a closed or broken Comm.
func (c *Comm) begin() error {
	if c.shut {
		return ErrClosed
	}
	if c.err != nil {
		return fmt.Errorf("%w: %w", ErrBroken, c.err)
	}
	return nil
}

// fail breaks the Comm: it abandons every posted receive (returning the
// caller's memory), tells the other members, and returns err.
func (c *Comm) fail(ctx context.Context, k Kind, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("collectives: %s: %w (%w)", k, ctx.Err(), err)
	}
	c.err = err
	for i := range c.world {
		if i != c.rank {
			c.mb.cancel(c.coll[i], err)
			c.mb.cancel(c.p2p[i], err)
		}
	}
	c.log.Warn("operation failed", "op", k.String(), "err", err)
	// Tell everyone, relaying an abort too: a member cut off from the one
	// that failed first still hears of it through the others.
	code := codeOf(err)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(c.cfg.Timeout, 2*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for i, w := range c.world {
		if i == c.rank {
			continue
		}
		wg.Go(func() {
			_ = c.t.Send(actx, w, Header{Tag: c.tag, Kind: KindAbort, Arg: uint32(code)}, nil)
		})
	}
	wg.Wait()
	return err
}

func (c *Comm) peerErr(k Kind, peer int, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("collectives: %s: waiting for rank %d: %w", k, peer, err)
	}
	return &PeerError{Op: k.String(), Peer: peer, World: c.world[peer], Err: err}
}

func (c *Comm) send(ctx context.Context, peer int, h Header, p []byte) error {
	h.Len = uint32(len(p))
	if err := c.t.Send(ctx, c.world[peer], h, p); err != nil {
		return c.peerErr(h.Kind, peer, err)
	}
	return nil
}

func (c *Comm) post(peer int, h Header, dst, acc []byte) (uint64, error) {
	h.Len = uint32(len(dst))
	s := c.coll[peer]
	if h.Kind == KindSend {
		s = c.p2p[peer]
	}
	t, err := c.mb.post(s, h, dst, acc)
	if err != nil {
		return 0, c.peerErr(h.Kind, peer, err)
	}
	return t, nil
}

func (c *Comm) wait(ctx context.Context, k Kind, peer int, t uint64) error {
	s := c.coll[peer]
	if k == KindSend {
		s = c.p2p[peer]
	}
	if err := c.mb.wait(ctx, s, t, c.cfg.Timeout); err != nil {
		return c.peerErr(k, peer, err)
	}
	return nil
}

// scratch returns n bytes of the Comm's scratch memory, aligned for any
// element type.
func (c *Comm) scratch(n int) []byte {
	if cap(c.tmp) < n {
		c.tmp = make([]byte, n)
	}
	return c.tmp[:n]
}

func (c *Comm) header(k Kind, b Buffer, op Op) Header {
	c.seq++
	return Header{Tag: c.tag, Seq: c.seq, Total: uint64(len(b.data)), Kind: k, DType: b.dtype, Op: op}
}

func checkBuf(b Buffer) error {
	if b.dtype.Size() == 0 {
		return fmt.Errorf("%w: buffer element type %d", ErrInvalid, b.dtype)
	}
	return nil
}

func (c *Comm) checkPeer(peer int) error {
	if peer < 0 || peer >= len(c.world) || peer == c.rank {
		return fmt.Errorf("%w: peer %d (group of %d, own rank %d)", ErrInvalid, peer, len(c.world), c.rank)
	}
	return nil
}

// piece returns the k-th piece of b cut every chunk bytes.
func piece(b []byte, off, chunk int) []byte { return b[off:min(off+chunk, len(b))] }

// chunk returns ChunkBytes rounded down to whole elements of width w.
func (c *Comm) chunk(w int) int { return max(w, c.cfg.ChunkBytes/w*w) }
