package sharding

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

var stateNames = []string{"m", "param", "v"}

// randomState returns whole flat vectors of n elements with random bits
// patterns, NaNs and negative zeros included, so a bit-exact comparison
// means something.
func randomState(seed uint64, n int) map[string][]float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	full := make(map[string][]float32, len(stateNames))
	for _, name := range stateNames {
		v := make([]float32, n)
		for i := range v {
			v[i] = math.Float32frombits(rng.Uint32())
		}
		full[name] = v
	}
	return full
}

// shardAll splits whole vectors into every rank's shard.
func shardAll(t testing.TB, p *Partition, full map[string][]float32) []*Shard {
	t.Helper()
	shards := make([]*Shard, p.Degree())
	for r := range shards {
		s, err := ShardOf(p, r, full)
		if err != nil {
			t.Fatal(err)
		}
		shards[r] = s
	}
	return shards
}

// checkShardBits is the naive reference: element j of rank r's shard is
// whole element r*ShardLen+j, or +0 in the padding, bit for bit.
func checkShardBits(t testing.TB, p *Partition, r int, s *Shard, full map[string][]float32) {
	t.Helper()
	blk, _ := p.Range(r)
	if s.Rank != r || s.Range != blk {
		t.Fatalf("shard is rank %d range %v, want rank %d range %v", s.Rank, s.Range, r, blk)
	}
	if len(s.Vectors) != len(full) {
		t.Fatalf("shard %d has %d vectors, want %d", r, len(s.Vectors), len(full))
	}
	for name, whole := range full {
		v := s.Vectors[name]
		if len(v) != blk.Len() {
			t.Fatalf("shard %d vector %q has %d elements, want %d", r, name, len(v), blk.Len())
		}
		for j, x := range v {
			var want uint32
			if i := blk.Lo + j; i < p.Len() {
				want = math.Float32bits(whole[i])
			}
			if got := math.Float32bits(x); got != want {
				t.Fatalf("rank %d %s[%d] (flat %d) = %#08x, want %#08x", r, name, j, blk.Lo+j, got, want)
			}
		}
	}
}

func TestReshard(t *testing.T) {
	tests := []struct {
		name        string
		lengths     []int
		from, to    int
		alignFrom   int
		alignTo     int
		wantPadOnly int // ranks of the new partition that hold only padding
	}{
		{name: "4 to 3", lengths: []int{1000, 24, 333}, from: 4, to: 3, alignFrom: 16, alignTo: 16},
		{name: "3 to 4", lengths: []int{1000, 24, 333}, from: 3, to: 4, alignFrom: 16, alignTo: 16},
		{name: "8 to 2", lengths: []int{4096, 4096}, from: 8, to: 2, alignFrom: 16, alignTo: 16},
		{name: "1 to 5", lengths: []int{777}, from: 1, to: 5, alignFrom: 16, alignTo: 16},
		{name: "5 to 1", lengths: []int{777}, from: 5, to: 1, alignFrom: 16, alignTo: 16},
		{name: "odd lengths 7 to 3", lengths: []int{1, 3, 5, 7, 11, 13, 0, 17}, from: 7, to: 3, alignFrom: 1, alignTo: 1},
		{name: "odd lengths 3 to 7, align changes", lengths: []int{1, 3, 5, 7, 11, 13, 0, 17}, from: 3, to: 7, alignFrom: 4, alignTo: 3},
		{name: "tiny model, most new ranks padding only", lengths: []int{5}, from: 2, to: 6, alignFrom: 1, alignTo: 4, wantPadOnly: 4},
		{name: "tiny model from padding-only ranks", lengths: []int{5}, from: 6, to: 2, alignFrom: 4, alignTo: 1},
		{name: "same degree", lengths: []int{99}, from: 3, to: 3, alignFrom: 2, alignTo: 2},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, err := NewPartition(vecTensors(tc.lengths...), tc.from, &Config{Align: tc.alignFrom})
			if err != nil {
				t.Fatal(err)
			}
			to, err := NewPartition(vecTensors(tc.lengths...), tc.to, &Config{Align: tc.alignTo})
			if err != nil {
				t.Fatal(err)
			}
			full := randomState(uint64(i), from.Len())
			old := shardAll(t, from, full)
			for r, s := range old {
				checkShardBits(t, from, r, s, full)
			}
			snapshot := make([][]float32, 0, len(old)*len(stateNames))
			for _, s := range old {
				for _, n := range stateNames {
					snapshot = append(snapshot, slices.Clone(s.Vectors[n]))
				}
			}

			got, err := Reshard(from, old, to)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.to {
				t.Fatalf("%d shards, want %d", len(got), tc.to)
			}
			padOnly := 0
			for r, s := range got {
				checkShardBits(t, to, r, s, full)
				if own, _ := to.Owned(r); own.Len() == 0 {
					padOnly++
				}
			}
			if padOnly != tc.wantPadOnly {
				t.Errorf("%d new ranks hold only padding, want %d", padOnly, tc.wantPadOnly)
			}
			k := 0
			for _, s := range old {
				for _, n := range stateNames {
					if !slices.Equal(math32bits(s.Vectors[n]), math32bits(snapshot[k])) {
						t.Fatalf("Reshard modified old shard %d vector %q", s.Rank, n)
					}
					k++
				}
			}
			// And back: the round trip is the identity.
			back, err := Reshard(to, got, from)
			if err != nil {
				t.Fatal(err)
			}
			for r, s := range back {
				checkShardBits(t, from, r, s, full)
			}
		})
	}
}

func math32bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

func TestTransfers(t *testing.T) {
	// 10 elements: old d=2 align 1 (blocks of 5), new d=3 align 1 (padded to
	// 12, blocks of 4).
	from, _ := NewPartition(vecTensors(10), 2, &Config{Align: 1})
	to, _ := NewPartition(vecTensors(10), 3, &Config{Align: 1})
	got, err := Transfers(from, to)
	if err != nil {
		t.Fatal(err)
	}
	want := []Transfer{
		{Src: 0, Dst: 0, SrcOff: 0, DstOff: 0, Len: 4},
		{Src: 0, Dst: 1, SrcOff: 4, DstOff: 0, Len: 1},
		{Src: 1, Dst: 1, SrcOff: 0, DstOff: 1, Len: 3},
		{Src: 1, Dst: 2, SrcOff: 3, DstOff: 0, Len: 2},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Transfers = %+v\nwant %+v", got, want)
	}
}

func TestReshardRankReadsOnlyOverlappingShards(t *testing.T) {
	from, _ := NewPartition(vecTensors(800), 8, &Config{Align: 1})
	to, _ := NewPartition(vecTensors(800), 3, &Config{Align: 1})
	full := randomState(42, 800)
	all := shardAll(t, from, full)
	// New rank 1 owns [267, 534): old shards 2..5 (blocks of 100).
	some := make([]*Shard, 8)
	for _, r := range []int{2, 3, 4, 5} {
		some[r] = all[r]
	}
	s, err := ReshardRank(from, some, to, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkShardBits(t, to, 1, s, full)

	some[3] = nil
	if _, err := ReshardRank(from, some, to, 1); !errors.Is(err, ErrMismatch) {
		t.Fatalf("missing old shard 3: err = %v, want ErrMismatch", err)
	}
	if _, err := ReshardRank(from, some, to, 3); !errors.Is(err, ErrInvalid) {
		t.Fatalf("rank 3 of 3: err = %v, want ErrInvalid", err)
	}
}

func TestReshardErrors(t *testing.T) {
	from, _ := NewPartition(vecTensors(64), 4, &Config{Align: 1})
	to, _ := NewPartition(vecTensors(64), 2, &Config{Align: 1})
	other, _ := NewPartition(vecTensors(32, 32), 2, &Config{Align: 1})
	fresh := func() []*Shard { return shardAll(t, from, randomState(7, 64)) }
	tests := []struct {
		name   string
		shards func() []*Shard
		to     *Partition
	}{
		{"other tensors", fresh, other},
		{"too few shards", func() []*Shard { return fresh()[:3] }, to},
		{"nil shard", func() []*Shard { s := fresh(); s[2] = nil; return s }, to},
		{"shards out of order", func() []*Shard { s := fresh(); s[0], s[1] = s[1], s[0]; return s }, to},
		{"short vector", func() []*Shard { s := fresh(); s[1].Vectors["m"] = s[1].Vectors["m"][:3]; return s }, to},
		{"vector missing on one rank", func() []*Shard { s := fresh(); delete(s[3].Vectors, "v"); return s }, to},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Reshard(from, tc.shards(), tc.to); !errors.Is(err, ErrMismatch) {
				t.Fatalf("err = %v, want ErrMismatch", err)
			}
		})
	}
	if _, err := ShardOf(from, 0, map[string][]float32{"param": make([]float32, 63)}); !errors.Is(err, ErrMismatch) {
		t.Errorf("ShardOf with 63 of 64 elements: err = %v, want ErrMismatch", err)
	}
	if _, err := NewShard(from, 0, "m", "m"); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewShard with a repeated name: err = %v, want ErrInvalid", err)
	}
}
