package engine

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// How a tensor is divided across the tensor-parallel group.
const (
	splitNone = iota // replicated on every TP rank
	splitRows        // rows divided: a row-parallel weight
	splitCols        // columns divided: a column-parallel weight or its bias
)

// tensorInfo describes one parameter tensor of the full (unsplit) model.
// Vectors are 1 x n matrices.
type tensorInfo struct {
	name       string
	rows, cols int
	split      int
	std        float64 // standard deviation of its initial values
}

// local returns the shape of TP rank t's piece of the tensor and the offsets
// of that piece in the full tensor.
func (ti tensorInfo) local(t, tp int) (rows, cols, row0, col0 int) {
	switch ti.split {
	case splitRows:
		r := ti.rows / tp
		return r, ti.cols, t * r, 0
	case splitCols:
		c := ti.cols / tp
		return ti.rows, c, 0, t * c
	}
	return ti.rows, ti.cols, 0, 0
}

// blockTensors lists the four tensors of block i, in flat-buffer order.
func blockTensors(m ModelSpec, i int) []tensorInfo {
	p := fmt.Sprintf("block%d.", i)
	return []tensorInfo{
		{name: p + "w1", rows: m.Width, cols: m.Hidden, split: splitCols, std: 1 / math.Sqrt(float64(m.Width))},
		{name: p + "b1", rows: 1, cols: m.Hidden, split: splitCols, std: 0.1},
		{name: p + "w2", rows: m.Hidden, cols: m.Width, split: splitRows, std: 0.5 / math.Sqrt(float64(m.Hidden))},
		{name: p + "b2", rows: 1, cols: m.Width, split: splitNone, std: 0.1},
	}
}

// headTensors lists the head's tensors, replicated across TP.
func headTensors(m ModelSpec) []tensorInfo {
	return []tensorInfo{
		{name: "head.w", rows: m.Width, cols: m.Outputs, split: splitNone, std: 1 / math.Sqrt(float64(m.Width))},
		{name: "head.b", rows: 1, cols: m.Outputs, split: splitNone, std: 0.1},
	}
}

// ModelTensors lists every tensor of the full model in a fixed order with its
// full shape: blocks first, then the head.
func ModelTensors(m ModelSpec) []TensorShape {
	var out []TensorShape
	add := func(ts []tensorInfo) {
		for _, t := range ts {
			out = append(out, TensorShape{Name: t.name, Rows: t.rows, Cols: t.cols})
		}
	}
	for i := range m.Blocks {
		add(blockTensors(m, i))
	}
	add(headTensors(m))
	return out
}

// TensorShape names a tensor of the full model and its shape.
type TensorShape struct {
	Name       string
	Rows, Cols int
}

// streamID derives an RNG stream from a name, so a tensor's initial values do
// not depend on which other tensors a rank holds.
func streamID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// initLocal fills dst with TP rank t's piece of the tensor's initial values.
// The full tensor is drawn from the seed and the tensor's name and then cut,
// so every layout starts from the same model.
func initLocal(ti tensorInfo, seed uint64, t, tp int, dst []float32) {
	rng := rand.New(rand.NewPCG(seed, streamID(ti.name)))
	rows, cols, row0, col0 := ti.local(t, tp)
	k := 0
	for r := range ti.rows {
		for c := range ti.cols {
			v := float32(rng.NormFloat64() * ti.std)
			if r >= row0 && r < row0+rows && c >= col0 && c < col0+cols {
				dst[k] = v
				k++
			}
		}
	}
}

// Tensor is a row-major matrix of the full model.
type Tensor struct {
	Rows, Cols int
	Data       []float32
}

// Params is a set of named tensors of the full model.
type Params map[string]*Tensor

// paramPiece is one rank's local piece of a tensor, for reassembly.
type paramPiece struct {
	Name       string
	Rows, Cols int // full shape
	Row0, Col0 int // offset of the piece in the full tensor
	PRows      int // piece rows
	PCols      int // piece columns
	Data       []float32
}

// assemble writes pieces into full tensors, allocating them on first use.
func (p Params) assemble(pieces []paramPiece) {
	for _, pc := range pieces {
		t, ok := p[pc.Name]
		if !ok {
			t = &Tensor{Rows: pc.Rows, Cols: pc.Cols, Data: make([]float32, pc.Rows*pc.Cols)}
			p[pc.Name] = t
		}
		full := t.Data
		for r := range pc.PRows {
			copy(full[(pc.Row0+r)*pc.Cols+pc.Col0:(pc.Row0+r)*pc.Cols+pc.Col0+pc.PCols], pc.Data[r*pc.PCols:(r+1)*pc.PCols])
		}
	}
}

// MaxRelDiff returns the largest |a-b| / max(|b|, floor) over every element
// of every tensor of b, and the tensor where it occurs. A tensor missing from
// a or of another length counts as an infinite difference.
func (p Params) MaxRelDiff(want Params, floor float64) (float64, string) {
	worst, where := 0.0, ""
	for name, wt := range want {
		gt, ok := p[name]
		if !ok || gt.Rows != wt.Rows || gt.Cols != wt.Cols {
			return math.Inf(1), name
		}
		g, w := gt.Data, wt.Data
		for i := range w {
			d := math.Abs(float64(g[i])-float64(w[i])) / math.Max(math.Abs(float64(w[i])), floor)
			if d > worst || math.IsNaN(d) {
				worst, where = d, name
			}
		}
	}
	return worst, where
}

// pieces returns the tensors as whole pieces, for writing.
func (p Params) pieces() []paramPiece {
	var out []paramPiece
	for name, t := range p {
		out = append(out, paramPiece{Name: name, Rows: t.Rows, Cols: t.Cols, PRows: t.Rows, PCols: t.Cols, Data: t.Data})
	}
	return out
}
