package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpucoord/gpucoord/internal/localproc"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/worker/engine"
	"github.com/gpucoord/gpucoord/worker/progress"
)

// PreemptSignal is what an agent sends its native ranks when the node is
// told to leave (SIGTERM to the agent): they checkpoint the step every rank
// finishes, then stop. It is SIGPWR, which nothing else sends a job's
// processes: Slurm's --signal delivers SIGUSR1 (or the signal a user
// names) to every process of a step, ranks included, and that is for
// launch alone.
const PreemptSignal = syscall.SIGPWR

// ExitPreempted is the exit status of a native rank that stopped after
// the checkpoint its preemption asked for (EX_TEMPFAIL): its node's other
// ranks are left to finish that step's collectives rather than stopped.
const ExitPreempted = 75

// ExitUnrestorable is the exit status of a rank that could not restore
// its generation's resume step (GPUCOORD_RESUME_STEP): missing, corrupt or
// half-written. The native engine's ranks exit with it, and any program
// may: the next generation then resumes from an earlier kept step, never
// from this one again (RankExit.unrestorable_step).
const ExitUnrestorable = 76

// ReadPlan reads the assignment a rank's GPUCOORD_PLAN names.
func ReadPlan() (*pb.Assignment, error) {
	path := os.Getenv(EnvPlan)
	if path == "" {
		return nil, fmt.Errorf("%s is not set: this command runs under a gpucoord worker agent", EnvPlan)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	asg := &pb.Assignment{}
	if err := protojson.Unmarshal(b, asg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return asg, nil
}

// NativeConfig is the engine configuration of an assignment's native job.
func NativeConfig(asg *pb.Assignment) (*engine.Config, error) {
	spec := asg.Spec
	job, err := engine.ParseJob(bytes.NewReader(spec.GetNativeJob()), nil)
	if err != nil {
		return nil, err
	}
	kind := schedule.OneFOneB
	if spec.GetSchedule() != "" {
		if kind, err = schedule.ParseKind(spec.GetSchedule()); err != nil {
			return nil, err
		}
	}
	g := pb.GenerationGrid(spec, asg.Generation)
	if g.VPP > 1 {
		kind = schedule.Interleaved
	}
	cfg, err := engine.NewConfig(job, engine.Shape{NP: int(asg.Generation.GetWorld()), TP: int(g.TP), PP: int(g.PP),
		Virtual: int(g.VPP), Zero: int(g.Zero), Schedule: kind, Order: spec.GetOrder()})
	if err != nil {
		return nil, err
	}
	// A generation after a loss resumes from the job's last committed
	// checkpoint: in the shared checkpoint directory, or, when the agents
	// hold the checkpoints, in the node-local directory the agent gathered
	// it into (the rank's GPUCOORD_CHECKPOINT_DIR), where ranks checkpoint
	// every step unless the job says otherwise.
	cfg.CheckpointEvery = int(spec.GetCheckpointEvery())
	cfg.CheckpointOverhead = spec.GetCheckpointOverhead()
	if g := asg.Generation; g.GetResumeTp() > 0 {
		// The files of the resume step were cut by the generation that
		// wrote them (re-planned, maybe another layout than this one's).
		cfg.CheckpointLayout = engine.CheckpointLayout{TP: int(g.GetResumeTp()), PP: int(g.GetResumePp()), Virtual: int(g.GetResumeVpp())}
	}
	if dir := spec.GetCheckpointDir(); dir != "" {
		cfg.CheckpointDir = SharedCheckpointDir(dir, asg.Job)
	} else {
		if cfg.CheckpointDir = os.Getenv(EnvCheckpointDir); cfg.CheckpointDir == "" {
			return nil, fmt.Errorf("%s is not set: the agent holds this job's checkpoints", EnvCheckpointDir)
		}
		cfg.LocalCheckpoints = true
		if cfg.CheckpointEvery == 0 && spec.GetCheckpointOverhead() == 0 {
			cfg.CheckpointEvery = 1
		}
	}
	cfg.Resume = int(asg.Generation.GetResumeStep())
	cfg.Generation = asg.Generation.GetNumber()
	cfg.KeepCheckpoints = int(spec.GetKeepCheckpoints())
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// RunNativeRank runs one rank of a native-engine job from the environment
// an agent gives it (RANK, MASTER_ADDR, MASTER_PORT, GPUCOORD_PLAN). Each
// rank tells its agent of each step and checkpoint over the progress
// channel (GPUCOORD_PROGRESS).
func RunNativeRank(ctx context.Context, stdout, stderr io.Writer) error {
	asg, err := ReadPlan()
	if err != nil {
		return err
	}
	cfg, err := NativeConfig(asg)
	if err != nil {
		return err
	}
	rank, err := strconv.Atoi(os.Getenv("RANK"))
	if err != nil {
		return fmt.Errorf("RANK %q: %v", os.Getenv("RANK"), err)
	}
	// Steps and checkpoints go to the agent over the progress channel.
	prog, err := progress.Dial()
	if err != nil {
		return err
	}
	defer prog.Close()
	cfg.Checkpointed = func(steps int) { prog.Checkpoint(int64(steps)) }
	// The agent answers each checkpoint once stored, and tells of each
	// commit: a rank prunes nothing at or after the last it heard of (a
	// rank cut off from its coordinators hears of none).
	if err := prog.Acks(); err != nil {
		return err
	}
	prog.SetCommitted(asg.Generation.GetResumeStep())
	cfg.Committed = prog.Committed
	if cfg.LocalCheckpoints {
		// A rank trains at most one step past the last stored one.
		cfg.WaitStored = func(ctx context.Context, steps int) error { return prog.WaitStored(ctx, int64(steps)) }
		// While it waits the rank says it is alive, well within the job's
		// own hang timeout.
		if ms := asg.Spec.GetHangTimeoutMs(); ms > 0 {
			prog.HeartbeatEvery = min(progress.DefaultHeartbeatEvery, time.Duration(ms)*time.Millisecond/4)
		}
	}
	// The agent sends PreemptSignal when its node is told to leave: every rank
	// then checkpoints the step in progress and this one stops.
	var preempted atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, PreemptSignal)
	defer signal.Stop(sig)
	go func() {
		if _, ok := <-sig; ok {
			preempted.Store(true)
		}
	}()
	cfg.Preempted = preempted.Load
	// The agent sends SIGQUIT to a rank it finds hung: the rank prints
	// every goroutine's stack and StacksEnd (the agent then kills it), so
	// that a rank blocked in a collective shows where.
	defer answerStacks(stderr)()
	store := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	// Every rank reports its steps: rank 0's lines carry the loss to the
	// coordinator, every rank's its compute time for straggler detection.
	secret, err := localproc.StoreSecret()
	if err != nil {
		return err
	}
	p := engine.Process{Rank: rank, Store: store, StoreSecret: secret, Log: stderr, Bind: os.Getenv(EnvBindHost), Advertise: os.Getenv(EnvHost)}
	return engine.RunProcess(ctx, cfg, p, func(s engine.StepResult) error {
		return prog.Step(int64(s.Step), progress.KV{Key: "loss", Value: s.Loss}, progress.KV{Key: "seconds", Value: s.Seconds},
			progress.KV{Key: "samples_per_sec", Value: s.SamplesPerSec}, progress.KV{Key: "compute_seconds", Value: s.ComputeSeconds})
	})
}

// answerStacks prints every goroutine's stack and StacksEnd to w at each
// SIGQUIT, until the function it returns is called. That function answers
// a SIGQUIT taken before it was called, and one being answered, before it
// returns: a stopped rank that its agent continues to ask for its stacks
// may find at once that its peers are gone (their agents found them hung
// too, and killed them once they answered), or be told to stop, and its
// stacks must come out before it ends.
func answerStacks(w io.Writer) (stop func()) {
	quit := make(chan os.Signal, 1)
	signal.Notify(quit, syscall.SIGQUIT)
	print := func() {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(w, "%s\n%s\n", buf[:n], StacksEnd)
	}
	stopping, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				print()
			case <-stopping:
				// signal.Stop has returned: every SIGQUIT the process
				// took is in quit, or was answered.
				select {
				case <-quit:
					print()
				default:
				}
				return
			}
		}
	}()
	return func() {
		signal.Stop(quit)
		close(stopping)
		<-done
	}
}
