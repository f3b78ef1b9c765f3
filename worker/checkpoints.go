package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
	"github.com/gpucoord/gpucoord/worker/progress"
)

// Checkpoint defaults when the agents hold a job's checkpoints.
const (
	// defaultKeep is how many committed steps each node keeps when the job
	// says 0 (keep all, which in memory would never end).
	defaultKeep = 2
	// shmMinFree is the free space /dev/shm needs to hold checkpoints.
	shmMinFree = 2 << 30
)

// held reports whether the agents hold asg's checkpoints (no shared
// directory).
func held(asg *pb.Assignment) bool { return pb.HeldCheckpoints(asg.Spec) }

// restore gathers, before a generation's ranks start, the files of its
// resume step from wherever they are: this node's own or replica
// directories, a peer holding them, or the backup tier. Each writer's
// files come from the first of its holders that answers.
func (a *Agent) restore(ctx context.Context, asg *pb.Assignment) error {
	g, job := asg.Generation, asg.Job
	step := g.GetResumeStep()
	if step == 0 || a.holder == nil {
		return nil
	}
	start := time.Now()
	if g.GetFromBackup() {
		if err := a.holder.FromBackup(job, step, SharedCheckpointDir(asg.Spec.GetCheckpointBackup(), job)); err != nil {
			return fmt.Errorf("restoring step %d from the backup tier: %w", step, err)
		}
		a.log.Info("restored from the backup tier", "job", job, "step", step, "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	addrs := map[string]string{}
	for _, m := range g.Members {
		addrs[m.Node] = m.CheckpointAddr
	}
	var bytes int64
	for _, c := range g.GetCheckpoint() {
		if err := a.gatherOne(ctx, asg, c, addrs, &bytes); err != nil {
			return err
		}
	}
	a.log.Info("restored from peers", "job", job, "step", step, "writers", len(g.GetCheckpoint()), "fetched_bytes", bytes,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// wroteResume says whether node wrote its own files of g's resume step in
// the generation that committed it: whether the step's holders (g's
// checkpoint) name it as a writer. A step from the backup tier is copied
// whole from there; a generation that names no holders at all says
// nothing either way, and the node's files stay as they are.
func wroteResume(g *pb.Generation, node string) bool {
	if g.GetFromBackup() {
		return false
	}
	cs := g.GetCheckpoint()
	return len(cs) == 0 || slices.ContainsFunc(cs, func(c *pb.Copies) bool { return c.Node == node })
}

// gatherOne brings writer c.Node's files of the resume step into this
// node's own directory of it.
func (a *Agent) gatherOne(ctx context.Context, asg *pb.Assignment, c *pb.Copies, addrs map[string]string, bytes *int64) error {
	job, step := asg.Job, asg.Generation.GetResumeStep()
	// Held here already: as the writer, or as one of its replicas.
	if slices.Contains(c.Holders, a.cfg.Name) && a.holder.Has(job, c.Node, step) {
		if c.Node == a.cfg.Name {
			return nil
		}
		return a.holder.CopyLocal(job, c.Node, step)
	}
	var errs []error
	for i, h := range c.Holders {
		if h == a.cfg.Name {
			continue
		}
		addr := addrs[h]
		if i < len(c.Addrs) && c.Addrs[i] != "" {
			addr = c.Addrs[i] // a live holder, member or not
		}
		if addr == "" {
			errs = append(errs, fmt.Errorf("%s: not alive when the generation was made", h))
			continue
		}
		n, err := a.holder.Fetch(ctx, ckpt.Peer{Name: h, Addr: addr}, job, c.Node, asg.Generation.GetNumber(), step)
		if err == nil {
			*bytes += n
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", h, err))
	}
	return fmt.Errorf("restoring step %d: no holder of node %s's files answered: %w", step, c.Node, errors.Join(errs...))
}

// checkpoints follows a run's progress lines for the agent: rank 0's steps
// go to the coordinator, every rank's step times to straggler detection,
// and once every local rank has written a step's files, the step is
// stored (replicated when the agents hold the checkpoints) and reported.
type checkpoints struct {
	a     *Agent
	asg   *pb.Assignment
	local []int
	log   *slog.Logger
	times *stepTimes
	step  func(s *pb.Step) // rank 0's progress
	// ack answers the local ranks that asked (progress's "acks"): the
	// agent is done with their checkpoint of step, stored or not.
	ack func(step int64, stored bool)
	// tell tells the local ranks of each newer commit (they prune nothing
	// at or after it).
	tell func(step int64)

	mu       sync.Mutex
	recent   []time.Duration  // the local ranks' last step times (replicaPace)
	written  map[int]int64    // each local rank's newest "checkpoint N"
	queued   int64            // newest step every local rank has written
	stored   []*pb.StoredStep // stored, not known committed
	commit   int64            // the job's last commit, as last heard
	wake     chan struct{}
	finished chan struct{}
}

func newCheckpoints(a *Agent, asg *pb.Assignment, local []int, times *stepTimes, step func(*pb.Step)) *checkpoints {
	c := &checkpoints{a: a, asg: asg, local: local, times: times, step: step, written: map[int]int64{},
		commit: asg.Generation.GetResumeStep(), wake: make(chan struct{}, 1), finished: make(chan struct{}),
		log: a.log.With("job", asg.Job, "generation", asg.Generation.GetNumber())}
	c.queued = c.commit
	return c
}

// handle takes one rank's progress line (progress.Handler).
func (c *checkpoints) handle(rank int, e progress.Event, _ time.Time) {
	switch e.Kind {
	case progress.Step:
		secs, ok := e.Float("compute_seconds")
		if !ok {
			secs, ok = e.Float("seconds")
		}
		if ok {
			c.times.add(rank, secs)
			c.mu.Lock()
			c.recent = append(c.recent, time.Duration(secs*float64(time.Second)))
			if len(c.recent) > paceWindow {
				c.recent = c.recent[len(c.recent)-paceWindow:]
			}
			c.mu.Unlock()
		}
		if rank == 0 {
			s := &pb.Step{Step: e.Step}
			s.Loss, _ = e.Float("loss")
			s.Seconds, _ = e.Float("seconds")
			s.SamplesPerSec, _ = e.Float("samples_per_sec")
			c.step(s)
		}
	case progress.Checkpoint:
		c.mu.Lock()
		c.written[rank] = max(c.written[rank], e.Step)
		ready := e.Step
		for _, r := range c.local {
			ready = min(ready, c.written[r])
		}
		if ready > c.queued {
			c.queued = ready
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
		c.mu.Unlock()
	}
}

// run stores each step as it becomes ready (the newest when several are:
// a slow replication skips steps, it never stalls training) until ctx
// ends; then it stores what is ready and reports, within grace, so that a
// preempted node's last checkpoint is committed while it is a member.
func (c *checkpoints) run(ctx context.Context, done <-chan struct{}, grace time.Duration) {
	defer close(c.finished)
	var storedUpTo int64 = c.commit
	storeReady := func(ctx context.Context) {
		c.mu.Lock()
		n := c.queued
		c.mu.Unlock()
		if n > storedUpTo {
			err := c.store(ctx, n)
			if c.ack != nil {
				c.ack(n, err == nil)
			}
			if err != nil {
				if ctx.Err() == nil {
					c.log.Warn("storing a checkpoint", "step", n, "err", err)
				}
				return
			}
			storedUpTo = n
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
			storeReady(fctx)
			cancel()
			return
		case <-c.wake:
			storeReady(ctx)
		}
	}
}

// store replicates this node's files of step to its peers (when the agents
// hold them: the step is sealed first, every local rank having written
// it), copies them to the backup tier when the step is one, and reports
// the node's stored steps. Each replica has its deadline
// (ckpt.Limits.ReplicaTimeout): a peer that does not take it fails the
// step, not the ranks waiting for it.
func (c *checkpoints) store(ctx context.Context, step int64) error {
	a, asg := c.a, c.asg
	spec := asg.Spec
	x := &pb.StoredStep{Step: step}
	if held(asg) && a.holder != nil {
		if err := a.holder.Seal(asg.Job, asg.Generation.GetNumber(), step); err != nil {
			return err
		}
		peers := asg.Replicas // the coordinator chose them
		addrs := map[string]string{}
		for _, m := range asg.Generation.Members {
			addrs[m.Node] = m.CheckpointAddr
		}
		c.mu.Lock()
		pace := replicaPace(c.recent, len(peers))
		c.mu.Unlock()
		start := time.Now()
		var mu sync.Mutex
		var wg sync.WaitGroup
		var errs []error
		var sent int64
		for _, p := range peers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := a.holder.SendPaced(ctx, ckpt.Peer{Name: p, Addr: addrs[p]}, asg.Job, asg.Generation.GetNumber(), step, pace)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", p, err))
				}
				sent += n
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		x.Holders = append([]string{a.cfg.Name}, peers...)
		c.log.Debug("replicated", "step", step, "peers", peers, "bytes", sent, "took", time.Since(start),
			"paced_within", pace.Within)
	}
	if dir := spec.GetCheckpointBackup(); dir != "" && spec.GetBackupEvery() > 0 && step%int64(spec.GetBackupEvery()) == 0 {
		dir = SharedCheckpointDir(dir, asg.Job)
		var err error
		if held(asg) && a.holder != nil {
			err = a.holder.ToBackup(asg.Job, step, dir)
		}
		if err != nil {
			return fmt.Errorf("backup of step %d: %w", step, err)
		}
		x.Backup = true
	}
	c.mu.Lock()
	c.stored = append(c.stored, x)
	if len(c.stored) > 32 {
		c.stored = c.stored[len(c.stored)-32:]
	}
	steps := slices.Clone(c.stored)
	c.mu.Unlock()
	resp, err := a.reportVia(ctx, asg, &pb.ReportRequest{Job: asg.Job, Generation: asg.Generation.GetNumber(),
		Kind: &pb.ReportRequest_Stored{Stored: &pb.Stored{Steps: steps}}})
	if err != nil {
		return err
	}
	c.committed(resp.GetCommitted())
	return nil
}

// committed notes the job's last commit: what is no longer needed goes.
func (c *checkpoints) committed(step int64) {
	c.mu.Lock()
	if step <= c.commit {
		c.mu.Unlock()
		return
	}
	c.commit = step
	c.stored = slices.DeleteFunc(c.stored, func(x *pb.StoredStep) bool { return x.Step <= step })
	c.mu.Unlock()
	if c.tell != nil {
		c.tell(step)
	}
	spec := c.asg.Spec
	keep := int(spec.GetKeepCheckpoints())
	if keep == 0 {
		keep = defaultKeep
	}
	if held(c.asg) && c.a.holder != nil {
		c.a.holder.Prune(c.asg.Job, keep, step)
	}
	if dir := spec.GetCheckpointBackup(); dir != "" {
		dir = SharedCheckpointDir(dir, c.asg.Job)
		if me := member(c.asg, c.a.cfg.Name); me != nil && me.FirstRank == 0 {
			ckpt.PruneBackup(dir, keep, step)
		}
	}
}

// Replication pacing (ckpt.Pace): a step's replicas are spread over part
// of a step instead of bursting at its start, where they would take the
// cores the ranks train on.
const (
	// replicaShare is the most of one core a step's replicas take, all
	// peers together, while they are ahead of their bound.
	replicaShare = 0.25
	// replicaWithin is the part of a step's compute time a step's replicas
	// may be spread over. The ranks wait for a step to be stored before
	// they train past the next one, so the rest of that step is left for
	// writing and sealing the files, the report that stores the step, and
	// slack: pacing never makes them wait.
	replicaWithin = 0.5
	// paceWindow is how many of the local ranks' latest step times the
	// pace is taken from (their median).
	paceWindow = 16
)

// replicaPace is how a step's replicas to peers peers are paced when the
// local ranks' latest step times (their compute time, or the whole step
// where a program reports no compute time) are recent: spread over
// replicaWithin of the median, at replicaShare of a core shared by the
// peers' streams. Not paced before any step time is known, or with no
// peer.
func replicaPace(recent []time.Duration, peers int) ckpt.Pace {
	if len(recent) == 0 || peers < 1 {
		return ckpt.Pace{}
	}
	s := slices.Clone(recent)
	slices.Sort(s)
	step := s[len(s)/2]
	if step <= 0 {
		return ckpt.Pace{}
	}
	return ckpt.Pace{Share: replicaShare / float64(peers), Within: time.Duration(replicaWithin * float64(step))}
}

// progressEnv is a rank's GPUCOORD_PROGRESS.
func progressEnv(l *progress.Listener, rank int) string {
	return progress.EnvPath + "=" + l.Path(rank)
}
