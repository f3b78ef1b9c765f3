package sharding

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
)

// Config configures how a flat buffer is cut into shards. Start from
// DefaultConfig and override fields.
type Config struct {
	// Align is the alignment of every shard boundary, in elements. The flat
	// buffer is padded to a multiple of Degree*Align elements so that every
	// rank's block has the same length, which is what a reduce-scatter or an
	// all-gather with equal blocks needs. 16 elements is 64 bytes of float32
	// (a cache line) and 32 bytes of bfloat16. Align must be at least 1.
	Align int
}

// DefaultConfig returns an alignment of 16 elements.
func DefaultConfig() *Config { return &Config{Align: 16} }

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	if c.Align < 1 {
		return fmt.Errorf("%w: Align %d is below 1", ErrInvalid, c.Align)
	}
	return nil
}

// Tensor is one parameter tensor of the model: its name and shape. Its
// elements take Numel() consecutive places in the flat buffer, row-major.
type Tensor struct {
	// Name identifies the tensor, e.g. "layers.0.fc1.weight".
	Name string `json:"name"`
	// Shape is the tensor's dimensions; an empty shape is a scalar.
	Shape []int `json:"shape"`
}

// Numel returns the number of elements, or an error for a negative
// dimension or a product that overflows int.
func (t Tensor) Numel() (int, error) {
	n := 1
	for _, s := range t.Shape {
		if s < 0 {
			return 0, fmt.Errorf("%w: tensor %q has negative dimension %d", ErrInvalid, t.Name, s)
		}
		if s != 0 && n > math.MaxInt/s {
			return 0, fmt.Errorf("%w: tensor %q shape %v overflows", ErrInvalid, t.Name, t.Shape)
		}
		n *= s
	}
	return n, nil
}

// Range is the half-open interval [Lo, Hi) of element indices.
type Range struct {
	Lo int `json:"lo"`
	Hi int `json:"hi"`
}

// Len returns Hi-Lo.
func (r Range) Len() int { return r.Hi - r.Lo }

// intersect returns the overlap of r and o, empty (Lo == Hi) when they do
// not overlap.
func (r Range) intersect(o Range) Range {
	lo, hi := max(r.Lo, o.Lo), min(r.Hi, o.Hi)
	if hi < lo {
		hi = lo
	}
	return Range{lo, hi}
}

// Piece is the part of one tensor that a shard covers.
type Piece struct {
	// Tensor is the index of the tensor in the partition's tensor list.
	Tensor int
	// Elems is the covered range of the tensor's own (flattened) elements.
	Elems Range
	// ShardOff is where Elems.Lo sits in the shard: shard[ShardOff+i] is
	// element Elems.Lo+i of the tensor.
	ShardOff int
}

// Partition says which data-parallel rank owns which contiguous slice of
// the flat parameter, gradient and optimizer-state buffers. The flat buffer
// holds the tensors back to back in the given order, then Padding() zero
// elements, for PaddedLen() elements in all; rank r owns
// [r*ShardLen(), (r+1)*ShardLen()). Every shard has the same length and
// starts at a multiple of the alignment; the padding sits at the tail, so the
// last ranks may own fewer real elements (or none, when the model is tiny).
// No rank owns more than Align-1 elements beyond the ideal Len()/Degree().
//
// A Partition is immutable and safe for concurrent use.
type Partition struct {
	tensors []Tensor
	offsets []int // offsets[i] is tensor i's first flat index; offsets[len] = n
	degree  int
	align   int
	n       int
	shard   int
}

// NewPartition lays the tensors out in one flat buffer and cuts it into
// degree equal, aligned shards. A nil cfg means DefaultConfig(). Zero-size
// tensors are allowed and own no elements.
func NewPartition(tensors []Tensor, degree int, cfg *Config) (*Partition, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if degree < 1 {
		return nil, fmt.Errorf("%w: data-parallel degree %d is below 1", ErrInvalid, degree)
	}
	if degree > math.MaxInt/cfg.Align {
		return nil, fmt.Errorf("%w: degree %d times align %d overflows", ErrInvalid, degree, cfg.Align)
	}
	p := &Partition{
		tensors: make([]Tensor, len(tensors)),
		offsets: make([]int, len(tensors)+1),
		degree:  degree,
		align:   cfg.Align,
	}
	for i, t := range tensors {
		k, err := t.Numel()
		if err != nil {
			return nil, err
		}
		if p.n > math.MaxInt-k {
			return nil, fmt.Errorf("%w: total length of %d tensors overflows", ErrInvalid, len(tensors))
		}
		p.tensors[i] = Tensor{Name: t.Name, Shape: append([]int{}, t.Shape...)}
		p.offsets[i] = p.n
		p.n += k
	}
	p.offsets[len(tensors)] = p.n
	unit := degree * cfg.Align
	blocks := p.n / unit
	if p.n%unit != 0 {
		blocks++
	}
	if blocks > math.MaxInt/unit {
		return nil, fmt.Errorf("%w: flat length %d padded to a multiple of %d overflows", ErrInvalid, p.n, unit)
	}
	p.shard = blocks * cfg.Align
	return p, nil
}

// Degree returns the data-parallel degree: the number of shards.
func (p *Partition) Degree() int { return p.degree }

// Align returns the shard alignment in elements.
func (p *Partition) Align() int { return p.align }

// Len returns the flat length: the total number of tensor elements.
func (p *Partition) Len() int { return p.n }

// PaddedLen returns the padded flat length, Degree()*ShardLen().
func (p *Partition) PaddedLen() int { return p.degree * p.shard }

// ShardLen returns the length of every rank's block.
func (p *Partition) ShardLen() int { return p.shard }

// Padding returns the number of zero elements after the tensors,
// PaddedLen()-Len(); it is below Degree()*Align().
func (p *Partition) Padding() int { return p.PaddedLen() - p.n }

// Tensors returns a copy of the tensor list.
func (p *Partition) Tensors() []Tensor {
	out := make([]Tensor, len(p.tensors))
	for i, t := range p.tensors {
		out[i] = Tensor{Name: t.Name, Shape: append([]int{}, t.Shape...)}
	}
	return out
}

// TensorRange returns tensor i's range in the flat buffer.
func (p *Partition) TensorRange(i int) (Range, error) {
	if i < 0 || i >= len(p.tensors) {
		return Range{}, fmt.Errorf("%w: tensor index %d outside [0, %d)", ErrInvalid, i, len(p.tensors))
	}
	return Range{p.offsets[i], p.offsets[i+1]}, nil
}

// Range returns rank r's block of the padded flat buffer.
func (p *Partition) Range(r int) (Range, error) {
	if err := p.checkRank(r); err != nil {
		return Range{}, err
	}
	return p.blockOf(r), nil
}

// Owned returns the real (non-padding) part of rank r's block, which is
// empty for a rank that holds only padding.
func (p *Partition) Owned(r int) (Range, error) {
	if err := p.checkRank(r); err != nil {
		return Range{}, err
	}
	return p.blockOf(r).intersect(Range{0, p.n}), nil
}

// Owner returns the rank whose block holds flat index i, padding included.
func (p *Partition) Owner(i int) (int, error) {
	if i < 0 || i >= p.PaddedLen() {
		return 0, fmt.Errorf("%w: flat index %d outside [0, %d)", ErrInvalid, i, p.PaddedLen())
	}
	return i / p.shard, nil
}

// Pieces returns the tensor pieces rank r's block covers, in flat order.
// Zero-size tensors and the padding give no piece.
func (p *Partition) Pieces(r int) ([]Piece, error) {
	own, err := p.Owned(r)
	if err != nil {
		return nil, err
	}
	if own.Len() == 0 {
		return nil, nil
	}
	block := p.blockOf(r)
	// First tensor whose end lies beyond own.Lo.
	i := sort.Search(len(p.tensors), func(i int) bool { return p.offsets[i+1] > own.Lo })
	var out []Piece
	for ; i < len(p.tensors) && p.offsets[i] < own.Hi; i++ {
		t := Range{p.offsets[i], p.offsets[i+1]}.intersect(own)
		if t.Len() == 0 {
			continue
		}
		out = append(out, Piece{
			Tensor:   i,
			Elems:    Range{t.Lo - p.offsets[i], t.Hi - p.offsets[i]},
			ShardOff: t.Lo - block.Lo,
		})
	}
	return out, nil
}

func (p *Partition) blockOf(r int) Range { return Range{r * p.shard, (r + 1) * p.shard} }

func (p *Partition) checkRank(r int) error {
	if r < 0 || r >= p.degree {
		return fmt.Errorf("%w: rank %d outside [0, %d)", ErrInvalid, r, p.degree)
	}
	return nil
}

// sameTensors reports whether p and o lay out the same tensors in the same
// order (names and shapes), so their flat buffers mean the same thing.
func (p *Partition) sameTensors(tensors []Tensor) bool {
	return slices.EqualFunc(p.tensors, tensors, func(a, b Tensor) bool {
		return a.Name == b.Name && slices.Equal(a.Shape, b.Shape)
	})
}

// layout returns a fingerprint of the tensor list (names and shapes, in
// order): the first 8 bytes of a SHA-256, which shard file headers carry so
// that a file written for other tensors is not taken for this partition's.
func (p *Partition) layout() uint64 {
	h := sha256.New()
	var b []byte
	for _, t := range p.tensors {
		b = binary.LittleEndian.AppendUint64(b[:0], uint64(len(t.Name)))
		b = append(b, t.Name...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(t.Shape)))
		for _, d := range t.Shape {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
		h.Write(b)
	}
	return binary.LittleEndian.Uint64(h.Sum(nil))
}
