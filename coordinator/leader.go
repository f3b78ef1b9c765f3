package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// campaign runs for leadership until ctx ends, and leads while elected. A
// lost session (etcd unreachable longer than ElectionTTL) ends the term;
// the coordinator then campaigns again, backing off while etcd refuses.
func (c *Coordinator) campaign(ctx context.Context) error {
	k := keys(c.cfg.Prefix)
	const first, most = 100 * time.Millisecond, 5 * time.Second
	backoff := first
	wait := func(why string, err error) {
		c.log.Warn(why, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, most)
	}
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(c.etcd.Client, concurrency.WithTTL(int(c.cfg.ElectionTTL/time.Second)), concurrency.WithContext(ctx))
		if err != nil {
			wait("election: no session with etcd", err)
			continue
		}
		el := concurrency.NewElection(sess, k.leader())
		// Campaign, when ctx ends while it waits, resigns with the
		// client's own context: with etcd gone it would wait until the
		// client closes, which comes after this returns. It is left to end
		// then.
		campaigned := make(chan error, 1)
		go func() { campaigned <- el.Campaign(ctx, c.cfg.Name) }()
		select {
		case err = <-campaigned:
		case <-ctx.Done():
			sess.Close()
			return nil
		}
		if err != nil {
			sess.Close()
			if ctx.Err() == nil {
				wait("election: campaign failed", err)
			}
			continue
		}
		backoff = first
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
		l := &leader{Coordinator: c, k: k, fence: clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev()), electionKey: el.Key(), electionRev: el.Rev(), now: time.Now}
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

// errDeposed is what a leader's write gets when another coordinator leads.
var errDeposed = errors.New("no longer the leader")

// gcItem is the queue's item for forgetting ended jobs beyond KeepJobs.
const gcItem = "\x00gc"

// leader applies decide's decisions while elected. It keeps nothing of its
// own: it reads the cache, decides, and writes each decision in one
// transaction fenced by its election key, so that a deposed leader's late
// write fails and a new leader goes on from what etcd holds.
type leader struct {
	*Coordinator
	k keys
	// fence is true while this coordinator's election key is the one it
	// created: every write carries it.
	fence       clientv3.Cmp
	electionKey string
	electionRev int64
	now         func() time.Time
	// planners are the re-planning jobs' planners, by job id (one per
	// submission: a job's spec never changes).
	planners map[string]*searchPlanner
}

// planner is job spec's planner when it re-plans (Replan auto), kept
// across decisions; nil otherwise, or when its input does not parse
// (Submit refused such specs: one from an older version falls back to
// dp-only).
func (l *leader) planner(spec *pb.JobSpec) planner {
	if ReplanMode(spec) != ReplanAuto {
		return nil
	}
	if p, ok := l.planners[spec.Id]; ok && p.spec == spec {
		return p
	}
	p, err := newSearchPlanner(spec)
	if err != nil {
		l.log.Warn("re-planning off: the job's planner input does not parse", "job", spec.Id, "err", err)
		return nil
	}
	if l.planners == nil {
		l.planners = map[string]*searchPlanner{}
	}
	l.planners[spec.Id] = p
	return p
}

// run leads until ctx ends or this coordinator is deposed. It acts only
// once its cache holds etcd as it was when it won: every write of the
// leader before it is in the view (leadership begins at a revision, not at
// a moment).
func (l *leader) run(ctx context.Context) error {
	q := newQueue(l.now)
	l.cache.setNotify(func(ids []string, _ bool) {
		for _, id := range ids {
			q.add(id)
		}
	})
	defer l.cache.setNotify(nil)
	// Still leading after the election: etcd's revision now is at or
	// after the one this coordinator won at.
	if _, _, err := l.txn(ctx, nil); err != nil {
		return err
	}
	if err := l.cache.sync(ctx); err != nil {
		return err
	}
	for _, j := range l.cache.jobsNow() {
		q.add(j.spec.Id)
	}
	q.add(gcItem)
	p := l.cfg.policy()
	for {
		id, err := q.get(ctx)
		if err != nil {
			return err
		}
		if id == gcItem {
			err = l.forgetEnded(ctx)
		} else {
			err = l.reconcile(ctx, q, id, p)
		}
		switch {
		case errors.Is(err, errDeposed):
			return err
		case err != nil && ctx.Err() == nil:
			if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
				err = fmt.Errorf("%w: etcd refuses a transaction this large; start etcd with --max-txn-ops 65536 --max-request-bytes 16777216, as the embedded etcd runs", err)
			}
			l.log.Warn("reconcile", "job", id, "err", err)
			q.retry(id)
		case err == nil:
			q.forgetRetries(id)
		}
	}
}

// reconcile takes the decision due for one job and applies it.
func (l *leader) reconcile(ctx context.Context, q *queue, id string, p policy) error {
	start := time.Now()
	v, ok := l.cache.view(id)
	if !ok {
		return nil // forgotten
	}
	if v.job.terminal() {
		delete(l.planners, id)
		q.add(gcItem)
		return nil
	}
	if pl := l.planner(v.job.spec); pl != nil {
		v.plan = pl
	}
	viewed := time.Now()
	d := decide(v, l.now(), p)
	decided := time.Now()
	if d.after > 0 {
		q.addAfter(id, d.after)
	}
	if !d.writes() {
		return nil
	}
	if l.hooks.beforeApply != nil {
		l.hooks.beforeApply(id, &d)
	}
	rev, ok, err := l.apply(ctx, v, &d)
	if err != nil {
		return err
	}
	// Where a decision's time goes, at scale: the view, the policy, the
	// transaction (to its answer).
	l.log.Debug("decision written", "job", id, "written", ok, "view", viewed.Sub(start).Round(time.Microsecond),
		"decide", decided.Sub(viewed).Round(time.Microsecond), "txn", time.Since(decided).Round(time.Microsecond))
	if ok && l.hooks.afterApply != nil {
		l.hooks.afterApply(id, &d)
	}
	if !ok {
		// Someone wrote the job since the view (a report, a cancel), or
		// another job took one of the nodes: the cache brings that write,
		// and this job is looked at again.
		q.retry(id)
		return nil
	}
	if d.msg != "" {
		if d.warn {
			l.log.Warn(d.msg, d.args...)
		} else {
			l.log.Info(d.msg, d.args...)
		}
	}
	// The next decision, of any job, must see this one (the nodes it took).
	return l.cache.waitRev(ctx, rev)
}

// apply writes d in one transaction, on the condition that this
// coordinator still leads and the job's state and generation are as the
// view saw them; a new generation also on its commit and on no other
// generation written since the view (generationTxn). A job that ends
// releases its nodes with its terminal state. It reports the revision
// written and whether it was.
func (l *leader) apply(ctx context.Context, v *view, d *decision) (int64, bool, error) {
	id := v.job.spec.Id
	var ops []clientv3.Op
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(l.k.state(id)), "=", v.job.stateRev),
		clientv3.Compare(clientv3.ModRevision(l.k.generation(id)), "=", v.job.genRev),
	}
	if d.state != nil {
		ops = append(ops, clientv3.OpPut(l.k.state(id), encode(d.state)))
	}
	if d.gen != nil {
		gcmps, gops := generationTxn(l.k, v, d.gen, d.commit)
		cmps, ops = append(cmps, gcmps...), append(ops, gops...)
	}
	if d.open != 0 {
		ops = append(ops, clientv3.OpPut(l.k.open(id), strconv.FormatInt(d.open, 10)))
	}
	if d.stragglers != nil {
		ops = append(ops, clientv3.OpPut(l.k.stragglers(id), encode(d.stragglers)))
	}
	if d.policy != nil {
		ops = append(ops, clientv3.OpPut(l.k.policy(id), encodeJSON(d.policy)))
	}
	for node, np := range d.strikes {
		ops = append(ops, clientv3.OpPut(l.k.nodePolicy(node), encodeJSON(np)))
	}
	return l.txn(ctx, ops, cmps...)
}

// generationTxn is what the transaction that writes the view's job's next
// generation compares and writes besides it, so that what spans objects
// is etcd's to keep, not the cache's:
//   - the commit is the one the view saw (a commit written since would be
//     passed over, and its later steps deleted by every holder's Begin);
//     a generation that resumes from another step (an earlier kept one,
//     the backup tier's) writes it as the commit, so that the commit never
//     names steps the holders drop;
//   - no generation of any job was written since the view's (the
//     generations key, which every generation's transaction writes, is
//     at the view's revision): the nodes the view saw free, no unfinished
//     job's generation has, so no node is in two. A node is released with
//     the generation that leaves it out or the terminal state that ends
//     its job, neither of which can make a free node taken. One compare
//     and one put, whatever the generation's size: a generation of 16,384
//     nodes writes no key per node;
//   - the keys of the generation before the previous one (its exits,
//     times and bootstrap) are deleted: a job's state stays bounded.
func generationTxn(k keys, v *view, next *pb.Generation, commit *pb.Step) ([]clientv3.Cmp, []clientv3.Op) {
	id := v.job.spec.Id
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.commit(id)), "=", v.job.commitRev),
		clientv3.Compare(clientv3.ModRevision(k.generations()), "=", v.gensRev)}
	ops := []clientv3.Op{clientv3.OpPut(k.generation(id), encode(next)),
		clientv3.OpPut(k.generations(), id+"/"+strconv.FormatInt(next.Number, 10))}
	if commit != nil {
		ops = append(ops, clientv3.OpPut(k.commit(id), encode(commit)))
	}
	if old := next.Number - 2; old >= 1 {
		ops = append(ops, clientv3.OpDelete(k.exits(id, old), clientv3.WithPrefix()),
			clientv3.OpDelete(k.timesOf(id, old), clientv3.WithPrefix()),
			clientv3.OpDelete(k.bootstrap(id, old)))
	}
	return cmps, ops
}

// txn commits ops if this coordinator leads and every cmp holds. It
// returns errDeposed when the fence fails, and false when only cmps do.
func (l *leader) txn(ctx context.Context, ops []clientv3.Op, cmps ...clientv3.Cmp) (int64, bool, error) {
	resp, err := l.etcd.Client.Txn(ctx).If(append([]clientv3.Cmp{l.fence}, cmps...)...).Then(ops...).
		Else(clientv3.OpGet(l.electionKey)).Commit()
	if err != nil {
		return 0, false, err
	}
	if resp.Succeeded {
		return resp.Header.Revision, true, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != l.electionRev {
		return 0, false, errDeposed
	}
	return 0, false, nil
}

// forgetEnded deletes every key of the oldest ended jobs beyond KeepJobs.
func (l *leader) forgetEnded(ctx context.Context) error {
	for _, id := range forget(l.cache.jobsNow(), l.cfg.KeepJobs) {
		if _, _, err := l.txn(ctx, []clientv3.Op{clientv3.OpDelete(l.k.job(id), clientv3.WithPrefix())}); err != nil {
			return fmt.Errorf("forgetting job %s: %w", id, err)
		}
		l.log.Info("ended job forgotten", "job", id)
	}
	return nil
}
