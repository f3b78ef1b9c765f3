package engine

import "math"

// adamUpdate applies one Adam step (Kingma & Ba 2015, Algorithm 1, with the
// bias corrections folded into the step size as PyTorch's Adam does) to p
// with gradient g and moments m, v; step counts from 1. All four slices have
// the same length: a ZeRO rank passes only the range it owns.
func adamUpdate(o AdamSpec, step int, p, g, m, v []float32) {
	b1, b2 := o.Beta1, o.Beta2
	c1 := 1 - math.Pow(b1, float64(step))
	c2 := 1 - math.Pow(b2, float64(step))
	for i, gi := range g {
		gd := float64(gi)
		mi := b1*float64(m[i]) + (1-b1)*gd
		vi := b2*float64(v[i]) + (1-b2)*gd*gd
		m[i], v[i] = float32(mi), float32(vi)
		p[i] -= float32(o.LR * (mi / c1) / (math.Sqrt(vi/c2) + o.Eps))
	}
}
