package coordinator

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// t0 is the tests' "now": every time in a case is relative to it.
var t0 = time.UnixMilli(1_800_000_000_000)

var testPolicy = policy{FailureSettle: time.Second, StableFor: 2 * time.Second, StragglerFactor: 2, StragglerWindows: 3, Recheck: 200 * time.Millisecond}

// pool is a view of connected nodes of 4 GPUs, registered an hour before
// t0, each run named "<name>-1", and one job.
func pool(j *job, names ...string) *view {
	v := &view{job: j, nodes: map[string]*pb.Node{}, connected: map[string]bool{}, busy: map[string]string{}, nodePolicy: map[string]nodePolicy{}}
	for _, n := range names {
		v.nodes[n] = &pb.Node{Name: n, Host: n, Gpus: 4, Instance: n + "-1", RegisteredUnixMs: ms(t0.Add(-time.Hour))}
		v.connected[n] = true
	}
	if j.gen != nil && !j.terminal() {
		for _, m := range j.gen.Members {
			v.busy[m.Node] = j.spec.Id
		}
	}
	return v
}

// pending is a submitted job of n nodes of 4 GPUs (tp 2, pp 2).
func pending(n int32, edit func(*pb.JobSpec)) *job {
	s := &pb.JobSpec{Id: "j", Nodes: n, GpusPerNode: 4, Tp: 2, Pp: 2, Command: []string{"true"}, MaxRestarts: 3}
	if edit != nil {
		edit(s)
	}
	return &job{spec: s, state: &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1, Reason: "waiting for rendezvous"},
		exits: map[int32]*pb.RankExit{}}
}

// runningOn is j running generation g on nodes (runs "<name>-1").
func runningOn(j *job, g int64, nodes ...string) *job {
	var ns []*pb.Node
	for _, n := range nodes {
		ns = append(ns, &pb.Node{Name: n, Host: n, Instance: n + "-1"})
	}
	l, err := Layout(j.spec, len(nodes))
	if err != nil {
		panic(err)
	}
	j.gen = buildGeneration(j.spec, g, ns, fitting{grid: pb.SpecGrid(j.spec)}, l.DP, restore{}, "")
	j.open = g // running: every earlier rank stopped
	j.state = &pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1}
	return j
}

func fail(j *job, rank, code int32, at time.Time) *job {
	j.exits[rank] = &pb.RankExit{Rank: rank, Code: code, FailedAtUnixMs: ms(at)}
	j.exitOrder = append(j.exitOrder, rank)
	return j
}

func names(g *pb.Generation) string {
	if g == nil {
		return "-"
	}
	return memberNames(g)
}

// want is what a case expects of a decision; zero fields are not checked
// unless noted.
type want struct {
	phase    pb.JobState_Phase // 0: no state written
	reason   string            // a substring of the new state's reason
	gen      string            // the next generation's nodes, comma-separated; "" none
	genNum   int64
	dp       int32
	resume   int64
	strikes  map[string]int // node -> strikes after; nil: none
	policy   *jobPolicy     // the job's timers written; nil: unchanged
	after    time.Duration  // when to look again; 0: never
	stragg   []int32        // ranks flagged
	hangs    int32          // the next generation's count of hangs
	noWrites bool
}

func check(t *testing.T, d decision, w want) {
	t.Helper()
	switch {
	case w.phase == 0 && d.state != nil:
		t.Errorf("state written: %v", d.state)
	case w.phase != 0 && d.state == nil:
		t.Errorf("no state written, want %v", w.phase)
	case w.phase != 0 && (d.state.Phase != w.phase || !strings.Contains(d.state.Reason, w.reason)):
		t.Errorf("state = %v %q, want %v containing %q", d.state.Phase, d.state.Reason, w.phase, w.reason)
	}
	if got := names(d.gen); w.gen == "" && d.gen != nil || w.gen != "" && got != w.gen {
		t.Errorf("generation on %s, want %q", got, w.gen)
	}
	if d.gen != nil && w.genNum != 0 && (d.gen.Number != w.genNum || d.gen.Dp != w.dp || d.gen.ResumeStep != w.resume) {
		t.Errorf("generation %d dp %d resume %d, want %d dp %d resume %d", d.gen.Number, d.gen.Dp, d.gen.ResumeStep, w.genNum, w.dp, w.resume)
	}
	if d.gen != nil && d.gen.Hangs != w.hangs {
		t.Errorf("generation hangs = %d, want %d", d.gen.Hangs, w.hangs)
	}
	if len(d.strikes) != len(w.strikes) {
		t.Errorf("strikes = %v, want %v", d.strikes, w.strikes)
	}
	for n, k := range w.strikes {
		if d.strikes[n].Strikes != k {
			t.Errorf("strikes of %s = %d, want %d", n, d.strikes[n].Strikes, k)
		}
	}
	if w.policy != nil && (d.policy == nil || !d.policy.equal(*w.policy)) {
		t.Errorf("policy = %+v, want %+v", d.policy, *w.policy)
	}
	if d.after != w.after {
		t.Errorf("after = %s, want %s", d.after, w.after)
	}
	if w.stragg != nil {
		var got []int32
		for _, s := range d.stragglers.GetRanks() {
			got = append(got, s.Rank)
		}
		if len(got) != len(w.stragg) || (len(got) > 0 && got[0] != w.stragg[0]) {
			t.Errorf("stragglers = %v, want %v", got, w.stragg)
		}
	}
	if w.noWrites && d.writes() {
		t.Errorf("writes %+v, want none", d)
	}
}

func TestDecideRendezvous(t *testing.T) {
	since := ms(t0.Add(-time.Second))
	tests := []struct {
		name string
		v    *view
		want want
	}{
		{name: "too few nodes: wait, start the clock",
			v:    pool(pending(2, func(s *pb.JobSpec) { s.RendezvousTimeoutMs = 5000 }), "n0"),
			want: want{phase: pb.JobState_PENDING, reason: "waiting for nodes: 1 of 2 free with 4 GPUs each (1 registered)", policy: &jobPolicy{PendingSince: ms(t0)}, after: 5 * time.Second}},
		{name: "too few until the timeout: failed",
			v: func() *view {
				j := pending(2, func(s *pb.JobSpec) { s.RendezvousTimeoutMs = 5000 })
				j.policy.PendingSince = ms(t0.Add(-5 * time.Second))
				return pool(j, "n0")
			}(),
			want: want{phase: pb.JobState_FAILED, reason: "rendezvous timed out after 5s: waiting for nodes: 1 of 2"}},
		{name: "a disconnected node is not free",
			v: func() *view {
				v := pool(pending(2, nil), "n0", "n1")
				delete(v.connected, "n1")
				return v
			}(),
			want: want{phase: pb.JobState_PENDING, reason: "1 of 2 free", policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "a node another job holds is not free",
			v: func() *view {
				v := pool(pending(2, nil), "n0", "n1")
				v.busy["n1"] = "other"
				return v
			}(),
			want: want{phase: pb.JobState_PENDING, reason: "1 of 2 free"}},
		{name: "a hostfile's hosts not free: each named with why",
			v: func() *view {
				v := pool(pending(4, func(s *pb.JobSpec) { s.Hosts = []string{"n0", "n1", "n2", "n3", "n9"}; s.GpusPerNode = 8 }), "n0", "n1", "n2", "n3")
				v.nodes["n0"].Gpus, v.nodes["n1"].Gpus, v.nodes["n2"].Gpus, v.nodes["n3"].Gpus = 8, 4, 8, 8
				v.busy["n2"] = "other"
				delete(v.connected, "n3")
				return v
			}(),
			want: want{phase: pb.JobState_PENDING, reason: "waiting for nodes: 1 of 4 free with 8 GPUs each (4 registered) among hosts n0,n1,n2,n3,n9: " +
				"n1 has 4 GPUs; n2 runs job other; n3 has no open stream; n9 is not registered", policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "nodes with too few GPUs: counted",
			v:    pool(pending(2, func(s *pb.JobSpec) { s.GpusPerNode = 8 }), "n0", "n1"),
			want: want{phase: pb.JobState_PENDING, reason: "0 of 2 free with 8 GPUs each (2 registered): 2 registered with fewer than 8 GPUs"}},
		{name: "enough: frozen on the nodes in name order",
			v:    pool(pending(2, nil), "n1", "n0", "n2"),
			want: want{phase: pb.JobState_RUNNING, gen: "n0,n1", genNum: 1, dp: 2, policy: &jobPolicy{}}},
		{name: "enough but fewer than max: last call",
			v: func() *view {
				j := pending(2, func(s *pb.JobSpec) { s.MaxNodes, s.LastCallMs = 4, 500 })
				j.policy.PendingSince = since
				return pool(j, "n0", "n1")
			}(),
			want: want{policy: &jobPolicy{PendingSince: since, EnoughSince: ms(t0)}, after: 500 * time.Millisecond}},
		{name: "last call over: frozen on what came",
			v: func() *view {
				j := pending(2, func(s *pb.JobSpec) { s.MaxNodes, s.LastCallMs = 4, 500 })
				j.policy = jobPolicy{PendingSince: since, EnoughSince: ms(t0.Add(-500 * time.Millisecond))}
				return pool(j, "n0", "n1", "n2")
			}(),
			want: want{phase: pb.JobState_RUNNING, gen: "n0,n1,n2", genNum: 1, dp: 3}},
		{name: "a loss during last call below nodes: back to waiting, the call forgotten",
			v: func() *view {
				j := pending(2, func(s *pb.JobSpec) { s.MaxNodes, s.LastCallMs = 4, 500 })
				j.policy = jobPolicy{PendingSince: since, EnoughSince: ms(t0.Add(-100 * time.Millisecond))}
				return pool(j, "n0")
			}(),
			want: want{phase: pb.JobState_PENDING, reason: "1 of 2 free", policy: &jobPolicy{PendingSince: since}}},
		{name: "a loss during last call that leaves enough: the call runs on",
			v: func() *view {
				j := pending(2, func(s *pb.JobSpec) { s.MaxNodes, s.LastCallMs = 4, 500 })
				j.policy = jobPolicy{PendingSince: since, EnoughSince: ms(t0.Add(-100 * time.Millisecond))}
				return pool(j, "n0", "n2")
			}(),
			want: want{after: 400 * time.Millisecond, noWrites: true}},
		{name: "max nodes present: no last call",
			v:    pool(pending(2, func(s *pb.JobSpec) { s.MaxNodes, s.LastCallMs = 3, 500 }), "n0", "n1", "n2", "n3"),
			want: want{phase: pb.JobState_RUNNING, gen: "n0,n1,n2", genNum: 1, dp: 3}},
		{name: "the most nodes a global batch allows",
			v: pool(pending(2, func(s *pb.JobSpec) {
				s.MaxNodes, s.GlobalBatch, s.MicroBatch = 3, 16, 2 // dp 3 does not divide 8 micro-batches
			}), "n0", "n1", "n2"),
			want: want{phase: pb.JobState_RUNNING, gen: "n0,n1", dp: 2, genNum: 1}},
		{name: "no layout works: failed with the reason",
			v:    pool(pending(1, func(s *pb.JobSpec) { s.GlobalBatch, s.MicroBatch = 3, 2 }), "n0"),
			want: want{phase: pb.JobState_FAILED, reason: "global batch 3 is not divisible by micro-batch*dp"}},
		{name: "hostfile order and hosts only",
			v:    pool(pending(2, func(s *pb.JobSpec) { s.Hosts = []string{"n2", "n0"} }), "n0", "n1", "n2"),
			want: want{phase: pb.JobState_RUNNING, gen: "n2,n0"}},
		{name: "ended: nothing",
			v: func() *view {
				j := pending(2, nil)
				j.state = &pb.JobState{Phase: pb.JobState_CANCELLED}
				return pool(j, "n0", "n1")
			}(),
			want: want{noWrites: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check(t, decide(tc.v, t0, testPolicy), tc.want) })
	}
}

func TestDecideRunning(t *testing.T) {
	settling := ms(t0.Add(-300 * time.Millisecond))
	tests := []struct {
		name string
		v    *view
		want want
	}{
		{name: "healthy: look again for stragglers",
			v:    pool(runningOn(pending(2, nil), 1, "n0", "n1"), "n0", "n1"),
			want: want{after: testPolicy.Recheck, noWrites: true}},
		{name: "every rank exited 0: succeeded",
			v: func() *view {
				j := runningOn(pending(1, nil), 1, "n0")
				for r := range int32(4) {
					j.exits[r] = &pb.RankExit{Rank: r}
				}
				return pool(j, "n0")
			}(),
			want: want{phase: pb.JobState_SUCCEEDED}},
		{name: "a rank failed: settle first",
			v:    pool(fail(runningOn(pending(2, nil), 1, "n0", "n1"), 2, 9, t0), "n0", "n1"),
			want: want{policy: &jobPolicy{FailedSince: ms(t0)}, after: time.Second}},
		{name: "settled: the next generation on the same nodes",
			v: func() *view {
				j := fail(runningOn(pending(2, nil), 1, "n0", "n1"), 2, 9, t0)
				j.policy.FailedSince = ms(t0.Add(-time.Second))
				j.commit, j.step = &pb.Step{Step: 7, Generation: 1}, &pb.Step{Step: 8}
				return pool(j, "n0", "n1")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "rank 2 on n0 exited with code 9; resuming after step 7", gen: "n0,n1", genNum: 2, dp: 2, resume: 7, policy: &jobPolicy{}}},
		{name: "a node lost: the next generation at once, without it, struck",
			v:    pool(runningOn(pending(2, func(s *pb.JobSpec) { s.MinNodes = 1 }), 1, "n0", "n1"), "n0"),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1 (ranks 4-7)", gen: "n0", genNum: 2, dp: 1, strikes: map[string]int{"n1": 1}}},
		{name: "a node lost while a failure settles: no more waiting",
			v: func() *view {
				j := fail(runningOn(pending(2, func(s *pb.JobSpec) { s.MinNodes = 1 }), 1, "n0", "n1"), 0, 1, t0)
				j.policy.FailedSince = settling
				return pool(j, "n0")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1", gen: "n0", strikes: map[string]int{"n1": 1}}},
		{name: "two losses in one settle window: both out, both struck",
			v: func() *view {
				j := fail(runningOn(pending(3, func(s *pb.JobSpec) { s.MinNodes = 1 }), 1, "n0", "n1", "n2"), 0, 1, t0)
				j.policy.FailedSince = settling
				return pool(j, "n0")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1 (ranks 4-7), n2 (ranks 8-11)", gen: "n0", strikes: map[string]int{"n1": 1, "n2": 1}}},
		{name: "disconnected when a rank fails: lost at once (a killed agent)",
			v: func() *view {
				v := pool(fail(runningOn(pending(2, func(s *pb.JobSpec) { s.MinNodes = 1 }), 1, "n0", "n1"), 1, 1, t0), "n0", "n1")
				delete(v.connected, "n1")
				return v
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1 (ranks 4-7)", gen: "n0", strikes: map[string]int{"n1": 1}}},
		{name: "disconnected without a failure: keeps its place",
			v: func() *view {
				v := pool(runningOn(pending(2, nil), 1, "n0", "n1"), "n0", "n1")
				delete(v.connected, "n1")
				return v
			}(),
			want: want{after: testPolicy.Recheck, noWrites: true}},
		{name: "a rejoin racing a loss: the node registered again is another run, the member is lost",
			v: func() *view {
				v := pool(runningOn(pending(2, func(s *pb.JobSpec) { s.MinNodes = 1 }), 1, "n0", "n1"), "n0", "n1")
				v.nodes["n1"].Instance, v.nodes["n1"].RegisteredUnixMs = "n1-2", ms(t0)
				return v
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1", gen: "n0", strikes: map[string]int{"n1": 1}}},
		{name: "a lost node's place taken by a stable spare",
			v:    pool(runningOn(pending(2, nil), 1, "n0", "n1"), "n0", "n2"),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1 (ranks 4-7); spare nodes joined: n2", gen: "n0,n2", strikes: map[string]int{"n1": 1}}},
		{name: "a spare still cooling is not taken",
			v: func() *view {
				v := pool(runningOn(pending(2, nil), 1, "n0", "n1"), "n0", "n2")
				v.nodePolicy["n2"] = nodePolicy{Strikes: 1, CooldownUntil: ms(t0.Add(time.Second))}
				return v
			}(),
			want: want{phase: pb.JobState_PENDING, reason: "paused after generation 1: node lost: n1 (ranks 4-7); waiting for nodes: 1 live of at least 2",
				strikes: map[string]int{"n1": 1}, policy: &jobPolicy{PendingSince: ms(t0)}}},
		{name: "a strike doubles the cooldown of a struck node",
			v: func() *view {
				v := pool(runningOn(pending(2, func(s *pb.JobSpec) { s.MinNodes = 1 }), 1, "n0", "n1"), "n0")
				v.nodePolicy["n1"] = nodePolicy{Strikes: 2}
				return v
			}(),
			want: want{phase: pb.JobState_RUNNING, gen: "n0", strikes: map[string]int{"n1": 3}}},
		{name: "too few left for min nodes: paused",
			v:    pool(runningOn(pending(2, func(s *pb.JobSpec) { s.RendezvousTimeoutMs = 9000 }), 1, "n0", "n1"), "n0"),
			want: want{phase: pb.JobState_PENDING, reason: "waiting for nodes: 1 live of at least 2", strikes: map[string]int{"n1": 1}, policy: &jobPolicy{PendingSince: ms(t0)}, after: 9 * time.Second}},
		{name: "no restarts left: failed naming the first failure in time",
			v: func() *view {
				j := runningOn(pending(2, func(s *pb.JobSpec) { s.MaxRestarts = 0 }), 1, "n0", "n1")
				fail(j, 6, 1, t0)
				fail(j, 2, 7, t0.Add(-10*time.Millisecond)) // reported later, failed first
				j.policy.FailedSince = ms(t0.Add(-time.Second))
				return pool(j, "n0", "n1")
			}(),
			want: want{phase: pb.JobState_FAILED, reason: "rank 2 on n0 exited with code 7", policy: &jobPolicy{}}},
		{name: "hung ranks: the stopped one is named, the next generation counts the hang",
			v: func() *view {
				j := runningOn(pending(2, nil), 1, "n0", "n1")
				j.commit = &pb.Step{Step: 11, Generation: 1}
				hang(j, 1, 12, false, t0.Add(-3*time.Second)) // waits in a collective, silent longest
				hang(j, 6, 12, true, t0.Add(-2900*time.Millisecond))
				fail(j, 5, 1, t0.Add(10*time.Millisecond)) // its peer, ended when the hung rank was killed
				j.policy.FailedSince = ms(t0.Add(-time.Second))
				return pool(j, "n0", "n1")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "rank 6 on n1 hung: no progress for 3s after step 12; resuming after step 11",
				gen: "n0,n1", genNum: 2, dp: 2, resume: 11, hangs: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check(t, decide(tc.v, t0, testPolicy), tc.want) })
	}
}

// hang reports rank hung after step, silent since last.
func hang(j *job, rank int32, step int64, stopped bool, last time.Time) *job {
	j.exits[rank] = &pb.RankExit{Rank: rank, Code: 124, FailedAtUnixMs: ms(last), Error: fmt.Sprintf("hung: no progress for 3s after step %d", step),
		Hang: &pb.Hang{LastStep: step, IdleMs: ms(t0) - ms(last), Stopped: stopped, FoundUnixMs: ms(t0)}}
	j.exitOrder = append(j.exitOrder, rank)
	return j
}

// TestCausedBefore: which of two failures caused the other. A rank that
// ended comes before a hung one; hung ranks by stopped, then step, then
// time silent.
func TestCausedBefore(t *testing.T) {
	ended := func(at int64) *pb.RankExit { return &pb.RankExit{Code: 1, FailedAtUnixMs: at} }
	// hung after step, silent since at, found at at+50.
	hung := func(step int64, stopped bool, at int64) *pb.RankExit {
		return &pb.RankExit{Code: 124, FailedAtUnixMs: at, Hang: &pb.Hang{LastStep: step, Stopped: stopped, FoundUnixMs: at + 50}}
	}
	tests := []struct {
		name string
		a, b *pb.RankExit
		want bool
	}{
		{"ended first in time", ended(10), ended(20), true},
		{"ended later", ended(20), ended(10), false},
		{"a time before none", ended(20), ended(0), true},
		{"none before a time", ended(0), ended(20), false},
		{"ended before the hang was found", ended(59), hung(5, true, 10), true},
		{"hung after a peer ended", hung(5, true, 10), ended(59), false},
		{"ended once the hang was found (killed with it)", ended(60), hung(5, true, 10), false},
		{"hung, then its peer ended", hung(5, true, 10), ended(60), true},
		{"ended without a time: not before a hang", ended(0), hung(5, true, 10), false},
		{"a hang before an end without a time", hung(5, true, 10), ended(0), true},
		{"stopped before waiting", hung(9, true, 50), hung(5, false, 10), true},
		{"waiting after stopped", hung(5, false, 10), hung(9, true, 50), false},
		{"lower step first", hung(4, false, 50), hung(5, false, 10), true},
		{"higher step after", hung(5, false, 10), hung(4, false, 50), false},
		{"same step: silent longest first", hung(5, false, 10), hung(5, false, 11), true},
		{"same step: silent shorter after", hung(5, false, 11), hung(5, false, 10), false},
	}
	for _, tc := range tests {
		if got := causedBefore(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: causedBefore = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDecideGrowPauseResume(t *testing.T) {
	atBoundary := func(j *job) *job {
		j.commit, j.step = &pb.Step{Step: 10, Generation: j.gen.Number}, &pb.Step{Step: 10}
		return j
	}
	shrunk := func(edit func(*pb.JobSpec)) *job {
		return runningOn(pending(2, func(s *pb.JobSpec) {
			s.MinNodes = 1
			if edit != nil {
				edit(s)
			}
		}), 2, "n0")
	}
	tests := []struct {
		name string
		v    *view
		want want
	}{
		{name: "grow back at a committed step with a stable node",
			v:    pool(atBoundary(shrunk(nil)), "n0", "n1"),
			want: want{phase: pb.JobState_RUNNING, reason: "nodes joined: n1; resuming after step 10", gen: "n0,n1", genNum: 3, dp: 2, resume: 10}},
		{name: "a commit one step behind the progress loses at most that step",
			v: func() *view {
				j := atBoundary(shrunk(nil))
				j.step = &pb.Step{Step: 11}
				return pool(j, "n0", "n1")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "nodes joined: n1; resuming after step 10", gen: "n0,n1", genNum: 3, dp: 2, resume: 10}},
		{name: "not at a committed step: wait for the next commit",
			v: func() *view {
				j := atBoundary(shrunk(nil))
				j.step = &pb.Step{Step: 12}
				return pool(j, "n0", "n1")
			}(),
			want: want{after: testPolicy.Recheck, noWrites: true}},
		{name: "a node registered less than stable-for ago waits, and is looked at again then",
			v: func() *view {
				v := pool(atBoundary(shrunk(nil)), "n0", "n1")
				v.nodes["n1"].RegisteredUnixMs = ms(t0.Add(-1900 * time.Millisecond))
				return v
			}(),
			want: want{after: 100 * time.Millisecond, noWrites: true}},
		{name: "a loss during a grow-back: recovery, the newcomer taken as a spare",
			v: func() *view {
				j := atBoundary(runningOn(pending(3, func(s *pb.JobSpec) { s.MinNodes = 1 }), 2, "n0", "n1"))
				return pool(j, "n0", "n2")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "node lost: n1 (ranks 4-7); spare nodes joined: n2", gen: "n0,n2", strikes: map[string]int{"n1": 1}}},
		{name: "no restarts left: no grow back",
			v:    pool(atBoundary(shrunk(func(s *pb.JobSpec) { s.MaxRestarts = 1 })), "n0", "n1"),
			want: want{after: testPolicy.Recheck, noWrites: true}},
		{name: "paused: resumed once a layout fits",
			v: func() *view {
				j := shrunk(func(s *pb.JobSpec) { s.MinNodes = 2 })
				j.state = &pb.JobState{Phase: pb.JobState_PENDING, Reason: "paused after generation 2: ..."}
				j.policy.PendingSince = ms(t0.Add(-time.Second))
				return pool(j, "n0", "n1")
			}(),
			want: want{phase: pb.JobState_RUNNING, reason: "resumed on 2 nodes after a pause", gen: "n0,n1", genNum: 3, dp: 2, policy: &jobPolicy{}}},
		{name: "paused past the rendezvous timeout: failed",
			v: func() *view {
				j := shrunk(func(s *pb.JobSpec) { s.MinNodes, s.RendezvousTimeoutMs = 2, 500 })
				j.state = &pb.JobState{Phase: pb.JobState_PENDING, Reason: "paused after generation 2: node lost"}
				j.policy.PendingSince = ms(t0.Add(-500 * time.Millisecond))
				return pool(j, "n0")
			}(),
			want: want{phase: pb.JobState_FAILED, reason: "paused for 500ms without enough nodes: paused after generation 2: node lost", policy: &jobPolicy{}}},
		{name: "paused, a member disconnected: not taken back",
			v: func() *view {
				j := runningOn(pending(2, nil), 1, "n0", "n1")
				j.state = &pb.JobState{Phase: pb.JobState_PENDING, Reason: "paused"}
				j.policy.PendingSince = ms(t0)
				v := pool(j, "n0", "n1")
				delete(v.connected, "n1")
				return v
			}(),
			want: want{noWrites: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check(t, decide(tc.v, t0, testPolicy), tc.want) })
	}
}

func TestDecideStragglers(t *testing.T) {
	windows := func(ranks map[int32][]float64) *nodeTimes {
		n := &nodeTimes{}
		for i := range 3 {
			w := &pb.RankTimes{}
			for r, secs := range ranks {
				if i < len(secs) {
					w.Add(r, secs[i], 0)
				}
			}
			n.push(w, 3)
		}
		return n
	}
	// Two coordinators, one node each, as their flushes summarise them.
	job := func(evict bool, slow []float64) *view {
		j := runningOn(pending(2, func(s *pb.JobSpec) { s.Tp, s.Pp, s.MinNodes, s.EvictStragglers = 1, 1, 1, evict }), 1, "n0", "n1")
		a := summarize(map[string]*nodeTimes{"n0": windows(map[int32][]float64{0: {.010, .010, .010}, 1: {.011, .011, .011}, 2: {.010, .010, .010}, 3: {.010, .010, .010}})}, nil, 3, testPolicy.StragglerFactor, false)
		b := summarize(map[string]*nodeTimes{"n1": windows(map[int32][]float64{4: {.010, .010, .010}, 5: {.010, .010, .010}, 6: {.010, .010, .010}, 7: slow})}, []*pb.TimesSummary{a}, 3, testPolicy.StragglerFactor, false)
		j.times = mergeTimes([]*pb.TimesSummary{a, b})
		return pool(j, "n0", "n1")
	}
	tests := []struct {
		name string
		v    *view
		want want
	}{
		// The median of the latest means is 0.010: 0.05 is 5x it.
		{name: "slow in each of the last three windows: flagged", v: job(false, []float64{.05, .05, .05}),
			want: want{stragg: []int32{7}, after: 0}},
		{name: "one normal window among three: not flagged", v: job(false, []float64{.05, .011, .05}),
			want: want{stragg: []int32{}, after: testPolicy.Recheck, noWrites: true}},
		{name: "evicted: the job goes on without the node, struck", v: job(true, []float64{.05, .05, .05}),
			want: want{phase: pb.JobState_RUNNING, reason: "stragglers evicted: n1", gen: "n0", stragg: []int32{7}, strikes: map[string]int{"n1": 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.v, t0, testPolicy)
			check(t, d, tc.want)
			if len(tc.want.stragg) > 0 && d.stragglers.Ranks[0].Ratio != 5 {
				t.Errorf("ratio = %v, want 5", d.stragglers.Ranks[0].Ratio)
			}
		})
	}
}

// TestForget: the oldest ended jobs beyond keep, never one still running.
func TestForget(t *testing.T) {
	var jobs []*job
	for i, phase := range []pb.JobState_Phase{pb.JobState_SUCCEEDED, pb.JobState_RUNNING, pb.JobState_FAILED, pb.JobState_CANCELLED, pb.JobState_PENDING} {
		jobs = append(jobs, &job{spec: &pb.JobSpec{Id: string(rune('a' + i))}, state: &pb.JobState{Phase: phase}})
	}
	for _, tc := range []struct {
		keep int
		want string
	}{{0, "a,c,d"}, {1, "a,c"}, {2, "a"}, {3, ""}, {100, ""}} {
		if got := strings.Join(forget(jobs, tc.keep), ","); got != tc.want {
			t.Errorf("forget keep %d = %q, want %q", tc.keep, got, tc.want)
		}
	}
}

func TestCommitOf(t *testing.T) {
	g := &pb.Generation{Number: 3, Dp: 2, Members: []*pb.Member{{Node: "a"}, {Node: "b"}}}
	st := func(gen int64, steps ...int64) *pb.Stored {
		s := &pb.Stored{}
		for _, n := range steps {
			s.Steps = append(s.Steps, &pb.StoredStep{Step: n, Generation: gen, Holders: []string{"x", "y"}, Backup: n%10 == 0})
		}
		return s
	}
	tests := []struct {
		name    string
		records map[string]*pb.Stored
		prev    *pb.Step
		want    string
	}{
		{"nobody stored", nil, nil, "none"},
		{"one member missing", map[string]*pb.Stored{"a": st(3, 5)}, nil, "none"},
		{"the newest common step", map[string]*pb.Stored{"a": st(3, 5, 6, 7), "b": st(3, 4, 5, 6)}, nil, "6 backup=false copies=2"},
		{"a backup step", map[string]*pb.Stored{"a": st(3, 10, 11), "b": st(3, 10)}, nil, "10 backup=true copies=2"},
		{"an older generation's records do not count", map[string]*pb.Stored{"a": st(2, 8), "b": st(3, 8)}, nil, "none"},
		{"not after the commit", map[string]*pb.Stored{"a": st(3, 6), "b": st(3, 6)}, &pb.Step{Step: 6, Generation: 3}, "none"},
		{"after a resume from an older backup", map[string]*pb.Stored{"a": st(3, 6), "b": st(3, 6)}, &pb.Step{Step: 9, Generation: 2}, "6 backup=false copies=2"},
		{"a non-member's record is ignored", map[string]*pb.Stored{"a": st(3, 6), "b": st(3, 6), "c": st(3, 7)}, nil, "6 backup=false copies=2"},
	}
	for _, tc := range tests {
		c := commitOf(g, tc.records, tc.prev)
		got := "none"
		if c != nil {
			got = fmt.Sprintf("%d backup=%v copies=%d", c.Step, c.Backup, len(c.Copies))
			if c.Generation != 3 || c.Dp != 2 || !c.Checkpointed {
				t.Errorf("%s: commit %v", tc.name, c)
			}
		}
		if got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestRestorePoint(t *testing.T) {
	copies := []*pb.Copies{{Node: "a", Holders: []string{"a", "b"}}, {Node: "b", Holders: []string{"b", "c"}}}
	tests := []struct {
		name   string
		live   []string
		backup *pb.Step
		want   string
	}{
		{"every writer alive", []string{"a", "b", "c"}, nil, "12 copies=2 backup=false addrs=[a:1 b:1] [b:1 c:1]"},
		{"a writer gone, its replica alive", []string{"b", "c"}, nil, "12 copies=2 backup=false addrs=[ b:1] [b:1 c:1]"},
		{"both holders of a's files gone: the backup", []string{"c"}, &pb.Step{Step: 8}, "8 copies=0 backup=true"},
		{"both holders gone, no backup", []string{"c"}, nil, "lost: the checkpoint of step 12 is lost: no live node holds node a's files of it (held by a, b)"},
	}
	for _, tc := range tests {
		v := &view{job: &job{commit: &pb.Step{Step: 12, Copies: copies}, backup: tc.backup}, nodes: map[string]*pb.Node{}, connected: map[string]bool{}}
		for _, n := range tc.live {
			v.nodes[n], v.connected[n] = &pb.Node{Name: n, CheckpointAddr: n + ":1"}, true
		}
		rp := restorePoint(v)
		resume, cs, fromBackup, lost := rp.resume, rp.copies, rp.fromBackup, rp.lost
		got := fmt.Sprintf("%d copies=%d backup=%v", resume, len(cs), fromBackup)
		if len(cs) > 0 {
			got += " addrs="
			for i, c := range cs {
				got += strings.Repeat(" ", min(i, 1)) + fmt.Sprint(c.Addrs)
			}
		}
		if lost != "" {
			got = "lost: " + lost
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	// A shared directory's commit has no copies: nothing to check.
	v := &view{job: &job{commit: &pb.Step{Step: 4}}}
	if rp := restorePoint(v); rp.resume != 4 || rp.lost != "" {
		t.Errorf("shared directory: %d %q", rp.resume, rp.lost)
	}
}

// TestStoredCounts: the view counts, per generation and step, the nodes
// whose record holds it, through replaced and deleted records, and finds
// a commit only once every member has the step.
func TestStoredCounts(t *testing.T) {
	g := &pb.Generation{Number: 2, Dp: 1, Members: []*pb.Member{{Node: "a"}, {Node: "b"}}}
	c := &cache{jobs: map[string]*jobEntry{"j": {gen: g, commit: &pb.Step{Step: 4, Generation: 1}, commitRv: 9}}}
	e := c.jobs["j"]
	rec := func(steps ...int64) *pb.Stored {
		r := &pb.Stored{}
		for _, s := range steps {
			r.Steps = append(r.Steps, &pb.StoredStep{Step: s, Generation: 2, Holders: []string{"x"}})
		}
		return r
	}
	e.setStored("a", rec(5, 6))
	if got, _, rv := c.nextCommit("j", g); got != nil || rv != 9 {
		t.Fatalf("one member stored: commit %v (rev %d), want none", got, rv)
	}
	e.setStored("b", rec(5))
	if got, prev, _ := c.nextCommit("j", g); got == nil || got.Step != 5 || prev != 4 {
		t.Fatalf("both stored 5: commit %v after %d, want 5 after 4", got, prev)
	}
	e.setStored("a", rec(6)) // a's record replaced: 5 is no longer a's
	if got, _, _ := c.nextCommit("j", g); got != nil {
		t.Fatalf("a replaced its record: commit %v, want none", got)
	}
	if e.storedN[[2]int64{2, 5}] != 1 || e.storedN[[2]int64{2, 6}] != 1 {
		t.Errorf("counts %v, want step 5: 1, step 6: 1", e.storedN)
	}
	e.setStored("b", nil)
	if len(e.storedN) != 1 || len(e.stored) != 1 {
		t.Errorf("after b's record went: counts %v, records %d", e.storedN, len(e.stored))
	}
}

// TestStoredBlocks: a node's record is the one of the block written last
// that has it, whatever order the blocks come in (a listing is in key
// order); a block rewritten without a node, or deleted, takes away the
// records it gave.
func TestStoredBlocks(t *testing.T) {
	e := &jobEntry{}
	rec := func(step int64) *pb.Stored { return &pb.Stored{Steps: []*pb.StoredStep{{Step: step, Generation: 1}}} }
	records := func() string {
		var out []string
		for _, n := range slices.Sorted(maps.Keys(e.stored)) {
			out = append(out, fmt.Sprintf("%s:%d", n, e.stored[n].Steps[0].Step))
		}
		return strings.Join(out, " ")
	}
	e.setBlock("r1", 20, map[string]*pb.Stored{"a": rec(5), "b": rec(5)})
	e.setBlock("r0", 10, map[string]*pb.Stored{"a": rec(3), "c": rec(3)}) // older: a keeps r1's
	if got := records(); got != "a:5 b:5 c:3" {
		t.Errorf("after r1 then the older r0: %s, want a:5 b:5 c:3", got)
	}
	e.setBlock("r1", 30, map[string]*pb.Stored{"b": rec(6)}) // a gone from r1
	if got := records(); got != "b:6 c:3" {
		t.Errorf("r1 rewritten with b alone: %s, want b:6 c:3", got)
	}
	e.setBlock("r0", 0, nil)
	if got := records(); got != "b:6" || e.storedN[[2]int64{1, 6}] != 1 || len(e.storedN) != 1 {
		t.Errorf("r0 deleted: %s, counts %v; want b:6", got, e.storedN)
	}
}

// TestMemberDomains: a member's failure domain is its node's, else its
// NVLink domain, else none (the node alone).
func TestMemberDomains(t *testing.T) {
	spec := &pb.JobSpec{Id: "j", Nodes: 3, GpusPerNode: 1, Tp: 1, Pp: 1}
	g := buildGeneration(spec, 1, []*pb.Node{{Name: "a", FailureDomain: "rack1", NvlinkDomain: "nvl0"}, {Name: "b", NvlinkDomain: "nvl0"}, {Name: "c"}}, fitting{grid: pb.SpecGrid(spec)}, 3, restore{}, "")
	var got []string
	for _, m := range g.Members {
		got = append(got, m.Node+"="+m.Domain)
	}
	if want := "[a=rack1 b=nvl0 c=]"; fmt.Sprint(got) != want {
		t.Errorf("domains %v, want %s", got, want)
	}
}

// TestDecideFence: a generation opens only once every rank of an earlier
// generation that may have run is surely stopped: its node said so, or
// registered again as another run, or its lease ended FenceMargin before
// (and a revoked lease's time left has passed), or FenceMargin has passed
// since the last deadline its stream gave the lease its key had.
func TestDecideFence(t *testing.T) {
	p := testPolicy
	p.FenceMargin = time.Second
	// Generation 2 on n0 and n2, made after generation 1 on n0 and n1
	// opened: n0's and n1's ranks of generation 1 may still run.
	waiting := func(edit func(j *job, v *view)) *view {
		j := runningOn(pending(2, nil), 2, "n0", "n2")
		j.open = 1
		j.gen.Stopping = []*pb.Member{{Node: "n0", Instance: "n0-1"}, {Node: "n1", Instance: "n1-1"}}
		j.stopped = map[string]int64{}
		v := pool(j, "n0", "n2") // n1's lease has ended
		v.fences = map[string]fence{}
		if edit != nil {
			edit(j, v)
		}
		return v
	}
	tests := []struct {
		name     string
		v        *view
		wantOpen bool
		open     int64 // the generation opened, when wantOpen; 0: 2
		after    time.Duration
		goneAt   int64 // GoneSince of n1 written; 0: none
	}{
		{name: "n0 has not said, n1 just seen gone", v: waiting(nil), after: time.Second, goneAt: ms(t0)},
		{name: "n0 said, n1 gone a margin ago", wantOpen: true, v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-time.Second))}
		})},
		{name: "n0 said of generation 1 only", v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 1
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-time.Second))}
		})},
		// Generations 2 and 3 were made and never opened; generation 4 waits
		// for what generation 1 ran. n0 left the job after generation 1 (it
		// runs nothing below 2): enough, since no rank of 2 or 3 ever ran.
		// (Asking for 4 left the generation waiting for ever: the chaos
		// test, seed 11.)
		{name: "n0 said of generation 1 only, and no later one opened", wantOpen: true, open: 4, v: waiting(func(j *job, v *view) {
			j.gen.Number = 4
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-time.Second))}
		})},
		{name: "n1 revoked with 3s left", after: 3500 * time.Millisecond, v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-5 * time.Second))}
			v.fences["n1"] = fence{Instance: "n1-1", UntilMs: ms(t0.Add(2500 * time.Millisecond))}
		})},
		// The pool found n1 dead after its last window deadline had
		// passed (its stream was cut with it): its key is seen gone just
		// now, but the window fence of the lease it had is the latest its
		// ranks ran to.
		{name: "n1's window fence of its lease: a margin after its deadline", wantOpen: true, v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0)}
			v.fences["n1"] = fence{Instance: "n1-1", UntilMs: ms(t0.Add(-1500 * time.Millisecond)), Window: true, Lease: 7, exact: true}
		})},
		{name: "n1's window fence of its lease, its deadline not passed", after: 1700 * time.Millisecond, v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0)}
			v.fences["n1"] = fence{Instance: "n1-1", UntilMs: ms(t0.Add(700 * time.Millisecond)), Window: true, Lease: 7, exact: true}
		})},
		// The same fence, of another lease of the run (it registered again
		// since): its key's end is all there is to go by.
		{name: "a window fence of another lease: a margin after n1 was seen gone", after: time.Second, v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0)}
			v.fences["n1"] = fence{Instance: "n1-1", UntilMs: ms(t0.Add(-1500 * time.Millisecond)), Window: true, Lease: 7}
		})},
		{name: "an earlier run's fence counts for nothing", wantOpen: true, v: waiting(func(j *job, v *view) {
			j.stopped["n0"] = 2
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-5 * time.Second))}
			v.fences["n1"] = fence{Instance: "n1-0", UntilMs: ms(t0.Add(time.Hour))}
		})},
		{name: "n0 registered again as another run", wantOpen: true, v: waiting(func(j *job, v *view) {
			v.nodes["n0"] = &pb.Node{Name: "n0", Gpus: 4, Instance: "n0-2"}
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-time.Second))}
		})},
		{name: "n0 disconnected, lease alive: waits", v: waiting(func(j *job, v *view) {
			delete(v.connected, "n0")
			j.policy.GoneSince = map[string]int64{"n1": ms(t0.Add(-time.Second))}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.v, t0, p)
			if got := d.open == cmp.Or(tc.open, 2); got != tc.wantOpen {
				t.Fatalf("opened %v (open %d), want %v", got, d.open, tc.wantOpen)
			}
			if d.gen != nil || d.state != nil {
				t.Fatalf("wrote generation %v, state %v: want only the gate", d.gen, d.state)
			}
			if d.after != tc.after {
				t.Errorf("after = %s, want %s", d.after, tc.after)
			}
			if tc.goneAt != 0 && (d.policy == nil || d.policy.GoneSince["n1"] != tc.goneAt) {
				t.Errorf("policy = %+v, want n1 gone at %d", d.policy, tc.goneAt)
			}
		})
	}

	// A member of the waiting generation lost: the next generation waits
	// for the same ranks (its predecessor never ran any).
	v := waiting(func(j *job, v *view) { j.spec.MinNodes = 1 })
	delete(v.nodes, "n2")
	d := decide(v, t0.Add(10*time.Second), p)
	if d.gen == nil || d.gen.Number != 3 || d.open != 0 {
		t.Fatalf("after losing n2 before opening: generation %v, open %d; want generation 3, not open", d.gen, d.open)
	}
	if got := memberNames(&pb.Generation{Members: d.gen.Stopping}); got != "n0,n1" {
		t.Errorf("generation 3 waits for %s, want n0,n1 (generation 2 never opened)", got)
	}
	// An opened generation's successor waits for its members.
	j := runningOn(pending(2, nil), 1, "n0", "n1")
	j.spec.MinNodes = 1
	v = pool(j, "n0") // n1 lost
	d = decide(v, t0, p)
	if d.gen == nil || memberNames(&pb.Generation{Members: d.gen.Stopping}) != "n0,n1" || d.open != 0 {
		t.Fatalf("after generation 1 ran: generation %v, open %d; want one waiting for n0,n1", d.gen, d.open)
	}
}

// TestDecideFallback: a generation that could not restore its resume step
// makes the next one resume from the newest earlier kept commit, which it
// writes as the commit; the broken step is never tried again, and when no
// kept step is left the job fails naming each one and why.
func TestDecideFallback(t *testing.T) {
	shared := func(edit func(j *job)) *view {
		j := runningOn(pending(2, func(s *pb.JobSpec) { s.CheckpointDir = "/shared"; s.MaxRestarts = 5 }), 2, "n0", "n1")
		j.gen.ResumeStep = 28
		j.commit = &pb.Step{Step: 28, Generation: 1, Earlier: []*pb.Step{{Step: 27, Generation: 1}}}
		fail(j, 1, 76, t0.Add(-2*time.Second))
		j.exits[1].UnrestorableStep, j.exits[1].Error = 28, "step 28 has no manifest"
		j.policy.FailedSince = ms(t0.Add(-2 * time.Second)) // settled
		if edit != nil {
			edit(j)
		}
		return pool(j, "n0", "n1")
	}
	d := decide(shared(nil), t0, testPolicy)
	check(t, d, want{phase: pb.JobState_RUNNING, gen: "n0,n1", genNum: 3, dp: 2, resume: 27, policy: &jobPolicy{},
		reason: "passed over (step 28: rank 1 could not restore it: step 28 has no manifest), so from step 27"})
	if d.commit.GetStep() != 27 || len(d.commit.GetEarlier()) != 0 {
		t.Errorf("commit written %v, want step 27", d.commit)
	}
	if u := d.gen.GetUnrestorable(); len(u) != 1 || u[0].Step != 28 {
		t.Errorf("unrestorable %v, want step 28", u)
	}

	// Generation 3 could not restore step 27 either: nothing kept is left.
	d = decide(shared(func(j *job) {
		j.gen.Number, j.gen.ResumeStep = 3, 27
		j.open = 3
		j.gen.Unrestorable = []*pb.Unrestorable{{Step: 28, Why: "rank 1 could not restore it: step 28 has no manifest"}}
		j.commit = &pb.Step{Step: 27, Generation: 1}
		j.exits[1].UnrestorableStep, j.exits[1].Error = 27, "shard checksum mismatch"
	}), t0, testPolicy)
	check(t, d, want{phase: pb.JobState_FAILED, reason: "no kept step can be restored: step 27: rank 1 could not restore it: shard checksum mismatch"})

	// A failure that is not about restoring resumes from the commit.
	d = decide(shared(func(j *job) { j.exits[1].UnrestorableStep = 0 }), t0, testPolicy)
	check(t, d, want{phase: pb.JobState_RUNNING, gen: "n0,n1", genNum: 3, dp: 2, resume: 28, policy: &jobPolicy{}})
	if d.commit != nil {
		t.Errorf("commit written %v, want none (the resume point is the commit)", d.commit)
	}
}

// TestDecideAwaitHolders: when every holder of some node's files of the
// kept steps is away (cut off with the members), the job pauses rather
// than fails, resumes from the step when the same runs of the holders'
// agents come back, and fails once the rendezvous timeout has passed since
// the pause began. A broken step fails at once: nothing comes back for it.
func TestDecideAwaitHolders(t *testing.T) {
	const timeout = 5 * time.Minute
	held := func(edit func(j *job)) *job {
		j := runningOn(pending(2, func(s *pb.JobSpec) { s.MinNodes = 1; s.RendezvousTimeoutMs = timeout.Milliseconds() }), 2, "n0", "n1")
		j.gen.ResumeStep = 10
		j.commit = &pb.Step{Step: 12, Generation: 2, Copies: []*pb.Copies{
			{Node: "n0", Holders: []string{"n0", "n1"}, Instances: []string{"n0-1", "n1-1"}},
			{Node: "n1", Holders: []string{"n1", "n0"}, Instances: []string{"n1-1", "n0-1"}}}}
		if edit != nil {
			edit(j)
		}
		return j
	}
	// n0 and n1 cut off together; n2 is free: the job pauses.
	lost := held(nil)
	d := decide(pool(lost, "n2"), t0, testPolicy)
	check(t, d, want{phase: pb.JobState_PENDING, policy: &jobPolicy{PendingSince: ms(t0)}, after: timeout, strikes: map[string]int{"n0": 1, "n1": 1},
		reason: "node lost: n0 (ranks 0-3), n1 (ranks 4-7); the checkpoint of step 12 is lost: no live node holds node n0's files of it (held by n0, n1), and the job has no backup tier (--checkpoint-backup); waiting for its holders"})

	paused := func(since time.Duration) *job {
		return held(func(j *job) {
			j.state = &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1, Reason: "paused after generation 2: ...; the checkpoint of step 12 is lost: no live node holds node n0's files of it (held by n0, n1), and the job has no backup tier (--checkpoint-backup); waiting for its holders"}
			j.policy.PendingSince = ms(t0.Add(-since))
		})
	}
	// Still away a minute later: nothing written, look again at the deadline.
	d = decide(pool(paused(time.Minute), "n2"), t0, testPolicy)
	check(t, d, want{after: timeout - time.Minute})

	// The same runs come back: generation 3 resumes from step 12.
	v := pool(paused(time.Minute), "n0", "n1", "n2")
	d = decide(v, t0, testPolicy)
	check(t, d, want{phase: pb.JobState_RUNNING, gen: "n0,n1", genNum: 3, dp: 2, resume: 12, policy: &jobPolicy{}})

	// Restarted agents hold nothing: still paused.
	v = pool(paused(time.Minute), "n0", "n1", "n2")
	v.nodes["n0"].Instance, v.nodes["n1"].Instance = "n0-2", "n1-2"
	check(t, decide(v, t0, testPolicy), want{after: timeout - time.Minute})

	// The timeout passes: the job fails, naming the step.
	d = decide(pool(paused(timeout), "n2"), t0, testPolicy)
	check(t, d, want{phase: pb.JobState_FAILED, policy: &jobPolicy{},
		reason: "the checkpoint of step 12 is lost: no live node holds node n0's files of it (held by n0, n1), and the job has no backup tier (--checkpoint-backup); its holders did not come back within 5m0s"})

	// No kept step that holders could bring back: fails at once.
	broken := held(func(j *job) {
		j.commit.Copies = nil
		fail(j, 1, 76, t0.Add(-2*time.Second))
		j.exits[1].UnrestorableStep, j.exits[1].Error = 12, "step 12 has no manifest"
		j.policy.FailedSince = ms(t0.Add(-2 * time.Second))
	})
	check(t, decide(pool(broken, "n0", "n1"), t0, testPolicy), want{phase: pb.JobState_FAILED,
		reason: "no kept step can be restored: step 12: rank 1 could not restore it: step 12 has no manifest"})
}

// testCache is a cache fed by hand, each write at the next revision.
type testCache struct {
	*cache
	k   keys
	rev int64
}

func newTestCache() *testCache {
	k := keys("/v/")
	return &testCache{cache: newCache(nil, k, slog.New(slog.NewTextHandler(io.Discard, nil))), k: k}
}

// kv is key's value at the next revision, on lease (0: none).
func (c *testCache) kv(key, value string, lease int64) *mvccpb.KeyValue {
	c.rev++
	return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: c.rev, ModRevision: c.rev, Lease: lease}
}

// reset lists kvs (made by kv) as the cache's first view.
func (c *testCache) reset(kvs ...*mvccpb.KeyValue) { c.cache.reset(c.rev, kvs) }

// put writes key at the next revision; del deletes it.
func (c *testCache) put(key, value string, lease int64) {
	kv := c.kv(key, value, lease)
	c.apply(c.rev, []*clientv3.Event{{Type: clientv3.EventTypePut, Kv: kv}})
}

func (c *testCache) del(key string) {
	c.rev++
	c.apply(c.rev, []*clientv3.Event{{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: c.rev}}})
}

// view is job id's view; tb fails without one.
func (c *testCache) view(tb testing.TB, id string) *view {
	tb.Helper()
	v, ok := c.cache.view(id)
	if !ok {
		tb.Fatalf("no view of job %s", id)
	}
	return v
}

// TestViewExactFence: a window fence is exact in a view only while it is
// of the lease the node's key had when the cache saw it go: not once the
// node has registered again and that key gone too, nor for a fence of the
// lease's time left.
func TestViewExactFence(t *testing.T) {
	c := newTestCache()
	k, put, del := c.k, c.put, c.del
	node := `{"name":"n1","host":"10.0.0.1","gpus":1}`
	c.reset(c.kv(k.spec("j"), `{"id":"j","nodes":1,"gpusPerNode":1,"command":["true"]}`, 0), c.kv(k.node("n1"), node, 7), c.kv(k.node("n2"), node, 9))
	exact := func(name string) bool {
		t.Helper()
		return c.view(t, "j").fences[name].exact
	}
	put(k.fence("n1"), `{"instance":"i1","until_ms":1,"window":true,"lease":7}`, 0)
	put(k.fence("n2"), `{"instance":"i2","until_ms":1,"lease":9}`, 0)
	if exact("n1") {
		t.Error("n1's fence exact while its key lives")
	}
	del(k.node("n1"))
	del(k.node("n2"))
	if !exact("n1") {
		t.Error("n1's window fence of lease 7 not exact once its key of lease 7 is gone")
	}
	if exact("n2") {
		t.Error("n2's fence of the lease's time left is exact")
	}
	put(k.node("n1"), node, 8)
	if exact("n1") {
		t.Error("n1's fence exact while it is registered again")
	}
	del(k.node("n1"))
	if exact("n1") {
		t.Error("n1's fence of lease 7 exact once its key of lease 8 is gone")
	}
}

// TestViewSharesPool: the views made while the pool does not change share
// its maps; a change gives the next view a pool with it, and leaves the
// maps of the views made before as they were.
func TestViewSharesPool(t *testing.T) {
	c := newTestCache()
	k := c.k
	node := func(name string) string { return fmt.Sprintf(`{"name":%q,"host":"10.0.0.1","gpus":1}`, name) }
	c.reset(c.kv(k.spec("j"), `{"id":"j","nodes":1,"gpusPerNode":1,"command":["true"]}`, 0), c.kv(k.node("n1"), node("n1"), 7))
	view := func() *view {
		t.Helper()
		return c.view(t, "j")
	}
	put := func(key, value string) { c.put(key, value, 7) }
	v1, v2 := view(), view()
	if fmt.Sprintf("%p %p", v1.nodes, v1.connected) != fmt.Sprintf("%p %p", v2.nodes, v2.connected) {
		t.Error("two views of an unchanged pool do not share its maps")
	}
	put(k.node("n2"), node("n2"))
	put(k.conn("n1"), "c/1")
	v3 := view()
	if v3.nodes["n2"] == nil || !v3.connected["n1"] {
		t.Errorf("the view after n2 registered and n1 connected: nodes %v, connected %v", slices.Sorted(maps.Keys(v3.nodes)), v3.connected)
	}
	if v1.nodes["n2"] != nil || v1.connected["n1"] || len(v1.nodes) != 1 {
		t.Errorf("the view before changed with the pool: nodes %v, connected %v", slices.Sorted(maps.Keys(v1.nodes)), v1.connected)
	}
	// A job's field is not the pool: the view after it shares the pool.
	put(k.state("j"), `{"phase":"RUNNING"}`)
	if v4 := view(); fmt.Sprintf("%p", v4.nodes) != fmt.Sprintf("%p", v3.nodes) {
		t.Error("a job's state made a new pool")
	}
}
