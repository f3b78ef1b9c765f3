package engine

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"gpucoord/schedule"
)

// TestResumeAcrossDP checks the elastic contract of the engine's
// checkpoints for every ZeRO stage: a run that checkpoints after step 3
// and resumes at the same layout gives bit-for-bit the losses of an
// uninterrupted run; resumed at another DP degree (2 -> 1 and 1 -> 2, TP
// and PP unchanged) it gives the losses of a run that uses that degree from
// step 4, within float32 rounding (1e-5 relative), because the data of a
// step and Adam's step count depend only on the step.
func TestResumeAcrossDP(t *testing.T) {
	job := tinyJob(LossCrossEntropy)
	job.Steps = 6
	cfg := func(dp, zero int) *Config {
		c := DefaultConfig(job)
		c.TP, c.PP, c.DP, c.Zero, c.Schedule = 2, 2, dp, zero, schedule.OneFOneB
		return c
	}
	run := func(c *Config) []float64 {
		t.Helper()
		res, err := RunInProc(t.Context(), c, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Losses
	}
	for zero := range 4 {
		for _, dps := range [][2]int{{2, 2}, {2, 1}, {1, 2}} {
			from, to := dps[0], dps[1]
			dir := t.TempDir()
			first := cfg(from, zero)
			first.CheckpointDir, first.CheckpointEvery = dir, 3
			j3 := *job
			j3.Steps = 3
			first.Job = &j3
			head := run(first)
			if _, err := os.Stat(filepath.Join(dir, "tp0-of-2", "chunk1-of-2", "step-3", "manifest.json")); err != nil {
				t.Fatalf("zero %d: no committed manifest: %v", zero, err)
			}
			second := cfg(to, zero)
			second.CheckpointDir, second.Resume = dir, 3
			tail := run(second)
			if len(head) != 3 || len(tail) != 3 {
				t.Fatalf("zero %d dp %d->%d: %d + %d steps, want 3 + 3", zero, from, to, len(head), len(tail))
			}
			// The reference: dp `from` for steps 1-3, dp `to` for 4-6, in
			// one uninterrupted process each (the loss of a step does not
			// depend on the layout beyond float32 rounding).
			want := append(run(cfg(from, zero))[:3], run(cfg(to, zero))[3:]...)
			got := append(head, tail...)
			for i := range want {
				exact := from == to || i < 3
				diff := math.Abs(got[i] - want[i])
				if exact && diff != 0 || diff > 1e-5*math.Abs(want[i]) {
					t.Errorf("zero %d dp %d->%d step %d: loss %.9g, want %.9g (exact: %v)", zero, from, to, i+1, got[i], want[i], exact)
				}
			}
		}
	}
}
