package engine

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// simulate runs a Cadence over steps of a model run: a plain step takes t
// seconds; a checkpoint adds snap to its own step and spread to each of
// the next two (its write and copy running beside them).
func simulate(c *Cadence, steps int, t, snap, spread float64) (checkpoints []int, overhead float64) {
	var extra [3]float64 // what the last checkpoints add to the next steps
	total, plain := 0.0, 0.0
	for n := 1; n <= steps; n++ {
		s := t + extra[0]
		extra = [3]float64{extra[1], extra[2], 0}
		due := c.Due(n)
		if due {
			s += snap
			extra[0] += spread
			extra[1] += spread
			checkpoints = append(checkpoints, n)
		}
		c.Observe(n, s, due)
		total += s
		plain += t
	}
	return checkpoints, total/plain - 1
}

func TestCadence(t *testing.T) {
	tests := []struct {
		name              string
		t, snap, spread   float64
		budget            float64
		cost              float64 // what a checkpoint adds in all
		wantOverheadBelow float64
	}{
		// 10 + 2*10 = 30 ms on a 100 ms step: 30% at every step, every 6
		// or 7 steps for 5%.
		{"a 30% checkpoint at 5%", 0.1, 0.01, 0.01, 0.05, 0.03, 0.055},
		// Free checkpoints: every step.
		{"free", 0.1, 0, 0, 0.05, 0, 0.001},
		// 3 ms of 100: within 5% at every step.
		{"cheap", 0.1, 0.003, 0, 0.05, 0.003, 0.05},
		// 54% (the held checkpoints' figure on this machine).
		{"54% at 5%", 0.1, 0.014, 0.02, 0.05, 0.054, 0.055},
		// A checkpoint costs more than 100 steps at 5%: Max (the probe's
		// one checkpoint at step 6 and a hundred steps' worth every 100).
		{"past Max", 0.01, 1, 0, 0.05, 1, 1.1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCadence(tc.budget)
			cks, over := simulate(c, 600, tc.t, tc.snap, tc.spread)
			// The interval is within the budget, and spends at least half
			// of it unless it is 1 or Max (the hysteresis band).
			k := c.Interval()
			share := tc.cost / (float64(k) * tc.t)
			if k != c.Max && (share > tc.budget*1.001 || k > 1 && share < tc.budget/2) {
				t.Errorf("interval %d: a checkpoint takes %.1f%% of the time, want %.1f%% to %.1f%% (%s)", k, 100*share, 50*tc.budget, 100*tc.budget, c)
			}
			if over > tc.wantOverheadBelow {
				t.Errorf("overhead %.2f%%, want below %.2f%% (%s)", 100*over, 100*tc.wantOverheadBelow, c)
			}
			// The probe: no checkpoint in steps 1-5, then one at step 6.
			if len(cks) == 0 || cks[0] != 6 {
				t.Fatalf("checkpoints %v, want the first at step 6", cks[:min(len(cks), 8)])
			}
			// Settled: the last checkpoints are the interval apart.
			for i := len(cks) - 3; i < len(cks) && i > 0 && k < c.Max; i++ {
				if cks[i]-cks[i-1] != k {
					t.Errorf("checkpoints at %d and %d, want %d apart", cks[i-1], cks[i], k)
				}
			}
			if !strings.Contains(c.String(), "a loss redoes at most") {
				t.Errorf("String() = %q", c)
			}
			t.Logf("%s; overhead %.2f%%", c, 100*over)
		})
	}
}

// TestCadenceFollowsChange: the step time changes (a slower phase of
// training): the interval follows, within a few windows.
func TestCadenceFollowsChange(t *testing.T) {
	c := NewCadence(0.05)
	simulate(c, 200, 0.1, 0.01, 0.01) // 30 ms a checkpoint on 100 ms: 6 (7 is within the budget too)
	if k := c.Interval(); k != 6 && k != 7 {
		t.Fatalf("interval %d, want 6 or 7", k)
	}
	// Steps four times longer, the same checkpoint: 30 of 400 ms, 2 apart.
	for n := 201; n <= 400; n++ {
		s := 0.4
		due := c.Due(n)
		if due {
			s += 0.03
		}
		c.Observe(n, s, due)
	}
	if c.Interval() != 2 {
		t.Errorf("interval %d after the steps grew fourfold, want 2 (%s)", c.Interval(), c)
	}
}

// TestCadenceSteadyUnderNoise: step times jitter by up to 30% around 100
// ms, a checkpoint costs 30 ms: the interval settles (it changes at most
// at most 3 times in steps 301-1,000, not at every window) and the
// overhead stays near the budget.
func TestCadenceSteadyUnderNoise(t *testing.T) {
	c := NewCadence(0.05)
	rng := rand.New(rand.NewPCG(1, 2))
	changes, was := 0, 0 // after the first 300 steps
	total, plain := 0.0, 0.0
	for n := 1; n <= 1000; n++ {
		base := 0.1 * (0.85 + 0.3*rng.Float64())
		s := base
		due := c.Due(n)
		if due {
			s += 0.03
		}
		c.Observe(n, s, due)
		total, plain = total+s, plain+base
		if k := c.Interval(); k != was {
			if n > 300 {
				changes++
			}
			was = k
		}
	}
	if changes > 3 {
		t.Errorf("the interval changed %d times in steps 301-1,000 (%s)", changes, c)
	}
	if over := total/plain - 1; over > 0.065 {
		t.Errorf("overhead %.2f%% (%s)", 100*over, c)
	}
	t.Logf("%d changes; %s", changes, c)
}

// TestTrainCheckpointOverhead: Train with CheckpointOverhead checkpoints
// no step of the probe's first five, then step 6, and its losses are the
// run's without checkpoints; a Config asking for both an interval and an
// overhead, or an overhead of 100%, is refused.
func TestTrainCheckpointOverhead(t *testing.T) {
	job := tinyJob(LossMSE)
	job.Steps = 12
	plain := DefaultConfig(job)
	plain.TP, plain.PP, plain.DP = 2, 1, 2
	want, err := RunInProc(t.Context(), plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := *plain
	c.CheckpointDir, c.CheckpointOverhead = t.TempDir(), 0.05
	var mu sync.Mutex
	done := map[int]bool{}
	c.Checkpointed = func(n int) { mu.Lock(); done[n] = true; mu.Unlock() }
	got, err := RunInProc(t.Context(), &c, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want.Losses {
		if got.Losses[i] != want.Losses[i] {
			t.Errorf("step %d: loss %v with checkpoints, %v without", i+1, got.Losses[i], want.Losses[i])
		}
	}
	for n := 1; n <= 6; n++ {
		if done[n] != (n == 6) {
			t.Errorf("step %d checkpointed: %v, want only step 6 of 1-6 (%v)", n, done[n], done)
		}
	}
	if !done[12] {
		t.Errorf("the last step was not checkpointed: %v", done)
	}
	for _, bad := range []struct {
		every    int
		overhead float64
	}{{2, 0.05}, {0, 1}, {0, -0.1}} {
		c := *plain
		c.CheckpointDir, c.CheckpointEvery, c.CheckpointOverhead = t.TempDir(), bad.every, bad.overhead
		if err := c.Validate(); err == nil {
			t.Errorf("every %d, overhead %g: accepted", bad.every, bad.overhead)
		}
	}
}
