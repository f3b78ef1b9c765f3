package collectivestest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
)

// NewWorld builds n connected world communicators with cfg. It registers
// their cleanup on t.
type NewWorld func(t *testing.T, n int, cfg *collectives.Config) []*collectives.Comm

// Config returns the suite's base configuration: a short timeout, small
// pieces so that pipelining is exercised at test sizes, logs to t.Output().
func Config(t *testing.T) *collectives.Config {
	cfg := collectives.DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg.Timeout = 10 * time.Second
	cfg.ChunkBytes = 256
	cfg.DirectBytes = 32
	cfg.SmallBytes = 96
	return cfg
}

// Each runs fn on every rank concurrently and returns the per-rank errors.
func Each(ctx context.Context, comms []*collectives.Comm, fn func(ctx context.Context, r int, c *collectives.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(ctx, r, c) })
	}
	wg.Wait()
	return errs
}

// MustEach is Each failing t on any error.
func MustEach(t testing.TB, comms []*collectives.Comm, fn func(ctx context.Context, r int, c *collectives.Comm) error) {
	t.Helper()
	for r, err := range Each(t.Context(), comms, fn) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// Run runs the whole suite against worlds made by nw.
func Run(t *testing.T, nw NewWorld) {
	t.Run("AllReduce", func(t *testing.T) { testAllReduce(t, nw) })
	t.Run("AllReduceBitIdentical", func(t *testing.T) { testBitIdentical(t, nw) })
	t.Run("ReduceScatter", func(t *testing.T) { testReduceScatter(t, nw) })
	t.Run("AllGather", func(t *testing.T) { testAllGather(t, nw) })
	t.Run("Broadcast", func(t *testing.T) { testBroadcast(t, nw) })
	t.Run("SendRecv", func(t *testing.T) { testSendRecv(t, nw) })
	t.Run("Barrier", func(t *testing.T) { testBarrier(t, nw) })
	t.Run("ConcurrentGroups", func(t *testing.T) { testGroups(t, nw) })
	t.Run("Mismatch", func(t *testing.T) { testMismatch(t, nw) })
	t.Run("SilentPeerTimesOut", func(t *testing.T) { testTimeout(t, nw) })
	t.Run("Cancel", func(t *testing.T) { testCancel(t, nw) })
}

// lengths are element counts: empty, below the world size, odd, not a
// multiple of the piece size, many pieces.
var lengths = []int{0, 1, 3, 7, 24, 101, 1000, 4099}

// ints returns deterministic small integers (exactly representable, so a
// sum in any order is exact) for rank r.
func ints(r, n, seed int) []float64 {
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(r)))
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(rng.IntN(17) - 8)
	}
	return v
}

// naive reduces the ranks' vectors one element at a time, rank order.
func naive(in [][]float64, op collectives.Op) []float64 {
	out := append([]float64(nil), in[0]...)
	for _, v := range in[1:] {
		for i := range out {
			switch op {
			case collectives.Sum:
				out[i] += v[i]
			case collectives.Max:
				out[i] = math.Max(out[i], v[i])
			case collectives.Min:
				out[i] = math.Min(out[i], v[i])
			}
		}
	}
	return out
}

// vec is one rank's data in one element type.
type vec struct {
	f32 []float32
	f64 []float64
	b16 []uint16
}

func makeVec(dt collectives.DType, v []float64) *vec {
	x := &vec{}
	switch dt {
	case collectives.Float32:
		x.f32 = make([]float32, len(v))
		for i, f := range v {
			x.f32[i] = float32(f)
		}
	case collectives.Float64:
		x.f64 = append([]float64{}, v...)
	case collectives.BFloat16:
		x.b16 = make([]uint16, len(v))
		for i, f := range v {
			x.b16[i] = collectives.F32ToBF16(float32(f))
		}
	}
	return x
}

func (x *vec) buf() collectives.Buffer {
	switch {
	case x.f32 != nil:
		return collectives.Float32s(x.f32)
	case x.f64 != nil:
		return collectives.Float64s(x.f64)
	}
	return collectives.BFloat16s(x.b16)
}

func (x *vec) at(i int) float64 {
	switch {
	case x.f32 != nil:
		return float64(x.f32[i])
	case x.f64 != nil:
		return x.f64[i]
	}
	return float64(collectives.BF16ToF32(x.b16[i]))
}

var dtypes = []collectives.DType{collectives.Float32, collectives.Float64, collectives.BFloat16}
var ops = []collectives.Op{collectives.Sum, collectives.Max, collectives.Min}

// algorithms force each all-reduce algorithm for every length the suite uses.
var algorithms = []struct {
	name          string
	direct, small int
}{{"ring", 0, 0}, {"doubling", 0, 1 << 20}, {"direct", 1 << 20, 0}, {"mixed", 64, 400}}

func testAllReduce(t *testing.T, nw NewWorld) {
	for n := 1; n <= 8; n++ {
		for _, alg := range algorithms {
			cfg := Config(t)
			cfg.DirectBytes, cfg.SmallBytes = alg.direct, alg.small
			t.Run(fmt.Sprintf("n=%d/%s", n, alg.name), func(t *testing.T) {
				comms := nw(t, n, cfg)
				for _, dt := range dtypes {
					for _, op := range ops {
						for _, l := range lengths {
							in := make([][]float64, n)
							vs := make([]*vec, n)
							for r := range n {
								in[r] = ints(r, l, l+int(op))
								vs[r] = makeVec(dt, in[r])
							}
							want := naive(in, op)
							MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
								return c.AllReduce(ctx, vs[r].buf(), op)
							})
							for r := range n {
								for i := range want {
									if got := vs[r].at(i); got != want[i] {
										t.Fatalf("%s %s len %d: rank %d element %d = %v, want %v", dt, op, l, r, i, got, want[i])
									}
								}
							}
						}
					}
				}
			})
		}
	}
}

// testBitIdentical uses random non-integers, where the order of a float sum
// matters: every rank must still get the same bits, and they must be close
// to the exact sum.
func testBitIdentical(t *testing.T, nw NewWorld) {
	for _, n := range []int{3, 5, 8} {
		for _, alg := range algorithms {
			cfg := Config(t)
			cfg.DirectBytes, cfg.SmallBytes = alg.direct, alg.small
			t.Run(fmt.Sprintf("n=%d/%s", n, alg.name), func(t *testing.T) {
				comms := nw(t, n, cfg)
				const l = 1001
				in := make([][]float32, n)
				for r := range n {
					rng := rand.New(rand.NewPCG(7, uint64(r)))
					in[r] = make([]float32, l)
					for i := range in[r] {
						in[r][i] = float32(rng.NormFloat64() * 1e3)
					}
				}
				exact := make([]float64, l)
				for r := range n {
					for i, v := range in[r] {
						exact[i] += float64(v)
					}
				}
				MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
					return c.AllReduce(ctx, collectives.Float32s(in[r]), collectives.Sum)
				})
				for r := 1; r < n; r++ {
					for i := range in[0] {
						if math.Float32bits(in[r][i]) != math.Float32bits(in[0][i]) {
							t.Fatalf("rank %d element %d = %x, rank 0 has %x", r, i, math.Float32bits(in[r][i]), math.Float32bits(in[0][i]))
						}
					}
				}
				for i, v := range in[0] {
					if d := math.Abs(float64(v) - exact[i]); d > 1e-5*float64(n)*1e3 {
						t.Fatalf("element %d = %v, exact %v", i, v, exact[i])
					}
				}
			})
		}
	}
}

func testReduceScatter(t *testing.T, nw NewWorld) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := nw(t, n, Config(t))
			for _, dt := range dtypes {
				for _, op := range ops {
					for _, m := range []int{0, 1, 5, 77, 301} {
						for _, inPlace := range []bool{false, true} {
							in := make([][]float64, n)
							sends, recvs := make([]*vec, n), make([]*vec, n)
							for r := range n {
								in[r] = ints(r, n*m, m*3+int(op))
								sends[r] = makeVec(dt, in[r])
								recvs[r] = makeVec(dt, make([]float64, m))
							}
							want := naive(in, op)
							MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
								recv := recvs[r].buf()
								if inPlace {
									recv = sends[r].buf().Slice(r*m, (r+1)*m)
								}
								return c.ReduceScatter(ctx, sends[r].buf(), recv, op)
							})
							for r := range n {
								for i := range m {
									got := recvs[r].at(i)
									if inPlace {
										got = sends[r].at(r*m + i)
									}
									if got != want[r*m+i] {
										t.Fatalf("%s %s m=%d inplace=%v: rank %d element %d = %v, want %v", dt, op, m, inPlace, r, i, got, want[r*m+i])
									}
								}
							}
						}
					}
				}
			}
		})
	}
}

func testAllGather(t *testing.T, nw NewWorld) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := nw(t, n, Config(t))
			for _, dt := range dtypes {
				for _, m := range []int{0, 1, 5, 77, 301} {
					for _, inPlace := range []bool{false, true} {
						in := make([][]float64, n)
						var want []float64
						sends, recvs := make([]*vec, n), make([]*vec, n)
						for r := range n {
							in[r] = ints(r, m, m)
							want = append(want, in[r]...)
							sends[r] = makeVec(dt, in[r])
							recvs[r] = makeVec(dt, make([]float64, n*m))
							if inPlace {
								recvs[r] = makeVec(dt, make([]float64, n*m))
								for i := range m {
									setAt(recvs[r], r*m+i, in[r][i])
								}
							}
						}
						MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
							send := sends[r].buf()
							if inPlace {
								send = recvs[r].buf().Slice(r*m, (r+1)*m)
							}
							return c.AllGather(ctx, send, recvs[r].buf())
						})
						for r := range n {
							for i := range want {
								if got := recvs[r].at(i); got != want[i] {
									t.Fatalf("%s m=%d inplace=%v: rank %d element %d = %v, want %v", dt, m, inPlace, r, i, got, want[i])
								}
							}
						}
					}
				}
			}
		})
	}
}

func setAt(x *vec, i int, f float64) {
	switch {
	case x.f32 != nil:
		x.f32[i] = float32(f)
	case x.f64 != nil:
		x.f64[i] = f
	default:
		x.b16[i] = collectives.F32ToBF16(float32(f))
	}
}

func testBroadcast(t *testing.T, nw NewWorld) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := nw(t, n, Config(t))
			for root := range n {
				for _, l := range lengths {
					bufs := make([][]float64, n)
					for r := range n {
						bufs[r] = ints(r, l, l)
					}
					want := append([]float64(nil), bufs[root]...)
					MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
						return c.Broadcast(ctx, collectives.Float64s(bufs[r]), root)
					})
					for r := range n {
						for i := range want {
							if bufs[r][i] != want[i] {
								t.Fatalf("root %d len %d: rank %d element %d = %v, want %v", root, l, r, i, bufs[r][i], want[i])
							}
						}
					}
				}
			}
		})
	}
}

// testSendRecv passes messages around a ring both ways (every rank sends
// before it receives, so sends must not wait for the receiver) and checks
// order and content.
func testSendRecv(t *testing.T, nw NewWorld) {
	for _, n := range []int{2, 3, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := nw(t, n, Config(t))
			MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
				right, left := (r+1)%n, (r+n-1)%n
				for k, l := range lengths {
					out := ints(r, l, k)
					if err := c.Send(ctx, collectives.Float64s(out), right); err != nil {
						return err
					}
					if err := c.Send(ctx, collectives.Float64s(out), left); err != nil {
						return err
					}
				}
				for k, l := range lengths {
					for _, from := range []int{left, right} {
						in := make([]float64, l)
						if err := c.Recv(ctx, collectives.Float64s(in), from); err != nil {
							return err
						}
						want := ints(from, l, k)
						for i := range want {
							if in[i] != want[i] {
								return fmt.Errorf("message %d from %d element %d = %v, want %v", k, from, i, in[i], want[i])
							}
						}
						if n == 2 {
							break // left == right: both messages come from the same peer, checked next
						}
					}
					if n == 2 {
						in := make([]float64, l)
						if err := c.Recv(ctx, collectives.Float64s(in), left); err != nil {
							return err
						}
					}
				}
				return nil
			})
		})
	}
}

// testBarrier checks that no rank leaves a barrier before the last enters.
// The last rank enters only once every other rank is blocked inside the
// barrier waiting for a frame (or has left it), and raises a flag just
// before it does; a rank that leaves with the flag down fails.
func testBarrier(t *testing.T, nw NewWorld) {
	for _, n := range []int{1, 2, 5, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := nw(t, n, Config(t))
			var lastIn atomic.Bool
			left := make([]atomic.Bool, n)
			MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
				if r == n-1 {
					for q := range n - 1 {
						err := waitUntil(ctx, fmt.Sprintf("rank %d blocked in the barrier", q), func() bool {
							return left[q].Load() || blocked(comms[q])
						})
						if err != nil {
							return err
						}
					}
					lastIn.Store(true)
				}
				err := c.Barrier(ctx)
				early := !lastIn.Load()
				left[r].Store(true)
				if err == nil && early {
					return fmt.Errorf("left the barrier before rank %d entered", n-1)
				}
				return err
			})
		})
	}
}

// blocked reports whether c's rank is blocked in a receive, waiting for a
// frame from some peer.
func blocked(c *collectives.Comm) bool {
	tr := c.Transport()
	mb := tr.Mailbox()
	for src := range tr.Size() {
		if src != tr.Rank() && mb.Waiting(src) {
			return true
		}
	}
	return false
}

// waitUntil polls cond every millisecond until it holds, and fails after
// 30 s or when ctx ends.
func waitUntil(ctx context.Context, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeoutCause(ctx, 30*time.Second, fmt.Errorf("no %s within 30s", what))
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// testGroups runs the TP and DP groups of a 2x4 grid concurrently, each
// from its own goroutine on every rank, many times: results must not mix.
func testGroups(t *testing.T, nw NewWorld) {
	const n, tp = 8, 2
	comms := nw(t, n, Config(t))
	tps, dps := make([]*collectives.Comm, n), make([]*collectives.Comm, n)
	MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		var err error
		tpRanks := []int{r / tp * tp, r/tp*tp + 1}
		var dpRanks []int
		for d := r % tp; d < n; d += tp {
			dpRanks = append(dpRanks, d)
		}
		if tps[r], err = c.Group(ctx, tpRanks); err != nil {
			return err
		}
		dps[r], err = c.Group(ctx, dpRanks)
		return err
	})
	t.Cleanup(func() {
		for r := range n {
			tps[r].Close()
			dps[r].Close()
		}
	})
	if _, err := comms[0].Group(t.Context(), []int{1, 2}); !errors.Is(err, collectives.ErrNotMember) {
		t.Fatalf("group without the caller: err = %v, want ErrNotMember", err)
	}
	MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		var wg sync.WaitGroup
		var tpErr, dpErr error
		wg.Go(func() {
			for it := range 30 {
				v := make([]float32, 333+it)
				for i := range v {
					v[i] = float32(r + 1)
				}
				if tpErr = tps[r].AllReduce(ctx, collectives.Float32s(v), collectives.Sum); tpErr != nil {
					return
				}
				g := r / tp * tp
				if want := float32(g + 1 + g + 2); v[len(v)-1] != want || v[0] != want {
					tpErr = fmt.Errorf("tp allreduce %d: got %v, want %v", it, v[0], want)
					return
				}
			}
		})
		wg.Go(func() {
			for it := range 30 {
				v := make([]float32, 4*(50+it))
				for i := range v {
					v[i] = float32(100 * (r + 1))
				}
				out := make([]float32, len(v)/4)
				if dpErr = dps[r].ReduceScatter(ctx, collectives.Float32s(v), collectives.Float32s(out), collectives.Sum); dpErr != nil {
					return
				}
				want := float32(0)
				for d := r % tp; d < n; d += tp {
					want += float32(100 * (d + 1))
				}
				if out[0] != want || out[len(out)-1] != want {
					dpErr = fmt.Errorf("dp reducescatter %d: got %v, want %v", it, out[0], want)
					return
				}
			}
		})
		wg.Wait()
		return errors.Join(tpErr, dpErr)
	})
}

// testMismatch gives one rank a longer buffer: every rank must fail, the
// ones that see the bad frames with ErrMismatch and the rest aborted, all
// well before the timeout.
func testMismatch(t *testing.T, nw NewWorld) {
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, r int, c *collectives.Comm) error
	}{
		{"allreduce-ring", func(ctx context.Context, r int, c *collectives.Comm) error {
			v := make([]float32, 1000+boolInt(r == 2))
			return c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum)
		}},
		{"allreduce-small", func(ctx context.Context, r int, c *collectives.Comm) error {
			v := make([]float32, 3+boolInt(r == 2))
			return c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum)
		}},
		{"op", func(ctx context.Context, r int, c *collectives.Comm) error {
			v := make([]float32, 40)
			if r == 2 {
				return c.Broadcast(ctx, collectives.Float32s(v), 0)
			}
			return c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum)
		}},
		{"sendrecv", func(ctx context.Context, r int, c *collectives.Comm) error {
			switch r {
			case 0:
				return c.Send(ctx, collectives.Float32s(make([]float32, 10)), 1)
			case 1:
				return c.Recv(ctx, collectives.Float32s(make([]float32, 11)), 0)
			}
			return c.Barrier(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config(t)
			comms := nw(t, 4, cfg)
			start := time.Now()
			errs := Each(t.Context(), comms, tc.op)
			if el := time.Since(start); el > cfg.Timeout/2 {
				t.Errorf("took %s; a mismatch must be reported without waiting for the %s timeout", el, cfg.Timeout)
			}
			mismatches := 0
			for r, err := range errs {
				if tc.name == "sendrecv" && r == 0 {
					continue // the sender's frames left; the receiver reports
				}
				if err == nil {
					t.Errorf("rank %d: no error", r)
					continue
				}
				if errors.Is(err, collectives.ErrMismatch) {
					mismatches++
				} else if !errors.Is(err, collectives.ErrAborted) {
					t.Errorf("rank %d: %v, want ErrMismatch or ErrAborted", r, err)
				}
				t.Logf("rank %d: %v", r, err)
			}
			if mismatches == 0 {
				t.Error("no rank reported ErrMismatch")
			}
			// The communicator is now broken.
			if err := comms[0].Barrier(t.Context()); !errors.Is(err, collectives.ErrBroken) && tc.name != "sendrecv" {
				t.Errorf("after a failure: %v, want ErrBroken", err)
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// testTimeout: only rank 0 calls the all-reduce; it must fail with
// ErrTimeout within about the timeout, naming the silent peer it waits on.
func testTimeout(t *testing.T, nw NewWorld) {
	cfg := Config(t)
	cfg.Timeout = 300 * time.Millisecond
	comms := nw(t, 3, cfg)
	start := time.Now()
	errs := Each(t.Context(), comms[:1], func(ctx context.Context, r int, c *collectives.Comm) error {
		return c.AllReduce(ctx, collectives.Float32s(make([]float32, 1000)), collectives.Sum)
	})
	el := time.Since(start)
	var pe *collectives.PeerError
	if !errors.As(errs[0], &pe) || !errors.Is(errs[0], collectives.ErrTimeout) {
		t.Fatalf("err = %v, want a *PeerError wrapping ErrTimeout", errs[0])
	}
	if pe.Peer != 2 { // the ring's first receive is from the left neighbour, rank 2
		t.Errorf("error names peer %d, want 2: %v", pe.Peer, pe)
	}
	if el < cfg.Timeout || el > cfg.Timeout+2*time.Second {
		t.Errorf("failed after %s, want about %s", el, cfg.Timeout)
	}
}

// testCancel: cancelling ctx ends a blocked operation promptly with the
// context's error. Only rank 0 calls the all-reduce, and ctx is cancelled
// once it is blocked waiting for rank 1.
func testCancel(t *testing.T, nw NewWorld) {
	comms := nw(t, 2, Config(t))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var returned atomic.Bool
	done := make(chan error, 1)
	go func() {
		err := comms[0].AllReduce(ctx, collectives.Float32s(make([]float32, 1000)), collectives.Sum)
		returned.Store(true)
		done <- err
	}()
	err := waitUntil(t.Context(), "all-reduce blocked on rank 1", func() bool { return returned.Load() || blocked(comms[0]) })
	if err != nil {
		t.Fatal(err)
	}
	if returned.Load() {
		t.Fatalf("the all-reduce returned before it blocked: %v", <-done)
	}
	start := time.Now()
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("cancel took %s", el)
	}
}

// AllocsPerOp returns the average number of heap allocations, across all
// ranks together, of one op on every rank, after a warm-up that lets scratch
// and pools grow. Like testing.AllocsPerRun it rounds down, so a few one-off
// allocations of the runtime (sudog caches refilled after a GC) amortize. Rank 0 runs under testing.AllocsPerRun; the others run the
// same number of ops in their own goroutines.
func AllocsPerOp(t testing.TB, comms []*collectives.Comm, runs int, op func(ctx context.Context, r int, c *collectives.Comm) error) float64 {
	t.Helper()
	ctx := context.Background() // t.Context() may allocate on first use
	for range 10 {
		for r, err := range Each(ctx, comms, op) {
			if err != nil {
				t.Fatalf("warm-up rank %d: %v", r, err)
			}
		}
	}
	errs := make(chan error, len(comms))
	for r := 1; r < len(comms); r++ {
		go func() {
			var err error
			for range runs + 1 { // AllocsPerRun runs once more to warm up
				if err = op(ctx, r, comms[r]); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	var err0 error
	avg := testing.AllocsPerRun(runs, func() {
		if err := op(ctx, 0, comms[0]); err != nil && err0 == nil {
			err0 = err
		}
	})
	for r := 1; r < len(comms); r++ {
		if err := <-errs; err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if err0 != nil {
		t.Fatalf("rank 0: %v", err0)
	}
	return avg
}

// AllocCases are the operations whose steady state must not allocate.
func AllocCases(n int) []struct {
	Name string
	Op   func(ctx context.Context, r int, c *collectives.Comm) error
} {
	big := make([][]float32, n)
	small := make([][]float32, n)
	shard := make([][]float32, n)
	p2p := make([][]float32, n)
	for r := range n {
		big[r] = make([]float32, 16<<10)
		small[r] = make([]float32, 16)
		shard[r] = make([]float32, len(big[r])/n)
		p2p[r] = make([]float32, 5000)
	}
	return []struct {
		Name string
		Op   func(ctx context.Context, r int, c *collectives.Comm) error
	}{
		{"allreduce-ring", func(ctx context.Context, r int, c *collectives.Comm) error {
			return c.AllReduce(ctx, collectives.Float32s(big[r]), collectives.Sum)
		}},
		{"allreduce-small", func(ctx context.Context, r int, c *collectives.Comm) error {
			return c.AllReduce(ctx, collectives.Float32s(small[r]), collectives.Max)
		}},
		{"reducescatter", func(ctx context.Context, r int, c *collectives.Comm) error {
			return c.ReduceScatter(ctx, collectives.Float32s(big[r]), collectives.Float32s(shard[r]), collectives.Sum)
		}},
		{"allgather", func(ctx context.Context, r int, c *collectives.Comm) error {
			return c.AllGather(ctx, collectives.Float32s(shard[r]), collectives.Float32s(big[r]))
		}},
		// Broadcast and Send are eager (the root or sender does not wait for
		// the receivers), so a loop of them alone lets the sender run ahead
		// without bound; the steady state of real use pairs them.
		{"broadcast", func(ctx context.Context, r int, c *collectives.Comm) error {
			if err := c.Broadcast(ctx, collectives.Float32s(big[r]), 1); err != nil {
				return err
			}
			return c.Barrier(ctx)
		}},
		{"barrier", func(ctx context.Context, r int, c *collectives.Comm) error { return c.Barrier(ctx) }},
		{"sendrecv", func(ctx context.Context, r int, c *collectives.Comm) error {
			b := collectives.Float32s(p2p[r])
			if r%2 == 0 {
				if err := c.Send(ctx, b, r+1); err != nil {
					return err
				}
				return c.Recv(ctx, b, r+1)
			}
			if err := c.Recv(ctx, b, r-1); err != nil {
				return err
			}
			return c.Send(ctx, b, r-1)
		}},
	}
}

// TestZeroAllocs checks every case of AllocCases on a world of 4.
func TestZeroAllocs(t *testing.T, nw NewWorld) {
	cfg := collectives.DefaultConfig()
	cfg.ChunkBytes = 4 << 10 // several pieces per block
	comms := nw(t, 4, cfg)
	for _, tc := range AllocCases(4) {
		if got := AllocsPerOp(t, comms, 200, tc.Op); got != 0 {
			t.Errorf("%s: %v allocations per op, want 0", tc.Name, got)
		}
	}
}
