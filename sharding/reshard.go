package sharding

import (
	"fmt"
	"maps"
	"slices"
)

// Shard is one data-parallel rank's block of the flat state vectors, for
// example the master weights "param" and Adam's "m" and "v". Every vector
// has Range.Len() elements: vector[i] is flat element Range.Lo+i, and the
// elements past the partition's Len() are padding, zero when this package
// makes the shard.
//
// The caller owns a Shard and its slices; functions of this package never
// keep or modify a Shard they are handed.
type Shard struct {
	// Rank is the data-parallel rank that owns the block.
	Rank int
	// Range is the block in the padded flat buffer.
	Range Range
	// Vectors holds the state vectors by name.
	Vectors map[string][]float32
}

// names returns the vector names, sorted.
func (s *Shard) names() []string { return slices.Sorted(maps.Keys(s.Vectors)) }

// NewShard returns rank r's block of p with a zeroed vector for each name.
func NewShard(p *Partition, r int, names ...string) (*Shard, error) {
	rg, err := p.Range(r)
	if err != nil {
		return nil, err
	}
	s := &Shard{Rank: r, Range: rg, Vectors: make(map[string][]float32, len(names))}
	for _, n := range names {
		if _, dup := s.Vectors[n]; dup {
			return nil, fmt.Errorf("%w: vector %q named twice", ErrInvalid, n)
		}
		s.Vectors[n] = make([]float32, rg.Len())
	}
	return s, nil
}

// ShardOf copies rank r's block out of whole flat vectors, each of p.Len()
// or p.PaddedLen() elements; the padding of the shard is zero. Use it to
// shard state that every rank starts with, such as identically initialised
// parameters.
func ShardOf(p *Partition, r int, full map[string][]float32) (*Shard, error) {
	s, err := NewShard(p, r, slices.Sorted(maps.Keys(full))...)
	if err != nil {
		return nil, err
	}
	own, _ := p.Owned(r)
	for name, v := range full {
		if len(v) != p.Len() && len(v) != p.PaddedLen() {
			return nil, fmt.Errorf("%w: vector %q has %d elements, want %d or %d", ErrMismatch, name, len(v), p.Len(), p.PaddedLen())
		}
		if own.Len() > 0 {
			copy(s.Vectors[name], v[own.Lo:own.Hi])
		}
	}
	return s, nil
}

// Transfer is one contiguous run of elements moved from a shard of the old
// partition to a shard of the new one when the data-parallel degree changes.
type Transfer struct {
	Src    int // rank in the old partition
	Dst    int // rank in the new partition
	SrcOff int // offset in the source shard
	DstOff int // offset in the destination shard
	Len    int // number of elements
}

// Transfers returns every run that re-sharding from one partition to
// another moves, ordered by destination rank and then by offset. Only real
// elements move; the new shards' padding is zero. It is the plan a
// distributed re-shard sends and receives by; Reshard and ReshardRank apply
// it in memory. The partitions must lay out the same tensors.
func Transfers(from, to *Partition) ([]Transfer, error) {
	if err := compatible(from, to); err != nil {
		return nil, err
	}
	var out []Transfer
	for r := range to.degree {
		out = append(out, transfersTo(from, to, r)...)
	}
	return out, nil
}

// transfersTo returns the runs that fill rank r of to, in offset order.
func transfersTo(from, to *Partition, r int) []Transfer {
	own, _ := to.Owned(r)
	dst := to.blockOf(r)
	var out []Transfer
	for lo := own.Lo; lo < own.Hi; {
		src := lo / from.shard
		run := from.blockOf(src).intersect(Range{lo, own.Hi})
		out = append(out, Transfer{
			Src: src, Dst: r,
			SrcOff: run.Lo - src*from.shard,
			DstOff: run.Lo - dst.Lo,
			Len:    run.Len(),
		})
		lo = run.Hi
	}
	return out
}

// compatible checks that two partitions describe the same flat buffer.
func compatible(from, to *Partition) error {
	if from.n != to.n || !from.sameTensors(to.tensors) {
		return fmt.Errorf("%w: partitions lay out different tensors (flat lengths %d and %d)", ErrMismatch, from.n, to.n)
	}
	return nil
}

// Reshard turns the shards of from, one per old rank in rank order, into the
// shards of to. Each new shard is filled straight from the old shards that
// overlap it, so the whole flat vectors are never built. The result is
// bit-exact: element i of every vector keeps its value.
func Reshard(from *Partition, shards []*Shard, to *Partition) ([]*Shard, error) {
	names, err := checkShards(from, shards, true)
	if err != nil {
		return nil, err
	}
	if err := compatible(from, to); err != nil {
		return nil, err
	}
	out := make([]*Shard, to.degree)
	for r := range out {
		if out[r], err = reshardRank(from, shards, to, r, names); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReshardRank builds only rank r's shard of to, reading only the old shards
// that overlap it: shards is indexed by old rank and may hold nil for the
// others (Transfers says which are needed). A rank that joins or survives an
// elastic change calls it with the old shards it has received.
func ReshardRank(from *Partition, shards []*Shard, to *Partition, r int) (*Shard, error) {
	if err := compatible(from, to); err != nil {
		return nil, err
	}
	if err := to.checkRank(r); err != nil {
		return nil, err
	}
	if len(shards) != from.degree {
		return nil, fmt.Errorf("%w: %d shards for degree %d", ErrMismatch, len(shards), from.degree)
	}
	for _, t := range transfersTo(from, to, r) {
		if shards[t.Src] == nil {
			return nil, fmt.Errorf("%w: new rank %d needs old shard %d, which is nil", ErrMismatch, r, t.Src)
		}
	}
	names, err := checkShards(from, shards, false)
	if err != nil {
		return nil, err
	}
	return reshardRank(from, shards, to, r, names)
}

func reshardRank(from *Partition, shards []*Shard, to *Partition, r int, names []string) (*Shard, error) {
	s, err := NewShard(to, r, names...)
	if err != nil {
		return nil, err
	}
	for _, t := range transfersTo(from, to, r) {
		for _, n := range names {
			copy(s.Vectors[n][t.DstOff:t.DstOff+t.Len], shards[t.Src].Vectors[n][t.SrcOff:t.SrcOff+t.Len])
		}
	}
	return s, nil
}

// checkShards verifies the non-nil shards against p (slot i holds rank i,
// with p's block and vectors of the block's length, the same names in each)
// and returns the vector names. At least one shard must be given, and all
// of them when all is set.
func checkShards(p *Partition, shards []*Shard, all bool) ([]string, error) {
	if len(shards) != p.degree {
		return nil, fmt.Errorf("%w: %d shards for degree %d", ErrMismatch, len(shards), p.degree)
	}
	var names []string
	seen := false
	for i, s := range shards {
		if s == nil {
			if all {
				return nil, fmt.Errorf("%w: shard %d is nil", ErrMismatch, i)
			}
			continue
		}
		if s.Rank != i || s.Range != p.blockOf(i) {
			return nil, fmt.Errorf("%w: slot %d holds rank %d range %v, want rank %d range %v", ErrMismatch, i, s.Rank, s.Range, i, p.blockOf(i))
		}
		got := s.names()
		if !seen {
			names, seen = got, true
		} else if !slices.Equal(got, names) {
			return nil, fmt.Errorf("%w: shard %d has vectors %q, shard before has %q", ErrMismatch, i, got, names)
		}
		for _, n := range got {
			if len(s.Vectors[n]) != p.shard {
				return nil, fmt.Errorf("%w: shard %d vector %q has %d elements, want %d", ErrMismatch, i, n, len(s.Vectors[n]), p.shard)
			}
		}
	}
	if !seen {
		return nil, fmt.Errorf("%w: no shard given", ErrMismatch)
	}
	return names, nil
}
