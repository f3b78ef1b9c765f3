package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/topology/estimate"
)

// tablePlanner is a planner that answers from tables: the planner's
// answer is decide's input, as the view is.
type tablePlanner struct {
	bests map[int]choice    // by node count
	ests  map[string]choice // by "n/label"
}

func (p tablePlanner) best(n int) (choice, bool) {
	c, ok := p.bests[n]
	return c, ok
}

func (p tablePlanner) estimate(n int, g pb.Grid) (choice, bool) {
	c, ok := p.ests[fmt.Sprintf("%d/%s", n, g.Label(0))]
	return c, ok
}

func est(tp, pp int32, dp int, step float64) choice {
	return choice{grid: pb.Grid{TP: tp, PP: pp, VPP: 1}, dp: dp, stepSec: step, memGiB: 41.2, capGiB: 80, samples: 64 / step}
}

// TestDecideReplan: decide's re-planning, the planner's answers given as a
// table. Nodes have 4 GPUs; jobs are submitted at tp 2 pp 2.
func TestDecideReplan(t *testing.T) {
	auto := func(edit func(*pb.JobSpec)) func(*pb.JobSpec) {
		return func(s *pb.JobSpec) {
			s.Replan = &pb.Replan{Planner: []byte(`{}`)}
			s.CheckpointDir = "/ckpt"
			if edit != nil {
				edit(s)
			}
		}
	}
	// committed: the job's step 10, trained at generation 1's tp 2 pp 2.
	committed := func(j *job) *job {
		j.commit, j.step = &pb.Step{Step: 10, Generation: j.gen.Number, Dp: j.gen.Dp, Tp: 2, Pp: 2}, &pb.Step{Step: 10}
		return j
	}
	two := tablePlanner{bests: map[int]choice{2: est(4, 1, 2, 1.31)}}
	type tcase struct {
		name   string
		v      *view
		plan   planner
		want   want
		layout string // the next generation's, "tp 4 pp 1 dp 2"
	}
	tests := []tcase{
		{name: "two of four nodes lost: the planner's best on two",
			v:      pool(committed(runningOn(pending(4, auto(nil)), 1, "n0", "n1", "n2", "n3")), "n0", "n1"),
			plan:   two,
			want:   want{phase: pb.JobState_RUNNING, reason: "re-planned tp 2 pp 2 dp 4 -> tp 4 pp 1 dp 2: 2 nodes, 41.2 of 80 GiB per GPU, 1.31 s/step estimated", gen: "n0,n1", genNum: 2, dp: 2, resume: 10, strikes: map[string]int{"n2": 1, "n3": 1}},
			layout: "tp 4 pp 1 dp 2"},
		{name: "the most nodes any layout fits: three left, the planner fits two",
			v:      pool(committed(runningOn(pending(4, auto(nil)), 1, "n0", "n1", "n2", "n3")), "n0", "n1", "n2"),
			plan:   two,
			want:   want{phase: pb.JobState_RUNNING, reason: "re-planned", gen: "n0,n1", genNum: 2, dp: 2, resume: 10, strikes: map[string]int{"n3": 1}},
			layout: "tp 4 pp 1 dp 2"},
		{name: "nothing fits the nodes left: paused",
			v:    pool(committed(runningOn(pending(4, auto(nil)), 1, "n0", "n1", "n2", "n3")), "n0", "n1"),
			plan: tablePlanner{bests: map[int]choice{3: est(2, 2, 3, 1)}},
			want: want{phase: pb.JobState_PENDING, reason: "paused after generation 1: node lost", strikes: map[string]int{"n2": 1, "n3": 1}, policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "below the throughput floor: paused",
			v:    pool(committed(runningOn(pending(4, auto(func(s *pb.JobSpec) { s.Replan.MinSamplesPerSecond = 60 })), 1, "n0", "n1", "n2", "n3")), "n0", "n1"),
			plan: two, // 64 / 1.31 = 48.9 samples/s
			want: want{phase: pb.JobState_PENDING, reason: "paused", strikes: map[string]int{"n2": 1, "n3": 1}, policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "dp-only keeps tp and pp: dp shrinks to what min_nodes allows",
			v:      pool(committed(runningOn(pending(4, auto(func(s *pb.JobSpec) { s.Replan.Mode, s.MinNodes = ReplanDPOnly, 1 })), 1, "n0", "n1", "n2", "n3")), "n0", "n1"),
			plan:   nil, // the leader gives no planner to a dp-only job
			want:   want{phase: pb.JobState_RUNNING, reason: "node lost", gen: "n0,n1", genNum: 2, dp: 2, resume: 10, strikes: map[string]int{"n2": 1, "n3": 1}},
			layout: "tp 2 pp 2 dp 2"},
		{name: "off: never fewer nodes than submitted, even with min_nodes",
			v:    pool(committed(runningOn(pending(4, auto(func(s *pb.JobSpec) { s.Replan.Mode, s.MinNodes = ReplanOff, 2 })), 1, "n0", "n1", "n2", "n3")), "n0", "n1"),
			want: want{phase: pb.JobState_PENDING, reason: "paused", strikes: map[string]int{"n2": 1, "n3": 1}, policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "a dp 1 job (2 GPUs a node) loses a node: one node's layout, not a pause",
			v:    pool(committed(runningOn(pending(2, auto(func(s *pb.JobSpec) { s.GpusPerNode = 2 })), 1, "n0", "n1")), "n0"),
			plan: tablePlanner{bests: map[int]choice{1: est(2, 1, 1, 2.5)}},
			want: want{phase: pb.JobState_RUNNING, reason: "re-planned tp 2 pp 2 dp 1 -> tp 2 pp 1 dp 1: 1 node, 41.2 of 80 GiB per GPU, 2.5 s/step estimated",
				gen: "n0", genNum: 2, dp: 1, resume: 10, strikes: map[string]int{"n1": 1}},
			layout: "tp 2 pp 1 dp 1"},
		{name: "the same dp 1 job without a planner: paused",
			v:    pool(committed(runningOn(pending(2, func(s *pb.JobSpec) { s.GpusPerNode, s.CheckpointDir = 2, "/ckpt" }), 1, "n0", "n1")), "n0"),
			want: want{phase: pb.JobState_PENDING, reason: "paused", strikes: map[string]int{"n1": 1}, policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "paused, two nodes back of four: resumed at the planner's best",
			v: func() *view {
				j := committed(runningOn(pending(4, auto(nil)), 1, "n0", "n1", "n2", "n3"))
				j.state = &pb.JobState{Phase: pb.JobState_PENDING, Reason: "paused after generation 1"}
				j.policy.PendingSince = ms(t0.Add(-time.Second))
				return pool(j, "n0", "n1")
			}(),
			plan:   two,
			want:   want{phase: pb.JobState_RUNNING, reason: "resumed on 2 nodes after a pause; re-planned", gen: "n0,n1", genNum: 2, dp: 2, resume: 10, policy: &jobPolicy{}},
			layout: "tp 4 pp 1 dp 2"},
	}
	// Growing back: running re-planned on two nodes at tp 4 pp 1, two
	// stable nodes free, at a committed step.
	shrunk := func() *job {
		j := runningOn(pending(4, auto(nil)), 2, "n0", "n1")
		j.gen.Tp, j.gen.Pp = 4, 1
		j.commit, j.step = &pb.Step{Step: 20, Generation: 2, Dp: 2, Tp: 4, Pp: 1}, &pb.Step{Step: 20}
		return j
	}
	grow := func(cur float64) tablePlanner {
		return tablePlanner{bests: map[int]choice{4: est(2, 2, 4, 1.0)}, ests: map[string]choice{"2/tp 4 pp 1 dp 0": est(4, 1, 2, cur)}}
	}
	tests = append(tests,
		tcase{name: "grows back when the estimate gains 50%",
			v:      pool(shrunk(), "n0", "n1", "n2", "n3"),
			plan:   grow(1.5),
			want:   want{phase: pb.JobState_RUNNING, reason: "nodes joined: n2, n3; re-planned tp 4 pp 1 dp 2 -> tp 2 pp 2 dp 4: 4 nodes", gen: "n0,n1,n2,n3", genNum: 3, dp: 4, resume: 20},
			layout: "tp 2 pp 2 dp 4"},
		tcase{name: "two free, the planner fits three nodes: one joins",
			v:      pool(shrunk(), "n0", "n1", "n2", "n3"),
			plan:   tablePlanner{bests: map[int]choice{3: est(2, 1, 6, 1.0)}, ests: map[string]choice{"2/tp 4 pp 1 dp 0": est(4, 1, 2, 1.5)}},
			want:   want{phase: pb.JobState_RUNNING, reason: "nodes joined: n2; re-planned tp 4 pp 1 dp 2 -> tp 2 pp 1 dp 6: 3 nodes", gen: "n0,n1,n2", genNum: 3, dp: 6, resume: 20},
			layout: "tp 2 pp 1 dp 6"},
		tcase{name: "stays when the estimate gains 5% (below the 10% default)",
			v:    pool(shrunk(), "n0", "n1", "n2", "n3"),
			plan: grow(1.05),
			want: want{after: testPolicy.Recheck, noWrites: true}},
		tcase{name: "grows at 5% when the job's grow_gain is 4%",
			v: func() *view {
				j := shrunk()
				j.spec.Replan.GrowGain = 0.04
				return pool(j, "n0", "n1", "n2", "n3")
			}(),
			plan:   grow(1.05),
			want:   want{phase: pb.JobState_RUNNING, reason: "re-planned tp 4 pp 1 dp 2 -> tp 2 pp 2 dp 4", gen: "n0,n1,n2,n3", genNum: 3, dp: 4, resume: 20},
			layout: "tp 2 pp 2 dp 4"},
	)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.v.plan = tc.plan
			d := decide(tc.v, t0, testPolicy)
			check(t, d, tc.want)
			if d.gen == nil {
				return
			}
			if got := pb.GenerationGrid(tc.v.job.spec, d.gen).Label(d.gen.Dp); got != tc.layout {
				t.Errorf("generation's layout %q, want %q", got, tc.layout)
			}
			// The files it restores were cut by the layout of the commit.
			if from := pb.ResumeGrid(tc.v.job.spec, d.gen); from != pb.StepGrid(tc.v.job.spec, tc.v.job.commit) {
				t.Errorf("resumes from a layout of %+v, the commit's is %+v", from, pb.StepGrid(tc.v.job.spec, tc.v.job.commit))
			}
			if tc.plan != nil && !strings.Contains(d.gen.Estimate, "s/step estimated") {
				t.Errorf("generation's estimate %q", d.gen.Estimate)
			}
		})
	}
}

// TestSearchPlanner: the leader's planner for llama-70b on DGX H100 nodes
// chooses, for each number of nodes left, what `plan --failures` shows
// for the same search (the job's micro-batch and recomputation, its
// limits): the layout on the most nodes one fits, the fastest there.
func TestSearchPlanner(t *testing.T) {
	m, err := topology.ModelPreset("llama-70b")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := topology.ClusterPreset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	cl.Nodes = 16
	base := topology.DefaultConfig()
	base.GlobalBatch, base.MicroBatch = 512, 1
	limits := Limits{PP: []int{1, 2, 4, 8}}
	in, _ := json.Marshal(PlannerInput{Cluster: cl, Model: m, Config: base, Limits: limits})
	spec := &pb.JobSpec{Id: "j", Nodes: 16, GpusPerNode: 8, Tp: 8, Pp: 4, GlobalBatch: 512, MicroBatch: 1, Command: []string{"x"}, Replan: &pb.Replan{Planner: in}}
	if err := ValidateSpec(spec); err != nil {
		t.Fatal(err)
	}
	p, err := newSearchPlanner(spec)
	if err != nil {
		t.Fatal(err)
	}
	space := topology.DefaultSearchSpace()
	space.Fixed.MicroBatch, space.Fixed.Recompute = &base.MicroBatch, &base.Recompute
	space.Allow = func(c topology.Config) bool { return slices.Contains(limits.PP, c.PP) && c.VPP <= 1 && c.Zero == 0 }
	rows, err := estimate.Failures(cl, m, base, space, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		v := &view{job: &job{spec: spec}, plan: p}
		f, ok := fit(v, row.Nodes, 1)
		switch {
		case !ok && row.Best == nil:
			t.Logf("%d nodes: pauses", row.Nodes)
			continue
		case !ok || row.Best == nil:
			t.Errorf("%d nodes: the leader fits %v, plan --failures %v", row.Nodes, ok, row.Best != nil)
			continue
		}
		want := gridOf(row.Best.Plan.Config)
		if f.n != row.Used || f.grid != want || f.est.stepSec != row.Best.Report.Step.Seconds {
			t.Errorf("%d nodes: the leader runs %+v on %d (%.4g s), plan --failures %+v on %d (%.4g s)", row.Nodes, f.grid, f.n, f.est.stepSec, want, row.Used, row.Best.Report.Step.Seconds)
		}
		if _, err := LayoutOn(spec, f.grid, f.n); err != nil {
			t.Errorf("%d nodes: %+v breaks the job's layout rules: %v", row.Nodes, f.grid, err)
		}
		if again, ok := p.estimate(f.n, f.grid); !ok || again.stepSec != f.est.stepSec {
			t.Errorf("%d nodes: the estimate of the chosen layout %v %v, the search's %v", row.Nodes, again.stepSec, ok, f.est.stepSec)
		}
		t.Logf("%d nodes: %s on %d: %s", row.Nodes, f.grid.Label(int32(f.est.dp)), f.n, f.est)
	}
}
