package nccl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gpucoord/gpucoord/collectives"
)

// EnvGPUTest opts in to the tests and benchmarks that need real NCCL and at
// least one GPU. docs/NCCL.md says what they check and how to run them.
const envGPUTest = "GPUCOORD_NCCL_GPU"

// realGroup builds one communicator per visible GPU (at most 8) over the real
// libraries named by DefaultConfig, in this process, one goroutine per rank.
func realGroup(t testing.TB) []*Communicator {
	t.Helper()
	if os.Getenv(envGPUTest) == "" {
		t.Skipf("set %s=1 on a machine with NCCL and a GPU", envGPUTest)
	}
	base := DefaultConfig()
	lib, err := loadLibrary(base.NCCLLibrary, base.CUDARTLibraries)
	if err != nil {
		t.Fatalf("%s is set but: %v", envGPUTest, err)
	}
	var n int32
	if r := call(lib.cudaGetDeviceCount, uintptr(unsafe.Pointer(&n))); r != cudaSuccess || n < 1 {
		t.Fatalf("cudaGetDeviceCount = %d devices, error %d", n, r)
	}
	world := min(int(n), 8)
	t.Logf("NCCL %s from %s, CUDA runtime %s, %d ranks", versionString(lib.version), lib.ncclPath, lib.cudartPath, world)
	store := collectives.NewMemStore()
	key := fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
	return newGroup(t, world, func(r int) *Config {
		cfg := DefaultConfig()
		cfg.Rank, cfg.Size, cfg.Device = r, world, r
		cfg.Store, cfg.Key = store, key
		cfg.Timeout = time.Minute
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
		return cfg
	})
}

// TestRealGPU runs every operation on the GPUs against the same naive
// references as the fake tests, then checks that a collective whose peers
// never come is aborted when its context ends.
func TestRealGPU(t *testing.T) {
	comms := realGroup(t)
	world := len(comms)
	for _, dt := range []collectives.DType{collectives.Float32, collectives.Float64, collectives.BFloat16} {
		for _, op := range []collectives.Op{collectives.Sum, collectives.Max, collectives.Min} {
			for _, n := range []int{1, 1001, 1 << 20} {
				in := make([][]float64, world)
				bufs := make([]collectives.Buffer, world)
				for r := range world {
					in[r] = make([]float64, n)
					for i := range n {
						in[r][i] = float64((i*7+r*13)%11 - 5)
					}
					bufs[r] = makeBuf(dt, in[r])
				}
				mustAll(t, "AllReduce", each(comms, func(r int, c *Communicator) error {
					return c.AllReduce(t.Context(), bufs[r], op)
				}))
				for i := range n {
					want := in[0][i]
					for r := 1; r < world; r++ {
						want = reduceRef(op, want, in[r][i])
					}
					for r := range world {
						if got := readBuf(bufs[r], i); got != want {
							t.Fatalf("AllReduce %v/%v n=%d rank %d [%d] = %v, want %v", dt, op, n, r, i, got, want)
						}
					}
				}
			}
		}
	}

	const n = 4099
	val := func(r, i int) float64 { return float64(r*1000 + i%1000) }
	recv := make([][]float64, world)
	mustAll(t, "ReduceScatter", each(comms, func(r int, c *Communicator) error {
		send := make([]float64, world*n)
		for i := range send {
			send[i] = val(r, i)
		}
		recv[r] = make([]float64, n)
		return c.ReduceScatter(t.Context(), collectives.Float64s(send), collectives.Float64s(recv[r]), collectives.Sum)
	}))
	for r := range world {
		for i := range n {
			want := 0.0
			for q := range world {
				want += val(q, r*n+i)
			}
			if recv[r][i] != want {
				t.Fatalf("ReduceScatter rank %d [%d] = %v, want %v", r, i, recv[r][i], want)
			}
		}
	}
	gathered := make([][]float32, world)
	mustAll(t, "AllGather", each(comms, func(r int, c *Communicator) error {
		send := make([]float32, n)
		for i := range send {
			send[i] = float32(val(r, i))
		}
		gathered[r] = make([]float32, world*n)
		return c.AllGather(t.Context(), collectives.Float32s(send), collectives.Float32s(gathered[r]))
	}))
	for r := range world {
		for q := range world {
			for i := range n {
				if got, want := gathered[r][q*n+i], float32(val(q, i)); got != want {
					t.Fatalf("AllGather rank %d block %d [%d] = %v, want %v", r, q, i, got, want)
				}
			}
		}
	}
	root := world - 1
	bc := make([][]float64, world)
	mustAll(t, "Broadcast", each(comms, func(r int, c *Communicator) error {
		bc[r] = make([]float64, n)
		for i := range bc[r] {
			bc[r][i] = val(r, i)
		}
		return c.Broadcast(t.Context(), collectives.Float64s(bc[r]), root)
	}))
	for r := range world {
		for i := range n {
			if bc[r][i] != val(root, i) {
				t.Fatalf("Broadcast rank %d [%d] = %v, want %v", r, i, bc[r][i], val(root, i))
			}
		}
	}
	mustAll(t, "Barrier", each(comms, func(_ int, c *Communicator) error { return c.Barrier(t.Context()) }))

	if world > 1 {
		checkPipeline(t, comms, n, val)
		errs := each(comms, func(r int, c *Communicator) error {
			return c.AllReduce(t.Context(), collectives.Float32s(make([]float32, 8+r)), collectives.Sum)
		})
		for r, err := range errs {
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("mismatched AllReduce rank %d: %v, want ErrMismatch", r, err)
			}
		}

		// Only rank 0 enters: it must be aborted when its context ends.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		err := comms[0].AllReduce(ctx, collectives.Float32s(make([]float32, 1<<20)), collectives.Sum)
		if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("lonely AllReduce = %v, want ErrAborted and DeadlineExceeded", err)
		}
		for _, c := range comms[1:] {
			c.Abort()
		}
	}
}

// TestRealGPUDevice runs the device-memory collectives on the GPUs against
// the same references as the fake tests, and checks that the
// DeviceBuffers' memory is given back.
func TestRealGPUDevice(t *testing.T) {
	comms := realGroup(t)
	for _, n := range []int{1, 1001, 1 << 20} {
		checkDeviceCollectives(t, comms, n)
	}
}

// BenchmarkRealAllReduce reports bus bandwidth of a float32 sum all-reduce
// over every visible GPU (nccl-tests' busbw: algbw * 2(n-1)/n), on host
// buffers (staged through device scratch) and on DeviceBuffers.
func BenchmarkRealAllReduce(b *testing.B) {
	comms := realGroup(b)
	world := len(comms)
	for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("host/bytes=%d", size), func(b *testing.B) {
			bufs := make([][]float32, world)
			for r := range bufs {
				bufs[r] = make([]float32, size/4)
			}
			benchAllReduce(b, comms, size, func(r int, c *Communicator) error {
				return c.AllReduce(b.Context(), collectives.Float32s(bufs[r]), collectives.Sum)
			})
		})
		b.Run(fmt.Sprintf("device/bytes=%d", size), func(b *testing.B) {
			bufs := make([]*DeviceBuffer, world)
			for r, c := range comms {
				var err error
				if bufs[r], err = c.Alloc(b.Context(), collectives.Float32, size/4); err != nil {
					b.Fatal(err)
				}
				defer bufs[r].Free()
			}
			benchAllReduce(b, comms, size, func(r int, c *Communicator) error {
				return c.AllReduceDevice(b.Context(), bufs[r], collectives.Sum)
			})
		})
	}
}

// benchAllReduce times f on every rank at once and reports busbw.
func benchAllReduce(b *testing.B, comms []*Communicator, size int, f func(r int, c *Communicator) error) {
	world := len(comms)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		mustAll(b, "AllReduce", each(comms, f))
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	alg := float64(size) / sec / 1e9
	b.ReportMetric(alg*2*float64(world-1)/float64(world), "busbw_GB/s")
}

// BenchmarkFakeAllReduce measures this package's host-side cost per call
// (purego calls, staging copies, polling, shape check) on the CPU fake with
// one rank, where the "GPU" work is a memcpy: on host memory with the shape
// check of every call, once per shape (the default) and none, and on a
// DeviceBuffer.
func BenchmarkFakeAllReduce(b *testing.B) {
	if fakeDir == "" {
		b.Skipf("fake NCCL not built: %v", fakeErr)
	}
	for _, tc := range []struct {
		name  string
		tweak func(*Config)
	}{
		{"host/check=every", func(c *Config) { c.CheckEveryCall = true }},
		{"host/check=once", nil},
		{"host/check=off", func(c *Config) { c.CheckShapes = false }},
		{"device/check=once", nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			fake.Reset()
			c := group(b, 1, tc.tweak)[0]
			buf := collectives.Float32s(make([]float32, 256))
			call := func() error { return c.AllReduce(b.Context(), buf, collectives.Sum) }
			if strings.HasPrefix(tc.name, "device") {
				d, err := c.Alloc(b.Context(), collectives.Float32, 256)
				if err != nil {
					b.Fatal(err)
				}
				call = func() error { return c.AllReduceDevice(b.Context(), d, collectives.Sum) }
			}
			for b.Loop() {
				if err := call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
