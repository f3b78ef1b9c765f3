package estimate

import (
	"testing"

	"github.com/gpucoord/gpucoord/topology"
)

// BenchmarkPlan32768 plans and evaluates gpt-1t on 32,768 H100s (4,096 DGX
// nodes), rank map and groups included, a layout that fits. Target: under
// 100 ms.
func BenchmarkPlan32768(b *testing.B) {
	cl, _ := topology.ClusterPreset("dgx-h100")
	cl.Nodes = 4096
	m, _ := topology.ModelPreset("gpt-1t")
	cfg := topology.DefaultConfig()
	cfg.TP, cfg.PP, cfg.Zero, cfg.GlobalBatch = 8, 32, 1, 8192
	cfg.Recompute, cfg.SequenceParallel = topology.RecomputeFull, true
	for b.Loop() {
		p, err := topology.New(cl, m, cfg)
		if err != nil {
			b.Fatal(err)
		}
		r, err := Evaluate(p)
		if err != nil || !r.Fits {
			b.Fatal(err, r.Reasons)
		}
		_ = p.RankMap()
		_ = p.Groups()
	}
}

// BenchmarkAuto4096 searches every layout of gpt-175b on 4,096 H100s.
// Target: under 1 s.
func BenchmarkAuto4096(b *testing.B) {
	cl, _ := topology.ClusterPreset("dgx-h100")
	cl.Nodes = 512
	m, _ := topology.ModelPreset("gpt-175b")
	for b.Loop() {
		res, err := Search(cl, m, topology.DefaultConfig(), topology.DefaultSearchSpace(), 5, nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Top) == 0 {
			b.Fatal("no plan fits")
		}
		b.ReportMetric(float64(res.Candidates), "candidates")
	}
}
