package nccl

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpucoord/gpucoord/collectives"
)

// allocFilled allocates a DeviceBuffer of n elements of dt on every rank and
// fills rank r's element i with val(r, i) through CopyFrom.
func allocFilled(t *testing.T, comms []*Communicator, dt collectives.DType, n int, val func(r, i int) float64) []*DeviceBuffer {
	t.Helper()
	bufs := make([]*DeviceBuffer, len(comms))
	for r, c := range comms {
		v := make([]float64, n)
		for i := range v {
			v[i] = val(r, i)
		}
		b, err := c.Alloc(t.Context(), dt, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.CopyFrom(t.Context(), makeBuf(dt, v)); err != nil {
			t.Fatal(err)
		}
		bufs[r] = b
	}
	return bufs
}

// readDevice copies b to the host and returns its elements as float64.
func readDevice(t *testing.T, b *DeviceBuffer) []float64 {
	t.Helper()
	host := makeBuf(b.DType(), make([]float64, b.Len()))
	if err := b.CopyTo(t.Context(), host); err != nil {
		t.Fatal(err)
	}
	out := make([]float64, b.Len())
	for i := range out {
		out[i] = readBuf(host, i)
	}
	return out
}

// The four collectives on device memory against the same naive references
// as the host path, for world sizes 1-4 and lengths that do not divide
// evenly.
func TestDeviceCollectivesAgainstReference(t *testing.T) {
	needFake(t)
	for _, world := range []int{1, 2, 3, 4} {
		for _, n := range []int{1, 5, 1000} {
			checkDeviceCollectives(t, group(t, world, nil), n)
			// The buffers are left to Close, which must free them (needFake
			// checks that none is left).
		}
	}
}

// checkDeviceCollectives runs each device collective on buffers of n
// elements (per rank) and checks the results against naive references:
// AllReduce in three types with three ops, ReduceScatter, AllGather and
// Broadcast from the last rank.
func checkDeviceCollectives(t *testing.T, comms []*Communicator, n int) {
	t.Helper()
	world := len(comms)
	val := func(r, i int) float64 { return float64((i*7+r*13)%11 - 5) } // exact in bfloat16
	for _, tc := range []struct {
		dt collectives.DType
		op collectives.Op
	}{{collectives.Float32, collectives.Sum}, {collectives.Float64, collectives.Max}, {collectives.BFloat16, collectives.Min}} {
		bufs := allocFilled(t, comms, tc.dt, n, val)
		mustAll(t, "AllReduceDevice", each(comms, func(r int, c *Communicator) error {
			return c.AllReduceDevice(t.Context(), bufs[r], tc.op)
		}))
		for r := range world {
			got := readDevice(t, bufs[r])
			for i := range n {
				want := val(0, i)
				for q := 1; q < world; q++ {
					want = reduceRef(tc.op, want, val(q, i))
				}
				if got[i] != want {
					t.Fatalf("world %d n %d %v/%v: AllReduceDevice rank %d [%d] = %v, want %v", world, n, tc.dt, tc.op, r, i, got[i], want)
				}
			}
		}
	}

	send := allocFilled(t, comms, collectives.Float64, world*n, val)
	recv := allocFilled(t, comms, collectives.Float64, n, func(int, int) float64 { return 0 })
	mustAll(t, "ReduceScatterDevice", each(comms, func(r int, c *Communicator) error {
		return c.ReduceScatterDevice(t.Context(), send[r], recv[r], collectives.Sum)
	}))
	for r := range world {
		got := readDevice(t, recv[r])
		for i := range n {
			want := 0.0
			for q := range world {
				want += val(q, r*n+i)
			}
			if got[i] != want {
				t.Fatalf("world %d n %d: ReduceScatterDevice rank %d [%d] = %v, want %v", world, n, r, i, got[i], want)
			}
		}
	}

	shard := allocFilled(t, comms, collectives.Float32, n, val)
	full := allocFilled(t, comms, collectives.Float32, world*n, func(int, int) float64 { return 0 })
	mustAll(t, "AllGatherDevice", each(comms, func(r int, c *Communicator) error {
		return c.AllGatherDevice(t.Context(), shard[r], full[r])
	}))
	for r := range world {
		got := readDevice(t, full[r])
		for q := range world {
			for i := range n {
				if got[q*n+i] != val(q, i) {
					t.Fatalf("world %d n %d: AllGatherDevice rank %d block %d [%d] = %v, want %v", world, n, r, q, i, got[q*n+i], val(q, i))
				}
			}
		}
	}

	root := world - 1
	bc := allocFilled(t, comms, collectives.Float64, n, val)
	mustAll(t, "BroadcastDevice", each(comms, func(r int, c *Communicator) error {
		return c.BroadcastDevice(t.Context(), bc[r], root)
	}))
	for r := range world {
		got := readDevice(t, bc[r])
		for i := range n {
			if got[i] != val(root, i) {
				t.Fatalf("world %d n %d: BroadcastDevice rank %d [%d] = %v, want %v", world, n, r, i, got[i], val(root, i))
			}
		}
	}
}

// Each device collective reaches NCCL with the buffers' own device
// addresses, the nccl.h values, the count and root, on the communicator's
// stream, and with no staging: no cudaMalloc, and no cudaMemcpyAsync but
// the 24-byte shape descriptors of the first call of a shape, which the
// second call of the same shape does not repeat.
func TestDevicePathArgumentsAndNoStaging(t *testing.T) {
	needFake(t)
	const world, n = 3, 37
	comms := group(t, world, nil)
	zero := func(int, int) float64 { return 0 }
	one := allocFilled(t, comms, collectives.Float32, n, zero)
	all := allocFilled(t, comms, collectives.Float32, world*n, zero)
	tests := []struct {
		name       string
		fn         string
		call       func(r int, c *Communicator) error
		send, recv []*DeviceBuffer
		op, root   int64
	}{
		{"AllReduce max", "ncclAllReduce", func(r int, c *Communicator) error {
			return c.AllReduceDevice(t.Context(), one[r], collectives.Max)
		}, one, one, ncclMax, -1},
		{"ReduceScatter sum", "ncclReduceScatter", func(r int, c *Communicator) error {
			return c.ReduceScatterDevice(t.Context(), all[r], one[r], collectives.Sum)
		}, all, one, ncclSum, -1},
		{"AllGather", "ncclAllGather", func(r int, c *Communicator) error {
			return c.AllGatherDevice(t.Context(), one[r], all[r])
		}, one, all, -1, -1},
		{"Broadcast from 1", "ncclBroadcast", func(r int, c *Communicator) error {
			return c.BroadcastDevice(t.Context(), one[r], 1)
		}, one, one, -1, 1},
	}
	byStream := map[int64]int{}
	for r, c := range comms {
		byStream[int64(c.stream)] = r
	}
	for _, tc := range tests {
		for call, wantSeq := range []string{
			"H2D,ncclAllGather(uint8),D2H," + tc.fn, // first call of the shape: descriptors, then the operation
			tc.fn,                                   // second call: the operation alone
		} {
			fake.Reset()
			mustAll(t, tc.name, each(comms, tc.call))
			seq := map[int][]string{}
			for _, rec := range fake.Records() {
				switch name := rec.Name(); name {
				case "cudaMalloc", "cudaFree":
					t.Errorf("%s call %d: %s during a device collective", tc.name, call, name)
				case "cudaMemcpyAsync":
					if rec.Bytes != descBytes && rec.Bytes != world*descBytes {
						t.Errorf("%s call %d: a copy of %d bytes: staging on the device path", tc.name, call, rec.Bytes)
					}
					seq[byStream[rec.Stream]] = append(seq[byStream[rec.Stream]], map[int64]string{1: "H2D", 2: "D2H"}[rec.Kind])
				case "ncclAllGather", "ncclAllReduce", "ncclReduceScatter", "ncclBroadcast":
					r := int(rec.Rank)
					if rec.DType == ncclUint8 {
						seq[r] = append(seq[r], name+"(uint8)")
						continue
					}
					seq[r] = append(seq[r], name)
					c := comms[r]
					if rec.SendBuf != int64(tc.send[r].ptr) || rec.RecvBuf != int64(tc.recv[r].ptr) {
						t.Errorf("%s rank %d: %s(send %#x, recv %#x), want the DeviceBuffers %#x and %#x",
							tc.name, r, name, rec.SendBuf, rec.RecvBuf, tc.send[r].ptr, tc.recv[r].ptr)
					}
					if rec.Count != n || rec.DType != ncclFloat32 || rec.Op != tc.op || rec.Peer != tc.root {
						t.Errorf("%s rank %d: count %d dtype %d op %d root %d; want %d, %d, %d, %d",
							tc.name, r, rec.Count, rec.DType, rec.Op, rec.Peer, n, ncclFloat32, tc.op, tc.root)
					}
					if rec.Stream != int64(c.stream) || rec.Comm != int64(c.comm) {
						t.Errorf("%s rank %d: on stream %#x comm %#x, want the communicator's %#x and %#x",
							tc.name, r, rec.Stream, rec.Comm, c.stream, c.comm)
					}
				}
			}
			for r := range world {
				if got := strings.Join(seq[r], ","); got != wantSeq {
					t.Errorf("%s call %d rank %d: %s, want %s", tc.name, call, r, got, wantSeq)
				}
			}
		}
	}
}

func TestDeviceBufferLifecycle(t *testing.T) {
	needFake(t)
	comms := group(t, 2, nil)
	c := comms[0]
	base := fake.LiveAllocs()
	fake.Reset()

	b, err := c.Alloc(t.Context(), collectives.Float64, 10)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := c.Alloc(t.Context(), collectives.Float32, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := fake.LiveAllocs() - base; got != 1 {
		t.Errorf("%d device allocations for 10 and 0 elements, want 1", got)
	}
	mallocs := fake.Records("cudaMalloc")
	if len(mallocs) != 1 || mallocs[0].Bytes != 80 || mallocs[0].RecvBuf != int64(b.ptr) || mallocs[0].Dev != 0 {
		t.Fatalf("cudaMalloc calls %+v, want one of 80 bytes on device 0 returning %#x", mallocs, b.ptr)
	}
	if b.Len() != 10 || b.DType() != collectives.Float64 || empty.Len() != 0 {
		t.Errorf("Len/DType = %d/%v and %d", b.Len(), b.DType(), empty.Len())
	}
	if err := empty.CopyFrom(t.Context(), collectives.Float32s(nil)); err != nil {
		t.Errorf("CopyFrom of nothing: %v", err)
	}

	f := func(n int) collectives.Buffer { return collectives.Float64s(make([]float64, n)) }
	other, err := comms[1].Alloc(t.Context(), collectives.Float64, 10)
	if err != nil {
		t.Fatal(err)
	}
	fake.Reset()
	for _, tc := range []struct {
		name string
		err  error
		want error
		has  string
	}{
		{"copy of another length", b.CopyFrom(t.Context(), f(9)), ErrInvalidArgument, "9 elements"},
		{"copy of another type", b.CopyTo(t.Context(), collectives.Float32s(make([]float32, 10))), ErrInvalidArgument, "type"},
		{"another communicator's buffer", c.AllReduceDevice(t.Context(), other, collectives.Sum), ErrInvalidArgument, "another communicator"},
		{"nil buffer", c.BroadcastDevice(t.Context(), nil, 0), ErrInvalidArgument, "nil DeviceBuffer"},
		{"mixed types", c.AllGatherDevice(t.Context(), empty, b), ErrInvalidArgument, "AllGather send is type"},
		{"bad type", func() error { _, err := c.Alloc(t.Context(), 0, 4); return err }(), ErrUnsupported, "data type 0"},
		{"negative length", func() error { _, err := c.Alloc(t.Context(), collectives.Float32, -1); return err }(), ErrInvalidArgument, "-1"},
	} {
		if !errors.Is(tc.err, tc.want) || !strings.Contains(fmt.Sprint(tc.err), tc.has) {
			t.Errorf("%s: %v, want %v mentioning %q", tc.name, tc.err, tc.want, tc.has)
		}
	}
	if recs := fake.Records("cudaMemcpyAsync", "cudaMalloc", "ncclAllReduce", "ncclAllGather", "ncclBroadcast"); len(recs) != 0 {
		t.Errorf("%d calls for rejected arguments, want 0", len(recs))
	}

	ptr := b.ptr
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if frees := fake.Records("cudaFree"); len(frees) != 1 || frees[0].SendBuf != int64(ptr) {
		t.Errorf("cudaFree calls %+v, want one of %#x", frees, ptr)
	}
	if err := b.Free(); err != nil {
		t.Errorf("second Free = %v", err)
	}
	if n := len(fake.Records("cudaFree")); n != 1 {
		t.Errorf("%d cudaFree calls after a second Free, want 1", n)
	}
	if err := c.AllReduceDevice(t.Context(), b, collectives.Sum); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "freed") {
		t.Errorf("AllReduceDevice on a freed buffer = %v, want ErrInvalidArgument", err)
	}
	if err := b.CopyTo(t.Context(), f(10)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("CopyTo from a freed buffer = %v, want ErrInvalidArgument", err)
	}
	if n := len(fake.Records("ncclAllReduce", "ncclAllGather", "cudaMemcpyAsync")); n != 0 {
		t.Errorf("%d calls on a freed buffer, want 0", n)
	}

	fake.Inject("cudaMalloc", 2, 0)
	if _, err := c.Alloc(t.Context(), collectives.Float32, 1<<20); !errors.Is(err, ErrCUDA) || !strings.Contains(err.Error(), "out of memory") {
		t.Errorf("Alloc with cudaMalloc failing = %v, want ErrCUDA", err)
	}

	// Close frees what is left (empty and other's are the only ones); a
	// later Free is a no-op, and other uses report the closed communicator.
	kept, err := c.Alloc(t.Context(), collectives.Float32, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := kept.Free(); err != nil {
		t.Errorf("Free after Close = %v", err)
	}
	if err := kept.CopyFrom(t.Context(), collectives.Float32s(make([]float32, 3))); !errors.Is(err, ErrClosed) {
		t.Errorf("CopyFrom after Close = %v, want ErrClosed", err)
	}
	// Rank 0's descriptor block and kept are gone, rank 1's buffer is alive.
	if got := fake.LiveAllocs() - base; got != 0 {
		t.Errorf("%+d device allocations after rank 0's Close, want +0", got)
	}
}

// An abort, from a context ending here, frees the DeviceBuffers too.
func TestAbortFreesDeviceBuffers(t *testing.T) {
	needFake(t)
	comms := group(t, 2, nil)
	base := fake.LiveAllocs()
	b, err := comms[0].Alloc(t.Context(), collectives.Float32, 64)
	if err != nil {
		t.Fatal(err)
	}
	comms[0].Abort()
	if got := fake.LiveAllocs() - base; got != -1 {
		t.Errorf("%+d device allocations after Abort, want -1 (the buffer and rank 0's descriptor block freed)", got)
	}
	if err := comms[0].AllReduceDevice(t.Context(), b, collectives.Sum); !errors.Is(err, ErrAborted) {
		t.Errorf("AllReduceDevice after Abort = %v, want ErrAborted", err)
	}
	if err := b.Free(); err != nil {
		t.Errorf("Free after Abort = %v", err)
	}
}

// The shape check runs for the first call of each shape, not again for a
// shape every member agreed on; with CheckEveryCall it runs every time, and
// without CheckShapes never. A mismatch in a new shape is still caught.
func TestShapeCheckOncePerShape(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tweak func(*Config)
		want  int // shape all-gathers per rank for the calls below
	}{
		{"default", nil, 3},
		{"every call", func(c *Config) { c.CheckEveryCall = true }, 6},
		{"off", func(c *Config) { c.CheckShapes = false }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needFake(t)
			comms := group(t, 2, tc.tweak)
			dev := allocFilled(t, comms, collectives.Float32, 8, func(r, i int) float64 { return 1 })
			fake.Reset()
			for _, n := range []int{8, 8, 9, 8} {
				mustAll(t, "AllReduce", each(comms, func(r int, c *Communicator) error {
					return c.AllReduce(t.Context(), collectives.Float32s(make([]float32, n)), collectives.Sum)
				}))
			}
			// The device call of 8 float32 sums has the host call's shape.
			mustAll(t, "AllReduceDevice", each(comms, func(r int, c *Communicator) error {
				return c.AllReduceDevice(t.Context(), dev[r], collectives.Sum)
			}))
			mustAll(t, "AllReduce max", each(comms, func(r int, c *Communicator) error {
				return c.AllReduce(t.Context(), collectives.Float32s(make([]float32, 8)), collectives.Max)
			}))
			checks := 0
			for _, r := range fake.Records("ncclAllGather") {
				if r.DType == ncclUint8 {
					checks++
				}
			}
			if checks != 2*tc.want {
				t.Errorf("%d shape all-gathers, want %d per rank", checks, tc.want)
			}
			if tc.want == 0 {
				return
			}
			errs := each(comms, func(r int, c *Communicator) error {
				return c.AllReduce(t.Context(), collectives.Float32s(make([]float32, 10+r)), collectives.Sum)
			})
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) {
					t.Errorf("rank %d: new shapes that differ = %v, want ErrMismatch", r, err)
				}
			}
		})
	}
}

// World.NewGroup builds NCCL communicators of the listed members, with keys
// that differ per member list and per repeat, and refuses a list without
// the caller before any NCCL call.
func TestWorldGroups(t *testing.T) {
	needFake(t)
	const size = 4
	_, worlds, err := collectives.NewInmemWorld(size, collectives.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	store := collectives.NewMemStore()
	sums := make([][]float32, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			defer worlds[r].Close()
			w := NewWorld(worlds[r], fakeConfig(t, 0, 1, store, "job/gen0"))
			for _, members := range [][]int{{r &^ 1, r | 1}, {r % 2, r%2 + 2}, {r &^ 1, r | 1}} {
				g, err := collectives.NewGroup(t.Context(), w, members)
				if err != nil {
					errs[r] = err
					return
				}
				buf := []float32{float32(r)}
				err = g.AllReduce(t.Context(), collectives.Float32s(buf), collectives.Sum)
				sums[r] = append(sums[r], buf[0])
				if cerr := g.(*Communicator).Close(); err == nil {
					err = cerr
				}
				if err != nil {
					errs[r] = err
					return
				}
			}
			if w.Rank() != r || w.Size() != size {
				errs[r] = fmt.Errorf("world rank %d size %d", w.Rank(), w.Size())
			}
		})
	}
	wg.Wait()
	mustAll(t, "groups", errs)
	for r := range size {
		pair := float32((r &^ 1) + (r | 1))
		want := []float32{pair, float32(2*(r%2) + 2), pair}
		if !slices.Equal(sums[r], want) {
			t.Errorf("rank %d group sums %v, want %v", r, sums[r], want)
		}
	}
	if n := len(fake.Records("ncclCommInitRankConfig")); n != 3*size {
		t.Errorf("%d ncclCommInitRankConfig calls, want %d", n, 3*size)
	}
	for _, k := range []string{"job/gen0/0,1/0", "job/gen0/2,3/0", "job/gen0/0,2/0", "job/gen0/1,3/0", "job/gen0/0,1/1", "job/gen0/2,3/1"} {
		if _, err := store.Get(t.Context(), k); err != nil {
			t.Errorf("no unique id under %q: %v", k, err)
		}
	}

	fake.Reset()
	w := NewWorld(worlds[0], fakeConfig(t, 0, 1, store, "job/gen1"))
	if _, err := w.NewGroup(t.Context(), []int{1, 2}); !errors.Is(err, collectives.ErrNotMember) {
		t.Errorf("NewGroup without the caller = %v, want ErrNotMember", err)
	}
	if _, err := w.NewGroup(t.Context(), []int{0, 0}); !errors.Is(err, collectives.ErrInvalid) {
		t.Errorf("NewGroup with a repeated rank = %v, want ErrInvalid", err)
	}
	if n := len(fake.Records("ncclGetUniqueId", "ncclCommInitRankConfig")); n != 0 {
		t.Errorf("%d NCCL calls for refused member lists", n)
	}
}

func TestPlaceLocal(t *testing.T) {
	for _, devices := range []int{0, 1, 2, 4} {
		const ranks = 8
		type place struct {
			dev int
			id  string
		}
		got := make([]place, ranks)
		for r := range got {
			got[r].dev, got[r].id = PlaceLocal(r, devices, "node7")
			if want := r % max(devices, 1); got[r].dev != want {
				t.Errorf("devices %d rank %d: device %d, want %d", devices, r, got[r].dev, want)
			}
			if !strings.HasPrefix(got[r].id, "node7/") {
				t.Errorf("devices %d rank %d: host id %q does not name the machine", devices, r, got[r].id)
			}
		}
		for a := range got {
			for b := a + 1; b < ranks; b++ {
				// NCCL refuses one host id twice on one GPU.
				if got[a] == got[b] {
					t.Errorf("devices %d: ranks %d and %d both at %+v", devices, a, b, got[a])
				}
				// Ranks on different GPUs keep one id, and with it NCCL's
				// transports within a host, while they can.
				if b < devices && got[a].id != got[b].id {
					t.Errorf("devices %d: ranks %d and %d on GPUs %d and %d have ids %q and %q",
						devices, a, b, got[a].dev, got[b].dev, got[a].id, got[b].id)
				}
			}
		}
	}
}

func TestDevices(t *testing.T) {
	needFake(t)
	cfg := fakeConfig(t, 0, 1, nil, "")
	streams := fake.LiveStreams()
	for _, tc := range []struct {
		set     int32
		want    int
		wantErr error
	}{{2, 2, nil}, {5, 5, nil}, {0, 0, ErrUnavailable}} {
		fake.SetDevices(tc.set)
		n, err := Devices(cfg)
		if n != tc.want || !errors.Is(err, tc.wantErr) {
			t.Errorf("Devices with %d devices = %d, %v; want %d, %v", tc.set, n, err, tc.want, tc.wantErr)
		}
	}
	cfg.NCCLLibrary = "/nonexistent/libnccl.so.2"
	if _, err := Devices(cfg); !errors.Is(err, ErrUnavailable) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Devices without NCCL = %q, want one line wrapping ErrUnavailable", err)
	}
	if got := fake.LiveStreams(); got != streams || len(fake.Records("ncclCommInitRankConfig", "cudaStreamCreateWithFlags")) != 0 {
		t.Errorf("Devices created a communicator or a stream")
	}
}
