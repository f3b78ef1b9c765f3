package sharding

import (
	"context"
	"flag"
	"fmt"
	"testing"

	"golang.org/x/sync/errgroup"
)

var benchLen = flag.Int("sharding.benchlen", 100_000_000, "flat length of the benchmark state (param, m and v of this many float32 each)")

// benchState returns the partition of a benchLen-element model at degree d
// and its shards of three state vectors, 12 bytes per element in all.
func benchState(b *testing.B, d int) (*Partition, []*Shard) {
	b.Helper()
	tensors := []Tensor{
		{Name: "embed", Shape: []int{*benchLen / 2}},
		{Name: "blocks", Shape: []int{*benchLen - *benchLen/2 - 1}},
		{Name: "scale", Shape: nil},
	}
	p, err := NewPartition(tensors, d, nil)
	if err != nil {
		b.Fatal(err)
	}
	shards := make([]*Shard, d)
	for r := range shards {
		s, err := NewShard(p, r, "param", "m", "v")
		if err != nil {
			b.Fatal(err)
		}
		for _, v := range s.Vectors {
			for i := range v {
				v[i] = float32(s.Range.Lo+i) * 1e-3
			}
		}
		shards[r] = s
	}
	return p, shards
}

func stateBytes(p *Partition) int64 { return int64(p.Len()) * 3 * 4 }

// BenchmarkReshard moves a whole state from 8 to 6 data-parallel ranks in
// memory. Throughput counts the state bytes (12 per element).
func BenchmarkReshard(b *testing.B) {
	from, shards := benchState(b, 8)
	to, err := NewPartition(from.Tensors(), 6, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(stateBytes(from))
	for b.Loop() {
		if _, err := Reshard(from, shards, to); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointWrite writes the shards of 4 ranks concurrently, as the
// ranks of one host would, and commits: encode, SHA-256 (whole file and
// chunks), write, fsync, rename.
func BenchmarkCheckpointWrite(b *testing.B) {
	p, shards := benchState(b, 4)
	root := b.TempDir()
	b.SetBytes(stateBytes(p))
	step := int64(0)
	for b.Loop() {
		step++
		infos := make([]ShardInfo, len(shards))
		var g errgroup.Group
		for r, s := range shards {
			g.Go(func() (err error) {
				infos[r], err = WriteShard(context.Background(), root, step, p, s)
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		if err := Commit(context.Background(), root, step, p, infos); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpointRead loads, at degree 3, every rank's shard of a
// checkpoint written at degree 4: ranged reads, chunk SHA-256, decode. The
// files were just written, so they come from the page cache.
func BenchmarkCheckpointRead(b *testing.B) {
	p, shards := benchState(b, 4)
	root := b.TempDir()
	infos := make([]ShardInfo, len(shards))
	for r, s := range shards {
		var err error
		if infos[r], err = WriteShard(context.Background(), root, 1, p, s); err != nil {
			b.Fatal(err)
		}
	}
	if err := Commit(context.Background(), root, 1, p, infos); err != nil {
		b.Fatal(err)
	}
	shards = nil
	to, err := NewPartition(p.Tensors(), 3, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, conc := range []int{1, 3} {
		b.Run(fmt.Sprintf("ranks-in-parallel=%d", conc), func(b *testing.B) {
			b.SetBytes(stateBytes(p))
			for b.Loop() {
				var g errgroup.Group
				g.SetLimit(conc)
				for r := range 3 {
					g.Go(func() error {
						_, err := ReadShard(context.Background(), root, 1, to, r)
						return err
					})
				}
				if err := g.Wait(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
