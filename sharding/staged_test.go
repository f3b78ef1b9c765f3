package sharding

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestStageShardIsWriteShard: a shard staged and placed is byte for byte
// the file WriteShard writes, whether its vectors come as the whole block
// or only their real part (the last rank's block ends in padding), and a
// step of staged, placed files seals and reads back.
func TestStageShardIsWriteShard(t *testing.T) {
	p, err := NewPartition(vecTensors(1001, 37), 3, nil) // 1038 elements: the last block is part padding
	if err != nil {
		t.Fatal(err)
	}
	full := randomState(7, p.Len())
	tests := []struct {
		name string
		// views gives StageShard rank r's vectors.
		views func(r int) map[string][]float32
	}{
		{name: "real part only", views: func(r int) map[string][]float32 {
			own, _ := p.Owned(r)
			out := map[string][]float32{}
			for n, v := range full {
				out[n] = v[own.Lo:own.Hi]
			}
			return out
		}},
		{name: "whole block", views: func(r int) map[string][]float32 {
			s, err := ShardOf(p, r, full)
			if err != nil {
				t.Fatal(err)
			}
			return s.Vectors
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want, got := t.TempDir(), t.TempDir()
			for r := range p.Degree() {
				s, _ := ShardOf(p, r, full)
				if _, err := WriteShard(t.Context(), want, 4, p, s); err != nil {
					t.Fatal(err)
				}
				st, err := StageShard(t.Context(), got, 4, p, r, tc.views(r))
				if err != nil {
					t.Fatal(err)
				}
				if err := Verify(t.Context(), got, 4); !errors.Is(err, ErrIncomplete) {
					t.Fatalf("a staged step before Place: Verify = %v, want ErrIncomplete", err)
				}
				if err := st.Place(); err != nil {
					t.Fatal(err)
				}
				a, _ := os.ReadFile(filepath.Join(StepDir(want, 4), ShardFile(r, 3)))
				b, err := os.ReadFile(filepath.Join(StepDir(got, 4), ShardFile(r, 3)))
				if err != nil || !bytes.Equal(a, b) {
					t.Fatalf("rank %d: staged file (%d bytes, %v) differs from WriteShard's (%d bytes)", r, len(b), err, len(a))
				}
			}
			if err := Seal(t.Context(), got, 4, p.Tensors(), nil); err != nil {
				t.Fatal(err)
			}
			whole, _ := NewPartition(p.Tensors(), 1, nil)
			sh, err := ReadShard(t.Context(), got, 4, whole, 0)
			if err != nil {
				t.Fatal(err)
			}
			for n, v := range full {
				if !bytes.Equal(floatBytes(sh.Vectors[n][:len(v)]), floatBytes(v)) {
					t.Fatalf("vector %s read back differs", n)
				}
			}
		})
	}
}

// TestStageShardDiscard: a discarded shard, or one refused, leaves no file.
func TestStageShardDiscard(t *testing.T) {
	p, _ := NewPartition(vecTensors(100), 2, nil)
	root := t.TempDir()
	full := randomState(1, 100)
	s, _ := ShardOf(p, 0, full)
	st, err := StageShard(t.Context(), root, 1, p, 0, s.Vectors)
	if err != nil {
		t.Fatal(err)
	}
	st.Discard()
	bad := map[string][]float32{"param": make([]float32, 3)}
	if _, err := StageShard(t.Context(), root, 1, p, 1, bad); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a vector of 3 elements: err = %v, want ErrMismatch", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := StageShard(ctx, root, 1, p, 1, s.Vectors); err == nil {
		t.Fatal("a cancelled context: StageShard succeeded")
	}
	entries, _ := os.ReadDir(StepDir(root, 1))
	if len(entries) != 0 {
		t.Fatalf("step directory holds %d entries after Discard and failures, want none (%v)", len(entries), entries[0].Name())
	}
}
