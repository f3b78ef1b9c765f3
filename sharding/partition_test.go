package sharding

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

// vecTensors names one 1-D tensor per length.
func vecTensors(lengths ...int) []Tensor {
	ts := make([]Tensor, len(lengths))
	for i, n := range lengths {
		ts[i] = Tensor{Name: fmt.Sprintf("t%d", i), Shape: []int{n}}
	}
	return ts
}

func TestNewPartition(t *testing.T) {
	tests := []struct {
		name    string
		tensors []Tensor
		degree  int
		align   int
		// Hand-computed expectations.
		wantLen, wantPadded, wantShard int
		wantOwned                      []Range
		wantPieces                     [][]Piece
	}{
		{
			name: "one tensor, padding spills over two ranks", tensors: vecTensors(10), degree: 4, align: 4,
			wantLen: 10, wantPadded: 16, wantShard: 4,
			wantOwned: []Range{{0, 4}, {4, 8}, {8, 10}, {12, 12}},
			wantPieces: [][]Piece{
				{{Tensor: 0, Elems: Range{0, 4}, ShardOff: 0}},
				{{Tensor: 0, Elems: Range{4, 8}, ShardOff: 0}},
				{{Tensor: 0, Elems: Range{8, 10}, ShardOff: 0}},
				nil,
			},
		},
		{
			name: "tensor split across ranks, empty tensor skipped", tensors: vecTensors(3, 6, 0, 6), degree: 2, align: 2,
			wantLen: 15, wantPadded: 16, wantShard: 8,
			wantOwned: []Range{{0, 8}, {8, 15}},
			wantPieces: [][]Piece{
				{{Tensor: 0, Elems: Range{0, 3}, ShardOff: 0}, {Tensor: 1, Elems: Range{0, 5}, ShardOff: 3}},
				{{Tensor: 1, Elems: Range{5, 6}, ShardOff: 0}, {Tensor: 3, Elems: Range{0, 6}, ShardOff: 1}},
			},
		},
		{
			name: "matrices and a scalar, exact fit", tensors: []Tensor{{"w", []int{2, 3}}, {"s", nil}, {"b", []int{5}}}, degree: 3, align: 1,
			wantLen: 12, wantPadded: 12, wantShard: 4,
			wantOwned: []Range{{0, 4}, {4, 8}, {8, 12}},
			wantPieces: [][]Piece{
				{{Tensor: 0, Elems: Range{0, 4}, ShardOff: 0}},
				{{Tensor: 0, Elems: Range{4, 6}, ShardOff: 0}, {Tensor: 1, Elems: Range{0, 1}, ShardOff: 2}, {Tensor: 2, Elems: Range{0, 1}, ShardOff: 3}},
				{{Tensor: 2, Elems: Range{1, 5}, ShardOff: 0}},
			},
		},
		{
			name: "degree 1 keeps everything", tensors: vecTensors(7), degree: 1, align: 1,
			wantLen: 7, wantPadded: 7, wantShard: 7,
			wantOwned:  []Range{{0, 7}},
			wantPieces: [][]Piece{{{Tensor: 0, Elems: Range{0, 7}, ShardOff: 0}}},
		},
		{
			name: "empty model", tensors: nil, degree: 3, align: 16,
			wantLen: 0, wantPadded: 0, wantShard: 0,
			wantOwned:  []Range{{0, 0}, {0, 0}, {0, 0}},
			wantPieces: [][]Piece{nil, nil, nil},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPartition(tc.tensors, tc.degree, &Config{Align: tc.align})
			if err != nil {
				t.Fatal(err)
			}
			if p.Len() != tc.wantLen || p.PaddedLen() != tc.wantPadded || p.ShardLen() != tc.wantShard {
				t.Fatalf("len/padded/shard = %d/%d/%d, want %d/%d/%d", p.Len(), p.PaddedLen(), p.ShardLen(), tc.wantLen, tc.wantPadded, tc.wantShard)
			}
			if p.Padding() != tc.wantPadded-tc.wantLen {
				t.Errorf("Padding = %d, want %d", p.Padding(), tc.wantPadded-tc.wantLen)
			}
			for r := range tc.degree {
				own, err := p.Owned(r)
				if err != nil {
					t.Fatal(err)
				}
				if own != tc.wantOwned[r] {
					t.Errorf("Owned(%d) = %v, want %v", r, own, tc.wantOwned[r])
				}
				blk, _ := p.Range(r)
				if want := (Range{r * tc.wantShard, (r + 1) * tc.wantShard}); blk != want {
					t.Errorf("Range(%d) = %v, want %v", r, blk, want)
				}
				pieces, err := p.Pieces(r)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(pieces, tc.wantPieces[r]) {
					t.Errorf("Pieces(%d) = %+v, want %+v", r, pieces, tc.wantPieces[r])
				}
			}
		})
	}
}

func TestPartitionErrors(t *testing.T) {
	p, err := NewPartition(vecTensors(10, 5), 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
	}{
		{"degree 0", func() error { _, err := NewPartition(vecTensors(4), 0, nil); return err }},
		{"align 0", func() error { _, err := NewPartition(vecTensors(4), 2, &Config{Align: 0}); return err }},
		{"negative dimension", func() error { _, err := NewPartition([]Tensor{{"w", []int{3, -1}}}, 2, nil); return err }},
		{"shape overflows", func() error {
			_, err := NewPartition([]Tensor{{"w", []int{math.MaxInt / 2, 3}}}, 2, nil)
			return err
		}},
		{"total overflows", func() error {
			_, err := NewPartition(vecTensors(math.MaxInt-10, 20), 1, &Config{Align: 1})
			return err
		}},
		{"padding overflows", func() error {
			_, err := NewPartition(vecTensors(math.MaxInt-10), 16, nil)
			return err
		}},
		{"degree times align overflows", func() error {
			_, err := NewPartition(vecTensors(1), math.MaxInt/2, &Config{Align: 4})
			return err
		}},
		{"rank -1", func() error { _, err := p.Range(-1); return err }},
		{"rank = degree", func() error { _, err := p.Owned(4); return err }},
		{"pieces of rank 9", func() error { _, err := p.Pieces(9); return err }},
		{"tensor 2 of 2", func() error { _, err := p.TensorRange(2); return err }},
		{"owner of padded length", func() error { _, err := p.Owner(p.PaddedLen()); return err }},
		{"owner of -1", func() error { _, err := p.Owner(-1); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestPartitionCopiesTensors(t *testing.T) {
	in := []Tensor{{"w", []int{2, 2}}}
	p, err := NewPartition(in, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	in[0].Shape[0] = 100
	out := p.Tensors()
	out[0].Shape[1] = 100
	if got := p.Tensors()[0].Shape; !slices.Equal(got, []int{2, 2}) || p.Len() != 4 {
		t.Fatalf("partition shape %v, len %d changed through a caller's slice", got, p.Len())
	}
}

// checkPartitionInvariants asserts what every partition must satisfy.
func checkPartitionInvariants(t *testing.T, p *Partition, lengths []int) {
	t.Helper()
	d, a := p.Degree(), p.Align()
	n := 0
	for _, l := range lengths {
		n += l
	}
	if p.Len() != n {
		t.Fatalf("Len = %d, want %d", p.Len(), n)
	}
	if p.PaddedLen()%(d*a) != 0 || p.Padding() < 0 || p.Padding() >= d*a {
		t.Fatalf("padded %d for len %d, d %d, align %d: want the next multiple of d*align", p.PaddedLen(), n, d, a)
	}
	// Balanced within align: every block is ShardLen, which exceeds the
	// ideal n/d by less than align.
	if s := p.ShardLen(); s%a != 0 || s*d-n >= d*a {
		t.Fatalf("shard %d: not aligned to %d or more than align above %d/%d", s, a, n, d)
	}
	// Blocks cover [0, padded) exactly once, in order; owned parts cover
	// [0, n) exactly once and shrink only at the tail.
	next, ownNext, prevOwn := 0, 0, p.ShardLen()
	for r := range d {
		blk, err := p.Range(r)
		if err != nil {
			t.Fatal(err)
		}
		if blk.Lo != next || blk.Len() != p.ShardLen() || blk.Lo%a != 0 {
			t.Fatalf("rank %d block %v after %d, shard %d", r, blk, next, p.ShardLen())
		}
		next = blk.Hi
		own, _ := p.Owned(r)
		if own.Lo != min(ownNext, n) && own.Len() > 0 || own.Len() > prevOwn || own.Lo < blk.Lo || own.Hi > blk.Hi {
			t.Fatalf("rank %d owns %v inside %v after %d (previous rank owned %d)", r, own, blk, ownNext, prevOwn)
		}
		ownNext += own.Len()
		prevOwn = own.Len()
		if own.Len() > 0 {
			if o, _ := p.Owner(own.Lo); o != r {
				t.Fatalf("Owner(%d) = %d, want %d", own.Lo, o, r)
			}
			if o, _ := p.Owner(own.Hi - 1); o != r {
				t.Fatalf("Owner(%d) = %d, want %d", own.Hi-1, o, r)
			}
		}
	}
	if next != p.PaddedLen() || ownNext != n {
		t.Fatalf("blocks end at %d, owned parts sum to %d; want %d and %d", next, ownNext, p.PaddedLen(), n)
	}
	// The pieces of all ranks cover every element of every tensor exactly
	// once, at the right shard offset.
	covered := make([]int, len(lengths))
	for r := range d {
		pieces, _ := p.Pieces(r)
		blk, _ := p.Range(r)
		for _, pc := range pieces {
			tr, _ := p.TensorRange(pc.Tensor)
			if pc.Elems.Len() <= 0 || pc.Elems.Lo != covered[pc.Tensor] || pc.Elems.Hi > lengths[pc.Tensor] {
				t.Fatalf("rank %d piece %+v: tensor %d covered up to %d of %d", r, pc, pc.Tensor, covered[pc.Tensor], lengths[pc.Tensor])
			}
			if blk.Lo+pc.ShardOff != tr.Lo+pc.Elems.Lo {
				t.Fatalf("rank %d piece %+v sits at flat %d, tensor element is at %d", r, pc, blk.Lo+pc.ShardOff, tr.Lo+pc.Elems.Lo)
			}
			covered[pc.Tensor] = pc.Elems.Hi
		}
	}
	if !slices.Equal(covered, lengths) {
		t.Fatalf("pieces cover %v of tensors %v", covered, lengths)
	}
}

func FuzzPartition(f *testing.F) {
	f.Add([]byte{10}, uint8(4), uint8(4))
	f.Add([]byte{3, 6, 0, 6}, uint8(2), uint8(2))
	f.Add([]byte{}, uint8(3), uint8(16))
	f.Add([]byte{255, 1, 77, 0, 0, 13}, uint8(64), uint8(1))
	f.Fuzz(func(t *testing.T, raw []byte, d, align uint8) {
		if d == 0 || align == 0 {
			_, err := NewPartition(vecTensors(1), int(d), &Config{Align: int(align)})
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("degree %d align %d: err = %v, want ErrInvalid", d, align, err)
			}
			return
		}
		// Each byte pair is a length up to 65535, so tensors straddle many
		// ranks as well as sitting inside one.
		var lengths []int
		for i := 0; i+1 < len(raw); i += 2 {
			lengths = append(lengths, int(raw[i])<<8|int(raw[i+1]))
		}
		if len(raw)%2 == 1 {
			lengths = append(lengths, int(raw[len(raw)-1]))
		}
		p, err := NewPartition(vecTensors(lengths...), int(d), &Config{Align: int(align)})
		if err != nil {
			t.Fatal(err)
		}
		checkPartitionInvariants(t, p, lengths)

		// Re-sharding to another degree and alignment moves every real
		// element exactly once, from where it is to where it belongs.
		to, err := NewPartition(vecTensors(lengths...), int(align%13)+1, &Config{Align: int(d%5) + 1})
		if err != nil {
			t.Fatal(err)
		}
		moves, err := Transfers(p, to)
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		for _, m := range moves {
			src, _ := p.Range(m.Src)
			dst, _ := to.Range(m.Dst)
			if m.Len <= 0 || src.Lo+m.SrcOff != next || dst.Lo+m.DstOff != next ||
				m.SrcOff+m.Len > src.Len() || m.DstOff+m.Len > dst.Len() {
				t.Fatalf("transfer %+v at flat %d: blocks %v -> %v", m, next, src, dst)
			}
			next += m.Len
		}
		if next != p.Len() {
			t.Fatalf("transfers move %d of %d elements", next, p.Len())
		}
	})
}
