package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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
	return cutRoot(root, r.cut(), r.coord.TP, cs.index)
}

// cutRoot is the checkpoint root of TP rank t's piece of chunk c under a
// checkpoint of cut k: root/tp<t>-of-<T>/chunk<c>-of-<C>.
func cutRoot(root string, k cut, t, c int) string {
	return filepath.Join(root, fmt.Sprintf("tp%d-of-%d", t, k.tp), fmt.Sprintf("chunk%d-of-%d", c, k.chunks))
}

// Checkpoint writes the state after steps optimizer steps under root as
// package sharding's atomic sharded checkpoints: every DP rank writes its
// block of each chunk's parameters and Adam moments (fsynced, renamed),
// and after the DP group's barrier DP rank 0 commits each chunk's
// manifest. Every rank of the world calls it together, after the same
// step; it returns when this rank's chunks are committed (a rank's DP
// group is all it waits for). Restore reads it back at any layout.
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

// LocalCheckpoint is one rank's files of a step's node-local checkpoint,
// staged by StageLocal and not yet in place. Call Place or Discard exactly
// once.
type LocalCheckpoint struct {
	steps  int
	staged []*sharding.StagedShard
}

// StageLocal writes this rank's shard of each chunk's state after steps
// optimizer steps under LocalDir(root, steps) straight from the rank's own
// buffers (sharding.StageShard): the one copy of the state a local
// checkpoint makes, into the files the agent seals and replicates. When it
// returns the rank may train on; the files are placed (fsynced and renamed,
// Place) while it does. A local checkpoint has no manifest and waits for
// no other rank (they write on their own nodes; RestoreLocal seals the
// step once its files are gathered).
func (r *Rank) StageLocal(ctx context.Context, root string, steps int) (*LocalCheckpoint, error) {
	dir := LocalDir(root, steps)
	c := &LocalCheckpoint{steps: steps}
	for _, cs := range r.chunks {
		st, err := sharding.StageShard(ctx, r.chunkRoot(dir, cs), int64(steps), cs.part, r.coord.DP, r.ownVectors(cs))
		if err != nil {
			c.Discard()
			return nil, fmt.Errorf("engine: local checkpoint of step %d: %w", steps, err)
		}
		c.staged = append(c.staged, st)
	}
	return c, nil
}

// Place puts every staged file in place (fsync, rename, fsync of its
// directory); on error the rest are discarded.
func (c *LocalCheckpoint) Place() error {
	for i, st := range c.staged {
		if err := st.Place(); err != nil {
			for _, rest := range c.staged[i+1:] {
				rest.Discard()
			}
			return fmt.Errorf("engine: local checkpoint of step %d: %w", c.steps, err)
		}
	}
	return nil
}

// Discard removes every staged file.
func (c *LocalCheckpoint) Discard() {
	for _, st := range c.staged {
		st.Discard()
	}
}

// ownVectors is this rank's block of chunk cs's state vectors as views of
// the rank's buffers, no copy: of a replicated buffer the real part of the
// rank's block (sharding.StageShard writes the padding as zeros, as
// sharding.ShardOf leaves it), a sharded one whole.
func (r *Rank) ownVectors(cs *chunkState) map[string][]float32 {
	real, _ := cs.part.Owned(r.coord.DP) // the rank's block, padding left out
	out := map[string][]float32{}
	for name, v := range cs.vectors() {
		if len(v) == cs.part.PaddedLen() {
			v = v[real.Lo:real.Hi]
		}
		out[name] = v
	}
	return out
}

// RestoreLocal loads the state after steps steps from LocalDir(root,
// steps), where the files every rank wrote with StageLocal (at any layout)
// have been gathered: it seals every chunk root of the layout that wrote
// them (sharding.Seal; Config.CheckpointLayout, or found as Restore finds
// it, sealing each candidate) and reads them as Restore does. The ranks
// of a node may call it at once on the same directory: Seal lets one
// process commit a root and the others find it committed.
func (r *Rank) RestoreLocal(ctx context.Context, root string, steps int) error {
	dir := LocalDir(root, steps)
	m := r.cfg.Job.Model
	seal := func(ctx context.Context, k cut) error {
		for t := range k.tp {
			for c := range k.chunks {
				if err := sharding.Seal(ctx, cutRoot(dir, k, t, c), int64(steps), k.chunk(m, c).shardingTensors(k.tp), nil); err != nil {
					return fmt.Errorf("%s: %w", cutRoot(dir, k, t, c), err)
				}
			}
		}
		return nil
	}
	k, err := r.findCut(ctx, dir, steps, seal)
	if err != nil {
		return err
	}
	if err := seal(ctx, k); err != nil { // a known layout's; found ones are sealed already
		return fmt.Errorf("engine: restore step %d: %w", steps, err)
	}
	return r.restore(ctx, dir, steps, k)
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
// under root, written at any layout of the same model: any TP, PP,
// Virtual and DP degree, any ZeRO stage. The layout that wrote it is
// Config.CheckpointLayout, or, when that is unknown, the one whose every
// chunk root holds a complete step under root (the rank's own when
// several do; an error naming them when several do and the rank's own is
// not among them). Written at the rank's own TP and PP*Virtual, each
// chunk root is read as it is: replicated buffers whole, sharded ones just
// this rank's block. Written at another, every tensor of the rank's
// chunks is cut out of the old chunk roots whose pieces overlap it, each
// of those read once and whole (with a known layout no other root is
// touched; finding one reads the manifests of the candidates' roots).
// Adam is elementwise, so the result is exact. Step must then continue
// with step index steps.
//
// Errors: sharding.ErrNoCheckpoint when no layout holds the step,
// ErrAmbiguousCheckpoint when several other layouts do,
// sharding.ErrMismatch when the layout does not divide the model or its
// files hold other tensors, and sharding's errors for files that cannot
// be read or trusted.
func (r *Rank) Restore(ctx context.Context, root string, steps int) error {
	k, err := r.findCut(ctx, root, steps, func(ctx context.Context, k cut) error {
		for t := range k.tp {
			for c := range k.chunks {
				if err := stepComplete(ctx, cutRoot(root, k, t, c), steps); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return r.restore(ctx, root, steps, k)
}

// restore reads the checkpoint of steps under root, written at cut k.
func (r *Rank) restore(ctx context.Context, root string, steps int, k cut) error {
	if k != r.cut() {
		return r.restoreResharded(ctx, root, steps, k)
	}
	for _, cs := range r.chunks {
		croot := r.chunkRoot(root, cs)
		whole, err := sharding.NewPartition(cs.part.Tensors(), 1, nil)
		if err != nil {
			return err
		}
		var full, mine *sharding.Shard
		for name, dst := range cs.vectors() {
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

// vectors returns the buffers of the chunk's three state vectors, by
// name: the parameters (their owned block under ZeRO-3) and Adam's
// moments (their owned block when the optimizer state is sharded).
func (cs *chunkState) vectors() map[string][]float32 {
	params := cs.params
	if params == nil {
		params = cs.shard
	}
	return map[string][]float32{vecParam: params, vecM: cs.m, vecV: cs.v}
}

// restoreResharded fills the rank's chunks from a checkpoint written at
// another cut k. For each tensor of each of its chunks it finds the old
// chunk that held the tensor and the old TP ranks whose pieces overlap
// its own (for a replicated tensor one of them, the rank already read for
// the split ones), copies the overlapping rectangle of every state vector
// into the chunk's full flat vectors, and then places those as the fast
// path does: replicated buffers whole, sharded ones sliced to the owned
// block. Each old chunk root is read once, whole, and only if it overlaps.
func (r *Rank) restoreResharded(ctx context.Context, root string, steps int, k cut) error {
	m := r.cfg.Job.Model
	if err := k.fits(m); err != nil {
		return fmt.Errorf("engine: restore step %d: %w", steps, err)
	}
	per := m.Blocks / k.chunks
	type pos struct{ tp, chunk int }
	olds := map[int]*chunk{}
	read := map[pos]*sharding.Shard{}
	load := func(p pos) (*sharding.Shard, error) {
		if sh, ok := read[p]; ok {
			return sh, nil
		}
		croot := cutRoot(root, k, p.tp, p.chunk)
		whole, err := sharding.NewPartition(olds[p.chunk].shardingTensors(k.tp), 1, nil)
		if err != nil {
			return nil, err
		}
		sh, err := sharding.ReadShard(ctx, croot, int64(steps), whole, 0)
		if err != nil {
			return nil, fmt.Errorf("engine: restore step %d of %s: %w", steps, croot, err)
		}
		for _, name := range []string{vecParam, vecM, vecV} {
			if _, ok := sh.Vectors[name]; !ok {
				return nil, fmt.Errorf("engine: restore step %d of %s: no vector %q", steps, croot, name)
			}
		}
		read[p] = sh
		return sh, nil
	}
	home := r.coord.TP * k.tp / r.tp // the old TP rank holding the first of this rank's hidden units
	for _, cs := range r.chunks {
		full := map[string][]float32{}
		for _, name := range []string{vecParam, vecM, vecV} {
			full[name] = make([]float32, cs.part.PaddedLen())
		}
		for i, ti := range cs.tensors {
			// The old chunk holding tensor i, and its index there.
			oc, j := k.chunks-1, 4*per+i-4*cs.blocks // the head
			if i < 4*cs.blocks {
				b := cs.first + i/4
				oc, j = b/per, (b%per)*4+i%4
			}
			old := olds[oc]
			if old == nil {
				old = k.chunk(m, oc)
				olds[oc] = old
			}
			if j >= len(old.tensors) || old.tensors[j].name != ti.name {
				return fmt.Errorf("engine: restore step %d: tensor %s is not where %s puts it", steps, ti.name, k)
			}
			rows, cols, row0, col0 := ti.local(r.coord.TP, r.tp)
			for t := range k.tp {
				if ti.split == splitNone && t != home {
					continue
				}
				orows, ocols, orow0, ocol0 := ti.local(t, k.tp)
				rlo, rhi := max(row0, orow0), min(row0+rows, orow0+orows)
				clo, chi := max(col0, ocol0), min(col0+cols, ocol0+ocols)
				if rlo >= rhi || clo >= chi {
					continue
				}
				sh, err := load(pos{t, oc})
				if err != nil {
					return err
				}
				for name, buf := range full {
					src, dst := old.view(sh.Vectors[name], j), cs.view(buf, i)
					for row := rlo; row < rhi; row++ {
						copy(dst[(row-row0)*cols+clo-col0:(row-row0)*cols+chi-col0], src[(row-orow0)*ocols+clo-ocol0:])
					}
				}
			}
		}
		for name, dst := range cs.vectors() {
			v := full[name]
			if len(dst) != len(v) {
				v = v[cs.owned.Lo:cs.owned.Hi]
			}
			copy(dst, v)
		}
	}
	return nil
}

// cut is how a layout divides the model among checkpoint roots: tp TP
// ranks times chunks chunks (PP*Virtual), root tp<t>-of-<tp>/
// chunk<c>-of-<chunks>. Layouts of the same cut write the same roots;
// the DP degree and the ZeRO stage do not show in a checkpoint's roots.
type cut struct{ tp, chunks int }

// String names the cut by its roots.
func (k cut) String() string { return fmt.Sprintf("tp*-of-%d/chunk*-of-%d", k.tp, k.chunks) }

// cut is the rank's own cut.
func (r *Rank) cut() cut { return cut{tp: r.tp, chunks: r.pp * r.cfg.Virtual} }

// cut is the cut of layout l, which must be known.
func (l CheckpointLayout) cut() cut { return cut{tp: l.TP, chunks: l.PP * max(l.Virtual, 1)} }

// fits says why a checkpoint of cut k cannot hold model m (sharding.
// ErrMismatch), or nil.
func (k cut) fits(m ModelSpec) error {
	switch {
	case k.tp < 1 || k.chunks < 1:
		return fmt.Errorf("%w: %s is no layout", sharding.ErrMismatch, k)
	case m.Hidden%k.tp != 0:
		return fmt.Errorf("%w: %s: model.hidden %d is not divisible by tp %d", sharding.ErrMismatch, k, m.Hidden, k.tp)
	case m.Blocks%k.chunks != 0:
		return fmt.Errorf("%w: %s: model.blocks %d is not divisible by %d chunks", sharding.ErrMismatch, k, m.Blocks, k.chunks)
	}
	return nil
}

// chunk builds chunk c of model m as cut k cuts it (k must fit m): its
// tensors and their offsets in a TP rank's flat buffer, the same for
// every TP rank.
func (k cut) chunk(m ModelSpec, c int) *chunk {
	per := m.Blocks / k.chunks
	return newChunk(m, c, c*per, per, c == k.chunks-1, k.tp)
}

// shardingTensors lists the chunk's tensors as a TP rank of tp holds
// them, in flat-buffer order: what a checkpoint root of the chunk lays
// out.
func (c *chunk) shardingTensors(tp int) []sharding.Tensor {
	out := make([]sharding.Tensor, len(c.tensors))
	for i, ti := range c.tensors {
		rows, cols, _, _ := ti.local(0, tp)
		out[i] = sharding.Tensor{Name: ti.name, Shape: []int{rows, cols}}
	}
	return out
}

// findCut returns the cut of the checkpoint of steps under root:
// Config.CheckpointLayout's when known (holds is not asked), else the one
// found by listing root. holds says whether every chunk root of a cut
// holds the step (nil) or why not; the rank's own cut is asked first and
// wins when it holds it.
func (r *Rank) findCut(ctx context.Context, root string, steps int, holds func(context.Context, cut) error) (cut, error) {
	m := r.cfg.Job.Model
	fail := func(format string, a ...any) (cut, error) {
		return cut{}, fmt.Errorf("engine: restore step %d under %s: %w", steps, root, fmt.Errorf(format, a...))
	}
	if l := r.cfg.CheckpointLayout; l.known() {
		k := l.cut()
		if err := k.fits(m); err != nil {
			return fail("checkpoint layout: %w", err)
		}
		return k, nil
	}
	cuts, err := listCuts(root)
	if err != nil {
		return fail("%w", err)
	}
	own := r.cut()
	slices.SortFunc(cuts, func(a, b cut) int {
		if a == own || b == own {
			return cmp.Compare(boolInt(b == own), boolInt(a == own))
		}
		return cmp.Or(cmp.Compare(a.tp, b.tp), cmp.Compare(a.chunks, b.chunks))
	})
	var found []cut
	var why causes
	for _, k := range cuts {
		if err := k.fits(m); err != nil {
			why = append(why, err)
			continue
		}
		if err := holds(ctx, k); err != nil {
			if ctx.Err() != nil {
				return cut{}, ctx.Err()
			}
			why = append(why, fmt.Errorf("%s: %w", k, err))
			continue
		}
		if k == own {
			return k, nil
		}
		found = append(found, k)
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		if len(why) == 0 {
			return fail("%w: no layout's chunk roots (tp<t>-of-<T>/chunk<c>-of-<C>) are there", sharding.ErrNoCheckpoint)
		}
		return fail("%w: no layout holds it whole: %w", sharding.ErrNoCheckpoint, why)
	}
	names := make([]string, len(found))
	for i, k := range found {
		names[i] = k.String()
	}
	return fail("%w: layouts %s all hold it and none is this rank's %s; set Config.CheckpointLayout", ErrAmbiguousCheckpoint, strings.Join(names, ", "), own)
}

// causes is the reasons of several failures on one line, each one
// matched by errors.Is and errors.As.
type causes []error

func (c causes) Error() string {
	s := make([]string, len(c))
	for i, err := range c {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (c causes) Unwrap() []error { return c }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// listCuts returns the cuts whose every chunk root is a directory under
// root: T directories tp0-of-T ... tp<T-1>-of-T, each holding C
// directories chunk0-of-C ... chunk<C-1>-of-C.
func listCuts(root string) ([]cut, error) {
	tps := map[int]int{} // T -> tp<t>-of-T directories
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", sharding.ErrNoCheckpoint, err)
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if t, n, ok := parseOf(e, "tp"); ok && t < n {
			tps[n]++
		}
	}
	var out []cut
	for tp, n := range tps {
		if n != tp {
			continue
		}
		chunks := map[int]int{} // C -> chunk<c>-of-C directories over every TP rank
		for t := range tp {
			entries, err := os.ReadDir(filepath.Join(root, fmt.Sprintf("tp%d-of-%d", t, tp)))
			if err != nil {
				return nil, err
			}
			for _, e := range entries {
				if c, n, ok := parseOf(e, "chunk"); ok && c < n {
					chunks[n]++
				}
			}
		}
		for c, n := range chunks {
			if n == tp*c {
				out = append(out, cut{tp: tp, chunks: c})
			}
		}
	}
	return out, nil
}

// parseOf parses a directory named <prefix><i>-of-<n> in canonical form,
// 0 <= i and 1 <= n.
func parseOf(e fs.DirEntry, prefix string) (i, n int, ok bool) {
	rest, found := strings.CutPrefix(e.Name(), prefix)
	if !found || !e.IsDir() {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, "-of-")
	if !found {
		return 0, 0, false
	}
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || i < 0 || n < 1 || strconv.Itoa(i) != a || strconv.Itoa(n) != b {
		return 0, 0, false
	}
	return i, n, true
}

// stepComplete says why step under root is not complete, or nil: it needs
// a manifest that reads and every shard file it names, at its recorded
// size (as sharding.LatestComplete checks, for one step).
func stepComplete(ctx context.Context, root string, steps int) error {
	man, err := sharding.ReadManifest(ctx, root, int64(steps))
	if err != nil {
		return err
	}
	for _, s := range man.Shards {
		st, err := os.Stat(filepath.Join(sharding.StepDir(root, int64(steps)), s.File))
		if err != nil {
			return fmt.Errorf("%w: %w", sharding.ErrCorrupt, err)
		}
		if st.Size() != s.Size {
			return fmt.Errorf("%w: shard file %s has %d bytes, the manifest says %d", sharding.ErrCorrupt, s.File, st.Size(), s.Size)
		}
	}
	return nil
}
