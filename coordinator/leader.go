package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// campaign runs for leadership until ctx ends, and leads while elected. A
// lost session (etcd unreachable longer than ElectionTTL) ends the term;
// the coordinator then campaigns again.
func (c *Coordinator) campaign(ctx context.Context) error {
	k := keys(c.cfg.Prefix)
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(c.etcd.Client, concurrency.WithTTL(int(c.cfg.ElectionTTL/time.Second)), concurrency.WithContext(ctx))
		if err != nil {
			c.log.Warn("election session", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		el := concurrency.NewElection(sess, k.leader())
		if err := el.Campaign(ctx, c.cfg.Name); err != nil {
			sess.Close()
			continue
		}
		c.log.Info("elected leader", "name", c.cfg.Name)
		c.leading.Store(true)
		lctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-sess.Done():
				c.log.Warn("leadership lost: etcd session ended")
			case <-lctx.Done():
			}
			cancel()
		}()
		l := &leader{Coordinator: c, k: k, since: map[string]time.Time{}, enough: map[string]time.Time{}, failed: map[string]time.Time{}, seen: map[string]seen{},
			strikes: map[string]int{}, cooldown: map[string]time.Time{}}
		err = l.run(lctx)
		c.leading.Store(false)
		cancel()
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		el.Resign(rctx)
		rcancel()
		sess.Close()
		if err != nil && ctx.Err() == nil {
			c.log.Warn("leader stopped", "err", err)
		}
	}
	return nil
}

// leader is the state machine of the elected coordinator. Its memory holds
// only timers; every decision is written to etcd in a transaction on the
// revision it read, so a deposed leader's late write fails.
type leader struct {
	*Coordinator
	k keys
	// since is when this leader first saw each pending job, enough when
	// enough nodes were first free for it, failed when it first saw a
	// failure of its running generation.
	since, enough, failed map[string]time.Time
	// seen is when each node's current registration was first seen.
	seen map[string]seen
	// strikes counts each node's losses and evictions; a struck node waits
	// StableFor * 2^strikes (at most 10 minutes) before a job takes it
	// back, so a host that keeps failing is kept out longer each time.
	strikes  map[string]int
	cooldown map[string]time.Time
}

// seen is a node registration (its key's create revision) and when the
// leader first saw it.
type seen struct {
	rev int64
	at  time.Time
}

func (l *leader) run(ctx context.Context) error {
	w := l.etcd.Client.Watch(clientv3.WithRequireLeader(ctx), l.cfg.Prefix, clientv3.WithPrefix())
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	for {
		if err := l.reconcile(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("reconcile", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case wr, ok := <-w:
			if !ok {
				return errors.New("etcd watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
		}
	}
}

// reconcile reads the pool and the jobs and takes every decision due.
func (l *leader) reconcile(ctx context.Context) error {
	snap, err := read(ctx, l.etcd.Client, l.k, "")
	if err != nil {
		return err
	}
	if err := l.forgetEnded(ctx, snap); err != nil {
		return err
	}
	busy := snap.busy()
	now := time.Now()
	for name, rev := range snap.nodeRev {
		if l.seen[name].rev != rev {
			l.seen[name] = seen{rev: rev, at: now}
		}
	}
	for _, j := range snap.jobs {
		if j.terminal() {
			delete(l.since, j.spec.Id)
			delete(l.enough, j.spec.Id)
			delete(l.failed, j.spec.Id)
			continue
		}
		var err error
		switch {
		case j.gen == nil:
			err = l.rendezvous(ctx, snap, j, busy, now)
		case j.state.GetPhase() == pb.JobState_PENDING:
			err = l.resumePaused(ctx, snap, j, busy, now)
		default:
			err = l.watchRunning(ctx, snap, j, busy, now)
		}
		if err != nil {
			return fmt.Errorf("job %s: %w", j.spec.Id, err)
		}
	}
	return nil
}

// forgetEnded deletes every key of the oldest ended jobs beyond KeepJobs.
func (l *leader) forgetEnded(ctx context.Context, snap *snapshot) error {
	var ended []*job
	for _, j := range snap.jobs { // in submission order
		if j.terminal() {
			ended = append(ended, j)
		}
	}
	for _, j := range ended[:max(0, len(ended)-l.cfg.KeepJobs)] {
		if _, err := l.etcd.Client.Delete(ctx, l.k.job(j.spec.Id), clientv3.WithPrefix()); err != nil {
			return err
		}
		l.log.Info("ended job forgotten", "job", j.spec.Id, "phase", j.state.GetPhase())
	}
	return nil
}

// rendezvous freezes the first generation of a pending job once enough
// free nodes have registered (and the last call for more has passed), or
// fails it when the rendezvous timeout passes first.
func (l *leader) rendezvous(ctx context.Context, snap *snapshot, j *job, busy map[string]string, now time.Time) error {
	spec := j.spec
	if _, ok := l.since[spec.Id]; !ok {
		l.since[spec.Id] = now
	}
	free := freeNodes(snap, spec, busy)
	need, most := int(spec.Nodes), max(int(spec.MaxNodes), int(spec.Nodes))
	if len(free) < need {
		delete(l.enough, spec.Id)
		waited := now.Sub(l.since[spec.Id])
		if t := time.Duration(spec.RendezvousTimeoutMs) * time.Millisecond; t > 0 && waited >= t {
			return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 1, FailedRank: -1,
				Reason: fmt.Sprintf("rendezvous timed out after %s: %s", t, waitingFor(snap, spec, len(free)))})
		}
		return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1, Reason: waitingFor(snap, spec, len(free))})
	}
	if _, ok := l.enough[spec.Id]; !ok {
		l.enough[spec.Id] = now
	}
	if len(free) < most && now.Sub(l.enough[spec.Id]) < time.Duration(spec.LastCallMs)*time.Millisecond {
		return nil // last call: wait a little for more
	}
	// The most nodes, up to max, on which the layout works.
	n := usableNodes(spec, min(len(free), most), need)
	if n == 0 {
		_, err := Layout(spec, need)
		return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 2, FailedRank: -1, Reason: fmt.Sprint(err)})
	}
	layout, _ := Layout(spec, n)
	gen := buildGeneration(spec, 1, free[:n], layout.DP, 0, "")
	for _, m := range gen.Members {
		busy[m.Node] = spec.Id
	}
	st := &pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1}
	resp, err := l.etcd.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(l.k.state(spec.Id)), "=", j.stateRev),
			clientv3.Compare(clientv3.CreateRevision(l.k.generation(spec.Id)), "=", 0)).
		Then(clientv3.OpPut(l.k.generation(spec.Id), encode(gen)), clientv3.OpPut(l.k.state(spec.Id), encode(st))).
		Commit()
	if err != nil {
		return err
	}
	if resp.Succeeded {
		names := make([]string, len(gen.Members))
		for i, m := range gen.Members {
			names[i] = m.Node
		}
		l.log.Info("generation frozen", "job", spec.Id, "generation", gen.Number, "nodes", strings.Join(names, ","), "world", gen.World,
			"rendezvous", now.Sub(l.since[spec.Id]).Round(time.Millisecond))
	}
	return nil
}

// freeNodes lists the live nodes a job may take, in placement order: the
// hostfile's order when the job has one, else by name.
func freeNodes(snap *snapshot, spec *pb.JobSpec, busy map[string]string) []*pb.Node {
	var out []*pb.Node
	for _, n := range snap.nodes {
		if busy[n.Name] == "" && n.Gpus >= spec.GpusPerNode && (len(spec.Hosts) == 0 || hostIndex(spec.Hosts, n) >= 0) {
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
func waitingFor(snap *snapshot, spec *pb.JobSpec, free int) string {
	s := fmt.Sprintf("waiting for nodes: %d of %d free with %d GPUs each (%d registered)", free, spec.Nodes, spec.GpusPerNode, len(snap.nodes))
	if len(spec.Hosts) > 0 {
		s += " among hosts " + strings.Join(spec.Hosts, ",")
	}
	return s
}

// firstFailure is the rank failure that came first in time, as its node
// saw it (a rank whose peer failed fails a moment later, and may be
// reported sooner); among failures without a time, the first reported.
// Nil when no rank failed.
func firstFailure(j *job) *pb.RankExit {
	var first *pb.RankExit
	for _, r := range j.exitOrder {
		e := j.exits[r]
		if e.Code == 0 {
			continue
		}
		if first == nil || e.FailedAtUnixMs != 0 && (first.FailedAtUnixMs == 0 || e.FailedAtUnixMs < first.FailedAtUnixMs) {
			first = e
		}
	}
	return first
}

// watchRunning ends a running generation: succeeded when every rank exited
// 0, failed when a rank failed or a member node was lost.
func (l *leader) watchRunning(ctx context.Context, snap *snapshot, j *job, busy map[string]string, now time.Time) error {
	var lost []string
	var lostRanks []int32
	for _, m := range j.gen.Members {
		if snap.nodes[m.Node] == nil {
			lost = append(lost, m.Node)
			for r := m.FirstRank; r < m.FirstRank+m.Ranks; r++ {
				lostRanks = append(lostRanks, r)
			}
		}
	}
	first := firstFailure(j)
	if first == nil && len(lost) == 0 {
		if len(j.exits) == int(j.gen.World) {
			return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_SUCCEEDED, FailedRank: -1})
		}
		if evicted, err := l.stragglers(ctx, snap, j, busy, now); evicted || err != nil {
			return err
		}
		return l.admit(ctx, snap, j, busy, now)
	}
	if _, ok := l.failed[j.spec.Id]; !ok {
		l.failed[j.spec.Id] = now
	}
	if len(lost) == 0 && now.Sub(l.failed[j.spec.Id]) < l.cfg.FailureSettle {
		return nil // give a node loss behind this failure time to show
	}
	st := &pb.JobState{Phase: pb.JobState_FAILED, FailedRank: -1, ExitCode: 1, LostNodes: lost, LostRanks: lostRanks}
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
	} else {
		st.Reason = fmt.Sprintf("rank %d on %s exited with code %d", first.Rank, st.FailedNode, first.Code)
		if first.Error != "" {
			st.Reason += ": " + first.Error
		}
	}
	for _, n := range lost {
		l.strike(n, now)
	}
	if ok, err := l.recoverWithout(ctx, snap, j, st.Reason, nil, busy, now); ok || err != nil {
		return err
	}
	if restartsLeft(j) {
		// Too few live nodes: pause until enough come back, or the
		// rendezvous timeout passes.
		l.since[j.spec.Id] = now
		l.log.Warn("job paused", "job", j.spec.Id, "generation", j.gen.Number, "reason", st.Reason)
		return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1,
			Reason: fmt.Sprintf("paused after generation %d: %s; %s", j.gen.Number, st.Reason, l.shortOf(snap, j))})
	}
	l.log.Warn("job failed", "job", j.spec.Id, "generation", j.gen.Number, "reason", st.Reason)
	return l.setState(ctx, j, st)
}

// shortOf says how many nodes a paused job has and needs.
func (l *leader) shortOf(snap *snapshot, j *job) string {
	live := 0
	for _, m := range j.gen.Members {
		if snap.nodes[m.Node] != nil {
			live++
		}
	}
	return fmt.Sprintf("waiting for nodes: %d live of at least %d", live, minNodes(j.spec))
}

// resumePaused restarts a paused job as soon as its live members and free
// nodes (registered for StableFor) make a usable layout of at least
// min_nodes, or fails it when the rendezvous timeout passes first.
func (l *leader) resumePaused(ctx context.Context, snap *snapshot, j *job, busy map[string]string, now time.Time) error {
	if _, ok := l.since[j.spec.Id]; !ok {
		l.since[j.spec.Id] = now // a leader that took over mid-pause starts the clock again
	}
	most := max(int(j.spec.MaxNodes), int(j.spec.Nodes))
	var nodes []*pb.Node
	for _, m := range j.gen.Members {
		if n := snap.nodes[m.Node]; n != nil {
			nodes = append(nodes, n)
		}
	}
	for _, n := range freeNodes(snap, j.spec, busy) {
		if len(nodes) < most && !l.cooling(n.Name, now) {
			nodes = append(nodes, n)
		}
	}
	if n := usableNodes(j.spec, len(nodes), minNodes(j.spec)); n > 0 {
		_, err := l.nextGeneration(ctx, j, nodes[:n], fmt.Sprintf("resumed on %d node%s after a pause", n, map[bool]string{true: "", false: "s"}[n == 1]), now)
		return err
	}
	if t := time.Duration(j.spec.RendezvousTimeoutMs) * time.Millisecond; t > 0 && now.Sub(l.since[j.spec.Id]) >= t {
		return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 1, FailedRank: -1,
			Reason: fmt.Sprintf("paused for %s without enough nodes: %s", t, j.state.Reason)})
	}
	return nil
}

// stragglers updates the job's stragglers from its nodes' recent windows
// of compute times: a rank is one when in each of its last
// StragglerWindows windows its mean exceeded StragglerFactor times the
// median of every rank's latest mean. The decision is a function of what
// etcd holds, not of when the leader looked. Stragglers are written to etcd
// (status, metrics) and logged with node and GPU; with evict_stragglers
// their nodes are dropped as failed (the job goes on without them, within
// max_restarts, and they wait out a cooldown). It reports whether it made
// a new generation.
func (l *leader) stragglers(ctx context.Context, snap *snapshot, j *job, busy map[string]string, now time.Time) (bool, error) {
	id := j.spec.Id
	var latest []float64
	for _, h := range j.times {
		if n := len(h.Windows); n > 0 {
			for _, r := range h.Windows[n-1].Ranks {
				latest = append(latest, r.ComputeSeconds)
			}
		}
	}
	if len(latest) < 3 {
		return false, nil // a median of two says nothing about which is slow
	}
	slices.Sort(latest)
	median := latest[len(latest)/2]
	if len(latest)%2 == 0 {
		median = (latest[len(latest)/2-1] + latest[len(latest)/2]) / 2
	}
	if median <= 0 {
		return false, nil
	}
	found := &pb.Stragglers{Generation: j.gen.Number}
	evict := map[string]bool{}
	for node, h := range j.times {
		if len(h.Windows) < l.cfg.StragglerWindows {
			continue
		}
		slowest := map[int32]float64{} // the fastest of each rank's windows
		count := map[int32]int{}
		for _, w := range h.Windows {
			for _, r := range w.Ranks {
				if count[r.Rank] == 0 || r.ComputeSeconds < slowest[r.Rank] {
					slowest[r.Rank] = r.ComputeSeconds
				}
				count[r.Rank]++
			}
		}
		for rank, fastest := range slowest {
			if count[rank] < l.cfg.StragglerWindows || fastest <= l.cfg.StragglerFactor*median {
				continue
			}
			local := rank
			for _, m := range j.gen.Members {
				if m.Node == node {
					local = rank - m.FirstRank
				}
			}
			found.Ranks = append(found.Ranks, &pb.Straggler{Rank: rank, Node: node, LocalRank: local, Ratio: math.Round(fastest/median*100) / 100})
			evict[node] = true
		}
	}
	slices.SortFunc(found.Ranks, func(a, b *pb.Straggler) int { return int(a.Rank - b.Rank) })
	if (len(found.Ranks) > 0 || j.stragglers != nil) && encode(found) != encode(j.stragglers) {
		for _, s := range found.Ranks {
			l.log.Warn("straggler", "job", id, "generation", j.gen.Number, "rank", s.Rank, "node", s.Node, "gpu", s.LocalRank, "ratio", s.Ratio)
		}
		if _, err := l.etcd.Client.Put(ctx, l.k.stragglers(id), encode(found)); err != nil {
			return false, err
		}
	}
	if !j.spec.EvictStragglers || len(evict) == 0 {
		return false, nil
	}
	names := slices.Sorted(maps.Keys(evict))
	ok, err := l.recoverWithout(ctx, snap, j, "stragglers evicted: "+strings.Join(names, ", "), evict, busy, now)
	if ok {
		for _, n := range names {
			l.strike(n, now)
		}
	}
	return ok, err
}

// strike puts node in a cooldown that doubles with each strike.
func (l *leader) strike(node string, now time.Time) {
	l.strikes[node]++
	d := l.cfg.StableFor << min(l.strikes[node], 20)
	l.cooldown[node] = now.Add(min(d, 10*time.Minute))
}

// cooling reports whether node may not join a running job yet.
func (l *leader) cooling(node string, now time.Time) bool {
	return now.Before(l.cooldown[node]) || now.Sub(l.seen[node].at) < l.cfg.StableFor
}

// restartsLeft reports whether the job may make another generation.
func restartsLeft(j *job) bool { return j.gen.Number-1 < int64(j.spec.MaxRestarts) }

// minNodes is the fewest nodes a job may run on.
func minNodes(spec *pb.JobSpec) int {
	if spec.MinNodes > 0 {
		return int(spec.MinNodes)
	}
	return int(spec.Nodes)
}

// resumeStep is the step a new generation of j starts from: its last
// committed checkpoint, or the beginning.
func resumeStep(j *job) int64 {
	if j.commit == nil {
		return 0
	}
	return j.commit.Step
}

// recoverWithout makes the next generation of a job whose generation
// failed, from the member nodes still alive (in their rank order, so rank 0
// stays put when its node lives) but those excluded, and free stable
// spares up to the job's size: TP and PP as planned, DP what the nodes
// hold, from the last committed step. It reports false when the job may not or cannot
// go on (no restarts left, fewer live nodes than min_nodes or than any
// layout needs).
func (l *leader) recoverWithout(ctx context.Context, snap *snapshot, j *job, why string, exclude map[string]bool, busy map[string]string, now time.Time) (bool, error) {
	if !restartsLeft(j) {
		return false, nil
	}
	var live []*pb.Node
	for _, m := range j.gen.Members {
		if n := snap.nodes[m.Node]; n != nil && !exclude[m.Node] {
			live = append(live, n)
		}
	}
	// Spare nodes, free and stable, take the lost ones' places at once
	// rather than joining a generation later.
	var spares []string
	for _, n := range freeNodes(snap, j.spec, busy) {
		if len(live) < max(int(j.spec.MaxNodes), int(j.spec.Nodes)) && !exclude[n.Name] && !l.cooling(n.Name, now) {
			live, spares = append(live, n), append(spares, n.Name)
		}
	}
	if len(spares) > 0 {
		why += "; spare nodes joined: " + strings.Join(spares, ", ")
	}
	n := usableNodes(j.spec, len(live), minNodes(j.spec))
	if n == 0 {
		return false, nil
	}
	return l.nextGeneration(ctx, j, live[:n], why, now)
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
// last reported step is committed, so no work is lost).
func (l *leader) admit(ctx context.Context, snap *snapshot, j *job, busy map[string]string, now time.Time) error {
	spec := j.spec
	most := max(int(spec.MaxNodes), int(spec.Nodes))
	if len(j.gen.Members) >= most || !restartsLeft(j) || j.commit == nil || j.step == nil || j.commit.Step != j.step.Step ||
		j.gen.Number != j.commit.Generation {
		return nil
	}
	var nodes []*pb.Node
	for _, m := range j.gen.Members {
		nodes = append(nodes, snap.nodes[m.Node])
	}
	var added []string
	for _, n := range freeNodes(snap, spec, busy) {
		if len(nodes) < most && !l.cooling(n.Name, now) {
			nodes, added = append(nodes, n), append(added, n.Name)
		}
	}
	if len(added) == 0 {
		return nil
	}
	n := usableNodes(spec, len(nodes), len(j.gen.Members)+1)
	if n == 0 {
		return nil
	}
	_, err := l.nextGeneration(ctx, j, nodes[:n], "nodes joined: "+strings.Join(added, ", "), now)
	return err
}

// nextGeneration writes generation g+1 of j on nodes, if g is still the
// current one.
func (l *leader) nextGeneration(ctx context.Context, j *job, nodes []*pb.Node, why string, now time.Time) (bool, error) {
	layout, err := Layout(j.spec, len(nodes))
	if err != nil {
		return false, err
	}
	resume := resumeStep(j)
	gen := buildGeneration(j.spec, j.gen.Number+1, nodes, layout.DP, resume, why)
	st := &pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1, Reason: fmt.Sprintf("generation %d: %s; resuming after step %d", gen.Number, why, resume)}
	resp, err := l.etcd.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(l.k.generation(j.spec.Id)), "=", j.genRev),
			clientv3.Compare(clientv3.ModRevision(l.k.state(j.spec.Id)), "=", j.stateRev)).
		Then(clientv3.OpPut(l.k.generation(j.spec.Id), encode(gen)), clientv3.OpPut(l.k.state(j.spec.Id), encode(st))).
		Commit()
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		l.log.Warn("new generation", "job", j.spec.Id, "generation", gen.Number, "nodes", len(nodes), "dp", gen.Dp, "resume", resume, "why", why)
		delete(l.failed, j.spec.Id)
	}
	return resp.Succeeded, nil
}

// buildGeneration lays out generation number of a job on nodes, in order:
// node i runs ranks i*G .. i*G+G-1.
func buildGeneration(spec *pb.JobSpec, number int64, nodes []*pb.Node, dp int, resume int64, why string) *pb.Generation {
	g := &pb.Generation{Job: spec.Id, Number: number, World: int32(len(nodes)) * spec.GpusPerNode, Dp: int32(dp), ResumeStep: resume, Reason: why}
	for i, n := range nodes {
		g.Members = append(g.Members, &pb.Member{Node: n.Name, Host: n.Host, FirstRank: int32(i) * spec.GpusPerNode, Ranks: spec.GpusPerNode})
	}
	return g
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

// setState writes a job's state if it changed and nobody wrote it since it
// was read.
func (l *leader) setState(ctx context.Context, j *job, st *pb.JobState) error {
	if encode(st) == encode(j.state) {
		return nil
	}
	_, err := l.etcd.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(l.k.state(j.spec.Id)), "=", j.stateRev)).
		Then(clientv3.OpPut(l.k.state(j.spec.Id), encode(st))).
		Commit()
	return err
}
