package engine

import (
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// Layout lays the job's ranks out in c.Order (Megatron-LM's tp-cp-dp-pp by
// default: global rank = tp + TP*dp + TP*DP*pp), the same layout the planner
// and the coordinator use.
func (c *Config) Layout() (topology.Layout, error) {
	l, err := topology.NewLayout(c.TP, c.PP, c.DP, c.Order)
	if err != nil {
		return topology.Layout{}, fmt.Errorf("%w: %v", ErrInvalidJob, err)
	}
	return l, nil
}

// NewGroups forms the TP, PP and DP groups of world rank world.Rank() from
// the world Communicator. Every rank of the world calls it once, in the same
// order relative to its other group creations. Groups of one are nil.
func NewGroups(ctx context.Context, cfg *Config, world collectives.Communicator) (topology.Coord, Groups, error) {
	layout, err := cfg.Layout()
	if err != nil {
		return topology.Coord{}, Groups{}, err
	}
	if world.Size() != layout.World() {
		return topology.Coord{}, Groups{}, fmt.Errorf("%w: world of %d ranks for tp*pp*dp = %d", ErrInvalidJob, world.Size(), layout.World())
	}
	me := topology.Rank(world.Rank())
	var g Groups
	for _, a := range []struct {
		axis topology.Axis
		dst  *collectives.Communicator
	}{{topology.AxisTP, &g.TP}, {topology.AxisPP, &g.PP}, {topology.AxisDP, &g.DP}} {
		members := layout.Group(a.axis, me)
		if len(members) == 1 {
			continue
		}
		ranks := make([]int, len(members))
		for i, r := range members {
			ranks[i] = int(r)
		}
		// Through c: a failed NewGroup's nil *Comm in *a.dst would be a
		// non-nil Communicator that g.Close closes (a rank whose peers
		// vanished while it formed its groups panicked there).
		c, err := collectives.NewGroup(ctx, world, ranks)
		if err != nil {
			g.Close()
			return topology.Coord{}, Groups{}, fmt.Errorf("engine: %s group %v: %w", a.axis, ranks, err)
		}
		*a.dst = c
	}
	return layout.Coord(me), g, nil
}

// Close closes the groups that can be closed.
func (g Groups) Close() {
	for _, c := range []collectives.Communicator{g.TP, g.PP, g.DP} {
		if cl, ok := c.(io.Closer); ok {
			cl.Close()
		}
	}
}

// StepResult is what a rank reports after each step.
type StepResult struct {
	// Step counts from 1.
	Step int `json:"step"`
	// Loss is the mean loss over the global batch before this step's update.
	Loss float64 `json:"loss"`
	// Seconds is the step's wall time on this rank.
	Seconds float64 `json:"seconds"`
	// SamplesPerSec is the global batch divided by Seconds.
	SamplesPerSec float64 `json:"samples_per_sec"`
	// ComputeSeconds is this rank's time in forward, backward and the
	// optimizer in the step, without waits for peers: what straggler
	// detection compares across ranks.
	ComputeSeconds float64 `json:"compute_seconds,omitempty"`
	// Checkpointed says the state after this step is in a committed
	// checkpoint of every rank.
	Checkpointed bool `json:"checkpointed,omitempty"`
	// Stats splits the step's time on this rank.
	Stats StepStats `json:"-"`
}

// Train runs the job's steps as world rank world.Rank(): it forms the
// groups, builds the Rank and calls report after every step. It returns the
// Rank for inspection (memory, timeline, parameters).
func Train(ctx context.Context, cfg *Config, world collectives.Communicator, report func(StepResult) error) (*Rank, error) {
	coord, g, err := NewGroups(ctx, cfg, world)
	if err != nil {
		return nil, err
	}
	r, err := NewRank(cfg, coord, g)
	if err != nil {
		g.Close()
		return nil, err
	}
	if cfg.CheckpointDir != "" && !cfg.LocalCheckpoints && cfg.Generation > 0 && world.Rank() == 0 {
		if err := sharding.RaiseFence(cfg.CheckpointDir, cfg.Generation); err != nil {
			return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, err)
		}
	}
	if cfg.Resume > 0 {
		restore := r.Restore
		if cfg.LocalCheckpoints {
			restore = r.RestoreLocal
		}
		if err := restore(ctx, cfg.CheckpointDir, cfg.Resume); err != nil {
			return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, unrestorable(ctx, err))
		}
	}
	bg := &background{r: r, root: cfg.CheckpointDir, done: cfg.Checkpointed}
	defer bg.wait()
	var cadence *Cadence
	if cfg.CheckpointOverhead > 0 && cfg.CheckpointDir != "" {
		cadence = NewCadence(cfg.CheckpointOverhead)
	}
	for s := cfg.Resume; s < cfg.Job.Steps; s++ {
		start := time.Now()
		loss, err := r.Step(ctx, s)
		if err != nil {
			return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, err)
		}
		res := StepResult{Step: s + 1, Loss: loss, Stats: r.Stats(), ComputeSeconds: r.Stats().Compute.Seconds()}
		if cfg.LocalCheckpoints && cfg.WaitStored != nil && bg.last > 0 {
			if err := bg.wait(); err != nil {
				return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, err)
			}
			if err := cfg.WaitStored(ctx, bg.last); err != nil {
				return r, fmt.Errorf("rank %d %+v: waiting for the checkpoint of step %d to be stored: %w", world.Rank(), coord, bg.last, err)
			}
		}
		preempted, me := false, false
		if cfg.CheckpointDir != "" && cfg.Preempted != nil {
			me = cfg.Preempted()
			flag := []float64{0}
			if me {
				flag[0] = 1
			}
			if err := world.AllReduce(ctx, collectives.Float64s(flag), collectives.Max); err != nil {
				return r, fmt.Errorf("rank %d %+v: preemption flag: %w", world.Rank(), coord, err)
			}
			preempted = flag[0] > 0
		}
		n := s + 1
		every := cfg.CheckpointEvery > 0 && n%cfg.CheckpointEvery == 0
		if cadence != nil {
			every = cadence.Due(n - cfg.Resume)
		}
		due := cfg.CheckpointDir != "" && (preempted || n == cfg.Job.Steps || every)
		if due && cfg.LocalCheckpoints {
			// Copy the state into the step's files now, place them while
			// the next step runs; a preempted rank waits for the placing.
			if err := bg.start(ctx, n); err != nil {
				return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, err)
			}
			if me {
				if err := bg.wait(); err != nil {
					return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, err)
				}
			}
		} else if due {
			if err := r.Checkpoint(ctx, cfg.CheckpointDir, n); err != nil {
				return r, fmt.Errorf("rank %d %+v: %w", world.Rank(), coord, err)
			}
			// Committed only once every (tp, pp) position has its manifest.
			if err := world.Barrier(ctx); err != nil {
				return r, err
			}
			res.Checkpointed = true
			if cfg.Checkpointed != nil {
				cfg.Checkpointed(n)
			}
		}
		// A step's time is all of it: its checkpoint's copy into its
		// files, or write and barrier, and the wait for the one before to
		// be stored.
		res.Seconds = time.Since(start).Seconds()
		res.SamplesPerSec = float64(cfg.Job.Batch.Global) / res.Seconds
		if cadence != nil {
			// Every rank tells its Cadence the same: the world's slowest.
			t := []float64{res.Seconds}
			if err := world.AllReduce(ctx, collectives.Float64s(t), collectives.Max); err != nil {
				return r, fmt.Errorf("rank %d %+v: step time: %w", world.Rank(), coord, err)
			}
			was := cadence.Interval()
			cadence.Observe(n-cfg.Resume, t[0], due)
			if cadence.Interval() != was && world.Rank() == 0 {
				r.log.Info("checkpoint cadence", "after_step", n, "choice", cadence.String())
			}
		}
		if report != nil {
			if err := report(res); err != nil {
				return r, err
			}
		}
		if me && s+1 < cfg.Job.Steps {
			return r, ErrPreempted
		}
	}
	return r, bg.wait()
}

// background places a rank's local checkpoints one at a time while it
// trains: start writes the state straight into the step's files (the one
// copy, made before the next step changes the state; it waits first for
// the placing before) and places them (fsync, rename) in a goroutine; wait
// returns the last placing's error. done is told of each step placed.
type background struct {
	r    *Rank
	root string
	done func(int)
	errc chan error
	last int // the step of the last checkpoint started
}

func (b *background) start(ctx context.Context, steps int) error {
	if err := b.wait(); err != nil {
		return err
	}
	c, err := b.r.StageLocal(ctx, b.root, steps)
	if err != nil {
		return err
	}
	b.errc, b.last = make(chan error, 1), steps
	go func() {
		err := c.Place()
		if err == nil && b.done != nil {
			b.done(steps)
		}
		b.errc <- err
	}()
	return nil
}

func (b *background) wait() error {
	if b.errc == nil {
		return nil
	}
	err := <-b.errc
	b.errc = nil
	return err
}

// Close releases the rank's groups.
func (r *Rank) Close() { r.g.Close() }

// Coord returns the rank's grid coordinates.
func (r *Rank) Coord() topology.Coord { return r.coord }

// Params returns this rank's pieces reassembled into full-model tensors
// (only the tensors this rank holds, its TP piece of each). Under ZeRO-3
// it all-gathers across DP, so every DP rank must call it together.
func (r *Rank) Params(ctx context.Context) (Params, error) {
	pieces, err := r.pieces(ctx)
	if err != nil {
		return nil, err
	}
	p := Params{}
	p.assemble(pieces)
	return p, nil
}

// WriteParams stores this rank's parameter pieces in dir for ReadParams. All
// DP ranks call it together (ZeRO-3 gathers); the DP rank 0 of each
// (tp, pp) writes its file.
func (r *Rank) WriteParams(ctx context.Context, dir string) error {
	pieces, err := r.pieces(ctx)
	if err != nil || r.coord.DP != 0 {
		return err
	}
	return writePieces(filepath.Join(dir, fmt.Sprintf("params-pp%d-tp%d.gob", r.coord.PP, r.coord.TP)), pieces)
}

// SaveParams writes a whole model to dir for ReadParams.
func SaveParams(dir string, p Params) error {
	return writePieces(filepath.Join(dir, "params-full.gob"), p.pieces())
}

// paramsPattern matches the files WriteParams and SaveParams write, and
// their temporary files.
const paramsPattern = "params-*.gob"

// PrepareParamsDir makes dir ready for WriteParams or SaveParams before a
// run starts: it creates dir, removes the parameter files an earlier run
// left there (params-*.gob and their .tmp files, which another layout would
// leave mixed with this run's; nothing else is touched) and checks that a
// file can be created in it. Call it once per run, before any rank trains.
func PrepareParamsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("engine: parameter directory: %w", err)
	}
	for _, pat := range []string{paramsPattern, paramsPattern + ".tmp"} {
		stale, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return err
		}
		for _, name := range stale {
			if err := os.Remove(name); err != nil {
				return fmt.Errorf("engine: parameter directory: %w", err)
			}
		}
	}
	probe, err := os.CreateTemp(dir, ".write-probe-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is the probe's, not the user's
		}
		return fmt.Errorf("engine: parameter directory %s is not writable: %w", dir, err)
	}
	name := probe.Name()
	probe.Close()
	return os.Remove(name)
}

// writePieces writes pieces to path through a temporary file and a rename.
func writePieces(path string, pieces []paramPiece) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(pieces); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// ReadParams assembles the full model from the files WriteParams left in dir.
func ReadParams(dir string) (Params, error) {
	files, err := filepath.Glob(filepath.Join(dir, paramsPattern))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("engine: no parameter files in %s", dir)
	}
	p := Params{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		var pieces []paramPiece
		err = gob.NewDecoder(f).Decode(&pieces)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("engine: %s: %w", name, err)
		}
		p.assemble(pieces)
	}
	return p, nil
}
