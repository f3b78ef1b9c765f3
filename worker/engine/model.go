package engine

import (
	"context"
	"math"
)

// chunk is a contiguous run of blocks (and, for the model's last chunk, the
// head) held by one pipeline rank: one entry of a schedule's chunk list. Its
// tensors are TP rank-local pieces laid out in one flat buffer.
type chunk struct {
	index   int // model chunk index, 0 = first
	first   int // model index of its first block
	blocks  int
	hasHead bool
	spec    ModelSpec
	tensors []tensorInfo
	offs    []int // offset of each local tensor in the flat buffer
	lens    []int
	n       int // flat length before padding
	hLocal  int // this TP rank's share of Hidden
}

func newChunk(m ModelSpec, index, first, blocks int, hasHead bool, tp int) *chunk {
	c := &chunk{index: index, first: first, blocks: blocks, hasHead: hasHead, spec: m, hLocal: m.Hidden / tp}
	for b := range blocks {
		c.tensors = append(c.tensors, blockTensors(m, first+b)...)
	}
	if hasHead {
		c.tensors = append(c.tensors, headTensors(m)...)
	}
	for _, ti := range c.tensors {
		r, cl, _, _ := ti.local(0, tp)
		c.offs = append(c.offs, c.n)
		c.lens = append(c.lens, r*cl)
		c.n += r * cl
	}
	return c
}

// view returns tensor i of the flat buffer buf.
func (c *chunk) view(buf []float32, i int) []float32 {
	return buf[c.offs[i] : c.offs[i]+c.lens[i]]
}

// blockStash is what one block keeps from forward for backward.
type blockStash struct {
	x  []float32 // input, n x Width
	z  []float32 // pre-activation, n x hLocal
	a  []float32 // activation, n x hLocal
	dy []float32 // gradient of the block output (kept for the weight pass)
	dz []float32 // gradient of z (kept for the weight pass)
}

// mbStash is one micro-batch's saved state for one chunk.
type mbStash struct {
	n       int
	blocks  []blockStash
	headX   []float32 // head input
	dlogits []float32 // gradient of the logits, already scaled
}

// bytes returns the float32 bytes the stash holds.
func (s *mbStash) bytes() int64 {
	var n int
	for _, b := range s.blocks {
		n += len(b.x) + len(b.z) + len(b.a) + len(b.dy) + len(b.dz)
	}
	return int64(4 * (n + len(s.headX) + len(s.dlogits)))
}

// reducer sums a buffer in place across the TP group.
type reducer func(ctx context.Context, buf []float32) error

// forward runs the chunk's blocks on x (n x Width), whose ownership passes
// to the stash, and returns the output. The row-parallel all-reduce (Megatron's
// g) follows each block's second linear; the column-parallel input needs no
// communication in forward (f is the identity).
func (c *chunk) forward(ctx context.Context, allReduceTP reducer, params []float32, x []float32, n int, st *mbStash) ([]float32, error) {
	w, h := c.spec.Width, c.hLocal
	st.n = n
	st.blocks = make([]blockStash, c.blocks)
	for b := range c.blocks {
		w1, b1 := c.view(params, 4*b), c.view(params, 4*b+1)
		w2, b2 := c.view(params, 4*b+2), c.view(params, 4*b+3)
		z := make([]float32, n*h)
		gemm(false, false, n, h, w, x, w1, 0, z)
		addRowVec(z, h, b1)
		a := make([]float32, n*h)
		activate(c.spec.Activation, z, a)
		out := make([]float32, n*w)
		gemm(false, false, n, w, h, a, w2, 0, out)
		if err := allReduceTP(ctx, out); err != nil {
			return nil, err
		}
		addRowVec(out, w, b2)
		for i, v := range x {
			out[i] += v
		}
		st.blocks[b] = blockStash{x: x, z: z, a: a}
		x = out
	}
	return x, nil
}

// loss runs the head on x and returns the summed per-sample loss. It stores
// the gradient of the logits scaled by scale (1 / global batch), so that
// gradients summed over micro-batches and replicas are those of the mean.
func (c *chunk) loss(params []float32, x []float32, labels []int32, y []float32, scale float32, st *mbStash) float64 {
	w, o, n := c.spec.Width, c.spec.Outputs, st.n
	hi := 4 * c.blocks
	hw, hb := c.view(params, hi), c.view(params, hi+1)
	logits := make([]float32, n*o)
	gemm(false, false, n, o, w, x, hw, 0, logits)
	addRowVec(logits, o, hb)
	var sum float64
	for s := range n {
		row := logits[s*o : (s+1)*o]
		if c.spec.Loss == LossMSE {
			for j, v := range row {
				d := v - y[s*o+j]
				sum += 0.5 * float64(d) * float64(d)
				row[j] = d * scale
			}
			continue
		}
		mx := row[0]
		for _, v := range row {
			mx = max(mx, v)
		}
		var z float64
		for _, v := range row {
			z += math.Exp(float64(v - mx))
		}
		lbl := labels[s]
		sum += math.Log(z) - float64(row[lbl]-mx)
		for j, v := range row {
			p := math.Exp(float64(v-mx)) / z
			if int32(j) == lbl {
				p--
			}
			row[j] = float32(p) * scale
		}
	}
	st.headX, st.dlogits = x, logits
	return sum
}

// backwardInput computes the gradient of the chunk's input from dOut, the
// gradient of its output (nil for the chunk with the head, which starts from
// its stored logits gradient). It keeps what the weight pass needs. The
// column-parallel input gradient is all-reduced across TP (backward of f).
func (c *chunk) backwardInput(ctx context.Context, allReduceTP reducer, params []float32, dOut []float32, st *mbStash) ([]float32, error) {
	w, h, n := c.spec.Width, c.hLocal, st.n
	if c.hasHead {
		hw := c.view(params, 4*c.blocks)
		dOut = make([]float32, n*w)
		gemm(false, true, n, w, c.spec.Outputs, st.dlogits, hw, 0, dOut)
	}
	for b := c.blocks - 1; b >= 0; b-- {
		bs := &st.blocks[b]
		w1, w2 := c.view(params, 4*b), c.view(params, 4*b+2)
		dz := make([]float32, n*h)
		gemm(false, true, n, h, w, dOut, w2, 0, dz)
		activateGrad(c.spec.Activation, bs.z, dz)
		dx := make([]float32, n*w)
		gemm(false, true, n, w, h, dz, w1, 0, dx)
		if err := allReduceTP(ctx, dx); err != nil {
			return nil, err
		}
		for i, v := range dOut {
			dx[i] += v
		}
		bs.dy, bs.dz, bs.z = dOut, dz, nil
		dOut = dx
	}
	return dOut, nil
}

// backwardWeight accumulates the weight gradients of one micro-batch into
// grads and releases the stash. It needs no parameters and no communication.
func (c *chunk) backwardWeight(grads []float32, st *mbStash) {
	w, h, n := c.spec.Width, c.hLocal, st.n
	for b := range c.blocks {
		bs := &st.blocks[b]
		gemm(true, false, w, h, n, bs.x, bs.dz, 1, c.view(grads, 4*b))
		accColSum(c.view(grads, 4*b+1), bs.dz, h)
		gemm(true, false, h, w, n, bs.a, bs.dy, 1, c.view(grads, 4*b+2))
		accColSum(c.view(grads, 4*b+3), bs.dy, w)
	}
	if c.hasHead {
		hi := 4 * c.blocks
		gemm(true, false, w, c.spec.Outputs, n, st.headX, st.dlogits, 1, c.view(grads, hi))
		accColSum(c.view(grads, hi+1), st.dlogits, c.spec.Outputs)
	}
	*st = mbStash{}
}
