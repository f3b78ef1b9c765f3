package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gpucoord/gpucoord/internal/localproc"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/worker/engine"
	"github.com/gpucoord/gpucoord/worker/progress"
)

// generation is the life of one generation of a job on this node, from
// its assignment to the report of how its ranks ended, in the order it
// runs: bootstrap (rank 0's node serves the rendezvous and reports it),
// the shared directory's probe, the plan file, the checkpoints (restored
// when the agents hold them), the ranks' output, their progress, the hang
// watchdog, and their exit. Each step that fails returns a *failedStep
// holding the exit to report; nothing is reported once the run's context
// has ended (the node was told to stop).
type generation struct {
	a      *Agent
	asg    *pb.Assignment
	log    *slog.Logger
	me     *pb.Member
	native bool // the native engine's ranks, not a user's command
	layout topology.Layout
	// dir is the generation's own directory (its plan file, the ranks'
	// error files), removed when it ends; ckptDir the ranks'
	// GPUCOORD_CHECKPOINT_DIR.
	dir, planPath, ckptDir string
	local                  []int // the node's ranks
	// cleanups run, last first, when the generation ends.
	cleanups []func()
}

// failedStep is a step of a generation that failed: the exit reported
// for the node's ranks.
type failedStep struct{ exit *pb.RankExit }

func (f *failedStep) Error() string { return f.exit.Error }

// fail is the failure of the generation's step on this node's first rank.
func (g *generation) fail(code int32, format string, args ...any) error {
	return &failedStep{&pb.RankExit{Rank: g.me.FirstRank, Code: code, Error: fmt.Sprintf(format, args...)}}
}

// run runs one generation on this node (see generation) and reports how
// it ended.
func (a *Agent) run(ctx context.Context, asg *pb.Assignment, masters <-chan *pb.Bootstrap, early *earlyBoot, hooks runHooks) {
	if early != nil {
		defer early.stop() // the run's now: ended after its ranks
	}
	log := a.log.With("job", asg.Job, "generation", asg.Generation.GetNumber())
	me := member(asg, a.cfg.Name)
	if me == nil {
		log.Error("assignment without this node")
		return
	}
	// However it ends, the generation's output ends here: its followers
	// stop once they have every line.
	defer a.output.End(asg.Job, asg.Generation.GetNumber())
	g := &generation{a: a, asg: asg, log: log, me: me, native: len(asg.Spec.GetCommand()) == 0}
	defer func() {
		for i := len(g.cleanups) - 1; i >= 0; i-- {
			g.cleanups[i]()
		}
	}()
	err := g.bootstrap(ctx, masters, early)
	if err == nil {
		err = g.prepare(ctx)
	}
	if err == nil {
		err = g.runRanks(ctx, hooks)
	}
	var f *failedStep
	switch {
	case ctx.Err() != nil:
	case errors.As(err, &f):
		a.reportExit(ctx, asg, f.exit)
	case err != nil:
		log.Warn("generation", "err", err)
	}
}

// probeDir is the directory every node of asg's generation must share (a
// shared checkpoint directory, or the backup tier of held ones), checked
// at every generation: rank 0's node writes a probe there and every other
// node must read it; "" when there is none to check.
func probeDir(asg *pb.Assignment) string {
	dir := cmp.Or(asg.Spec.GetCheckpointDir(), asg.Spec.GetCheckpointBackup())
	if dir == "" || asg.GroupWorld < 2 {
		return ""
	}
	return dir
}

// bootstrapRank0 makes rank 0's part of asg's generation on this node:
// its rendezvous (Agent.bootstrap) and, where the nodes must share a
// directory, the probe written there. stop ends the one and removes the
// other.
func (a *Agent) bootstrapRank0(ctx context.Context, asg *pb.Assignment) (boot *pb.Bootstrap, stop func(), err error) {
	boot, stopStore, err := a.bootstrap(ctx, len(asg.Spec.GetCommand()) == 0)
	if err != nil {
		return nil, nil, fmt.Errorf("bootstrap: %w", err)
	}
	dir := probeDir(asg)
	if dir == "" {
		return boot, stopStore, nil
	}
	if boot.Probe, err = writeProbe(dir, asg); err != nil {
		stopStore()
		return nil, nil, err
	}
	return boot, func() { stopStore(); os.Remove(filepath.Join(Owned(dir), boot.Probe)) }, nil
}

// earlyBoot is rank 0's bootstrap made on this node while its generation
// had not opened (the ranks of the one before still stopping elsewhere):
// its store serves and its address is reported meanwhile, so that the
// opening brings every node the address in one message, with nobody
// waiting on rank 0's node then. The generation's run takes it over.
type earlyBoot struct {
	job  string
	gen  int64
	boot *pb.Bootstrap
	stop func()
	// reported is closed once the report is answered, or given up.
	reported chan struct{}
}

// bootstrap, on rank 0's node, serves the generation's rendezvous, writes
// the probe and reports both, or takes over those made before the
// generation opened (early); then every node waits for the master address
// and checks the probe.
func (g *generation) bootstrap(ctx context.Context, masters <-chan *pb.Bootstrap, early *earlyBoot) error {
	a, asg, probeDir := g.a, g.asg, probeDir(g.asg)
	if g.me.FirstRank == 0 && asg.Master == "" {
		var boot *pb.Bootstrap
		if early != nil {
			// Reported already, or being reported: once more does no
			// harm (the first report of a generation's is the one kept).
			boot = early.boot
		} else {
			b, stop, err := a.bootstrapRank0(ctx, asg)
			if err != nil {
				g.log.Error("bootstrap", "err", err)
				return &failedStep{&pb.RankExit{Rank: 0, Code: 1, Error: err.Error()}}
			}
			g.cleanups = append(g.cleanups, stop)
			boot = b
		}
		if err := a.report(ctx, &pb.ReportRequest{Job: asg.Job, Generation: asg.Generation.GetNumber(),
			Kind: &pb.ReportRequest_Bootstrap{Bootstrap: boot}}); err != nil {
			return fmt.Errorf("reporting the bootstrap: %w", err)
		}
	}
	var boot *pb.Bootstrap
	select {
	case <-ctx.Done():
		return ctx.Err()
	case boot = <-masters:
	}
	asg.Master, asg.StoreSecret = boot.Master, boot.StoreSecret
	if probeDir != "" && g.me.FirstRank != 0 {
		if err := readProbe(probeDir, boot.Probe, rankNode(asg, 0), a.cfg.Name); err != nil {
			g.log.Error("checkpoint directory", "err", err)
			return g.fail(1, "%v", err)
		}
	}
	return nil
}

// prepare lays the generation out: its layout, its plan file, the ranks'
// checkpoint directory (with the resume step's files gathered there when
// the agents hold the checkpoints), the working directory, and what the
// ranks' user may reach.
func (g *generation) prepare(ctx context.Context) error {
	a, asg := g.a, g.asg
	var err error
	if g.layout, err = layout(asg); err != nil {
		return g.fail(2, "%v", err)
	}
	g.dir = filepath.Join(a.jobDir(asg.Job), "gen-"+strconv.FormatInt(asg.Generation.GetNumber(), 10))
	g.cleanups = append(g.cleanups, func() { os.RemoveAll(g.dir) }) // the plan file is this generation's alone
	g.planPath = filepath.Join(g.dir, "plan.json")
	if err := writePlan(g.planPath, asg); err != nil {
		return g.fail(1, "plan file on node %s: %v", a.cfg.Name, err)
	}
	if err := writeGroups(g.dir, asg, g.layout); err != nil {
		return g.fail(1, "process groups file on node %s: %v", a.cfg.Name, err)
	}
	if err := g.checkpoints(ctx); err != nil {
		return err
	}
	if wd := asg.Spec.GetWorkdir(); wd != "" && !g.native {
		if fi, err := os.Stat(wd); err != nil || !fi.IsDir() {
			return g.fail(1, "working directory %s does not exist on node %s", wd, a.cfg.Name)
		}
	}
	if ru := a.rankUser; ru != nil {
		// The ranks' user may write what is theirs: the generation's
		// directory (their error files) and their checkpoint directory;
		// every other job's held checkpoints are closed to them.
		err := ru.give(g.dir)
		if held(asg) {
			err = errors.Join(err, ru.closeHeld(a.holder.Root(), a.holder.Jobs(), asg.Job, g.ckptDir))
			g.cleanups = append(g.cleanups, func() {
				if err := ru.closeHeld(a.holder.Root(), a.holder.Jobs(), "", ""); err != nil {
					g.log.Warn("closing the held checkpoints", "err", err)
				}
			})
		} else {
			err = errors.Join(err, ru.give(g.ckptDir))
		}
		if err != nil {
			return g.fail(1, "node %s: the ranks' user %s: %v", a.cfg.Name, ru.name, err)
		}
	}
	g.local = make([]int, g.me.Ranks)
	for i := range g.local {
		g.local[i] = int(g.me.FirstRank) + i
	}
	return nil
}

// checkpoints makes the ranks' checkpoint directory: the job's own in a
// shared directory, or, without one, this node's directory of the
// checkpoints the agents hold, after the resume step's files are gathered
// there (a step that cannot be gathered is unrestorable_step).
func (g *generation) checkpoints(ctx context.Context) error {
	a, asg := g.a, g.asg
	if shared := asg.Spec.GetCheckpointDir(); shared != "" {
		g.ckptDir = SharedCheckpointDir(shared, asg.Job)
	} else {
		g.ckptDir = a.holder.Own(asg.Job)
		if err := a.holder.Begin(asg.Job, asg.Generation.GetNumber(), asg.Generation.GetResumeStep(), wroteResume(asg.Generation, a.cfg.Name)); err != nil {
			g.log.Error("checkpoint", "err", err)
			return g.fail(1, "node %s: %v", a.cfg.Name, err)
		}
		if err := a.restore(ctx, asg); err != nil {
			if ctx.Err() == nil {
				g.log.Error("checkpoint", "err", err)
			}
			if engine.NodeFull(err) {
				// This node has no room for the step now, which says nothing
				// of the step: the next generation tries it again.
				return g.fail(1, "node %s: no room to gather the resume step: %v", a.cfg.Name, err)
			}
			e := &pb.RankExit{Rank: g.me.FirstRank, Code: ExitUnrestorable, Error: fmt.Sprintf("node %s: %v", a.cfg.Name, err),
				UnrestorableStep: asg.Generation.GetResumeStep()}
			return &failedStep{e}
		}
	}
	if err := os.MkdirAll(g.ckptDir, 0o755); err != nil {
		return g.fail(1, "checkpoint directory on node %s: %v", a.cfg.Name, err)
	}
	return nil
}

// runRanks runs the node's ranks until they end or ctx does, with their
// output tagged and kept, their progress followed (steps reported,
// checkpoints stored and committed, hangs found), and reports how they
// ended.
func (g *generation) runRanks(ctx context.Context, hooks runHooks) error {
	a, asg, local := g.a, g.asg, g.local
	argv := asg.Spec.GetCommand()
	if g.native {
		argv = a.cfg.NativeCommand
	}
	out := g.output(ctx)
	// Every rank speaks the progress protocol (native ranks always, a
	// user's program when it cares): rank 0's steps go to the coordinator
	// as the job's progress, every rank's step times to straggler
	// detection, and its checkpoints are stored and committed.
	times := newStepTimes()
	cp := newCheckpoints(a, asg, local, times, func(s *pb.Step) {
		a.report(ctx, &pb.ReportRequest{Job: asg.Job, Generation: asg.Generation.GetNumber(), Kind: &pb.ReportRequest_Step{Step: s}})
	})
	// A rank silent for the hang timeout is hung (hang.go).
	wd := newWatchdog(time.Duration(asg.Spec.GetHangTimeoutMs())*time.Millisecond, local)
	pl, err := progress.Listen("", local, g.log, func(rank int, e progress.Event, at time.Time) {
		wd.saw(rank, e, at)
		cp.handle(rank, e, at)
	})
	if err != nil {
		return g.fail(1, "node %s: %v", a.cfg.Name, err)
	}
	if ru := a.rankUser; ru != nil {
		// Their progress sockets too.
		err := ru.give(filepath.Dir(pl.Path(local[0])))
		for _, r := range local {
			err = errors.Join(err, ru.give(pl.Path(r)))
		}
		if err != nil {
			g.log.Error("progress sockets for the ranks' user", "user", ru.name, "err", err)
		}
	}
	cp.ack = func(step int64, stored bool) {
		for _, r := range local {
			pl.Stored(r, step, stored)
		}
	}
	cp.tell = pl.Committed
	ranksDone := make(chan struct{})
	go cp.run(ctx, ranksDone, a.cfg.Grace)
	tctx, stopTimes := context.WithCancel(ctx)
	defer stopTimes()
	go a.reportTimes(tctx, asg, times)
	var pidsMu sync.Mutex
	pids := map[int]int{}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		wd.run(ctx, ranksDone, func(s []rankProgress, timeout time.Duration) {
			a.reportHang(ctx, asg, s, timeout, func(rank int) int {
				pidsMu.Lock()
				defer pidsMu.Unlock()
				return pids[rank]
			}, out.tails, ranksDone)
		})
	}()
	pcfg := localproc.Config{
		Ranks: g.layout.World(), Local: local, Store: asg.Master, StoreSecret: asg.StoreSecret, Grace: a.cfg.Grace,
		Stdout: out.writer, Stderr: out.writer,
		Started: func(rank int, p *os.Process) {
			pidsMu.Lock()
			pids[rank] = p.Pid
			pidsMu.Unlock()
			hooks.started(rank, p)
		},
		Command: func(ctx context.Context, rank int, _ string) (*exec.Cmd, error) {
			return g.command(ctx, argv, rank, pl)
		},
	}
	if g.native {
		pcfg.Linger = ExitPreempted // its node's other ranks finish the checkpoint's step
	}
	g.log.Info("starting ranks", "first", g.me.FirstRank, "count", g.me.Ranks, "master", asg.Master)
	err = localproc.Run[struct{}](ctx, pcfg, nil)
	out.flush()
	// The ranks' last lines are in (read to their end, though reporting
	// the lines before took a while: a coordinator failing over), and
	// reported: what they checkpointed is stored and reported before how
	// they ended, so that a step every rank wrote before a failure (or a
	// preemption) is committed in this generation.
	dctx, stopDrain := context.WithTimeout(ctx, progressDrain)
	pl.Drain(dctx)
	stopDrain()
	pl.Close()
	close(ranksDone)
	<-cp.finished
	<-watched
	if ctx.Err() != nil {
		g.log.Info("ranks stopped")
		return nil
	}
	if wd.found() {
		return nil // reported hung, not as they ended when asked for stacks
	}
	g.exited(ctx, err, out)
	return nil
}

// progressDrain bounds how long the ranks' last progress lines are read
// after they exited, while reports of the lines before are tried again.
const progressDrain = 10 * time.Second

// command is rank's process: the program (or the native rank) with the
// rank's environment, as the ranks' user when there is one.
func (g *generation) command(ctx context.Context, argv []string, rank int, pl *progress.Listener) (*exec.Cmd, error) {
	a, asg := g.a, g.asg
	env, err := RankEnv(asg, a.node(), rank, g.planPath, g.ckptDir)
	if err != nil {
		return nil, err
	}
	env = append(env, progressEnv(pl, rank))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	// The agent's own environment (its join token among it) stays with the
	// agent: a rank inherits only what programs need.
	cmd.Env = inheritedEnv(os.Environ(), a.cfg.RankEnv)
	if ru := a.rankUser; ru != nil {
		cmd.SysProcAttr = ru.credential()
		cmd.Env = append(cmd.Env, ru.env()...) // the job's own env may still say otherwise
	}
	cmd.Env = append(cmd.Env, env...)
	if g.native {
		return cmd, nil
	}
	cmd.Dir = asg.Spec.GetWorkdir()
	if os.Getenv("OMP_NUM_THREADS") == "" {
		cmd.Env = append(cmd.Env, "OMP_NUM_THREADS=1") // as torchrun does for several local ranks
	}
	if os.Getenv(EnvErrorFile) == "" && asg.Spec.GetEnv()[EnvErrorFile] == "" {
		cmd.Env = append(cmd.Env, EnvErrorFile+"="+errorFilePath(g.dir, rank)) // as torchrun sets it
	}
	if os.Getenv("PYTHONFAULTHANDLER") == "" && asg.Spec.GetEnv()["PYTHONFAULTHANDLER"] == "" {
		cmd.Env = append(cmd.Env, "PYTHONFAULTHANDLER=1") // a hung Python rank prints its stacks on SIGABRT
	}
	return cmd, nil
}

// rankOutput is where the ranks' lines go: every line a rank prints goes
// to the agent's output and to the node's record of the job's output
// (ranklog), behind the rank's tag; its last lines are kept for the
// report of its failure.
type rankOutput struct {
	writer  func(rank int) io.Writer
	tails   map[int]*outputTail
	writers []*localproc.LineWriter
}

func (g *generation) output(ctx context.Context) *rankOutput {
	a, asg := g.a, g.asg
	out := &rankOutput{tails: map[int]*outputTail{}}
	for _, r := range g.local {
		out.tails[r] = &outputTail{}
	}
	gen := asg.Generation.GetNumber()
	out.writer = func(rank int) io.Writer {
		pre := prefix(a.cfg.Name, rank, g.layout)
		w := &localproc.LineWriter{Line: func(b []byte) error {
			if ctx.Err() != nil {
				// Stopped (a new generation, a cancel): what the ranks say
				// of their interruption is noise.
				return nil
			}
			out.tails[rank].add(b, time.Now())
			text := append([]byte(pre), b...)
			a.output.Line(asg.Job, gen, rank, text)
			a.out.Lock()
			defer a.out.Unlock()
			_, err := a.cfg.Output.Write(text)
			return err
		}}
		out.writers = append(out.writers, w)
		return w
	}
	return out
}

func (o *rankOutput) flush() {
	for _, w := range o.writers {
		w.Flush()
	}
}

// exited reports how the ranks ended (err is localproc.Run's): every one
// 0, or the first that failed, in the program's own words (its error file
// from @record, or the exception that ends its output).
func (g *generation) exited(ctx context.Context, err error, out *rankOutput) {
	a, asg := g.a, g.asg
	var ee *localproc.ExitError
	switch {
	case err == nil:
		for _, r := range g.local {
			a.reportExit(ctx, asg, &pb.RankExit{Rank: int32(r)})
		}
	case errors.As(err, &ee):
		file, _ := os.ReadFile(errorFilePath(g.dir, ee.Rank))
		cause, output := failureCause(file, out.tails[ee.Rank].String())
		e := &pb.RankExit{Rank: int32(ee.Rank), Code: int32(ee.Code()), Error: cmp.Or(cause, ee.Err.Error()),
			FailedAtUnixMs: ee.At.UnixMilli(), Output: output}
		if ee.Code() == ExitUnrestorable {
			e.UnrestorableStep = asg.Generation.GetResumeStep()
		}
		a.reportExit(ctx, asg, e)
	default:
		a.reportExit(ctx, asg, &pb.RankExit{Rank: g.me.FirstRank, Code: 1, Error: err.Error()})
	}
}
