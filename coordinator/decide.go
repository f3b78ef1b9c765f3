package coordinator

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// view is what decide reads: one job and the pool, as the cache held them
// at one revision. Its pool maps (nodes, connected, busy, nodePolicy) are
// shared with the other views of the same pool (cache.view): nothing
// writes to them; the job's and fences are its own.
type view struct {
	job *job
	// nodes are the registered nodes (their lease lives), by name.
	nodes map[string]*pb.Node
	// connected are the nodes whose agent has a Watch stream open.
	connected map[string]bool
	// busy names, for each node an unfinished job's generation holds (this
	// job's too), that job.
	busy map[string]string
	// gensRev is the revision of the generations key busy was derived at:
	// a generation is written only while it is still that.
	gensRev    int64
	nodePolicy map[string]nodePolicy
	// fences are the latest deadlines revoked nodes' agents may have (a
	// revocation ends a lease before the agent's own deadline), by node.
	fences map[string]fence
	// plan answers for the job's planner when it re-plans (Replan auto);
	// nil keeps the spec's tp and pp and changes dp alone.
	plan planner
}

// policy is the part of Config that decide reads.
type policy struct {
	FailureSettle    time.Duration
	FenceMargin      time.Duration
	StableFor        time.Duration
	StragglerFactor  float64
	StragglerWindows int
	// Recheck is how often a running job's compute times are looked at
	// for stragglers (they change every window, not at an event).
	Recheck time.Duration
}

func (c *Config) policy() policy {
	return policy{FailureSettle: c.FailureSettle, FenceMargin: c.FenceMargin, StableFor: c.StableFor, StragglerFactor: c.StragglerFactor,
		StragglerWindows: c.StragglerWindows, Recheck: c.Tick}
}

// decision is everything the leader does for a job after one look: the
// writes, which it makes in one transaction (all or none), what to log,
// and when to look again if nothing happens before.
type decision struct {
	state *pb.JobState   // the job's new state; nil: unchanged
	gen   *pb.Generation // the next generation; nil: none
	// commit is the commit the next generation resumes from, when it is
	// not the last one (an earlier kept step, the backup tier's): written
	// with the generation.
	commit     *pb.Step
	stragglers *pb.Stragglers // nil: unchanged
	// open is the generation number whose ranks may now start (every rank
	// of an earlier generation is stopped); 0: unchanged.
	open   int64
	policy *jobPolicy // the job's new timers; nil: unchanged
	// strikes are the nodes struck, with their policy after the strike.
	strikes map[string]nodePolicy
	// msg and args are the log line of what happened; "" for nothing worth
	// a line. warn marks one an operator should see.
	msg  string
	args []any
	warn bool
	// after is when to look again without an event; 0 for never.
	after time.Duration
}

// writes reports whether d changes anything in etcd.
func (d *decision) writes() bool {
	return d.state != nil || d.gen != nil || d.stragglers != nil || d.policy != nil || len(d.strikes) > 0 || d.open != 0
}

// wake makes d look again at t at the latest.
func (d *decision) wake(now, t time.Time) {
	if left := t.Sub(now); left > 0 && (d.after == 0 || left < d.after) {
		d.after = left
	}
}

func (d *decision) log(warn bool, msg string, args ...any) { d.msg, d.args, d.warn = msg, args, warn }

// decide is the leader's whole policy for one job: given the job and the
// pool at one revision and the time, what to write and when to look again.
// It reads no clock and does no I/O.
//
//   - Not yet frozen: wait for enough free connected nodes, then a last
//     call for more up to max_nodes, and freeze generation 1 on the most
//     nodes the layout works on; fail when the rendezvous timeout passes.
//   - Running: succeeded when every rank exited 0. A failure waits
//     FailureSettle for a node loss to show (a member disconnected at a
//     failure counts as lost at once), then the next generation runs on
//     the live members and free stable spares from the last commit; too few
//     nodes pause the job; no restarts left fail it. Lost nodes are struck.
//   - Stragglers are flagged and, when the job asks, evicted (struck).
//   - A job below its size grows back at a step boundary with stable nodes.
//   - Paused: resume once a layout of at least min_nodes is possible; fail
//     when the rendezvous timeout passes first. A job whose kept steps'
//     holders are all away pauses too, and resumes when they come back.
//   - Ended (succeeded, failed, cancelled): nothing.
func decide(v *view, now time.Time, p policy) decision {
	j := v.job
	switch {
	case j.terminal():
		return decision{}
	case j.gen == nil:
		return rendezvous(v, now)
	case j.state.GetPhase() == pb.JobState_PENDING:
		return resumePaused(v, now, p)
	default:
		return running(v, now, p)
	}
}

// member is the registered node of a generation's member, or nil when the
// member is lost: its lease ended, or the node registered again since (a
// restarted agent, whose ranks died with its earlier run).
func (v *view) member(m *pb.Member) *pb.Node {
	n := v.nodes[m.Node]
	if n == nil || m.Instance != "" && n.Instance != m.Instance {
		return nil
	}
	return n
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func at(ms int64) time.Time { return time.UnixMilli(ms) }

// stateIf is st when it differs from the job's current state, else nil.
func stateIf(j *job, st *pb.JobState) *pb.JobState {
	if proto.Equal(st, j.state) {
		return nil
	}
	return st
}

// rendezvous freezes the first generation of a pending job once enough
// free nodes are connected (and the last call for more has passed), or
// fails it when the rendezvous timeout passes first.
func rendezvous(v *view, now time.Time) decision {
	var d decision
	j, spec := v.job, v.job.spec
	pol := j.policy
	if pol.PendingSince == 0 {
		pol.PendingSince = ms(now)
	}
	free := freeNodes(v, spec)
	need, most := int(spec.Nodes), max(int(spec.MaxNodes), int(spec.Nodes))
	if len(free) < need {
		pol.EnoughSince = 0
		if t := time.Duration(spec.RendezvousTimeoutMs) * time.Millisecond; t > 0 {
			deadline := at(pol.PendingSince).Add(t)
			if !now.Before(deadline) {
				d.state = &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 1, FailedRank: -1,
					Reason: fmt.Sprintf("rendezvous timed out after %s: %s", t, waitingFor(v, spec, len(free)))}
				d.log(true, "job failed", "job", spec.Id, "reason", d.state.Reason)
				return d
			}
			d.wake(now, deadline)
		}
		d.state = stateIf(j, &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1, Reason: waitingFor(v, spec, len(free))})
		if !pol.equal(j.policy) {
			d.policy = &pol
		}
		return d
	}
	if pol.EnoughSince == 0 {
		pol.EnoughSince = ms(now)
	}
	if call := at(pol.EnoughSince).Add(time.Duration(spec.LastCallMs) * time.Millisecond); len(free) < most && now.Before(call) {
		d.wake(now, call) // last call: wait a little for more
		if !pol.equal(j.policy) {
			d.policy = &pol
		}
		return d
	}
	// The most nodes, up to max, on which the layout works.
	n := usableNodes(spec, min(len(free), most), need)
	if n == 0 {
		_, err := Layout(spec, need)
		d.state = &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 2, FailedRank: -1, Reason: fmt.Sprint(err)}
		d.log(true, "job failed", "job", spec.Id, "reason", d.state.Reason)
		return d
	}
	sh, _ := shapeOn(spec, pb.SpecGrid(spec), n)
	layout := sh.Layout
	// A job submitted to resume an earlier run's backup step (Submit wrote
	// it as the commit) starts there.
	var r restore
	why := ""
	if j.commit != nil {
		if r = restorePoint(v); r.fromBackup {
			why = fmt.Sprintf("an earlier run's step %d, from the backup tier", r.resume)
		}
	}
	grid := pb.SpecGrid(spec)
	grid.VPP = int32(sh.Virtual) // stored resolved: the files it writes are cut by it
	d.gen = buildGeneration(spec, 1, free[:n], fitting{n: n, grid: grid}, layout.DP, r, why)
	if v.plan != nil {
		if c, ok := v.plan.estimate(n, pb.SpecGrid(spec)); ok {
			d.gen.Estimate, d.gen.StepSeconds = c.String(), c.stepSec
		}
	}
	d.open = 1 // no earlier generation to wait for
	d.state = &pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1}
	d.policy = &jobPolicy{}
	d.log(false, "generation frozen", "job", spec.Id, "generation", 1, "nodes", memberNames(d.gen), "world", d.gen.World,
		"rendezvous", now.Sub(at(pol.PendingSince)).Round(time.Millisecond))
	return d
}

// running ends or replaces a running generation: succeeded when every rank
// exited 0; on a rank failure or a lost member, the next generation, a
// pause or the end.
func running(v *view, now time.Time, p policy) decision {
	j := v.job
	if j.open < j.gen.Number {
		pol := j.policy
		ok, until, waiting := fenced(v, now, p, &pol)
		var d decision
		if !pol.equal(j.policy) {
			d.policy = &pol
		}
		if ok {
			d.open = j.gen.Number
			d.log(false, "generation opened", "job", j.spec.Id, "generation", j.gen.Number)
			return d
		}
		if !until.IsZero() {
			d.wake(now, until)
		}
		// A member of this generation lost before it opened is acted on
		// below; nothing else is, until the generation runs.
		lost := false
		for _, m := range j.gen.Members {
			lost = lost || v.member(m) == nil
		}
		if !lost {
			d.log(false, "generation waits for earlier ranks to stop", "job", j.spec.Id, "generation", j.gen.Number, "nodes", someNames(waiting))
			return d
		}
	}
	var lost []string
	for _, m := range j.gen.Members {
		if v.member(m) == nil {
			lost = append(lost, m.Node)
		}
	}
	first := firstFailure(j)
	if first == nil && len(lost) == 0 {
		if len(j.exits) == int(j.gen.World) {
			d := decision{state: &pb.JobState{Phase: pb.JobState_SUCCEEDED, FailedRank: -1}}
			d.log(false, "job succeeded", "job", j.spec.Id, "generation", j.gen.Number)
			return d
		}
		if d := stragglers(v, now, p); d.gen != nil || d.stragglers != nil {
			return d
		}
		d := admit(v, now, p)
		if p.Recheck > 0 && d.gen == nil {
			d.wake(now, now.Add(p.Recheck)) // compute times change without an event
		}
		return d
	}
	var d decision
	pol := j.policy
	if pol.FailedSince == 0 {
		pol.FailedSince = ms(now)
	}
	if first != nil {
		// A member whose agent is gone from its stream when a rank fails is
		// most likely why (killed with its ranks): it is not trusted with
		// the next generation, and nothing is waited for.
		for _, m := range j.gen.Members {
			if v.member(m) != nil && !v.connected[m.Node] {
				lost = append(lost, m.Node)
			}
		}
	}
	if settle := at(pol.FailedSince).Add(p.FailureSettle); len(lost) == 0 && now.Before(settle) {
		d.wake(now, settle) // give a node loss behind this failure time to show
		if !pol.equal(j.policy) {
			d.policy = &pol
		}
		return d
	}
	st := &pb.JobState{Phase: pb.JobState_FAILED, FailedRank: -1, ExitCode: 1, LostNodes: lost}
	for _, n := range lost {
		for _, m := range j.gen.Members {
			if m.Node == n {
				for r := m.FirstRank; r < m.FirstRank+m.Ranks; r++ {
					st.LostRanks = append(st.LostRanks, r)
				}
			}
		}
	}
	if first != nil {
		st.FailedRank, st.ExitCode, st.FailedNode, st.Output = first.Rank, first.Code, memberOf(j.gen, first.Rank), first.Output
	}
	if len(lost) > 0 {
		parts := make([]string, len(lost))
		for i, n := range lost {
			for _, m := range j.gen.Members {
				if m.Node == n {
					parts[i] = fmt.Sprintf("%s (ranks %d-%d)", n, m.FirstRank, m.FirstRank+m.Ranks-1)
				}
			}
		}
		st.Reason = "node lost: " + strings.Join(parts, ", ")
	} else if first.Hang != nil {
		st.Reason = fmt.Sprintf("rank %d on %s %s", first.Rank, st.FailedNode, first.Error)
	} else {
		st.Reason = fmt.Sprintf("rank %d on %s exited with code %d", first.Rank, st.FailedNode, first.Code)
		if first.Error != "" {
			st.Reason += ": " + first.Error
		}
	}
	exclude := map[string]bool{}
	for _, n := range lost {
		exclude[n] = true
	}
	if d, ok := recoverWithout(v, now, p, st.Reason, exclude); ok {
		d.strikes = strike(v, now, p, lost, d.strikes)
		if d.gen != nil && first != nil && len(lost) == 0 {
			d.gen.Output = first.Output
			if first.Hang != nil {
				d.gen.Hangs++
			}
		}
		return d
	}
	d.strikes = strike(v, now, p, lost, nil)
	if restartsLeft(j) {
		// Too few live nodes: pause until enough come back, or the
		// rendezvous timeout passes.
		d.state = &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1,
			Reason: fmt.Sprintf("paused after generation %d: %s; %s", j.gen.Number, st.Reason, shortOf(v, exclude))}
		d.policy = &jobPolicy{PendingSince: ms(now)}
		d.log(true, "job paused", "job", j.spec.Id, "generation", j.gen.Number, "reason", st.Reason)
		if t := time.Duration(j.spec.RendezvousTimeoutMs) * time.Millisecond; t > 0 {
			d.wake(now, now.Add(t))
		}
		return d
	}
	d.state = st
	d.policy = &jobPolicy{}
	d.log(true, "job failed", "job", j.spec.Id, "generation", j.gen.Number, "reason", st.Reason)
	return d
}

// shortOf says how many nodes a paused job has and needs.
func shortOf(v *view, exclude map[string]bool) string {
	live := 0
	for _, m := range v.job.gen.Members {
		if v.member(m) != nil && !exclude[m.Node] {
			live++
		}
	}
	return fmt.Sprintf("waiting for nodes: %d live of at least %d", live, minNodes(v.job.spec))
}

// resumePaused restarts a paused job as soon as its live members and free
// stable nodes make a usable layout of at least min_nodes, or fails it
// when the rendezvous timeout passes first.
func resumePaused(v *view, now time.Time, p policy) decision {
	var d decision
	j := v.job
	pol := j.policy
	if pol.PendingSince == 0 {
		pol.PendingSince = ms(now) // paused by a version that kept no timer
	}
	most := max(int(j.spec.MaxNodes), int(j.spec.Nodes))
	var nodes []*pb.Node
	for _, m := range j.gen.Members {
		if n := v.member(m); n != nil && v.connected[m.Node] {
			nodes = append(nodes, n)
		}
	}
	for _, n := range stableFree(v, now, p, &d, nil) {
		if len(nodes) < most {
			nodes = append(nodes, n)
		}
	}
	if f, ok := fit(v, len(nodes), minNodes(j.spec)); ok {
		why := fmt.Sprintf("resumed on %d node%s after a pause", f.n, plural(f.n))
		r := restorePoint(v)
		if r.lost != "" {
			return awaitHolders(v, now, why, r)
		}
		return nextGeneration(v, r, nodes[:f.n], f, why, now)
	}
	if t := time.Duration(j.spec.RendezvousTimeoutMs) * time.Millisecond; t > 0 {
		deadline := at(pol.PendingSince).Add(t)
		if !now.Before(deadline) {
			d.state = &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 1, FailedRank: -1,
				Reason: fmt.Sprintf("paused for %s without enough nodes: %s", t, j.state.Reason)}
			d.policy = &jobPolicy{}
			d.log(true, "job failed", "job", j.spec.Id, "reason", d.state.Reason)
			d.after = 0 // over: no cooling node is waited for
			return d
		}
		d.wake(now, deadline)
	}
	if !pol.equal(j.policy) {
		d.policy = &pol
	}
	return d
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// stragglers flags the job's stragglers from the coordinators' summaries
// of its compute times: a rank is one when in each of its last
// StragglerWindows windows its mean exceeded StragglerFactor times the
// median of every rank's latest mean (the summaries list the ranks that
// may be: times.go). They are written (status, metrics) and logged with
// node and GPU; with evict_stragglers their nodes are dropped as failed
// (the job goes on without them, within max_restarts) and struck.
func stragglers(v *view, now time.Time, p policy) decision {
	var d decision
	j := v.job
	median, count := histMedian(j.times.latest)
	if count < 3 || median <= 0 {
		return d // a median of two says nothing about which is slow
	}
	found := &pb.Stragglers{Generation: j.gen.Number}
	evict := map[string]bool{}
	for _, s := range j.times.slow {
		if s.Fastest <= p.StragglerFactor*median {
			continue
		}
		local := s.Rank
		for _, m := range j.gen.Members {
			if m.Node == s.Node {
				local = s.Rank - m.FirstRank
			}
		}
		found.Ranks = append(found.Ranks, &pb.Straggler{Rank: s.Rank, Node: s.Node, LocalRank: local, Ratio: math.Round(s.Fastest/median*100) / 100})
		evict[s.Node] = true
	}
	slices.SortFunc(found.Ranks, func(a, b *pb.Straggler) int { return int(a.Rank - b.Rank) })
	if (len(found.Ranks) > 0 || j.stragglers != nil) && !proto.Equal(found, j.stragglers) {
		d.stragglers = found
		if len(found.Ranks) > 0 {
			s := found.Ranks[0]
			d.log(true, "stragglers", "job", j.spec.Id, "generation", j.gen.Number, "count", len(found.Ranks),
				"rank", s.Rank, "node", s.Node, "gpu", s.LocalRank, "ratio", s.Ratio)
		}
	}
	if !j.spec.EvictStragglers || len(evict) == 0 {
		return d
	}
	names := slices.Sorted(maps.Keys(evict))
	next, ok := recoverWithout(v, now, p, "stragglers evicted: "+strings.Join(names, ", "), evict)
	if !ok {
		return d
	}
	next.stragglers = d.stragglers
	next.strikes = strike(v, now, p, names, next.strikes)
	return next
}

// strike adds a strike to each node: a struck node waits StableFor *
// 2^strikes (at most 10 minutes) before a job takes it back, so a host that
// keeps failing is kept out longer each time.
func strike(v *view, now time.Time, p policy, nodes []string, into map[string]nodePolicy) map[string]nodePolicy {
	if len(nodes) == 0 {
		return into
	}
	if into == nil {
		into = map[string]nodePolicy{}
	}
	for _, n := range nodes {
		np := v.nodePolicy[n]
		np.Strikes++
		np.CooldownUntil = ms(now.Add(min(p.StableFor<<min(np.Strikes, 20), 10*time.Minute)))
		into[n] = np
	}
	return into
}

// coolingUntil is when node may join a running job: after its cooldown and
// once registered for StableFor; the zero time when it may now.
func coolingUntil(v *view, n *pb.Node, now time.Time, p policy) time.Time {
	until := at(v.nodePolicy[n.Name].CooldownUntil)
	if n.RegisteredUnixMs != 0 {
		if stable := at(n.RegisteredUnixMs).Add(p.StableFor); stable.After(until) {
			until = stable
		}
	}
	if !now.Before(until) {
		return time.Time{}
	}
	return until
}

// stableFree lists the free nodes a running or paused job may take now,
// in placement order, but those excluded; d wakes when a cooling one may.
func stableFree(v *view, now time.Time, p policy, d *decision, exclude map[string]bool) []*pb.Node {
	var out []*pb.Node
	for _, n := range freeNodes(v, v.job.spec) {
		if exclude[n.Name] {
			continue
		}
		if until := coolingUntil(v, n, now, p); !until.IsZero() {
			d.wake(now, until)
			continue
		}
		out = append(out, n)
	}
	return out
}

// restartsLeft reports whether the job may make another generation.
func restartsLeft(j *job) bool { return j.gen.Number-1 < int64(j.spec.MaxRestarts) }

// minNodes is the fewest nodes a job may run on.
// Re-planning (auto) may go down to one node; off never goes below the
// submitted count.
func minNodes(spec *pb.JobSpec) int {
	switch mode := ReplanMode(spec); {
	case mode == ReplanOff:
		return int(spec.Nodes)
	case spec.MinNodes > 0:
		return int(spec.MinNodes)
	case mode == ReplanAuto:
		return 1
	}
	return int(spec.Nodes)
}

// restore is where a new generation of a job starts from (restorePoint).
type restore struct {
	resume     int64
	copies     []*pb.Copies // who holds each node's files of resume (held checkpoints)
	fromBackup bool
	// commit, when not nil, is the commit the generation writes with
	// itself: the resume point is always the commit.
	commit *pb.Step
	// skipped says why newer kept steps were passed over; "" for none.
	skipped string
	// unrestorable are the job's steps no generation may resume from.
	unrestorable []*pb.Unrestorable
	// lost, when not empty, says why the job cannot go on: no kept step
	// can be restored, each named with why.
	lost string
	// holdersAway: some kept step was passed over only because no live
	// node holds some of its files. Those holders may come back (cut off,
	// not restarted: the same run of an agent counts again), and the step
	// with them.
	holdersAway bool
	// from is the commit of resume, which says the layout that wrote it;
	// nil from the beginning.
	from *pb.Step
}

// restorePoint is where a new generation of v's job starts from: the
// newest kept commit that can be restored (the last commit, else the
// earlier ones the checkpoints keep, Step.earlier), else the job's backup
// tier's step when newer, else the beginning before any commit. A commit
// cannot be restored when a generation failed restoring it (a rank's
// unrestorable_step, remembered in Generation.unrestorable), or, held by
// the agents, when some node's files of it have no live holder: a holder
// is alive when the run of its agent that stored the files
// (Copies.instances) is registered and connected (a node whose agent
// restarted holds nothing). A backup_only commit is the backup tier's
// step a generation resumed from. When the point is not the last commit,
// the generation rewrites the commit to it.
func restorePoint(v *view) restore {
	j := v.job
	var r restore
	broken := map[int64]string{}
	for _, u := range j.gen.GetUnrestorable() {
		broken[u.Step] = u.Why
		r.unrestorable = append(r.unrestorable, u)
	}
	for _, rank := range j.exitOrder {
		if e := j.exits[rank]; e.GetUnrestorableStep() > 0 {
			if _, seen := broken[e.UnrestorableStep]; !seen {
				why := fmt.Sprintf("rank %d could not restore it: %s", e.Rank, cmp.Or(e.Error, fmt.Sprintf("exit code %d", e.Code)))
				broken[e.UnrestorableStep] = why
				r.unrestorable = append(r.unrestorable, &pb.Unrestorable{Step: e.UnrestorableStep, Why: why})
			}
		}
	}
	if j.commit == nil {
		return r
	}
	var why []string // of each kept step passed over
	candidates := append([]*pb.Step{j.commit}, j.commit.Earlier...)
	for i, c := range candidates {
		if w, bad := broken[c.Step]; bad {
			why = append(why, fmt.Sprintf("step %d: %s", c.Step, w))
			continue
		}
		if c.BackupOnly {
			r.resume, r.fromBackup, r.from = c.Step, true, c
			break
		}
		copies, missing := liveCopies(v, c)
		if missing != "" {
			why = append(why, fmt.Sprintf("step %d: %s", c.Step, missing))
			r.holdersAway = true
			continue
		}
		r.resume, r.copies, r.from = c.Step, copies, c
		if i > 0 {
			r.commit = proto.Clone(c).(*pb.Step)
			r.commit.Earlier = candidates[i+1:]
		}
		break
	}
	if b := j.backup; b != nil && b.Step > r.resume && broken[b.Step] == "" {
		r = restore{resume: b.Step, fromBackup: true, unrestorable: r.unrestorable,
			commit: &pb.Step{Step: b.Step, Generation: b.Generation, Dp: b.Dp, Tp: b.Tp, Pp: b.Pp, Vpp: b.Vpp, Checkpointed: true, Backup: true, BackupOnly: true}}
		r.from = r.commit
	}
	switch {
	case r.resume == 0 && len(why) > 0 && !passedBroken(broken, candidates):
		// Every kept step's holders are gone: the newest says why.
		r.lost = fmt.Sprintf("the checkpoint of step %d is lost: %s", j.commit.Step, strings.TrimPrefix(why[0], fmt.Sprintf("step %d: ", j.commit.Step)))
		if len(why) > 1 {
			r.lost += fmt.Sprintf(" (and so are the %d earlier kept steps)", len(why)-1)
		}
		r.lost += ", and the job has no backup tier (--checkpoint-backup)"
	case r.resume == 0:
		r.lost = "no kept step can be restored: " + strings.Join(why, "; ")
		if j.spec.GetCheckpointBackup() == "" {
			r.lost += "; the job has no backup tier (--checkpoint-backup)"
		}
	case len(why) > 0:
		r.skipped = strings.Join(why, "; ")
	}
	return r
}

// passedBroken says whether a step restorePoint passed over was one a
// generation could not restore (not only one whose holders are gone).
func passedBroken(broken map[int64]string, candidates []*pb.Step) bool {
	for _, c := range candidates {
		if _, bad := broken[c.Step]; bad {
			return true
		}
	}
	return false
}

// liveCopies is, for each node's files of commit c, where its live
// holders serve them (member of the next generation or not; "" for one
// that is gone); missing says whose files have no live holder.
func liveCopies(v *view, c *pb.Step) (copies []*pb.Copies, missing string) {
	for _, cp := range c.Copies {
		x := &pb.Copies{Node: cp.Node, Holders: cp.Holders, Addrs: make([]string, len(cp.Holders)), Instances: cp.Instances}
		alive := false
		for i, h := range cp.Holders {
			n := v.nodes[h]
			if n == nil || !v.connected[n.Name] || i < len(cp.Instances) && cp.Instances[i] != "" && n.Instance != cp.Instances[i] {
				continue
			}
			x.Addrs[i], alive = n.CheckpointAddr, true
		}
		if !alive {
			return nil, fmt.Sprintf("no live node holds node %s's files of it (held by %s)", cp.Node, strings.Join(cp.Holders, ", "))
		}
		copies = append(copies, x)
	}
	return copies, ""
}

// recoverWithout makes the next generation of a job whose generation
// failed, from the member nodes still alive (in their rank order, so rank 0
// stays put when its node lives) but those excluded, and free stable
// spares up to the job's size: TP and PP as planned, DP what the nodes
// hold, from the last committed step. It reports false when the job may
// not or cannot go on (no restarts left, fewer live nodes than min_nodes or
// than any layout needs).
func recoverWithout(v *view, now time.Time, p policy, why string, exclude map[string]bool) (decision, bool) {
	j := v.job
	if !restartsLeft(j) {
		return decision{}, false
	}
	var live []*pb.Node
	for _, m := range j.gen.Members {
		if n := v.member(m); n != nil && !exclude[m.Node] {
			live = append(live, n)
		}
	}
	// Spare nodes, free and stable, take the lost ones' places at once
	// rather than joining a generation later.
	var spares []string
	var ignored decision
	for _, n := range stableFree(v, now, p, &ignored, exclude) {
		if len(live) < max(int(j.spec.MaxNodes), int(j.spec.Nodes)) {
			live, spares = append(live, n), append(spares, n.Name)
		}
	}
	f, ok := fit(v, len(live), minNodes(j.spec))
	if !ok {
		return decision{}, false
	}
	r := restorePoint(v)
	if r.lost != "" {
		return awaitHolders(v, now, why, r), true // no spare joins a generation not made
	}
	if len(spares) > 0 {
		why += "; spare nodes joined: " + strings.Join(spares, ", ")
	}
	return nextGeneration(v, r, live[:f.n], f, why, now), true
}

// fitting is where a next generation runs: on how many nodes, at which
// grid, and the planner's estimate of it (nil without re-planning).
type fitting struct {
	n    int
	grid pb.Grid
	est  *choice
}

// fit lays out a next generation on at most have nodes and at least least.
// Re-planning (Replan auto, with the leader's planner): the layout the
// planner ranks fastest on the most nodes any allowed layout fits, as
// `plan --failures` shows, above the job's throughput floor. Otherwise
// the spec's tp and pp on the most nodes they work on, dp changing.
func fit(v *view, have, least int) (fitting, bool) {
	spec := v.job.spec
	if v.plan == nil || ReplanMode(spec) != ReplanAuto {
		n := usableNodes(spec, have, least)
		return fitting{n: n, grid: pb.SpecGrid(spec)}, n > 0
	}
	floor := spec.GetReplan().GetMinSamplesPerSecond()
	for n := have; n >= max(least, 1); n-- {
		if c, ok := v.plan.best(n); ok && c.samples >= floor {
			return fitting{n: n, grid: c.grid, est: &c}, true
		}
	}
	return fitting{}, false
}

// growGain is the job's Replan.grow_gain, or DefaultGrowGain.
func growGain(spec *pb.JobSpec) float64 {
	if g := spec.GetReplan().GetGrowGain(); g > 0 {
		return g
	}
	return DefaultGrowGain
}

// usableNodes is the most nodes, at most have and at least least, on which
// the job's layout works; 0 when none.
func usableNodes(spec *pb.JobSpec, have, least int) int {
	for n := have; n >= max(least, 1); n-- {
		if _, err := Layout(spec, n); err == nil {
			return n
		}
	}
	return 0
}

// admit grows a running job that has fewer nodes than it asked for with
// free nodes registered for at least StableFor, at a step boundary (the
// last reported step, or the one before, is committed: at most that step
// is trained again).
func admit(v *view, now time.Time, p policy) decision {
	var d decision
	j, spec := v.job, v.job.spec
	most := max(int(spec.MaxNodes), int(spec.Nodes))
	if len(j.gen.Members) >= most || !restartsLeft(j) {
		return d
	}
	var nodes []*pb.Node
	for _, m := range j.gen.Members {
		nodes = append(nodes, v.nodes[m.Node])
	}
	var added []string
	for _, n := range stableFree(v, now, p, &d, nil) {
		if len(nodes) < most {
			nodes, added = append(nodes, n), append(added, n.Name)
		}
	}
	// A commit comes after the step's progress (its replicas are made
	// first): a commit of this generation at most one step behind the
	// progress loses at most that step.
	if len(added) == 0 || j.commit == nil || j.step == nil || j.step.Step-j.commit.Step > 1 || j.gen.Number != j.commit.Generation {
		return d // nobody to take, or not at a committed step boundary: the next commit looks again
	}
	f, ok := fit(v, len(nodes), len(j.gen.Members)+1)
	if !ok {
		return d
	}
	if f.est != nil {
		// Re-planned: grow only for a gain worth a restart (no flapping).
		if cur, ok := v.plan.estimate(len(j.gen.Members), pb.GenerationGrid(spec, j.gen)); ok && cur.stepSec < f.est.stepSec*(1+growGain(spec)) {
			return d
		}
	}
	r := restorePoint(v)
	if r.lost != "" {
		return d // a running job grows from a step it can restore, or not at all
	}
	// nodes are the members, then the added: fit took the first f.n.
	joined := added[:min(len(added), f.n-len(j.gen.Members))]
	return nextGeneration(v, r, nodes[:f.n], f, "nodes joined: "+strings.Join(joined, ", "), now)
}

// nextGeneration is the decision to run generation g+1 of the job on
// nodes, from r (restorePoint's, with a step to resume from: the callers
// pause or fail a job whose r is lost, awaitHolders).
func nextGeneration(v *view, r restore, nodes []*pb.Node, f fitting, why string, now time.Time) decision {
	j := v.job
	sh, err := shapeOn(j.spec, f.grid, len(nodes))
	if err != nil { // fit chose nodes the layout works on: a bug
		panic(fmt.Sprintf("next generation of %s on %d nodes: %v", j.spec.Id, len(nodes), err))
	}
	layout := sh.Layout
	f.grid.VPP = int32(sh.Virtual) // stored resolved: the files it writes are cut by it
	if f.est != nil {
		was, now := pb.GenerationGrid(j.spec, j.gen), f.grid
		if was != now || int(j.gen.Dp) != layout.DP {
			why += fmt.Sprintf("; re-planned %s -> %s: %d node%s, %s", was.Label(j.gen.Dp), now.Label(int32(layout.DP)), len(nodes), plural(len(nodes)), f.est)
		}
	}
	resume := r.resume
	switch {
	case r.fromBackup && j.commit != nil && j.commit.Step != resume && !strings.Contains(r.skipped, "could not restore"):
		why += fmt.Sprintf("; the replicas of step %d are gone, so from the backup tier's step %d", j.commit.Step, resume)
	case r.fromBackup && r.skipped != "":
		why += fmt.Sprintf("; passed over (%s), so from the backup tier's step %d", r.skipped, resume)
	case r.skipped != "":
		why += fmt.Sprintf("; passed over (%s), so from step %d", r.skipped, resume)
	}
	gen := buildGeneration(j.spec, j.gen.Number+1, nodes, f, layout.DP, r, why)
	gen.Checkpoint, gen.Hangs, gen.Unrestorable = r.copies, j.gen.GetHangs(), r.unrestorable
	// The ranks that may still run: the generation's, once it opened;
	// else those it was waiting for.
	if j.open >= j.gen.Number {
		gen.Stopping = stoppingOf(j.gen.Members)
	} else {
		gen.Stopping = j.gen.Stopping
	}
	d := decision{gen: gen, commit: r.commit, policy: &jobPolicy{},
		state: &pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1, Reason: fmt.Sprintf("generation %d: %s; resuming after step %d", gen.Number, why, resume)}}
	if len(gen.Stopping) == 0 {
		d.open = gen.Number
	}
	d.log(true, "new generation", "job", j.spec.Id, "generation", gen.Number, "nodes", len(nodes), "layout", f.grid.Label(gen.Dp), "resume", resume, "why", why)
	return d
}

// awaitHolders decides for a job whose next generation has no kept step to
// resume from (r.lost). When some kept step was passed over only because
// its holders are away, the job pauses and waits for them (a partition
// heals, a frozen agent thaws) until the rendezvous timeout has passed
// since the pause began; it fails at once when every kept step is broken,
// or when the timeout passes, naming each step and why.
func awaitHolders(v *view, now time.Time, why string, r restore) decision {
	j := v.job
	var d decision
	t := time.Duration(j.spec.RendezvousTimeoutMs) * time.Millisecond
	paused := j.state.GetPhase() == pb.JobState_PENDING
	since := now
	if paused && j.policy.PendingSince != 0 {
		since = at(j.policy.PendingSince)
	}
	if r.holdersAway && restartsLeft(j) && (t == 0 || now.Before(since.Add(t))) {
		if !paused {
			d.state = &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1,
				Reason: fmt.Sprintf("paused after generation %d: %s; %s; waiting for its holders", j.gen.Number, why, r.lost)}
			d.policy = &jobPolicy{PendingSince: ms(now)}
			d.log(true, "job paused", "job", j.spec.Id, "generation", j.gen.Number, "reason", r.lost)
		} else if !strings.Contains(j.state.GetReason(), r.lost) {
			d.state = &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1,
				Reason: fmt.Sprintf("paused after generation %d: %s; waiting for its holders", j.gen.Number, r.lost)}
		}
		if t > 0 {
			d.wake(now, since.Add(t))
		}
		return d
	}
	reason := fmt.Sprintf("generation %d: %s; %s", j.gen.Number, why, r.lost)
	if r.holdersAway && paused && t > 0 {
		reason = fmt.Sprintf("generation %d: %s; its holders did not come back within %s", j.gen.Number, r.lost, t)
	}
	d.state = &pb.JobState{Phase: pb.JobState_FAILED, FailedRank: -1, ExitCode: 1, Reason: reason}
	d.policy = &jobPolicy{}
	d.log(true, "job failed", "job", j.spec.Id, "generation", j.gen.Number, "reason", r.lost)
	return d
}

// fenced says whether every rank of an earlier generation of v's job that
// may have run is surely stopped, so that the current generation may open
// (no two generations' ranks of a job run at once). A node of the
// generation's stopping set is done when it has reported so (Stopped) for
// the newest generation that opened (ranks start only in an open one, so
// no rank of a generation after it ever ran: a node that left the job
// after generation g says it runs nothing below g+1, which is enough
// however many generations were made and never opened since), when it
// registered again as another run (its agent's end took its ranks
// with it), or, its lease ended, FenceMargin after the latest its own
// deadline can be: when its key was first seen gone, or the lease's time
// left when a coordinator revoked it (fences), whichever is later; or,
// when a window fence is of the lease its key had (exact), the last
// deadline its stream gave, however late the key was seen gone. Else the
// job waits: for a report, or until when. pol gains the times nodes were
// first seen gone.
func fenced(v *view, now time.Time, p policy, pol *jobPolicy) (ok bool, until time.Time, waiting []string) {
	j := v.job
	ok = true
	for _, s := range j.gen.Stopping {
		if j.stopped[s.Node] > j.open {
			continue
		}
		if n := v.nodes[s.Node]; n != nil {
			if s.Instance != "" && n.Instance != s.Instance {
				continue // another run: the one that ran ranks has ended, and they with it
			}
			ok, waiting = false, append(waiting, s.Node) // it reports, or its lease ends
			continue
		}
		since, seen := pol.GoneSince[s.Node]
		if !seen {
			since = ms(now)
			pol.GoneSince = maps.Clone(pol.GoneSince)
			if pol.GoneSince == nil {
				pol.GoneSince = map[string]int64{}
			}
			pol.GoneSince[s.Node] = since
		}
		t := at(since)
		if f, ok := v.fences[s.Node]; ok && (s.Instance == "" || f.Instance == s.Instance) && (f.exact || at(f.UntilMs).After(t)) {
			t = at(f.UntilMs)
		}
		if t = t.Add(p.FenceMargin); now.Before(t) {
			ok, waiting = false, append(waiting, s.Node)
			if until.IsZero() || t.Before(until) {
				until = t
			}
		}
	}
	return ok, until, waiting
}

// freeNodes lists the connected nodes no job holds that a job may
// take, in placement order: the hostfile's order when the job has one,
// else by name.
func freeNodes(v *view, spec *pb.JobSpec) []*pb.Node {
	var out []*pb.Node
	for _, n := range v.nodes {
		if v.busy[n.Name] == "" && v.connected[n.Name] && n.Gpus >= spec.GpusPerNode && (len(spec.Hosts) == 0 || hostIndex(spec.Hosts, n) >= 0) {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *pb.Node) int {
		if len(spec.Hosts) > 0 {
			if d := hostIndex(spec.Hosts, a) - hostIndex(spec.Hosts, b); d != 0 {
				return d
			}
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// hostIndex is the position of n in a hostfile's list (by name or host),
// or -1.
func hostIndex(hosts []string, n *pb.Node) int {
	for i, h := range hosts {
		if h == n.Name || h == n.Host {
			return i
		}
	}
	return -1
}

// waitingFor says, in one line, what a pending job waits for.
func waitingFor(v *view, spec *pb.JobSpec, free int) string {
	gpus := "GPUs"
	if spec.GpusPerNode == 1 {
		gpus = "GPU"
	}
	s := fmt.Sprintf("waiting for nodes: %d of %d free with %d %s each (%d registered)", free, spec.Nodes, spec.GpusPerNode, gpus, len(v.nodes))
	if len(spec.Hosts) > 0 {
		s += " among hosts " + strings.Join(spec.Hosts, ",")
	}
	if why := notFree(v, spec); why != "" {
		s += ": " + why
	}
	return s
}

// notFree names why nodes a pending job could use are not free: with a
// hostfile, each listed host that is not registered, has too few GPUs,
// runs another job or has no open stream; without, how many registered
// nodes have too few GPUs.
func notFree(v *view, spec *pb.JobSpec) string {
	var why []string
	if len(spec.Hosts) == 0 {
		few := 0
		for _, n := range v.nodes {
			if n.Gpus < spec.GpusPerNode {
				few++
			}
		}
		if few > 0 {
			why = append(why, fmt.Sprintf("%d registered with fewer than %d GPUs", few, spec.GpusPerNode))
		}
		return strings.Join(why, "; ")
	}
	for _, h := range spec.Hosts {
		var n *pb.Node
		for _, x := range v.nodes {
			if hostIndex([]string{h}, x) == 0 && (n == nil || x.Name < n.Name) {
				n = x
			}
		}
		switch {
		case n == nil:
			why = append(why, h+" is not registered")
		case n.Gpus < spec.GpusPerNode:
			why = append(why, fmt.Sprintf("%s has %d GPUs", h, n.Gpus))
		case v.busy[n.Name] != "" && v.busy[n.Name] != spec.Id:
			why = append(why, fmt.Sprintf("%s runs job %s", h, v.busy[n.Name]))
		case !v.connected[n.Name]:
			why = append(why, h+" has no open stream")
		}
	}
	return strings.Join(why, "; ")
}

// firstFailure is the rank failure that caused the others, nil when no
// rank failed: the one that came first by causedBefore.
func firstFailure(j *job) *pb.RankExit {
	var first *pb.RankExit
	for _, r := range j.exitOrder {
		if e := j.exits[r]; e.Code != 0 && (first == nil || causedBefore(e, first)) {
			first = e
		}
	}
	return first
}

// causedBefore says whether failure a comes before failure b. Ranks that
// ended: the first in time as its node saw it (a rank whose peer failed
// fails a moment later, and may be reported sooner), a time before none.
// A rank that ended and a hung one: the ended one when it ended before
// the hang was found (its end likely stalled the other), else the hung
// one (found, then killed, it ended its peers). Hung ranks: a stopped
// process (SIGSTOP, a debugger) before a waiting one, then the lowest last
// step (its peers went on past it), then the one silent longest.
func causedBefore(a, b *pb.RankExit) bool {
	ha, hb := a.GetHang(), b.GetHang()
	switch {
	case ha == nil && hb != nil:
		return a.FailedAtUnixMs != 0 && a.FailedAtUnixMs < hb.FoundUnixMs
	case ha != nil && hb == nil:
		return !causedBefore(b, a)
	case ha != nil && ha.Stopped != hb.Stopped:
		return ha.Stopped
	case ha != nil && ha.LastStep != hb.LastStep:
		return ha.LastStep < hb.LastStep
	}
	return a.FailedAtUnixMs != 0 && (b.FailedAtUnixMs == 0 || a.FailedAtUnixMs < b.FailedAtUnixMs)
}

// buildGeneration lays out generation number of a job on nodes, in order:
// node i runs ranks i*G .. i*G+G-1, at f's grid and dp, resuming from r.
func buildGeneration(spec *pb.JobSpec, number int64, nodes []*pb.Node, f fitting, dp int, r restore, why string) *pb.Generation {
	g := &pb.Generation{Job: spec.Id, Number: number, World: int32(len(nodes)) * spec.GpusPerNode, Dp: int32(dp), ResumeStep: r.resume, Reason: why,
		Tp: f.grid.TP, Pp: f.grid.PP, Vpp: f.grid.VPP, Zero: f.grid.Zero, FromBackup: r.fromBackup}
	if f.est != nil {
		g.Estimate, g.StepSeconds = f.est.String(), f.est.stepSec
	}
	if r.from != nil {
		from := pb.StepGrid(spec, r.from)
		g.ResumeTp, g.ResumePp, g.ResumeVpp = from.TP, from.PP, from.VPP
	}
	for i, n := range nodes {
		g.Members = append(g.Members, &pb.Member{Node: n.Name, Host: n.Host, FirstRank: int32(i) * spec.GpusPerNode, Ranks: spec.GpusPerNode,
			Instance: n.Instance, CheckpointAddr: n.CheckpointAddr, Domain: cmp.Or(n.FailureDomain, n.NvlinkDomain)})
	}
	return g
}

// stoppingOf is members as Generation.stopping keeps them: a node and its
// run are all that fenced reads, and a copy of the whole members would
// double a large generation's value.
func stoppingOf(members []*pb.Member) []*pb.Member {
	out := make([]*pb.Member, len(members))
	for i, m := range members {
		out[i] = &pb.Member{Node: m.Node, Instance: m.Instance}
	}
	return out
}

// memberOf names the node running rank r.
func memberOf(g *pb.Generation, r int32) string {
	for _, m := range g.Members {
		if r >= m.FirstRank && r < m.FirstRank+m.Ranks {
			return m.Node
		}
	}
	return ""
}

// memberNames lists a generation's nodes, comma-separated, as a log line
// holds them (someNames).
func memberNames(g *pb.Generation) string {
	names := make([]string, len(g.Members))
	for i, m := range g.Members {
		names[i] = m.Node
	}
	return someNames(names)
}

// logNames is how many nodes a log line names.
const logNames = 16

// someNames joins names with commas, the first logNames of them and how
// many more: a line about a 16,384-node generation stays a line.
func someNames(names []string) string {
	if len(names) <= logNames {
		return strings.Join(names, ",")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:logNames], ","), len(names)-logNames)
}

// forget lists the ended jobs to delete so that at most keep remain: the
// oldest first. jobs are in submission order.
func forget(jobs []*job, keep int) []string {
	var ended []string
	for _, j := range jobs {
		if j.terminal() {
			ended = append(ended, j.spec.Id)
		}
	}
	return ended[:max(0, len(ended)-keep)]
}
