package engine

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// Config configures one run of the engine on a 3D layout. Start from
// DefaultConfig and override fields.
type Config struct {
	// Job is the model, batch, optimizer, steps and seed.
	Job *Job
	// TP is the tensor-parallel degree; it must divide model.hidden.
	TP int
	// PP is the number of pipeline stages.
	PP int
	// DP is the data-parallel degree.
	DP int
	// Virtual is the number of model chunks per pipeline rank; above 1 only
	// with the interleaved schedule.
	Virtual int
	// Schedule is the pipeline schedule: gpipe, 1f1b, interleaved, zb-h1.
	Schedule schedule.Kind
	// Zero is the ZeRO stage, 0-3.
	Zero int
	// Order is the rank order, fastest axis first ("" is Megatron-LM's
	// tp-cp-dp-pp; see topology.ParseOrder).
	Order string
	// Timeline records a span per executed op for bubble measurements.
	Timeline bool
	// CheckpointDir is where Train writes sharded checkpoints (Rank.
	// Checkpoint) and Resume reads from; empty writes none.
	CheckpointDir string
	// CheckpointEvery writes a checkpoint after every this many steps, and
	// after the last; 0 with a CheckpointDir means only after the last.
	CheckpointEvery int
	// CheckpointOverhead, above 0 with a CheckpointDir and no
	// CheckpointEvery, chooses the interval as the run goes so that
	// checkpoints add at most this share of the training time (0.05: 5%):
	// Cadence, fed each step's largest time over the world (one all-reduce
	// of a value per step).
	CheckpointOverhead float64
	// Preempted, when set with a CheckpointDir, is asked after every step:
	// if it is true on any rank (an all-reduce of one value per step), every
	// rank checkpoints that step, and the preempted ranks return
	// ErrPreempted while the others go on. A node told to leave (a cloud's
	// preemption notice) so loses no step.
	Preempted func() bool
	// LocalCheckpoints makes CheckpointDir node-local: after each
	// checkpointed step every rank writes its state straight into its
	// files under CheckpointDir/<step> (Rank.StageLocal: one copy, no
	// buffer in between) and places them (fsync, rename) in the background
	// while the next step runs, with no manifest and no barrier; Resume
	// reads with Rank.RestoreLocal. The agent that gathered and replicates
	// the files commits a step.
	LocalCheckpoints bool
	// Checkpointed, when set, is told of every step whose checkpoint this
	// rank has written; with LocalCheckpoints it is called from the
	// background writer.
	Checkpointed func(steps int)
	// WaitStored, when set with LocalCheckpoints, waits until the agent is
	// done with the checkpoint of a step (replicated and reported, or given
	// up). Train calls it at the end of each step for the last checkpoint
	// written, before the step's closing all-reduce: once any rank reports
	// step N, every node has stored the checkpoint before it, so a failure
	// loses at most the step in flight.
	WaitStored func(ctx context.Context, steps int) error
	// Resume is the number of steps already done: Train restores their
	// checkpoint from CheckpointDir (written at any layout of the model:
	// TP, PP, Virtual, DP and ZeRO stage; see Rank.Restore) and goes on
	// with the next step. Data and Adam's step count depend only on the
	// step, so the run continues as if it had not stopped.
	Resume int
	// CheckpointLayout is the layout that wrote the checkpoint Resume
	// reads, when the caller knows it (a coordinator records it with each
	// commit). The zero value means unknown: Restore then finds it among
	// the layouts under CheckpointDir that hold the step.
	CheckpointLayout CheckpointLayout
	// KeepCheckpoints is how many committed checkpoint steps stay in
	// CheckpointDir: after each commit older ones are removed
	// (sharding.Prune). 0 keeps every one; otherwise at least 2.
	KeepCheckpoints int
	// Committed, when set, is the job's newest commit as the rank has
	// heard of it: pruning keeps it and every later step (see
	// sharding.Prune's floor). Nil: no floor (a run without a
	// coordinator).
	Committed func() int64
	// Generation, when above 0, fences the checkpoints: world rank 0 raises
	// CheckpointDir's fence to it before the first step, and every
	// checkpoint write first checks that no later generation has started
	// (sharding.ErrFenced), so that a replaced generation still running
	// (a host cut off from its coordinator) cannot overwrite its successor's.
	Generation int64
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// CheckpointLayout is the tensor- and pipeline-parallel layout that wrote a
// checkpoint. It decides the checkpoint's roots,
// tp<t>-of-<TP>/chunk<c>-of-<PP*Virtual>, and so which tensors each holds;
// the DP degree and the ZeRO stage do not matter to a reader. The zero
// value means unknown.
type CheckpointLayout struct {
	// TP is the tensor-parallel degree.
	TP int
	// PP is the number of pipeline stages.
	PP int
	// Virtual is the number of model chunks per pipeline rank; 0 means 1.
	Virtual int
}

// known reports whether l names a layout (is not the zero value).
func (l CheckpointLayout) known() bool { return l != CheckpointLayout{} }

// DefaultConfig returns a single-process layout: tp=pp=dp=1, 1F1B, ZeRO 0.
func DefaultConfig(job *Job) *Config {
	return &Config{Job: job, TP: 1, PP: 1, DP: 1, Virtual: 1, Schedule: schedule.OneFOneB}
}

// Stage returns the ZeRO stage as sharding's Stage, whose Spec says what the
// engine keeps whole, what it shards and how it communicates.
func (c *Config) Stage() sharding.Stage { return sharding.Stage(c.Zero) }

// World returns tp*pp*dp.
func (c *Config) World() int { return c.TP * c.PP * c.DP }

// Microbatches returns the number of micro-batches each pipeline runs per
// step: global / (micro * dp).
func (c *Config) Microbatches() int { return c.Job.Batch.Global / (c.Job.Batch.Micro * c.DP) }

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidJob, fmt.Sprintf(format, a...))
	}
	if c.Job == nil {
		return bad("no job")
	}
	if err := c.Job.Validate(); err != nil {
		return err
	}
	m := c.Job.Model
	switch {
	case c.DP < 1 || c.Virtual < 1:
		return bad("dp %d and virtual stages %d must be at least 1 (a Config holds them resolved; NewConfig derives them)", c.DP, c.Virtual)
	case c.Stage().Validate() != nil:
		return bad("ZeRO stage %d: want 0, 1, 2 or 3", c.Zero)
	case c.CheckpointOverhead < 0 || c.CheckpointOverhead >= 1 || c.CheckpointOverhead > 0 && c.CheckpointEvery > 0:
		return bad("checkpoint overhead %g with checkpoint every %d: want a share in [0, 1) and not both", c.CheckpointOverhead, c.CheckpointEvery)
	case c.CheckpointEvery < 0 || c.Resume < 0 || c.Resume > c.Job.Steps:
		return bad("checkpoint every %d and resume after %d steps: want both >= 0 and resume <= steps %d", c.CheckpointEvery, c.Resume, c.Job.Steps)
	case sharding.CheckKeep(c.KeepCheckpoints) != nil:
		return bad("keep %d checkpoints: %v", c.KeepCheckpoints, sharding.CheckKeep(c.KeepCheckpoints))
	case c.CheckpointDir == "" && c.LocalCheckpoints:
		return bad("local checkpoints without a checkpoint directory")
	case c.CheckpointDir == "" && (c.CheckpointEvery > 0 || c.Resume > 0):
		return bad("checkpointing and resuming need a checkpoint directory")
	}
	if l := c.CheckpointLayout; l.known() {
		switch {
		case l.TP < 1 || l.PP < 1 || l.Virtual < 0:
			return bad("checkpoint layout tp %d pp %d virtual %d: want tp and pp at least 1, virtual at least 0 (0 is 1)", l.TP, l.PP, l.Virtual)
		case m.Hidden%l.TP != 0:
			return bad("checkpoint layout: model.hidden %d is not divisible by tp %d", m.Hidden, l.TP)
		case m.Blocks%l.PP != 0 || m.Blocks/l.PP%max(l.Virtual, 1) != 0: // no product to overflow
			return bad("checkpoint layout: model.blocks %d is not divisible by pp*virtual = %d*%d", m.Blocks, l.PP, max(l.Virtual, 1))
		}
	}
	if _, err := c.shape(); err != nil {
		return err
	}
	switch {
	case m.Hidden%c.TP != 0:
		return bad("model.hidden %d is not divisible by tp %d", m.Hidden, c.TP)
	case m.Blocks%(c.PP*c.Virtual) != 0:
		return bad("model.blocks %d is not divisible by pp*virtual = %d*%d", m.Blocks, c.PP, c.Virtual)
	}
	if _, err := c.schedule(); err != nil {
		return err
	}
	return nil
}

// shape checks c's parallel shape with topology.NewShape, where the rules
// the planner, the coordinator and the engine share are stated.
func (c *Config) shape() (topology.Shape, error) {
	sh, err := topology.NewShape(c.World(), topology.ShapeSpec{TP: c.TP, PP: c.PP, DP: c.DP, Order: c.Order,
		GlobalBatch: c.Job.Batch.Global, MicroBatch: c.Job.Batch.Micro, Schedule: c.Schedule, Virtual: c.Virtual,
		WorldName: fmt.Sprintf("np %d", c.World())})
	if err != nil {
		return topology.Shape{}, fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	return sh, nil
}

// schedule builds the op lists of the configured pipeline schedule.
func (c *Config) schedule() (*schedule.Schedule, error) {
	s, err := schedule.Build(c.Schedule, c.PP, c.Microbatches(), c.Virtual)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJob, err)
	}
	return s, nil
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}

// Shape is a parallel layout as a user states it; zero fields are derived
// by NewConfig.
type Shape struct {
	// NP is the number of ranks; 0 means TP*PP*DP.
	NP int
	// TP and PP are the tensor- and pipeline-parallel degrees; at least 1.
	TP, PP int
	// DP is the data-parallel degree; 0 means NP/(TP*PP), or 1 without NP.
	DP int
	// Virtual is the number of model chunks per pipeline rank; 0 means 2
	// with the interleaved schedule and 1 otherwise.
	Virtual int
	// Zero is the ZeRO stage, 0-3.
	Zero int
	// Schedule is the pipeline schedule.
	Schedule schedule.Kind
	// Order is the rank order ("" is Megatron-LM's tp-cp-dp-pp).
	Order string
}

// NewConfig resolves s for job with topology.NewShape (DP from NP, virtual
// stages from the schedule) and validates the result. It is the one place a
// layout given on a command line or in a launch request becomes an engine
// Config.
func NewConfig(job *Job, s Shape) (*Config, error) {
	if job == nil {
		return nil, fmt.Errorf("%w: no job", ErrInvalidJob)
	}
	if err := job.Validate(); err != nil {
		return nil, err
	}
	world := s.NP
	if world == 0 {
		world = s.TP * s.PP * max(s.DP, 1)
	}
	kind := s.Schedule
	if kind == "" {
		kind = schedule.OneFOneB
	}
	sh, err := topology.NewShape(world, topology.ShapeSpec{TP: s.TP, PP: s.PP, DP: s.DP, Order: s.Order,
		GlobalBatch: job.Batch.Global, MicroBatch: job.Batch.Micro, Schedule: kind, Virtual: s.Virtual,
		WorldName: fmt.Sprintf("np %d", world)})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	cfg := DefaultConfig(job)
	cfg.TP, cfg.PP, cfg.DP, cfg.Virtual, cfg.Schedule, cfg.Zero, cfg.Order = sh.TP, sh.PP, sh.DP, sh.Virtual, sh.Schedule, s.Zero, s.Order
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}
