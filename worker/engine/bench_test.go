package engine

import (
	"fmt"
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
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
