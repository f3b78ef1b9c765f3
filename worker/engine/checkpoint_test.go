package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
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

// layout is a test's parallel layout; virtual above 1 runs the
// interleaved schedule.
type layout struct {
	tp, pp, dp, virtual, zero int
}

func (l layout) config(job *Job) *Config {
	c := DefaultConfig(job)
	c.TP, c.PP, c.DP, c.Zero = l.tp, l.pp, l.dp, l.zero
	if l.virtual > 1 {
		c.Virtual, c.Schedule = l.virtual, schedule.Interleaved
	}
	return c
}

// TestResumeAcrossLayouts checks that a checkpoint restores under any
// layout of the model: 3 steps at layout `from` checkpointed after step 3,
// then 3 more resumed at layout `to`, give the losses of `from`'s
// uninterrupted run for steps 1-3 bit for bit and those of `to`'s for
// steps 4-6 within float32 rounding (1e-5 relative): resharding the
// parameters and Adam's moments across TP ranks and chunks is exact. With
// local checkpoints every rank of `to` seals the gathered files of
// `from`'s layout at once (RestoreLocal) before reading them. tinyJob has
// 4 blocks (so PP*Virtual up to 4) and hidden 8.
func TestResumeAcrossLayouts(t *testing.T) {
	job := tinyJob(LossCrossEntropy)
	job.Steps = 6
	tests := []struct {
		name     string
		from, to layout
		local    bool
	}{
		{name: "tp2 pp2 dp2 -> tp1 pp2 dp1, zero 1", from: layout{2, 2, 2, 1, 1}, to: layout{1, 2, 1, 1, 1}},
		{name: "tp2 pp2 dp2 zero 2 -> tp2 pp1 dp1 zero 0", from: layout{2, 2, 2, 1, 2}, to: layout{2, 1, 1, 1, 0}},
		{name: "tp1 pp1 dp1 -> tp2 pp2 dp2 zero 3", from: layout{1, 1, 1, 1, 0}, to: layout{2, 2, 2, 1, 3}},
		{name: "tp2 pp2 dp2 zero 3 -> tp1 pp1 dp1 zero 0", from: layout{2, 2, 2, 1, 3}, to: layout{1, 1, 1, 1, 0}},
		{name: "tp2 pp2 virtual 2 (interleaved) -> tp1 pp2 dp2 1f1b", from: layout{2, 2, 1, 2, 1}, to: layout{1, 2, 2, 1, 2}},
		{name: "tp1 pp2 virtual 2 -> tp1 pp4: the same four chunk roots", from: layout{1, 2, 2, 2, 0}, to: layout{1, 4, 1, 1, 0}},
		{name: "tp4 pp1 dp2 -> tp2 pp4 dp1", from: layout{4, 1, 2, 1, 0}, to: layout{2, 4, 1, 1, 0}},
		{name: "local: tp2 pp1 dp2 -> tp1 pp2 dp2", from: layout{2, 1, 2, 1, 0}, to: layout{1, 2, 2, 1, 1}, local: true},
		{name: "local: tp1 pp2 virtual 2 dp2 -> tp2 pp1 dp2 zero 3", from: layout{1, 2, 2, 2, 2}, to: layout{2, 1, 2, 1, 3}, local: true},
	}
	run := func(t *testing.T, c *Config) []float64 {
		t.Helper()
		res, err := RunInProc(t.Context(), c, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Losses
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			j3 := *job
			j3.Steps = 3
			first := tc.from.config(&j3)
			first.CheckpointDir, first.CheckpointEvery, first.LocalCheckpoints = dir, 3, tc.local
			head := run(t, first)
			second := tc.to.config(job)
			second.CheckpointDir, second.Resume, second.LocalCheckpoints = dir, 3, tc.local
			tail := run(t, second)
			if len(head) != 3 || len(tail) != 3 {
				t.Fatalf("%d + %d steps, want 3 + 3", len(head), len(tail))
			}
			want := append(run(t, tc.from.config(job))[:3], run(t, tc.to.config(job))[3:]...)
			got := append(head, tail...)
			for i := range want {
				diff := math.Abs(got[i] - want[i])
				if i < 3 && diff != 0 || diff > 1e-5*math.Abs(want[i]) {
					t.Errorf("step %d: loss %.9g, want %.9g", i+1, got[i], want[i])
				}
			}
		})
	}
}

// soloGroup is a group whose other members are not there: enough for
// NewRank, Restore and a Checkpoint at DP degree 1, which do not
// communicate.
type soloGroup struct {
	collectives.Communicator
	rank, size int
}

func (g soloGroup) Rank() int { return g.rank }
func (g soloGroup) Size() int { return g.size }

// ranksAt builds every rank of cfg's layout at DP degree 1, by TP then PP
// coordinate, without running them.
func ranksAt(t *testing.T, cfg *Config) [][]*Rank {
	t.Helper()
	group := func(rank, size int) collectives.Communicator {
		if size == 1 {
			return nil
		}
		return soloGroup{rank: rank, size: size}
	}
	out := make([][]*Rank, cfg.TP)
	for tp := range cfg.TP {
		for pp := range cfg.PP {
			r, err := NewRank(cfg, topology.Coord{TP: tp, PP: pp}, Groups{TP: group(tp, cfg.TP), PP: group(pp, cfg.PP)})
			if err != nil {
				t.Fatal(err)
			}
			out[tp] = append(out[tp], r)
		}
	}
	return out
}

// TestRestoreReshardsExactly: a checkpoint written at tp 2 pp 2 (dp 2,
// ZeRO 1), restored at tp 4 pp 4 with the old layout named in the Config
// by ranks that each see only the one old chunk root their pieces come
// from, checkpointed there, and restored back at tp 2 pp 2 (the layout
// found by listing), holds bit for bit the parameters and Adam moments
// that reading the first checkpoint at its own layout gives.
func TestRestoreReshardsExactly(t *testing.T) {
	job := tinyJob(LossMSE)
	job.Steps = 3
	dir := t.TempDir()
	a := layout{2, 2, 2, 1, 1}.config(job)
	a.CheckpointDir, a.CheckpointEvery = dir, 3
	if _, err := RunInProc(t.Context(), a, nil); err != nil {
		t.Fatal(err)
	}
	b := layout{4, 4, 1, 1, 0}.config(job)
	b.CheckpointLayout = CheckpointLayout{TP: 2, PP: 2}
	there := t.TempDir()
	for tp, ranks := range ranksAt(t, b) {
		for pp, r := range ranks {
			// Rank (tp, pp) of tp 4 pp 4 holds hidden units from old TP
			// rank tp/2 and blocks of old chunk pp/2: one root.
			own := t.TempDir()
			sub := filepath.Join(fmt.Sprintf("tp%d-of-2", tp/2), fmt.Sprintf("chunk%d-of-2", pp/2))
			if err := os.CopyFS(filepath.Join(own, sub), os.DirFS(filepath.Join(dir, sub))); err != nil {
				t.Fatal(err)
			}
			if err := r.Restore(t.Context(), own, 3); err != nil {
				t.Fatalf("tp4 pp4 rank (%d, %d): %v", tp, pp, err)
			}
			if err := r.Checkpoint(t.Context(), there, 3); err != nil {
				t.Fatal(err)
			}
		}
	}
	back := layout{2, 2, 1, 1, 0}.config(job)
	direct, fresh := ranksAt(t, back), ranksAt(t, back)
	for tp, ranks := range ranksAt(t, back) {
		for pp, r := range ranks {
			d := direct[tp][pp]
			if err := d.Restore(t.Context(), dir, 3); err != nil {
				t.Fatal(err)
			}
			if err := r.Restore(t.Context(), there, 3); err != nil {
				t.Fatal(err)
			}
			for i, cs := range r.chunks {
				for name, got := range cs.vectors() {
					want := d.chunks[i].vectors()[name]
					if !slices.Equal(got, want) {
						t.Errorf("tp %d pp %d chunk %d: %s after tp 4 pp 4 differs from the direct read", tp, pp, cs.index, name)
					}
					if name == vecParam && slices.Equal(want, fresh[tp][pp].chunks[i].params) {
						t.Errorf("tp %d pp %d chunk %d: the restored parameters are the initial ones", tp, pp, cs.index)
					}
				}
			}
		}
	}
}

// TestRestoreLayoutErrors: which layout Restore reads when
// Config.CheckpointLayout is unknown, and its errors. The directory holds
// step 3 at tp 2 pp 2 and at tp 1 pp 1; tinyJob has hidden 8 and 4 blocks.
func TestRestoreLayoutErrors(t *testing.T) {
	job := tinyJob(LossMSE)
	job.Steps = 4
	base := t.TempDir()
	for _, l := range []layout{{2, 2, 1, 1, 0}, {1, 1, 1, 1, 0}} {
		j3 := *job
		j3.Steps = 3
		c := l.config(&j3)
		c.CheckpointDir, c.CheckpointEvery = base, 3
		if _, err := RunInProc(t.Context(), c, nil); err != nil {
			t.Fatal(err)
		}
	}
	// copyTP copies base's tree at path from to dir's path to.
	copyTP := func(t *testing.T, dir, from, to string) {
		t.Helper()
		if err := os.CopyFS(filepath.Join(dir, to), os.DirFS(filepath.Join(base, from))); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		setup  func(t *testing.T, dir string) // builds the checkpoint directory; nil: a copy of base
		at     layout
		known  CheckpointLayout
		resume int
		want   []error // nil: it resumes
		msg    string
	}{
		{name: "own layout among two", at: layout{2, 2, 1, 1, 0}, resume: 3},
		{name: "the layout named", at: layout{2, 1, 1, 1, 0}, known: CheckpointLayout{TP: 1, PP: 1}, resume: 3},
		{name: "two layouts, neither the rank's", at: layout{2, 1, 1, 1, 0}, resume: 3,
			want: []error{ErrUnrestorable, ErrAmbiguousCheckpoint}, msg: "layouts tp*-of-1/chunk*-of-1, tp*-of-2/chunk*-of-2 all hold it and none is this rank's tp*-of-2/chunk*-of-1"},
		{name: "one of two layouts incomplete", at: layout{2, 1, 1, 1, 0}, resume: 3, setup: func(t *testing.T, dir string) {
			copyTP(t, dir, "tp0-of-1", "tp0-of-1")
			copyTP(t, dir, "tp0-of-2", "tp0-of-2")
			copyTP(t, dir, "tp1-of-2", "tp1-of-2")
			if err := os.Remove(filepath.Join(sharding.StepDir(filepath.Join(dir, "tp1-of-2", "chunk0-of-2"), 3), sharding.ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "no layout has the step", at: layout{1, 1, 1, 1, 0}, resume: 2,
			want: []error{ErrUnrestorable, sharding.ErrNoCheckpoint}, msg: "no layout holds it whole"},
		{name: "an empty directory", at: layout{1, 1, 1, 1, 0}, resume: 3, setup: func(*testing.T, string) {},
			want: []error{ErrUnrestorable, sharding.ErrNoCheckpoint}, msg: "no layout's chunk roots"},
		{name: "the named layout does not hold the step", at: layout{1, 1, 1, 1, 0}, known: CheckpointLayout{TP: 1, PP: 2}, resume: 3,
			want: []error{ErrUnrestorable, sharding.ErrIncomplete}, msg: "tp0-of-1/chunk0-of-2"},
		{name: "tp 3 does not divide hidden 8", at: layout{1, 1, 1, 1, 0}, resume: 3, setup: func(t *testing.T, dir string) {
			for i := range 3 {
				copyTP(t, dir, "tp0-of-1", fmt.Sprintf("tp%d-of-3", i))
			}
		}, want: []error{ErrUnrestorable, sharding.ErrNoCheckpoint, sharding.ErrMismatch}, msg: "model.hidden 8 is not divisible by tp 3"},
		{name: "3 chunks do not divide 4 blocks", at: layout{1, 1, 1, 1, 0}, resume: 3, setup: func(t *testing.T, dir string) {
			for i := range 3 {
				copyTP(t, dir, filepath.Join("tp0-of-1", "chunk0-of-1"), filepath.Join("tp0-of-1", fmt.Sprintf("chunk%d-of-3", i)))
			}
		}, want: []error{ErrUnrestorable, sharding.ErrNoCheckpoint, sharding.ErrMismatch}, msg: "model.blocks 4 is not divisible by 3 chunks"},
		{name: "a named layout that does not divide the model", at: layout{1, 1, 1, 1, 0}, known: CheckpointLayout{TP: 3, PP: 1}, resume: 3,
			want: []error{ErrInvalidJob}, msg: "checkpoint layout: model.hidden 8 is not divisible by tp 3"},
		{name: "a named layout whose pp*virtual overflows to 0", at: layout{1, 1, 1, 1, 0}, known: CheckpointLayout{TP: 1, PP: math.MaxInt/2 + 1, Virtual: 4}, resume: 3,
			want: []error{ErrInvalidJob}, msg: "checkpoint layout: model.blocks 4 is not divisible by pp*virtual"},
		{name: "a named layout of no stages", at: layout{1, 1, 1, 1, 0}, known: CheckpointLayout{TP: 1}, resume: 3,
			want: []error{ErrInvalidJob}, msg: "checkpoint layout tp 1 pp 0 virtual 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.setup != nil {
				tc.setup(t, dir)
			} else if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
				t.Fatal(err)
			}
			c := tc.at.config(job)
			c.CheckpointDir, c.Resume, c.CheckpointLayout = dir, tc.resume, tc.known
			_, err := RunInProc(t.Context(), c, nil)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want %v", err, want)
				}
			}
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v, want it to say %q", err, tc.msg)
			}
		})
	}
}
