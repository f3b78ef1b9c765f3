package estimate

import "github.com/gpucoord/gpucoord/topology"

// layerForwardFLOPs returns the forward FLOPs of one transformer layer for
// one sequence (2 FLOPs per multiply-add, matrix multiplications only):
// QKV 2sh(h+2kv), attention scores and their product with V 4s^2h, output
// projection 2sh^2 and the MLP 2shF per matrix. For GPT (kv = h, F = 4h,
// two MLP matrices) this is 24sh^2 + 4s^2h, the per-layer forward count of
// Narayanan et al. 2021, Sec. 5.1.
func layerForwardFLOPs(m topology.Model) float64 {
	s, h, kv, f := float64(m.Seq), float64(m.Hidden), float64(m.KVDim()), float64(m.FFNSize())
	mats := 2.0
	if m.GatedMLP {
		mats = 3
	}
	return 2*s*h*(h+2*kv) + 4*s*s*h + 2*s*h*h + 2*s*h*f*mats
}

// attentionCoreFLOPs is the part of layerForwardFLOPs that selective
// recomputation runs again: QK^T and the product with V, 4s^2h.
func attentionCoreFLOPs(m topology.Model) float64 {
	s, h := float64(m.Seq), float64(m.Hidden)
	return 4 * s * s * h
}

// logitFLOPs returns the output layer's forward FLOPs for one sequence, 2shV.
func logitFLOPs(m topology.Model) float64 {
	return 2 * float64(m.Seq) * float64(m.Hidden) * float64(m.Vocab)
}

// recomputeFLOPs returns the forward FLOPs one layer runs again during its
// backward pass under policy r.
func recomputeFLOPs(m topology.Model, r topology.Recompute) float64 {
	switch r {
	case topology.RecomputeFull:
		return layerForwardFLOPs(m)
	case topology.RecomputeSelective:
		return attentionCoreFLOPs(m)
	}
	return 0
}

// StepFLOPs returns the FLOPs of one training step over the global batch.
// The backward pass costs twice the forward, and recomputation is counted,
// as Narayanan et al. 2021 Eq. 3 does: with full recomputation this is
// 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) for GPT. A bare model has no
// architecture and returns 0.
func StepFLOPs(p *topology.Plan) float64 {
	m := p.Model
	if m.Bare() {
		return 0
	}
	B, l := float64(p.Config.GlobalBatch), float64(m.Layers)
	perSeq := l*(3*layerForwardFLOPs(m)+recomputeFLOPs(m, p.Config.Recompute)) + 3*logitFLOPs(m)
	return B * perSeq
}
