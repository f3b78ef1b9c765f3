package engine

import (
	"math"
	"math/rand/v2"
)

// dataStream salts the data RNG so samples never share a stream with the
// initial weights.
const dataStream = 0x6461746100000000

// teacher is the fixed random linear map that defines the targets.
type teacher struct {
	w       []float32 // Width x Outputs
	width   int
	outputs int
	loss    string
}

func newTeacher(m ModelSpec, seed uint64) *teacher {
	t := &teacher{w: make([]float32, m.Width*m.Outputs), width: m.Width, outputs: m.Outputs, loss: m.Loss}
	initLocal(tensorInfo{name: "teacher", rows: m.Width, cols: m.Outputs, std: 1 / math.Sqrt(float64(m.Width))}, seed, 0, 1, t.w)
	return t
}

// batch fills x (n x Width) and the targets of samples first..first+n-1 of
// step: labels for cross-entropy, y (n x Outputs) for MSE. Sample i depends
// only on (seed, step, i), never on the layout that asks for it.
func (t *teacher) batch(seed uint64, step, first, n int, x []float32, labels []int32, y []float32) {
	out := make([]float64, t.outputs)
	for s := range n {
		rng := rand.New(rand.NewPCG(seed^dataStream, uint64(step)<<32|uint64(first+s)))
		row := x[s*t.width : (s+1)*t.width]
		for j := range row {
			row[j] = float32(rng.NormFloat64())
		}
		for o := range out {
			out[o] = 0
		}
		for j, v := range row {
			w := t.w[j*t.outputs : (j+1)*t.outputs]
			for o := range out {
				out[o] += float64(v) * float64(w[o])
			}
		}
		if t.loss == LossMSE {
			for o, v := range out {
				y[s*t.outputs+o] = float32(math.Tanh(v))
			}
			continue
		}
		best := 0
		for o, v := range out {
			if v > out[best] {
				best = o
			}
		}
		labels[s] = int32(best)
	}
}
