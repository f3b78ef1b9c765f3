package sharding

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// StagedShard is a shard file written in full under a temporary name in
// its step's directory and not yet in place: StageShard's result. Call
// Place or Discard exactly once.
type StagedShard struct {
	f    *os.File
	dir  string
	name string
}

// zeros is the padding StageShard writes after a vector given without it.
var zeros = make([]byte, 64<<10)

// StageShard writes rank r's shard file of p for step under root straight
// from the caller's buffers: one copy of the state, into the file, with no
// buffer in between and no checksums. vectors holds, by name, the rank's
// block of each state vector, whole (ShardLen elements) or only its real
// part (Owned(r).Len() elements: the padding after it is written as
// zeros). When StageShard returns, the bytes are in the file and the
// caller may change its buffers; the file is neither fsynced nor named
// yet (Place). The file is byte for byte what WriteShard writes for the
// same shard.
//
// It is WriteShard cut in two, for a writer that must copy its state out
// before it changes and may settle the file later (a rank's node-local
// checkpoint, placed while the rank trains on). Such a step gets its
// checksums when it is sealed (Seal reads every file in full); WriteShard
// computes them as it writes, for Commit.
//
// Like WriteShard, staging into a step that has a manifest first removes
// the manifest. On error nothing is left behind.
func StageShard(ctx context.Context, root string, step int64, p *Partition, r int, vectors map[string][]float32) (*StagedShard, error) {
	if step < 0 {
		return nil, fmt.Errorf("%w: step %d is negative", ErrInvalid, step)
	}
	if err := p.checkRank(r); err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(vectors))
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: shard %d has no vectors", ErrInvalid, r)
	}
	if err := checkVectorNames(names); err != nil {
		return nil, err
	}
	own, _ := p.Owned(r)
	for _, n := range names {
		if l := len(vectors[n]); l != p.shard && l != own.Len() {
			return nil, fmt.Errorf("%w: shard %d vector %q has %d elements, want %d (the block) or %d (its real part)", ErrMismatch, r, n, l, p.shard, own.Len())
		}
	}
	dir := StepDir(root, step)
	if err := makeDir(root); err != nil {
		return nil, err
	}
	if err := makeDir(dir); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(dir, ManifestFile)); err == nil {
		if err := syncDir(dir); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sharding: uncommit step %d: %w", step, err)
	}
	name := ShardFile(r, p.degree)
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("sharding: stage shard %d of step %d: %w", r, step, err)
	}
	s := &StagedShard{f: f, dir: dir, name: name}
	fail := func(err error) (*StagedShard, error) {
		s.Discard()
		return nil, fmt.Errorf("sharding: stage shard %d of step %d: %w", r, step, err)
	}
	if _, err := f.Write(encodeShardHeader(step, p, r, names)); err != nil {
		return fail(err)
	}
	var buf []byte // big-endian hosts convert through it
	if !littleEndian {
		buf = make([]byte, 1<<20)
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		v := vectors[n]
		if littleEndian {
			_, err = f.Write(floatBytes(v))
		} else {
			err = encodeFloats(ctx, f, v, buf)
		}
		if err != nil {
			return fail(err)
		}
		for pad := 4 * (p.shard - len(v)); pad > 0; {
			k, err := f.Write(zeros[:min(pad, len(zeros))])
			if err != nil {
				return fail(err)
			}
			pad -= k
		}
	}
	return s, nil
}

// Place makes the staged file rank r's shard file of its step, as
// WriteShard leaves it: fsync, rename, fsync of the directory. On error
// the temporary file is removed and any earlier file of that name is left
// as it was.
func (s *StagedShard) Place() (err error) {
	tmp := s.f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
			err = fmt.Errorf("sharding: place %s: %w", s.name, err)
		}
	}()
	if err = s.f.Chmod(0o644); err != nil {
		s.f.Close()
		return err
	}
	if err = s.f.Sync(); err != nil {
		s.f.Close()
		return err
	}
	if err = s.f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, filepath.Join(s.dir, s.name)); err != nil {
		return err
	}
	return syncDir(s.dir)
}

// Discard removes the staged file; nothing of it stays.
func (s *StagedShard) Discard() {
	s.f.Close()
	os.Remove(s.f.Name())
}
