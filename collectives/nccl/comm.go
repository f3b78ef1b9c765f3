package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gpucoord/gpucoord/collectives"
)

// Communicator is one NCCL communicator: a member of a process group whose
// collectives run on a GPU. The collectives.Communicator methods take host
// memory; each call stages it through device scratch memory that the
// Communicator keeps and reuses, on a CUDA stream of its own, and returns
// once the result is back in the caller's buffer. The *Device methods run on
// DeviceBuffers (Alloc) in place, with no copy at all.
//
// Calls must not be concurrent (the collectives.Communicator contract), with
// one exception: Abort may be called from any goroutine at any time.
type Communicator struct {
	lib  *library
	cfg  Config
	log  *slog.Logger
	rank int
	size int

	mu       sync.Mutex
	state    error // nil while usable; ErrClosed or an ErrAborted error after
	abortReq atomic.Bool

	comm     uintptr // ncclComm_t
	stream   uintptr // cudaStream_t
	dev      uintptr // device scratch for host payloads
	devCap   int
	meta     uintptr // device scratch: descriptors of all ranks, p2p descriptors, barrier word
	host     []byte  // host copy of meta
	async    int32   // out-parameter of ncclCommGetAsyncError
	out      uintptr // out-parameter of cudaMalloc
	ccfg     commConfig
	pin      runtime.Pinner
	bufs     map[*DeviceBuffer]struct{} // DeviceBuffers allocated and not freed
	verified map[desc]struct{}          // shapes every member has agreed on (CheckShapes)
}

var _ collectives.Communicator = (*Communicator)(nil)

// descBytes is the size of one shape descriptor: kind, dtype, op/role, 5
// bytes of padding, count (int64), root or second count (int64).
const descBytes = 24

// cudaStreamNonBlocking makes the stream not synchronise with stream 0.
const cudaStreamNonBlocking = 1

// New loads NCCL, obtains the unique id (rank 0 creates it and stores it
// under cfg.Key; the others wait for it in cfg.Store), and creates this
// rank's communicator with ncclCommInitRankConfig in non-blocking mode. It
// returns when every member has joined, or with an error when ctx ends or
// cfg.Timeout passes first (the half-built communicator is aborted).
//
// Without NCCL or CUDA on the machine, New returns an error wrapping
// ErrUnavailable that names the library that failed to load.
func New(ctx context.Context, cfg *Config) (*Communicator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lib, err := loadLibrary(cfg.NCCLLibrary, cfg.CUDARTLibraries)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Communicator{
		lib:      lib,
		cfg:      *cfg,
		log:      log.With("component", "nccl", "rank", cfg.Rank, "size", cfg.Size, "device", cfg.Device),
		rank:     cfg.Rank,
		size:     cfg.Size,
		host:     make([]byte, (cfg.Size+2)*descBytes+8),
		bufs:     map[*DeviceBuffer]struct{}{},
		verified: map[desc]struct{}{},
	}
	c.cfg.CUDARTLibraries = append([]string(nil), cfg.CUDARTLibraries...)
	ctx, cancel := c.bound(ctx)
	defer cancel()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.init(ctx); err != nil {
		if c.comm != 0 {
			call(lib.commAbort, c.comm)
			c.comm = 0
		}
		c.release()
		return nil, c.wrap(err)
	}
	c.log.Debug("communicator ready", "nccl", versionString(lib.version), "nccl_library", lib.ncclPath, "cudart_library", lib.cudartPath)
	return c, nil
}

// init does New's work on a locked OS thread; on error the caller releases
// whatever was allocated.
func (c *Communicator) init(ctx context.Context) error {
	l := c.lib
	n, err := l.devices()
	if err != nil {
		return err
	}
	if c.cfg.Device >= n {
		return fmt.Errorf("%w: Device %d, but only %d CUDA devices are visible", ErrInvalidArgument, c.cfg.Device, n)
	}
	if err := c.setDevice(); err != nil {
		return err
	}

	var id uniqueID
	if c.rank == 0 {
		if r := call(l.getUniqueID, uintptr(unsafe.Pointer(&id))); r != resSuccess {
			return l.ncclError("ncclGetUniqueId", r, 0)
		}
		if c.size > 1 {
			if err := c.cfg.Store.Set(ctx, c.cfg.Key, id.internal[:]); err != nil {
				return fmt.Errorf("publishing the unique id under %q: %w", c.cfg.Key, err)
			}
		}
	} else {
		v, err := c.cfg.Store.Get(ctx, c.cfg.Key)
		if err != nil {
			return fmt.Errorf("waiting for rank 0's unique id under %q: %w", c.cfg.Key, err)
		}
		if len(v) != UniqueIDBytes {
			return fmt.Errorf("%w: the unique id under %q is %d bytes, want %d", ErrInvalidArgument, c.cfg.Key, len(v), UniqueIDBytes)
		}
		copy(id.internal[:], v)
	}

	if r := call(l.cudaStreamCreateWithFlags, uintptr(unsafe.Pointer(&c.stream)), cudaStreamNonBlocking); r != cudaSuccess {
		return l.cudaError("cudaStreamCreateWithFlags", r)
	}
	if c.meta, err = c.malloc(len(c.host)); err != nil {
		return err
	}

	c.ccfg = commConfig{
		size:           unsafe.Sizeof(commConfig{}),
		magic:          configMagic,
		version:        configVersion,
		blocking:       0,
		cgaClusterSize: configUndef,
		minCTAs:        configUndef,
		maxCTAs:        configUndef,
	}
	r := l.commInitRankConfig(&c.comm, int32(c.size), id, int32(c.rank), &c.ccfg)
	if r != resSuccess && r != resInProgress {
		return l.ncclError("ncclCommInitRankConfig", r, c.comm)
	}
	if err := c.wait(ctx, "ncclCommInitRankConfig", false); err != nil {
		return err
	}
	return nil
}

// Rank returns this member's rank in the group.
func (c *Communicator) Rank() int { return c.rank }

// Size returns the number of members.
func (c *Communicator) Size() int { return c.size }

// Version returns the loaded NCCL's version, e.g. "2.21.5".
func (c *Communicator) Version() string { return versionString(c.lib.version) }

// AllReduce reduces buf element-wise across the group with op (ncclAllReduce
// in place) and leaves the result in buf on every member.
func (c *Communicator) AllReduce(ctx context.Context, buf collectives.Buffer, op collectives.Op) error {
	d, err := c.allReduceDesc(buf, op)
	if err != nil {
		return c.wrap(err)
	}
	b := buf.Bytes()
	return c.staged(ctx, d, b, b, 0, 0)
}

// ReduceScatter reduces send (Size()*recv.Len() elements) across the group
// and leaves block Rank() of the result in recv (ncclReduceScatter, in place
// in device memory).
func (c *Communicator) ReduceScatter(ctx context.Context, send, recv collectives.Buffer, op collectives.Op) error {
	d, err := c.reduceScatterDesc(send, recv, op)
	if err != nil {
		return c.wrap(err)
	}
	rb := recv.Bytes()
	return c.staged(ctx, d, send.Bytes(), rb, 0, c.rank*len(rb))
}

// AllGather concatenates every member's send, in rank order, into recv
// (Size()*send.Len() elements) with ncclAllGather, in place in device memory.
func (c *Communicator) AllGather(ctx context.Context, send, recv collectives.Buffer) error {
	d, err := c.allGatherDesc(send, recv)
	if err != nil {
		return c.wrap(err)
	}
	sb := send.Bytes()
	return c.staged(ctx, d, sb, recv.Bytes(), c.rank*len(sb), 0)
}

// Broadcast copies root's buf into buf on every member (ncclBroadcast in place).
func (c *Communicator) Broadcast(ctx context.Context, buf collectives.Buffer, root int) error {
	d, err := c.broadcastDesc(buf, root)
	if err != nil {
		return c.wrap(err)
	}
	b := buf.Bytes()
	in := b
	if c.rank != root {
		in = nil // only the root's buffer is read
	}
	return c.staged(ctx, d, in, b, 0, 0)
}

// staged runs the collective d on host memory through the payload scratch,
// laid out as the in-place form of the operation has it: in is copied to
// scratch+inAt, the operation reads there and writes at scratch+outAt, and
// out is copied back from there once it has finished.
func (c *Communicator) staged(ctx context.Context, d desc, in, out []byte, inAt, outAt int) error {
	return c.run(ctx, task{name: d.kind.nccl(), d: d, empty: d.count == 0, host: [][]byte{in, out},
		in: func() error {
			if err := c.reserve(max(inAt+len(in), outAt+len(out))); err != nil {
				return err
			}
			if err := c.h2d(c.dev+uintptr(inAt), in); err != nil {
				return err
			}
			return c.launch(d, c.dev+uintptr(inAt), c.dev+uintptr(outAt))
		},
		out: func() error { return c.d2h(out, c.dev+uintptr(outAt)) }})
}

// launch enqueues the NCCL collective d reading send and writing recv
// (device addresses) on the communicator's stream.
func (c *Communicator) launch(d desc, send, recv uintptr) error {
	n, dt, op := uintptr(d.count), uintptr(d.dtype), uintptr(d.op)
	switch d.kind {
	case kindAllReduce:
		return c.nccl("ncclAllReduce", c.lib.allReduce, send, recv, n, dt, op, c.comm, c.stream)
	case kindReduceScatter:
		return c.nccl("ncclReduceScatter", c.lib.reduceScatter, send, recv, n, dt, op, c.comm, c.stream)
	case kindAllGather:
		return c.nccl("ncclAllGather", c.lib.allGather, send, recv, n, dt, c.comm, c.stream)
	case kindBroadcast:
		return c.nccl("ncclBroadcast", c.lib.broadcast, send, recv, n, dt, uintptr(d.root), c.comm, c.stream)
	}
	return fmt.Errorf("%w: %s is not a collective", ErrInternal, d.kind)
}

// shaped is a buffer's element type and length: a host collectives.Buffer
// or a *DeviceBuffer.
type shaped interface {
	DType() collectives.DType
	Len() int
}

// The *Desc methods check a collective's arguments, which must be of one
// element type, and return its shape.

func (c *Communicator) allReduceDesc(buf shaped, op collectives.Op) (desc, error) {
	dt, ro, err := mapTypes(buf.DType(), op)
	return desc{kind: kindAllReduce, dtype: dt, op: uint8(ro), count: int64(buf.Len())}, err
}

func (c *Communicator) reduceScatterDesc(send, recv shaped, op collectives.Op) (desc, error) {
	if send.DType() != recv.DType() {
		return desc{}, fmt.Errorf("%w: ReduceScatter send is type %d, recv type %d", ErrInvalidArgument, send.DType(), recv.DType())
	}
	if send.Len() != c.size*recv.Len() {
		return desc{}, fmt.Errorf("%w: ReduceScatter send has %d elements, want Size()*recv.Len() = %d*%d",
			ErrInvalidArgument, send.Len(), c.size, recv.Len())
	}
	dt, ro, err := mapTypes(send.DType(), op)
	return desc{kind: kindReduceScatter, dtype: dt, op: uint8(ro), count: int64(recv.Len())}, err
}

func (c *Communicator) allGatherDesc(send, recv shaped) (desc, error) {
	if send.DType() != recv.DType() {
		return desc{}, fmt.Errorf("%w: AllGather send is type %d, recv type %d", ErrInvalidArgument, send.DType(), recv.DType())
	}
	if recv.Len() != c.size*send.Len() {
		return desc{}, fmt.Errorf("%w: AllGather recv has %d elements, want Size()*send.Len() = %d*%d",
			ErrInvalidArgument, recv.Len(), c.size, send.Len())
	}
	dt, err := dataType(send.DType())
	return desc{kind: kindAllGather, dtype: dt, op: noOp, count: int64(send.Len())}, err
}

func (c *Communicator) broadcastDesc(buf shaped, root int) (desc, error) {
	if root < 0 || root >= c.size {
		return desc{}, fmt.Errorf("%w: Broadcast root %d is outside 0..%d", ErrInvalidArgument, root, c.size-1)
	}
	dt, err := dataType(buf.DType())
	return desc{kind: kindBroadcast, dtype: dt, op: noOp, count: int64(buf.Len()), root: int64(root)}, err
}

// Send sends buf to peer with ncclSend inside ncclGroupStart/End; it pairs
// with the peer's Recv.
func (c *Communicator) Send(ctx context.Context, buf collectives.Buffer, peer int) error {
	return c.p2p(ctx, buf, collectives.Buffer{}, peer, roleSend)
}

// Recv receives into buf from peer with ncclRecv inside ncclGroupStart/End;
// it pairs with the peer's Send.
func (c *Communicator) Recv(ctx context.Context, buf collectives.Buffer, peer int) error {
	return c.p2p(ctx, collectives.Buffer{}, buf, peer, roleRecv)
}

// SendRecv sends send to peer and receives recv from the same peer in one
// NCCL group, so two members that exchange with each other cannot deadlock
// whatever their order; it pairs with the peer's SendRecv. Pipeline stages
// use it to pass activations one way and gradients the other.
func (c *Communicator) SendRecv(ctx context.Context, send, recv collectives.Buffer, peer int) error {
	if send.DType() != recv.DType() && send.Len() > 0 && recv.Len() > 0 {
		return c.wrap(fmt.Errorf("%w: SendRecv send is type %d, recv type %d", ErrInvalidArgument, send.DType(), recv.DType()))
	}
	return c.p2p(ctx, send, recv, peer, roleExchange)
}

// Point-to-point roles in a descriptor.
const (
	roleSend     = 1
	roleRecv     = 2
	roleExchange = 3
	noOp         = 0xff // descriptor op of collectives without a reduction
)

func (c *Communicator) p2p(ctx context.Context, send, recv collectives.Buffer, peer int, role uint8) error {
	if peer < 0 || peer >= c.size || peer == c.rank {
		return c.wrap(fmt.Errorf("%w: peer %d is not another rank of 0..%d", ErrInvalidArgument, peer, c.size-1))
	}
	typ := send.DType()
	if role == roleRecv || typ == 0 {
		typ = recv.DType()
	}
	dt, err := dataType(typ)
	if err != nil {
		return c.wrap(err)
	}
	ns, nr := send.Len(), recv.Len()
	sb, rb := send.Bytes(), recv.Bytes()
	name := map[uint8]string{roleSend: "ncclSend", roleRecv: "ncclRecv", roleExchange: "ncclSend/ncclRecv"}[role]
	d := desc{kind: kindSendRecv, dtype: dt, op: role, count: int64(ns), root: int64(nr), peer: peer}
	return c.run(ctx, task{name: name, d: d, empty: ns == 0 && nr == 0, host: [][]byte{sb, rb},
		in: func() error {
			if err := c.reserve(len(sb) + len(rb)); err != nil {
				return err
			}
			if ns > 0 {
				if err := c.h2d(c.dev, sb); err != nil {
					return err
				}
			}
			if err := c.nccl("ncclGroupStart", c.lib.groupStart); err != nil {
				return err
			}
			var err error
			if ns > 0 {
				err = c.nccl("ncclSend", c.lib.send, c.dev, uintptr(ns), uintptr(dt), uintptr(peer), c.comm, c.stream)
			}
			if err == nil && nr > 0 {
				err = c.nccl("ncclRecv", c.lib.recv, c.dev+uintptr(len(sb)), uintptr(nr), uintptr(dt), uintptr(peer), c.comm, c.stream)
			}
			// ncclGroupEnd always closes the group, also after a failed call.
			if endErr := c.nccl("ncclGroupEnd", c.lib.groupEnd); err == nil {
				err = endErr
			}
			return err
		},
		out: func() error { return c.d2h(rb, c.dev+uintptr(len(sb))) }})
}

// Barrier returns once every member has entered it: a one-element float32
// all-reduce whose result, the group size, is checked.
func (c *Communicator) Barrier(ctx context.Context) error {
	word := c.host[len(c.host)-4:]
	slot := c.meta + uintptr(len(c.host)-4)
	err := c.run(ctx, task{name: "ncclAllReduce(barrier)",
		in: func() error {
			binary.LittleEndian.PutUint32(word, 0x3f800000) // 1.0f
			if err := c.h2d(slot, word); err != nil {
				return err
			}
			return c.nccl("ncclAllReduce", c.lib.allReduce, slot, slot, 1, ncclFloat32, ncclSum, c.comm, c.stream)
		},
		out: func() error { return c.d2h(word, slot) }})
	if err != nil {
		return err
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(word)); v != float32(c.size) {
		return c.wrap(fmt.Errorf("%w: barrier all-reduce of 1.0 gave %v, want %d", ErrInternal, v, c.size))
	}
	return nil
}

// Close destroys the communicator (ncclCommDestroy) and frees its stream and
// device memory. Every member should close its communicator. Close after
// Abort, or a second Close, returns nil.
func (c *Communicator) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != nil {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.abortReq.Load() {
		_ = c.abort(errors.New("Abort called"))
		return nil
	}
	var err error
	if c.comm != 0 {
		if err = c.setDevice(); err == nil {
			if r := call(c.lib.commDestroy, c.comm); r != resSuccess && r != resInProgress {
				err = c.lib.ncclError("ncclCommDestroy", r, 0)
			}
		}
		c.comm = 0
	}
	c.release()
	c.state = ErrClosed
	if err != nil {
		return c.wrap(err)
	}
	return nil
}

// Abort aborts the communicator with ncclCommAbort, ending any NCCL work it
// has in flight, and frees its resources. It may be called from any
// goroutine: an operation in progress on another goroutine notices within a
// poll interval and returns an error wrapping ErrAborted. Every later call
// returns ErrAborted.
func (c *Communicator) Abort() {
	c.abortReq.Store(true)
	if c.mu.TryLock() {
		defer c.mu.Unlock()
		if c.state == nil {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := c.setDevice(); err != nil {
				c.log.Warn("cudaSetDevice before abort failed", "err", err)
			}
			_ = c.abort(errors.New("Abort called"))
		}
	}
}

// desc is the shape of one call, compared across ranks when CheckShapes is on.
type desc struct {
	kind  kind
	dtype int32
	op    uint8 // ncclRedOp_t, noOp, or the point-to-point role
	count int64 // elements (sent, for point-to-point)
	root  int64 // broadcast root, or elements received for point-to-point
	peer  int   // point-to-point peer; not encoded
}

func (d desc) encode(b []byte) {
	clear(b[:descBytes])
	b[0], b[1], b[2] = byte(d.kind), byte(d.dtype), d.op
	binary.LittleEndian.PutUint64(b[8:], uint64(d.count))
	binary.LittleEndian.PutUint64(b[16:], uint64(d.root))
}

func decode(b []byte) desc {
	return desc{
		kind: kind(b[0]), dtype: int32(b[1]), op: b[2],
		count: int64(binary.LittleEndian.Uint64(b[8:])),
		root:  int64(binary.LittleEndian.Uint64(b[16:])),
	}
}

func (d desc) String() string {
	t := map[int32]string{ncclFloat32: "float32", ncclFloat64: "float64", ncclBfloat16: "bfloat16"}[d.dtype]
	switch d.kind {
	case kindSendRecv:
		return fmt.Sprintf("%s (send %d, receive %d %s elements)",
			map[uint8]string{roleSend: "Send", roleRecv: "Recv", roleExchange: "SendRecv"}[d.op], d.count, d.root, t)
	case kindBroadcast:
		return fmt.Sprintf("Broadcast of %d %s elements from root %d", d.count, t, d.root)
	case kindAllGather:
		return fmt.Sprintf("AllGather of %d %s elements", d.count, t)
	}
	o := map[uint8]string{ncclSum: "sum", ncclMax: "max", ncclMin: "min"}[d.op]
	return fmt.Sprintf("%s of %d %s elements with %s", d.kind, d.count, t, o)
}

// pairs reports whether this rank's point-to-point call pairs with the
// peer's: a Send with a Recv of the same length, a SendRecv with a SendRecv
// whose lengths are the mirror image.
func (d desc) pairs(p desc) bool {
	if p.kind != kindSendRecv || p.dtype != d.dtype && d.count+d.root > 0 {
		return false
	}
	switch d.op {
	case roleSend:
		return p.op == roleRecv && p.root == d.count
	case roleRecv:
		return p.op == roleSend && p.count == d.root
	}
	return p.op == roleExchange && p.root == d.count && p.count == d.root
}

// task is one operation for run.
type task struct {
	name  string          // names the operation in errors
	d     desc            // the shape compared across members; kind 0 for none
	empty bool            // nothing to move: only the shape check runs
	in    func() error    // enqueues the work, after any copy in
	out   func() error    // enqueues the copy out; nil for none
	host  [][]byte        // host memory the copies use, pinned for the call
	dev   []*DeviceBuffer // device memory the call uses, which must not be freed
}

// maxVerified bounds the shapes remembered as verified; members forget them
// all at once when it is reached, which they do at the same call when their
// calls agree.
const maxVerified = 4096

// run executes one operation: lock, check usability, bound ctx by Timeout,
// pin the host buffers, set the device, check that device buffers are live,
// compare shapes, then in (stage in and enqueue the NCCL call), wait, out
// (stage out), wait. The wait between in and out matters: a device-to-host
// copy into pageable memory blocks the calling thread until the stream
// reaches it, so it is only enqueued once the NCCL operation has finished
// and cannot hang.
//
// With CheckShapes, a shape is compared the first time this communicator
// runs it (every call with Config.CheckEveryCall); once every member has
// agreed on it, later calls of that shape skip the exchange.
func (c *Communicator) run(ctx context.Context, t task) error {
	return c.exclusive(ctx, func(ctx context.Context) error {
		c.pin.Pin(&c.host[0])
		for _, b := range t.host {
			if len(b) > 0 {
				c.pin.Pin(&b[0])
			}
		}
		defer c.pin.Unpin()
		for _, b := range t.dev {
			if b.freed {
				return fmt.Errorf("%s: %w: the DeviceBuffer was freed", t.name, ErrInvalidArgument)
			}
		}
		if _, ok := c.verified[t.d]; c.cfg.CheckShapes && t.d.kind != 0 && (!ok || c.cfg.CheckEveryCall) {
			if err := c.checkShape(ctx, t.d); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if len(c.verified) == maxVerified {
				clear(c.verified)
			}
			c.verified[t.d] = struct{}{}
		}
		if t.empty {
			return nil
		}
		if err := c.step(ctx, t.name, t.in); err != nil {
			return err
		}
		if t.out == nil {
			return nil
		}
		return c.step(ctx, t.name, t.out)
	})
}

// exclusive runs f as one call: under the lock, on a usable communicator,
// with ctx bounded by Timeout, on a thread locked to the OS thread whose
// current device is this communicator's. Errors come back wrapped with the
// member's identity.
func (c *Communicator) exclusive(ctx context.Context, f func(ctx context.Context) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != nil {
		return c.wrap(c.state)
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	err := c.onDevice(func() error {
		if c.abortReq.Load() {
			return c.abort(errors.New("Abort called"))
		}
		return f(ctx)
	})
	if err != nil {
		return c.wrap(err)
	}
	return nil
}

// onDevice runs f locked to an OS thread whose current CUDA device is this
// communicator's (the current device belongs to the thread).
func (c *Communicator) onDevice(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.setDevice(); err != nil {
		return err
	}
	return f()
}

// step runs f and waits for the stream. If f fails after enqueueing work,
// the stream is still drained so that no copy touches the caller's buffer
// after the call returns.
func (c *Communicator) step(ctx context.Context, name string, f func() error) error {
	err := f()
	if werr := c.wait(ctx, name, true); werr != nil {
		return werr
	}
	return err
}

// checkShape exchanges descriptors: an all-gather among all members for a
// collective, a grouped send and receive with the peer for point-to-point.
func (c *Communicator) checkShape(ctx context.Context, d desc) error {
	all := c.size * descBytes
	if d.kind == kindSendRecv {
		mine, theirs := c.host[all:all+descBytes], c.host[all+descBytes:all+2*descBytes]
		dMine, dTheirs := c.meta+uintptr(all), c.meta+uintptr(all+descBytes)
		d.encode(mine)
		err := c.step(ctx, "shape check", func() error {
			if err := c.h2d(dMine, mine); err != nil {
				return err
			}
			if err := c.nccl("ncclGroupStart", c.lib.groupStart); err != nil {
				return err
			}
			err := c.nccl("ncclSend", c.lib.send, dMine, descBytes, ncclUint8, uintptr(d.peer), c.comm, c.stream)
			if err == nil {
				err = c.nccl("ncclRecv", c.lib.recv, dTheirs, descBytes, ncclUint8, uintptr(d.peer), c.comm, c.stream)
			}
			if endErr := c.nccl("ncclGroupEnd", c.lib.groupEnd); err == nil {
				err = endErr
			}
			return err
		})
		if err == nil {
			err = c.step(ctx, "shape check", func() error { return c.d2h(theirs, dTheirs) })
		}
		if err != nil {
			return err
		}
		if p := decode(theirs); !d.pairs(p) {
			return c.mismatch(d.peer, p, d)
		}
		return nil
	}
	mine := c.host[c.rank*descBytes : (c.rank+1)*descBytes]
	d.encode(mine)
	slot := c.meta + uintptr(c.rank*descBytes)
	err := c.step(ctx, "shape check", func() error {
		if err := c.h2d(slot, mine); err != nil {
			return err
		}
		return c.nccl("ncclAllGather", c.lib.allGather, slot, c.meta, descBytes, ncclUint8, c.comm, c.stream)
	})
	if err == nil {
		err = c.step(ctx, "shape check", func() error { return c.d2h(c.host[:all], c.meta) })
	}
	if err != nil {
		return err
	}
	for r := 0; r < c.size; r++ {
		if p := decode(c.host[r*descBytes:]); p != d {
			return c.mismatch(r, p, d)
		}
	}
	return nil
}

// mismatch reports that peer called theirs where this rank called mine.
func (c *Communicator) mismatch(peer int, theirs, mine desc) error {
	return &collectives.PeerError{Op: mine.kind.String(), Peer: peer, World: peer,
		Err: fmt.Errorf("%w: rank %d called %s, this rank %d called %s", ErrMismatch, peer, theirs, c.rank, mine)}
}

// wait polls ncclCommGetAsyncError and, when stream is set, cudaStreamQuery
// until the communicator is idle and the stream empty. An asynchronous NCCL
// error, a CUDA error, an Abort request or the end of ctx aborts the
// communicator.
func (c *Communicator) wait(ctx context.Context, name string, stream bool) error {
	start := time.Now()
	sleep := time.Microsecond
	for {
		if r := call(c.lib.commGetAsyncError, c.comm, uintptr(unsafe.Pointer(&c.async))); r != resSuccess {
			return c.abort(c.lib.ncclError("ncclCommGetAsyncError", r, c.comm))
		}
		switch st := c.async; st {
		case resSuccess:
			if !stream {
				return nil
			}
			q := call(c.lib.cudaStreamQry, c.stream)
			if q == cudaSuccess {
				return nil
			}
			if q != cudaErrorNotReady {
				return c.abort(c.lib.cudaError("cudaStreamQuery", q))
			}
		case resInProgress:
		default:
			return c.abort(c.lib.ncclError(name, st, c.comm))
		}
		if c.abortReq.Load() {
			return c.abort(fmt.Errorf("%s: Abort called", name))
		}
		if err := ctx.Err(); err != nil {
			return c.abort(fmt.Errorf("%s did not complete after %s: %w", name, time.Since(start).Round(time.Millisecond), context.Cause(ctx)))
		}
		// Back to back for the first tens of microseconds (NCCL latency on
		// NVLink), then back off to PollInterval.
		if time.Since(start) < 50*time.Microsecond {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		if sleep *= 2; sleep > c.cfg.PollInterval {
			sleep = c.cfg.PollInterval
		}
	}
}

// abort calls ncclCommAbort, frees the communicator's resources and marks it
// unusable; it returns cause wrapped with ErrAborted.
func (c *Communicator) abort(cause error) error {
	if c.comm != 0 {
		if r := call(c.lib.commAbort, c.comm); r != resSuccess && r != resInProgress {
			c.log.Warn("ncclCommAbort failed", "code", r)
		}
		c.comm = 0
	}
	c.release()
	err := fmt.Errorf("%w: %w", ErrAborted, cause)
	c.state = err
	c.log.Warn("communicator aborted", "err", cause)
	return err
}

// release frees the device memory, DeviceBuffers included, and the stream.
// The communicator itself is destroyed or aborted by the caller first.
func (c *Communicator) release() {
	for b := range c.bufs {
		if err := c.free(b); err != nil {
			c.log.Warn("freeing a DeviceBuffer failed", "err", err)
		}
	}
	for _, p := range []*uintptr{&c.dev, &c.meta} {
		if *p != 0 {
			if r := call(c.lib.cudaFree, *p); r != cudaSuccess {
				c.log.Warn("cudaFree failed", "code", r)
			}
			*p = 0
		}
	}
	c.devCap = 0
	if c.stream != 0 {
		if r := call(c.lib.cudaStreamDestroy, c.stream); r != cudaSuccess {
			c.log.Warn("cudaStreamDestroy failed", "code", r)
		}
		c.stream = 0
	}
}

// bound limits ctx by Config.Timeout. When the timeout is what ends ctx, its
// cause wraps ErrTimeout as well as context.DeadlineExceeded.
func (c *Communicator) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.cfg.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, c.cfg.Timeout,
		fmt.Errorf("%w: Config.Timeout %s passed: %w", ErrTimeout, c.cfg.Timeout, context.DeadlineExceeded))
}

// wrap prefixes an error with this member's identity.
func (c *Communicator) wrap(err error) error {
	return fmt.Errorf("nccl rank %d of %d (device %d): %w", c.rank, c.size, c.cfg.Device, err)
}

func (c *Communicator) setDevice() error {
	if r := call(c.lib.cudaSetDevice, uintptr(c.cfg.Device)); r != cudaSuccess {
		return c.lib.cudaError("cudaSetDevice", r)
	}
	return nil
}

// reserve makes the payload scratch at least n bytes. It is called with the
// stream idle, so the old block can be freed at once.
func (c *Communicator) reserve(n int) error {
	if n <= c.devCap {
		return nil
	}
	if c.dev != 0 {
		if r := call(c.lib.cudaFree, c.dev); r != cudaSuccess {
			return c.lib.cudaError("cudaFree", r)
		}
		c.dev, c.devCap = 0, 0
	}
	n = (n + 4095) &^ 4095
	p, err := c.malloc(n)
	if err != nil {
		return err
	}
	c.dev, c.devCap = p, n
	return nil
}

func (c *Communicator) malloc(n int) (uintptr, error) {
	if r := call(c.lib.cudaMalloc, uintptr(unsafe.Pointer(&c.out)), uintptr(n)); r != cudaSuccess {
		return 0, fmt.Errorf("allocating %d bytes of device memory: %w", n, c.lib.cudaError("cudaMalloc", r))
	}
	return c.out, nil
}

// h2d enqueues a copy of the pinned host slice b to device address dst.
func (c *Communicator) h2d(dst uintptr, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if r := call(c.lib.cudaMemcpyAsync, dst, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), cudaMemcpyHostToDev, c.stream); r != cudaSuccess {
		return c.lib.cudaError("cudaMemcpyAsync(host to device)", r)
	}
	return nil
}

// d2h enqueues a copy from device address src into the pinned host slice b.
func (c *Communicator) d2h(b []byte, src uintptr) error {
	if len(b) == 0 {
		return nil
	}
	if r := call(c.lib.cudaMemcpyAsync, uintptr(unsafe.Pointer(&b[0])), src, uintptr(len(b)), cudaMemcpyDevToHost, c.stream); r != cudaSuccess {
		return c.lib.cudaError("cudaMemcpyAsync(device to host)", r)
	}
	return nil
}

// nccl calls an NCCL function that returns ncclResult_t. ncclInProgress is
// success on a non-blocking communicator: wait polls for the outcome.
func (c *Communicator) nccl(name string, fn uintptr, args ...uintptr) error {
	if r := call(fn, args...); r != resSuccess && r != resInProgress {
		return c.lib.ncclError(name, r, c.comm)
	}
	return nil
}

// mapTypes maps a data type and a reduction together.
func mapTypes(d collectives.DType, o collectives.Op) (int32, int32, error) {
	dt, err := dataType(d)
	if err != nil {
		return 0, 0, err
	}
	ro, err := redOp(o)
	if err != nil {
		return 0, 0, err
	}
	return dt, ro, nil
}
