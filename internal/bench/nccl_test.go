package bench

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/collectives/nccl/nccltest"
)

// fakeNCCL points nccl.DefaultConfig, and so Run, at the fake libraries of
// nccltest (the nccl package's own hook: the library environment
// variables), with devices GPUs, and fails the test on a leaked device
// allocation or stream.
func fakeNCCL(t *testing.T, devices int32) *nccltest.Fake {
	t.Helper()
	f, err := nccltest.Build(t.TempDir())
	if errors.Is(err, nccltest.ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(nccl.EnvNCCLLibrary, f.NCCL)
	t.Setenv(nccl.EnvCUDARTLibrary, f.CUDART)
	f.Reset()
	f.SetDevices(devices)
	f.CheckLeaks(t)
	return f
}

// The nccl backend on the fakes, ranks in process: every operation runs on
// device memory through its NCCL call on every timed iteration, the payload
// crosses between host and device only to set up and check the data (one
// copy each way per rank and size, however many calls were timed), every
// result is checked, and algbw and busbw follow nccl-tests.
func TestRunNCCLOnFakes(t *testing.T) {
	f := fakeNCCL(t, 4)
	const np, warmup, iters, batch = 3, 1, 3, 2
	for _, tc := range []struct {
		op, fn    string
		count     int // elements of the buffer at 64 KiB
		callCount int // the count argument of the NCCL call
		bus       float64
	}{
		{"allreduce", "ncclAllReduce", 16384, 16384, 4.0 / 3},
		{"reducescatter", "ncclReduceScatter", 16383, 5461, 2.0 / 3},
		{"allgather", "ncclAllGather", 16383, 5461, 2.0 / 3},
		{"broadcast", "ncclBroadcast", 16384, 16384, 1},
	} {
		t.Run(tc.op, func(t *testing.T) {
			f.Reset()
			f.SetDevices(4)
			cfg := DefaultConfig()
			cfg.Op, cfg.NP, cfg.Backend, cfg.InProc = tc.op, np, "nccl", true
			cfg.Sizes, cfg.Warmup, cfg.Iters, cfg.Batch = []int{64 << 10}, warmup, iters, batch
			var got []Result
			if err := Run(t.Context(), cfg, func(r Result) error { got = append(got, r); return nil }); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("%d results, want 1", len(got))
			}
			r := got[0]
			if !r.Correct || r.Backend != "nccl" || r.N != np || r.Count != tc.count || r.Bytes != 4*tc.count || r.Host == "" {
				t.Errorf("result %+v", r)
			}
			if alg := float64(r.Bytes) / r.Seconds / 1e9; math.Abs(r.AlgBW-alg) > 1e-9*alg || math.Abs(r.BusBW-alg*tc.bus) > 1e-9*alg {
				t.Errorf("algbw %v busbw %v, want %v and %v", r.AlgBW, r.BusBW, alg, alg*tc.bus)
			}

			calls := 0
			for _, rec := range f.Records(tc.fn) {
				if rec.DType == 7 && rec.Count == int64(tc.callCount) {
					calls++
				}
			}
			if want := np * (1 + warmup + 3 + iters*batch); calls != want {
				t.Errorf("%d %s calls of %d float32, want %d (check, warm-up, probe and samples on %d ranks)",
					calls, tc.fn, tc.callCount, want, np)
			}
			copies := map[int64]int{}
			for _, rec := range f.Records("cudaMemcpyAsync") {
				if rec.Bytes == int64(4*tc.count) {
					copies[rec.Kind]++
				}
			}
			if copies[1] != np || copies[2] != np {
				t.Errorf("%d host-to-device and %d device-to-host copies of the buffer, want %d each (set up and check only)",
					copies[1], copies[2], np)
			}
			// Device memory of the buffer's size: the buffers themselves,
			// no staging scratch (the host-side reductions of the probe and
			// the samples stage through 4 KiB).
			big := 0
			for _, rec := range f.Records("cudaMalloc") {
				if rec.Bytes >= int64(4*tc.count) {
					big++
				}
			}
			if big != np {
				t.Errorf("%d device allocations of at least the buffer's %d bytes, want %d (one buffer per rank)", big, 4*tc.count, np)
			}
		})
	}
}

func TestRunNCCLRefusals(t *testing.T) {
	f := fakeNCCL(t, 2)
	cfg := DefaultConfig()
	cfg.NP, cfg.Backend, cfg.InProc, cfg.Sizes = 3, "nccl", true, []int{4096}
	emit := func(Result) error { t.Error("a result was emitted"); return nil }
	err := Run(t.Context(), cfg, emit)
	if err == nil || !strings.Contains(err.Error(), "3 ranks in one process need as many GPUs, and 2 are visible") {
		t.Errorf("3 ranks in process on 2 GPUs: %v", err)
	}
	if n := len(f.Records("ncclGetUniqueId", "ncclCommInitRankConfig")); n != 0 {
		t.Errorf("%d NCCL calls before refusing", n)
	}

	f.SetDevices(0)
	for _, inproc := range []bool{true, false} {
		cfg.InProc, cfg.NP, cfg.WorkerCommand = inproc, 2, []string{"/nonexistent/never-started"}
		if err := Run(t.Context(), cfg, emit); !errors.Is(err, nccl.ErrUnavailable) {
			t.Errorf("no GPU, inproc %v: %v, want ErrUnavailable", inproc, err)
		}
	}
}

func TestCheck(t *testing.T) {
	const n, r = 3, 1
	fill := func(m int, v float32) []float32 {
		s := make([]float32, m)
		for i := range s {
			s[i] = v
		}
		return s
	}
	gathered := append(append(fill(2, 1), fill(2, 2)...), fill(2, 3)...)
	for _, tc := range []struct {
		op         string
		buf, shard []float32
		want       bool
	}{
		{"allreduce", fill(6, 6), nil, true},
		{"allreduce", append(fill(5, 6), 5), nil, false},
		{"reducescatter", fill(6, 2), fill(2, 6), true},
		{"reducescatter", fill(6, 6), append(fill(1, 6), 0), false},
		{"allgather", gathered, fill(2, 2), true},
		{"allgather", append(fill(2, 1), fill(4, 3)...), fill(2, 2), false},
		{"broadcast", fill(6, 1), nil, true},
		{"broadcast", fill(6, 2), nil, false},
	} {
		if got := check(tc.op, n, r, tc.buf, tc.shard); got != tc.want {
			t.Errorf("check(%s, %v, %v) = %v, want %v", tc.op, tc.buf, tc.shard, got, tc.want)
		}
	}
}
