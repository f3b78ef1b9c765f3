package engine

import (
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/topology/estimate"
)

// stashFloats is the hand count of what one micro-batch leaves stashed in
// one chunk between its forward and its backward, per TP rank: each block
// keeps its input (b x W), pre-activation and activation (b x H/t each); the
// chunk with the head keeps the head input (b x W) and the logits gradient
// (b x O).
func stashFloats(m ModelSpec, b, blocks, tp int, head bool) int {
	n := blocks * b * (m.Width + 2*m.Hidden/tp)
	if head {
		n += b * (m.Width + m.Outputs)
	}
	return n
}

// TestMemoryAgainstPlanner compares each stage's measured peak with the
// planner's numbers: model states from topology/estimate.ModelStates (fp32
// Adam: 4+4+8 bytes per parameter, divided by ZeRO as the paper says) and
// activations as the hand count above times the schedule's peak in-flight
// micro-batches. Optimizer state must match up to ZeRO padding; activations
// must be at least the in-flight stash and at most four b x W buffers more
// (outputs waiting for their send, inputs and gradients received ahead of
// their pass). ZB-H1 also holds micro-batches between B and W, which the
// in-flight count leaves out, so its activations are only logged.
func TestMemoryAgainstPlanner(t *testing.T) {
	job := tinyJob(LossCrossEntropy)
	job.Model = ModelSpec{Width: 16, Hidden: 64, Blocks: 4, Outputs: 4, Activation: ActGeLU, Loss: LossCrossEntropy}
	job.Batch = BatchSpec{Global: 32, Micro: 4}
	for _, tc := range []struct {
		tp, pp, dp, zero int
		kind             schedule.Kind
	}{
		{1, 2, 1, 0, schedule.GPipe}, {1, 2, 1, 0, schedule.OneFOneB}, {2, 2, 2, 1, schedule.OneFOneB},
		{1, 4, 1, 0, schedule.OneFOneB}, {1, 2, 2, 2, schedule.ZBH1}, {2, 2, 2, 3, schedule.OneFOneB},
	} {
		cfg := DefaultConfig(job)
		cfg.TP, cfg.PP, cfg.DP, cfg.Zero, cfg.Schedule = tc.tp, tc.pp, tc.dp, tc.zero, tc.kind
		t.Run(cfgName(cfg), func(t *testing.T) {
			prof, err := ProfileInProc(t.Context(), cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			sched, _ := cfg.schedule()
			inflight := sched.PeakInFlight()
			for s, mem := range prof.Memory {
				w, g, o := estimate.ModelStates(float64(prof.Params[s]), tc.dp, sharding.Stage(tc.zero), topology.PrecisionFP32)
				b := job.Batch.Micro
				act := 4 * inflight[s] * stashFloats(job.Model, b, job.Model.Blocks/tc.pp, tc.tp, s == tc.pp-1)
				slack := int64(4 * 4 * b * job.Model.Width)
				t.Logf("stage %d: params %d/%.0f grads %d/%.0f optimizer %d/%.0f activations %d/%d (in-flight %d) total %d",
					s, mem.Peak[MemParams], w, mem.Peak[MemGrads], g, mem.Peak[MemOptimizer], o,
					mem.Peak[MemActivations], act, inflight[s], mem.PeakTotal)
				pad := float64(4 * 2 * 16) // Adam m and v of up to Align padding elements
				if d := float64(mem.Peak[MemOptimizer]) - o; d < 0 || d > pad {
					t.Errorf("stage %d: optimizer %d bytes, planner %.0f", s, mem.Peak[MemOptimizer], o)
				}
				if a := mem.Peak[MemActivations]; tc.kind != schedule.ZBH1 && (a < int64(act) || a > int64(act)+slack) {
					t.Errorf("stage %d: activations %d bytes, want %d (+ at most %d)", s, a, act, slack)
				}
			}
		})
	}
}
