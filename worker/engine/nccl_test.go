package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/collectives/nccl/nccltest"
	"github.com/gpucoord/gpucoord/schedule"
)

// The engine's TP, PP and DP groups as NCCL communicators (nccl.NewWorld,
// what RunProcess does with Process.NCCL), on the fake NCCL with every rank
// a goroutine: the same losses and parameters as the in-memory run of the
// same layout, with every group's traffic going through NCCL calls.
func TestTrainOverNCCLGroups(t *testing.T) {
	f, err := nccltest.Build(t.TempDir())
	if errors.Is(err, nccltest.ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, zero := range []int{0, 3} {
		t.Run(fmt.Sprintf("zero%d", zero), func(t *testing.T) {
			f.Reset()
			f.CheckLeaks(t)
			job := tinyJob("")
			job.Steps = 5
			cfg, err := NewConfig(job, Shape{TP: 2, PP: 2, DP: 2, Zero: zero, Schedule: schedule.OneFOneB})
			if err != nil {
				t.Fatal(err)
			}
			want, err := RunInProc(t.Context(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := trainOverNCCL(t, f, cfg)
			compareRuns(t, got, want)
			inits := f.Records("ncclCommInitRankConfig")
			if len(inits) != 3*cfg.World() {
				t.Errorf("%d NCCL communicators, want %d (TP, PP and DP on each of %d ranks)", len(inits), 3*cfg.World(), cfg.World())
			}
			for _, fn := range []string{"ncclAllReduce", "ncclSend", "ncclRecv", "ncclBroadcast"} {
				if len(f.Records(fn)) == 0 {
					t.Errorf("no %s call: some group did not run over NCCL", fn)
				}
			}
			if zero == 3 && (len(f.Records("ncclReduceScatter")) == 0 || len(f.Records("ncclAllGather")) == 0) {
				t.Error("ZeRO-3 made no NCCL reduce-scatter or all-gather")
			}
		})
	}
}

// trainOverNCCL trains cfg with one goroutine per rank over an in-memory
// world whose groups are NCCL communicators on the fakes, and returns rank
// 0's losses and the assembled parameters.
func trainOverNCCL(t *testing.T, f *nccltest.Fake, cfg *Config) *Result {
	t.Helper()
	_, worlds, err := collectives.NewInmemWorld(cfg.World(), collectives.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	store := collectives.NewMemStore()
	res := &Result{Params: Params{}}
	var mu sync.Mutex
	errs := make([]error, cfg.World())
	var wg sync.WaitGroup
	for i, w := range worlds {
		wg.Go(func() {
			defer w.Close()
			nc := nccl.DefaultConfig()
			nc.NCCLLibrary, nc.CUDARTLibraries = f.NCCL, []string{f.CUDART}
			nc.Device, nc.Store, nc.Key = i%2, store, "test"
			nc.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
			r, err := Train(t.Context(), cfg, nccl.NewWorld(w, nc), func(s StepResult) error {
				if i == 0 {
					res.Losses = append(res.Losses, s.Loss)
				}
				return nil
			})
			if r != nil {
				defer r.Close()
			}
			if err == nil {
				var pieces []paramPiece
				if pieces, err = r.pieces(t.Context()); err == nil && r.coord.DP == 0 {
					mu.Lock()
					res.Params.assemble(pieces)
					mu.Unlock()
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return res
}
