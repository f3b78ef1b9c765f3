package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	pb "gpucoord/proto/gpucoordpb"
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
		l := &leader{Coordinator: c, k: k, since: map[string]time.Time{}, enough: map[string]time.Time{}, failed: map[string]time.Time{}}
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
	busy := snap.busy()
	now := time.Now()
	for _, j := range snap.jobs {
		if j.terminal() {
			delete(l.since, j.spec.Id)
			delete(l.enough, j.spec.Id)
			delete(l.failed, j.spec.Id)
			continue
		}
		var err error
		if j.gen == nil {
			err = l.rendezvous(ctx, snap, j, busy, now)
		} else {
			err = l.watchRunning(ctx, snap, j, now)
		}
		if err != nil {
			return fmt.Errorf("job %s: %w", j.spec.Id, err)
		}
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
	n := min(len(free), most)
	for ; n > need; n-- {
		if _, err := Layout(spec, n); err == nil {
			break
		}
	}
	layout, err := Layout(spec, n)
	if err != nil {
		return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_FAILED, ExitCode: 2, FailedRank: -1, Reason: err.Error()})
	}
	gen := &pb.Generation{Job: spec.Id, Number: 1, World: int32(layout.World()), Dp: int32(layout.DP)}
	for i, node := range free[:n] {
		gen.Members = append(gen.Members, &pb.Member{Node: node.Name, Host: node.Host,
			FirstRank: int32(i) * spec.GpusPerNode, Ranks: spec.GpusPerNode})
		busy[node.Name] = spec.Id
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

// watchRunning ends a running generation: succeeded when every rank exited
// 0, failed when a rank failed or a member node was lost.
func (l *leader) watchRunning(ctx context.Context, snap *snapshot, j *job, now time.Time) error {
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
	var first *pb.RankExit
	for _, r := range j.exitOrder {
		if e := j.exits[r]; e.Code != 0 {
			first = e
			break
		}
	}
	if first == nil && len(lost) == 0 {
		if len(j.exits) == int(j.gen.World) {
			return l.setState(ctx, j, &pb.JobState{Phase: pb.JobState_SUCCEEDED, FailedRank: -1})
		}
		return nil
	}
	if _, ok := l.failed[j.spec.Id]; !ok {
		l.failed[j.spec.Id] = now
	}
	if len(lost) == 0 && now.Sub(l.failed[j.spec.Id]) < l.cfg.FailureSettle {
		return nil // give a node loss behind this failure time to show
	}
	st := &pb.JobState{Phase: pb.JobState_FAILED, FailedRank: -1, ExitCode: 1, LostNodes: lost, LostRanks: lostRanks}
	if first != nil {
		st.FailedRank, st.ExitCode, st.FailedNode = first.Rank, first.Code, memberOf(j.gen, first.Rank)
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
	l.log.Warn("job failed", "job", j.spec.Id, "generation", j.gen.Number, "reason", st.Reason)
	return l.setState(ctx, j, st)
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
