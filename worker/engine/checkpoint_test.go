package engine

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
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

// TestPreemptionCheckpoints: a rank that reports itself preempted makes
// every rank checkpoint the step they all finished (no CheckpointEvery is
// set), and returns ErrPreempted; resuming from that step gives the
// uninterrupted run's losses bit for bit.
func TestPreemptionCheckpoints(t *testing.T) {
	job := tinyJob(LossMSE)
	job.Steps = 6
	base := DefaultConfig(job)
	base.TP, base.PP, base.DP, base.Zero = 1, 2, 2, 1
	want, err := RunInProc(t.Context(), base, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var asked atomic.Int64
	c := *base
	c.CheckpointDir = dir
	// Every rank asks once per step; the fifth question (step 2 at the
	// latest, as 4 ranks ask per step) and later say "preempted".
	c.Preempted = func() bool { return asked.Add(1) > 4 }
	if _, err := RunInProc(t.Context(), &c, nil); !errors.Is(err, ErrPreempted) {
		t.Fatalf("err = %v, want ErrPreempted", err)
	}
	step, err := sharding.LatestComplete(t.Context(), filepath.Join(dir, "tp0-of-1", "chunk0-of-2"))
	if err != nil || step < 1 || step > 2 {
		t.Fatalf("latest committed step %d (%v), want 1 or 2", step, err)
	}
	r := *base
	r.CheckpointDir, r.Resume = dir, int(step)
	got, err := RunInProc(t.Context(), &r, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range got.Losses {
		if w := want.Losses[int(step)+i]; l != w {
			t.Errorf("step %d after resuming from %d: loss %.9g, want %.9g", int(step)+i+1, step, l, w)
		}
	}
}

// TestCheckpointFenced: a generation replaced by a later one (whose rank 0
// raised the checkpoint directory's fence) cannot write a checkpoint:
// Train fails with sharding.ErrFenced before any shard or manifest of its
// lands, while the later generation checkpoints as usual.
func TestCheckpointFenced(t *testing.T) {
	job := tinyJob(LossMSE)
	job.Steps = 2
	dir := t.TempDir()
	newer := DefaultConfig(job)
	newer.TP, newer.PP, newer.DP = 1, 2, 2
	newer.CheckpointDir, newer.CheckpointEvery, newer.Generation = dir, 1, 3
	if _, err := RunInProc(t.Context(), newer, nil); err != nil {
		t.Fatalf("generation 3: %v", err)
	}
	root := filepath.Join(dir, "tp0-of-1", "chunk0-of-2")
	before, err := sharding.LatestComplete(t.Context(), root)
	if err != nil || before != 2 {
		t.Fatalf("generation 3 committed step %d (%v), want 2", before, err)
	}
	older := *newer
	older.Generation = 2
	older.Job.Steps = 4
	if _, err := RunInProc(t.Context(), &older, nil); !errors.Is(err, sharding.ErrFenced) {
		t.Fatalf("generation 2 after generation 3: %v, want ErrFenced", err)
	}
	for _, step := range []int64{3, 4} {
		if _, err := os.Stat(sharding.StepDir(root, step)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("generation 2 wrote step %d's directory (%v)", step, err)
		}
	}
}

// TestLocalCheckpointsWaitStored: with node-local checkpoints every step,
// each rank asks, at the end of step N and before reporting it, that the
// checkpoint of step N-1 be stored (WaitStored), and only after its
// background write said so (Checkpointed); resumed from a local step with
// the files every rank wrote, the run continues on the uninterrupted
// losses.
func TestLocalCheckpointsWaitStored(t *testing.T) {
	job := tinyJob(LossCrossEntropy)
	job.Steps = 5
	cfg := func() *Config {
		c := DefaultConfig(job)
		c.TP, c.PP, c.DP, c.Schedule = 2, 1, 2, schedule.OneFOneB
		return c
	}
	want, err := RunInProc(t.Context(), cfg(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := cfg()
	c.CheckpointDir, c.CheckpointEvery, c.LocalCheckpoints, c.Preempted = dir, 1, true, func() bool { return false }
	var mu sync.Mutex
	written := map[int]int{} // step -> ranks whose write finished
	var waits []int
	c.Checkpointed = func(steps int) {
		mu.Lock()
		written[steps]++
		mu.Unlock()
	}
	c.WaitStored = func(_ context.Context, steps int) error {
		mu.Lock()
		defer mu.Unlock()
		if written[steps] == 0 {
			t.Errorf("WaitStored(%d) before any write of it finished", steps)
		}
		waits = append(waits, steps)
		return nil
	}
	head := *job
	head.Steps = 3
	c.Job = &head
	res, err := RunInProc(t.Context(), c, func(s StepResult) error {
		mu.Lock()
		defer mu.Unlock()
		// Rank 0 reports step N after it waited for step N-1.
		if n := len(waits); s.Step > 1 && (n == 0 || waits[n-1] < s.Step-1) {
			t.Errorf("step %d reported before step %d was stored (waits %v)", s.Step, s.Step-1, waits)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// 4 ranks wait at the end of steps 2 and 3, for steps 1 and 2.
	if len(waits) != 8 {
		t.Errorf("%d waits (%v), want 8", len(waits), waits)
	}
	r := cfg()
	r.CheckpointDir, r.LocalCheckpoints, r.Resume = dir, true, 3
	tail, err := RunInProc(t.Context(), r, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := append(res.Losses, tail.Losses...)
	for i := range want.Losses {
		if i >= len(got) || got[i] != want.Losses[i] {
			t.Fatalf("losses %v, want %v", got, want.Losses)
		}
	}
}
