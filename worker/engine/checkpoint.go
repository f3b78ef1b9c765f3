package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/gpucoord/gpucoord/sharding"
)

// The state vectors a checkpoint holds for each chunk, in package
// sharding's flat layout: the parameters and Adam's two moments. Adam's
// step count is the checkpoint's step.
const (
	vecParam = "param"
	vecM     = "m"
	vecV     = "v"
)

// chunkRoot is the checkpoint root of one chunk's flat buffer: one per
// (tp, pp, chunk) position, each sharded over the DP ranks.
func (r *Rank) chunkRoot(root string, cs *chunkState) string {
	return filepath.Join(root, fmt.Sprintf("tp%d-of-%d", r.coord.TP, r.tp), fmt.Sprintf("chunk%d-of-%d", cs.index, r.pp*r.cfg.Virtual))
}

// Checkpoint writes the state after steps optimizer steps under root as
// package sharding's atomic sharded checkpoints: every DP rank writes its
// block of each chunk's parameters and Adam moments (fsynced, renamed),
// and after the DP group's barrier DP rank 0 commits each chunk's
// manifest. Every rank of the world calls it together, after the same
// step; it returns when this rank's chunks are committed (a rank's DP
// group is all it waits for). A checkpoint of any DP degree can be read
// back at another by Restore.
func (r *Rank) Checkpoint(ctx context.Context, root string, steps int) error {
	if err := r.checkFence(root, steps); err != nil {
		return err
	}
	for _, cs := range r.chunks {
		sh, err := r.block(cs)
		if err != nil {
			return err
		}
		if _, err := sharding.WriteShard(ctx, r.chunkRoot(root, cs), int64(steps), cs.part, sh); err != nil {
			return fmt.Errorf("engine: checkpoint of step %d: %w", steps, err)
		}
	}
	if r.dp > 1 {
		if err := r.g.DP.Barrier(ctx); err != nil {
			return err
		}
	}
	if r.coord.DP == 0 {
		if err := r.checkFence(root, steps); err != nil {
			return err
		}
		for _, cs := range r.chunks {
			croot := r.chunkRoot(root, cs)
			infos := make([]sharding.ShardInfo, r.dp)
			for d := range r.dp {
				info, err := sharding.InspectShard(ctx, croot, int64(steps), cs.part, d)
				if err != nil {
					return fmt.Errorf("engine: checkpoint of step %d: %w", steps, err)
				}
				infos[d] = info
			}
			if err := sharding.Commit(ctx, croot, int64(steps), cs.part, infos); err != nil {
				return fmt.Errorf("engine: checkpoint of step %d: %w", steps, err)
			}
			var floor int64
			if r.cfg.Committed != nil {
				floor = max(r.cfg.Committed(), 1) // at least the start: never a step a commit may name
			}
			if _, err := sharding.Prune(ctx, croot, r.cfg.KeepCheckpoints, floor); err != nil {
				return fmt.Errorf("engine: checkpoint of step %d: %w", steps, err)
			}
		}
	}
	if r.dp > 1 {
		// Nobody leaves before the manifests are written.
		return r.g.DP.Barrier(ctx)
	}
	return nil
}

// block is this rank's block of chunk cs's state vectors, sharing memory
// with the rank's buffers.
func (r *Rank) block(cs *chunkState) (*sharding.Shard, error) {
	full := map[string][]float32{}
	sh := &sharding.Shard{Rank: r.coord.DP, Range: cs.owned, Vectors: map[string][]float32{}}
	for name, v := range map[string][]float32{vecParam: cs.params, vecM: cs.m, vecV: cs.v} {
		switch {
		case v == nil: // sharded parameters (ZeRO-3)
			sh.Vectors[name] = cs.shard
		case len(v) == cs.part.PaddedLen(): // replicated: take this rank's block
			full[name] = v
		default: // already this rank's block
			sh.Vectors[name] = v
		}
	}
	if len(full) > 0 {
		own, err := sharding.ShardOf(cs.part, r.coord.DP, full)
		if err != nil {
			return nil, err
		}
		for name, v := range own.Vectors {
			sh.Vectors[name] = v
		}
	}
	return sh, nil
}

// LocalDir is the directory of step's node-local checkpoint under root
// (Config.LocalCheckpoints): root/<step>, the progress protocol's
// GPUCOORD_CHECKPOINT_DIR/<step>.
func LocalDir(root string, step int) string { return filepath.Join(root, strconv.Itoa(step)) }

// Snapshot is a copy of one rank's blocks of its state after a step: what
// a local checkpoint writes while the next step runs.
type Snapshot struct {
	steps  int
	shards []*sharding.Shard
}

// Snapshot copies this rank's blocks of every chunk's state after steps
// optimizer steps, into reuse's buffers when it has the right sizes (a
// rank alternates two snapshots, so a step costs no allocation).
func (r *Rank) Snapshot(reuse *Snapshot, steps int) (*Snapshot, error) {
	s := reuse
	if s == nil || len(s.shards) != len(r.chunks) {
		s = &Snapshot{shards: make([]*sharding.Shard, len(r.chunks))}
	}
	s.steps = steps
	for i, cs := range r.chunks {
		b, err := r.block(cs)
		if err != nil {
			return nil, err
		}
		dst := s.shards[i]
		if dst == nil {
			dst = &sharding.Shard{Vectors: map[string][]float32{}}
			s.shards[i] = dst
		}
		dst.Rank, dst.Range = b.Rank, b.Range
		for name, v := range b.Vectors {
			if len(dst.Vectors[name]) != len(v) {
				dst.Vectors[name] = make([]float32, len(v))
			}
			copy(dst.Vectors[name], v)
		}
	}
	return s, nil
}

// WriteLocal writes s under LocalDir(root, s's step): this rank's shard of
// each chunk, with no manifest and no wait for any other rank (they write
// on their own nodes; RestoreLocal seals the step once its files are
// gathered). It may run while the rank trains on.
func (r *Rank) WriteLocal(ctx context.Context, root string, s *Snapshot) error {
	dir := LocalDir(root, s.steps)
	for i, cs := range r.chunks {
		if _, err := sharding.WriteShard(ctx, r.chunkRoot(dir, cs), int64(s.steps), cs.part, s.shards[i]); err != nil {
			return fmt.Errorf("engine: local checkpoint of step %d: %w", s.steps, err)
		}
	}
	return nil
}

// RestoreLocal loads the state after steps steps from LocalDir(root,
// steps), where the files every rank wrote with WriteLocal (at any DP
// degree) have been gathered: it seals each chunk's step (sharding.Seal)
// and reads it as Restore does.
func (r *Rank) RestoreLocal(ctx context.Context, root string, steps int) error {
	dir := LocalDir(root, steps)
	for _, cs := range r.chunks {
		if err := sharding.Seal(ctx, r.chunkRoot(dir, cs), int64(steps), cs.part.Tensors(), nil); err != nil {
			return fmt.Errorf("engine: restore step %d: %w", steps, err)
		}
	}
	return r.Restore(ctx, dir, steps)
}

// checkFence fails with sharding.ErrFenced when a generation after this
// rank's (Config.Generation, 0 for none) has started writing under root.
func (r *Rank) checkFence(root string, steps int) error {
	if r.cfg.Generation == 0 {
		return nil
	}
	if err := sharding.CheckFence(root, r.cfg.Generation); err != nil {
		return fmt.Errorf("engine: checkpoint of step %d: %w", steps, err)
	}
	return nil
}

// Restore loads the state after steps optimizer steps from the checkpoint
// under root, written at any DP degree with the same TP and PP layout:
// replicated buffers read whole, sharded ones read just this rank's
// block. Step must then continue with step index steps.
func (r *Rank) Restore(ctx context.Context, root string, steps int) error {
	for _, cs := range r.chunks {
		croot := r.chunkRoot(root, cs)
		whole, err := sharding.NewPartition(cs.part.Tensors(), 1, nil)
		if err != nil {
			return err
		}
		var full, mine *sharding.Shard
		for name, dst := range map[string][]float32{vecParam: cs.params, vecM: cs.m, vecV: cs.v} {
			if dst == nil {
				dst = cs.shard
			}
			src := func() (*sharding.Shard, error) {
				if len(dst) == cs.part.PaddedLen() {
					if full == nil {
						full, err = sharding.ReadShard(ctx, croot, int64(steps), whole, 0)
					}
					return full, err
				}
				if mine == nil {
					mine, err = sharding.ReadShard(ctx, croot, int64(steps), cs.part, r.coord.DP)
				}
				return mine, err
			}
			sh, err := src()
			if err != nil {
				return fmt.Errorf("engine: restore step %d of %s: %w", steps, croot, err)
			}
			v, ok := sh.Vectors[name]
			if !ok {
				return fmt.Errorf("engine: restore step %d of %s: no vector %q", steps, croot, name)
			}
			clear(dst)
			copy(dst, v[:min(len(v), len(dst))])
		}
	}
	return nil
}
