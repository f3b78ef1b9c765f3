package engine

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
)

// BenchmarkStep profiles one warm step of examples/jobs/mlp-bench.yaml in
// process for 1, 2 and 4 ranks and reports throughput and where the time
// goes, averaged over ranks: compute (passes and Adam, less TP
// collectives), comm (TP and DP collectives and pipeline sends) and wait
// (blocked in pipeline receives, the bubble, plus anything unaccounted).
// It also reports the measured pipeline bubble against the simulator's.
func BenchmarkStep(b *testing.B) {
	job, err := LoadJob("../../examples/jobs/mlp-bench.yaml", nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range []struct {
		tp, pp, dp int
		kind       schedule.Kind
		v          int
	}{
		{1, 1, 1, schedule.OneFOneB, 1},
		{2, 1, 1, schedule.OneFOneB, 1}, {1, 2, 1, schedule.OneFOneB, 1}, {1, 1, 2, schedule.OneFOneB, 1},
		{1, 2, 1, schedule.GPipe, 1}, {1, 2, 1, schedule.ZBH1, 1}, {1, 2, 1, schedule.Interleaved, 2},
		{1, 4, 1, schedule.OneFOneB, 1}, {2, 2, 1, schedule.OneFOneB, 1}, {1, 2, 2, schedule.OneFOneB, 1}, {2, 1, 2, schedule.OneFOneB, 1},
	} {
		cfg := DefaultConfig(job)
		cfg.TP, cfg.PP, cfg.DP, cfg.Schedule, cfg.Virtual = l.tp, l.pp, l.dp, l.kind, l.v
		b.Run(fmt.Sprintf("ranks%d/%s", cfg.World(), cfgName(cfg)), func(b *testing.B) {
			var p *Profile
			for b.Loop() {
				if p, err = ProfileInProc(b.Context(), cfg, 2); err != nil {
					b.Fatal(err)
				}
			}
			st := p.Stats
			wall := float64(st.Wall)
			b.ReportMetric(float64(job.Batch.Global)/st.Wall.Seconds(), "samples/s")
			b.ReportMetric(100*float64(st.Compute)/wall, "compute%")
			b.ReportMetric(100*float64(st.TP+st.DP+st.Send)/wall, "comm%")
			b.ReportMetric(100*float64(st.Wall-st.Compute-st.TP-st.DP-st.Send)/wall, "wait%")
			if cfg.PP > 1 {
				b.ReportMetric(p.MeasuredBubble, "bubble")
				b.ReportMetric(p.SimulatedBubble, "sim-bubble")
			}
		})
	}
}

// BenchmarkLocalCheckpoint is a node-local checkpoint of one rank holding
// all of examples/jobs/mlp-bench.yaml (12.7 MB of parameters and Adam
// moments) under /dev/shm where there is one, as an agent keeps them:
// copy, what the rank spends before it trains on (StageLocal: the state
// written straight into the step's files); place, what its background
// goroutine does while it trains (fsync, rename).
func BenchmarkLocalCheckpoint(b *testing.B) {
	job, err := LoadJob("../../examples/jobs/mlp-bench.yaml", nil)
	if err != nil {
		b.Fatal(err)
	}
	r, err := NewRank(DefaultConfig(job), topology.Coord{}, Groups{})
	if err != nil {
		b.Fatal(err)
	}
	root, err := os.MkdirTemp("/dev/shm", "engine-bench-")
	if err != nil {
		root = b.TempDir()
	} else {
		b.Cleanup(func() { os.RemoveAll(root) })
	}
	var copyTime, placeTime time.Duration
	var bytes int64
	step := 0
	for b.Loop() {
		step++
		start := time.Now()
		c, err := r.StageLocal(b.Context(), root, step)
		if err != nil {
			b.Fatal(err)
		}
		copyTime += time.Since(start)
		start = time.Now()
		if err := c.Place(); err != nil {
			b.Fatal(err)
		}
		placeTime += time.Since(start)
		if step == 1 {
			bytes = dirSize(b, LocalDir(root, 1))
		}
		if step > 2 {
			os.RemoveAll(LocalDir(root, step-2))
		}
	}
	b.SetBytes(bytes)
	b.ReportMetric(float64(copyTime.Microseconds())/1e3/float64(b.N), "copy-ms/op")
	b.ReportMetric(float64(placeTime.Microseconds())/1e3/float64(b.N), "place-ms/op")
}

// dirSize is the size of the files under dir.
func dirSize(b *testing.B, dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
