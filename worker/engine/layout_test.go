package engine

import (
	"fmt"
	"math"
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
)

// layouts are the (tp, pp, dp) grids of the headline test.
var layouts = [][3]int{{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}}

// reference runs the single-process baseline: tp=pp=dp=1, GPipe, ZeRO 0.
func reference(t *testing.T, job *Job) *Result {
	t.Helper()
	cfg := DefaultConfig(job)
	cfg.Schedule = schedule.GPipe
	res, err := RunInProc(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// compareRuns checks per-step losses within 1e-5 relative and final
// parameters within 1e-4 (relative above magnitude 1, absolute below).
func compareRuns(t *testing.T, got, want *Result) {
	t.Helper()
	if len(got.Losses) != len(want.Losses) {
		t.Fatalf("%d losses, want %d", len(got.Losses), len(want.Losses))
	}
	for s := range want.Losses {
		if d := math.Abs(got.Losses[s]-want.Losses[s]) / math.Abs(want.Losses[s]); !(d <= 1e-5) {
			t.Errorf("step %d: loss %.9g, single process %.9g (relative %.2g)", s+1, got.Losses[s], want.Losses[s], d)
		}
	}
	if d, where := got.Params.MaxRelDiff(want.Params, 1); !(d <= 1e-4) {
		t.Errorf("final parameters differ by %.3g in %s", d, where)
	}
}

// layoutConfigs returns every (layout, schedule, ZeRO stage) of the
// headline matrix. Interleaved needs at least 2 stages (the planner's rule),
// so it runs with pp > 1 only, with 2 chunks per rank.
func layoutConfigs(job *Job) []*Config {
	var out []*Config
	for _, l := range layouts {
		for _, kind := range schedule.Kinds() {
			if kind == schedule.Interleaved && l[1] == 1 {
				continue
			}
			for zero := range 4 {
				cfg := DefaultConfig(job)
				cfg.TP, cfg.PP, cfg.DP, cfg.Schedule, cfg.Zero = l[0], l[1], l[2], kind, zero
				if kind == schedule.Interleaved {
					cfg.Virtual = 2
				}
				out = append(out, cfg)
			}
		}
	}
	return out
}

func cfgName(c *Config) string {
	return fmt.Sprintf("tp%d-pp%d-dp%d-%s-v%d-zero%d", c.TP, c.PP, c.DP, c.Schedule, c.Virtual, c.Zero)
}

// TestLayoutsMatchSingleProcess is the headline test, in process: every
// layout, schedule and ZeRO stage trains 20 steps with the same per-step loss
// and final parameters as the single-process run.
func TestLayoutsMatchSingleProcess(t *testing.T) {
	for _, loss := range []string{LossCrossEntropy, LossMSE} {
		job := tinyJob(loss)
		want := reference(t, job)
		if len(want.Losses) != 20 || !(want.Losses[19] < want.Losses[0]) {
			t.Fatalf("%s reference does not train: %v", loss, want.Losses)
		}
		for _, cfg := range layoutConfigs(job) {
			t.Run(loss+"/"+cfgName(cfg), func(t *testing.T) {
				got, err := RunInProc(t.Context(), cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				compareRuns(t, got, want)
			})
		}
	}
}
