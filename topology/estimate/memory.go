package estimate

import (
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// Memory is a per-GPU memory breakdown in bytes.
type Memory struct {
	// Params holds the weights kept on the GPU.
	Params float64 `json:"params"`
	// Grads holds the gradients kept on the GPU.
	Grads float64 `json:"grads"`
	// Optimizer holds the optimizer state kept on the GPU (fp32 master
	// weights and Adam moments; zero when offloaded).
	Optimizer float64 `json:"optimizer"`
	// Activations holds the activations saved for the backward pass at the
	// schedule's peak.
	Activations float64 `json:"activations"`
	// Transient is what the memory peak holds beyond the model states and
	// the saved activations: the working buffers of the backward pass (the
	// loss layer, or a layer's backward; see transientBytes), or, where the
	// optimizer update's buffers (updateBytes, alive when no activation is)
	// exceed the activations and those, the difference.
	Transient float64 `json:"transient"`
	// Other is the stated allowance: CUDA context, library workspaces,
	// communication buffers and allocator fragmentation (see otherBytes).
	Other float64 `json:"other"`
	// Total is the sum of the parts.
	Total float64 `json:"total"`
}

// The allowance for what is not model state or activations.
const (
	// contextBytes covers the CUDA context, cuBLAS/cuDNN workspaces and
	// NCCL's communicator buffers: about 1.5 GiB on current GPUs.
	contextBytes = 1.5 * topology.GiB
	// fragmentation is the share of allocated tensors lost to the caching
	// allocator's fragmentation.
	fragmentation = 0.05
)

// zeroStage returns the plan's ZeRO stage as sharding's Stage, the one
// source of what each stage shards and communicates.
func zeroStage(p *topology.Plan) sharding.Stage { return sharding.Stage(p.Config.Zero) }

// bytesPerParam returns the bytes per parameter of weights, gradients and
// optimizer state. Mixed precision Adam is 2 + 2 + 12 (fp32 master weights,
// momentum and variance), as Rajbhandari et al. 2020 (ZeRO) count it, Sec. 3.1;
// fp32 Adam is 4 + 4 + 8 (the weights are the master copy).
func bytesPerParam(p topology.Precision) (w, g, o float64) {
	if p == topology.PrecisionFP32 {
		return 4, 4, 8
	}
	return 2, 2, 12
}

// gradBytes is the bytes of one parameter's gradient: the precision's,
// or fp32 with MainGradsFP32.
func gradBytes(c topology.Config) float64 {
	if c.MainGradsFP32 {
		return 4
	}
	_, g, _ := bytesPerParam(c.Precision)
	return g
}

// activationBytes returns the 16-bit activation width (4 for fp32 training).
func activationBytes(p topology.Precision) float64 {
	if p == topology.PrecisionFP32 {
		return 4
	}
	return 2
}

// ModelStates returns the weights, gradients and optimizer bytes held by one
// GPU for params parameters on its model-parallel shard, with data-parallel
// degree dp and ZeRO stage stage. What each stage shards is sharding's
// Stage semantics (Rajbhandari et al. 2020, Sec. 5 and Figure 1: stage 1
// partitions the optimizer state, stage 2 also the gradients, stage 3 also
// the weights, each across the dp replicas).
func ModelStates(params float64, dp int, stage sharding.Stage, prec topology.Precision) (w, g, o float64) {
	bw, bg, bo := bytesPerParam(prec)
	w, g, o = bw*params, bg*params, bo*params
	d := float64(dp)
	if stage.ShardsOptimizer() {
		o /= d
	}
	if stage.ShardsGradients() {
		g /= d
	}
	if stage.ShardsParams() {
		w /= d
	}
	return w, g, o
}

// stageParams returns the parameters one GPU of pipeline stage stage holds:
// its layers split across the TP group, plus the word embedding on the first
// stage (split by vocabulary, Megatron's VocabParallelEmbedding) and the
// output layer on the last. With tied embeddings and more than one stage the
// last stage keeps its own copy of the word embedding, as Megatron-LM does.
func stageParams(p *topology.Plan, stage int) float64 {
	m, c := p.Model, p.Config
	t, pp := float64(c.TP), c.PP
	if m.Bare() {
		return m.Params / (t * float64(pp))
	}
	n := float64(m.Layers/pp) * m.LayerParams() / t
	if stage == 0 {
		n += m.EmbeddingParams() / t
	}
	if stage == pp-1 {
		n += m.OutputParams() / t
		if !m.UntiedEmbeddings && pp > 1 {
			n += float64(m.Vocab) * float64(m.Hidden) / t
		}
	}
	return n
}

// LayerActivations returns the bytes of activations one transformer layer
// saves for its backward pass, per micro-batch, on one GPU of the TP group.
//
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"), Sec. 4, count with 16-bit activations
// sbh(34 + 5as/h) per layer: attention 11sbh + 5as^2b, MLP 19sbh, layer
// norms 4sbh. Tensor parallelism splits all but 10sbh (the layer-norm
// inputs, the QKV and MLP inputs and two dropout masks): sbh(10 + 24/t +
// 5as/(ht)); sequence parallelism splits those too: sbh(34/t + 5as/(ht)).
// Selective recomputation drops the 5as^2b attention-core term; full
// recomputation keeps only the layer input, 2sbh (/t with sequence
// parallelism). Generalised here to grouped-query attention (K and V of
// width kv) and to a gated MLP (8sbF instead of 4sbF for the inner
// activations); with kv = h and F = 4h the formulas are the paper's.
// Flash attention (Dao et al. 2022) never stores the s x s scores, softmax
// or its dropout mask: the 5as^2b term is replaced by the fp32 log-sum-exp
// statistics, 4asb. The result is scaled by w/2 for w-byte activations.
// In fp8 (Transformer Engine), the inputs of the four matrix multiplies are
// saved in fp8, one byte an element: the QKV and first MLP inputs (2sbh
// each, unsplit) and the projection and second MLP inputs (2sbh and 2sbF,
// split) take half.
func LayerActivations(m topology.Model, c topology.Config) float64 {
	s, b, h := float64(m.Seq), float64(c.MicroBatch), float64(m.Hidden)
	a, kv, f := float64(m.Heads), float64(m.KVDim()), float64(m.FFNSize())
	t := float64(c.TP)
	scale := activationBytes(c.Precision) / 2
	sp := 1.0
	if c.SequenceParallel {
		sp = t
	}
	if c.Recompute == topology.RecomputeFull {
		return 2 * s * b * h / sp * scale
	}
	unsplit := 10 * s * b * h
	mlp := 4 * s * b * f
	if m.GatedMLP {
		mlp = 8 * s * b * f
	}
	split := 4*s*b*h + 4*s*b*kv + mlp
	if c.Precision == topology.PrecisionFP8 {
		unsplit -= 2 * s * b * h
		split -= s*b*h + s*b*f
	}
	var core float64 // the attention-core term
	switch {
	case c.FlashAttention:
		core = 4 * a * s * b
	case c.Recompute == topology.RecomputeSelective:
		core = 0
	default:
		core = 5 * a * s * s * b
	}
	return (unsplit/sp + (split+core)/t) * scale
}

// fullLayerActivations returns one layer's activations without
// recomputation: the working set rebuilt while a recomputed layer runs its
// backward pass.
func fullLayerActivations(m topology.Model, c topology.Config) float64 {
	c.Recompute = topology.RecomputeNone
	return LayerActivations(m, c)
}

// stageActivations returns the activation bytes one GPU of stage stage
// keeps for the backward pass at its peak, given the peak number of
// (micro-batch, model chunk) forward passes the schedule holds in flight on
// that stage.
//
// Korthikanti et al. 2022 Sec. 4.2.3: the first stage's extra memory is the
// embedding's dropout mask, sbh per in-flight micro-batch (/t with sequence
// parallelism); the last stage keeps the final layer norm's input and the
// output layer's input, 4sbh/t, for one micro-batch (its logits are
// consumed at once by the loss: transientBytes counts them).
func stageActivations(p *topology.Plan, stage, inflight int) float64 {
	m, c := p.Model, p.Config
	if m.Bare() {
		return 0
	}
	s, b, h, t := float64(m.Seq), float64(c.MicroBatch), float64(m.Hidden), float64(c.TP)
	layersPerChunk := float64(m.Layers / (c.PP * c.VPP))
	act := float64(inflight) * layersPerChunk * LayerActivations(m, c)
	scale := activationBytes(c.Precision) / 2
	if stage == 0 {
		sp := 1.0
		if c.SequenceParallel {
			sp = t
		}
		mbs := (inflight + c.VPP - 1) / c.VPP // micro-batches in flight on chunk 0
		act += float64(mbs) * s * b * h / sp * scale
	}
	if stage == c.PP-1 {
		act += 4 * s * b * h / t * scale
	}
	return act
}

// LossBytesPerLogit returns the bytes per logit alive at the loss layer's
// peak, the start of the backward pass, by implementation. PyTorch's
// cross_entropy over an fp32 copy of the logits (LossUnfused) saves the
// fp32 log-softmax (4 bytes) and, in its backward, holds the gradient of
// the log-probabilities and that of the logits (4 + 4) beside it: 12.
// Megatron-LM's vocabulary-parallel cross entropy (LossFused) saves the
// fp32 softmax and turns it into the gradient in place, plus the 16-bit
// copy of that gradient the output layer takes: 6. The loss is computed
// in fp32 in every precision.
func LossBytesPerLogit(l topology.Loss) float64 {
	if l == topology.LossFused {
		return 6
	}
	return 12
}

// transientBytes returns the working buffers one GPU of stage stage holds
// at its peak beyond the saved activations. The peak comes at the start of
// the backward pass, with every in-flight activation still saved, and is
// the larger of two moments that never overlap:
//   - on the last stage, the loss layer of one micro-batch: sbV/t logits at
//     LossBytesPerLogit bytes each;
//   - one layer's backward: the activations a recomputed layer rebuilds
//     (all of them with full recomputation, the attention core with
//     selective recomputation without flash attention), plus two
//     activation gradients of the MLP's inner width, 2sbF/t (the gradient
//     arriving and the one produced).
func transientBytes(p *topology.Plan, stage int) float64 {
	m, c := p.Model, p.Config
	if m.Bare() {
		return 0
	}
	s, b, t := float64(m.Seq), float64(c.MicroBatch), float64(c.TP)
	w := activationBytes(c.Precision)
	layer := 2 * s * b * float64(m.FFNSize()) / t * w
	switch {
	case c.Recompute == topology.RecomputeFull:
		layer += fullLayerActivations(m, c)
	case c.Recompute == topology.RecomputeSelective && !c.FlashAttention:
		layer += 5 * float64(m.Heads) * s * s * b / t * w / 2
	}
	if stage != c.PP-1 {
		return layer
	}
	return max(layer, s*b*float64(m.Vocab)/t*LossBytesPerLogit(c.Loss))
}

// otherBytes is the stated allowance beyond model states and activations:
// contextBytes, fragmentation of the allocated tensors, and, when the ZeRO
// stage shards the parameters (stage 3), the buffers that hold two gathered
// layers' 16-bit weights (the one computing and the one prefetched).
func otherBytes(p *topology.Plan, allocated float64) float64 {
	o := contextBytes + fragmentation*allocated
	if zeroStage(p).ShardsParams() && !p.Model.Bare() { // a bare model has no layer size
		bw, _, _ := bytesPerParam(p.Config.Precision)
		o += 2 * bw * p.Model.LayerParams() / float64(p.Config.TP)
	}
	return o
}

// updateBytes returns the working buffers of the optimizer update on one
// GPU of stage stage, a moment when no activation is saved. Adam updates
// fp32 master weights from fp32 gradients: 16-bit gradients are first
// copied to fp32, 4 bytes a parameter it updates (Megatron-LM's
// Float16Optimizer and a PyTorch program alike; none with MainGradsFP32,
// which keeps them in fp32, or in fp32 training). PyTorch's multi-tensor
// step also computes sqrt(v) for every parameter at once, 4 more; a fused
// kernel updates in place. Offloaded optimizer state is updated on the host.
func updateBytes(p *topology.Plan, stage int) float64 {
	c := p.Config
	if c.OffloadOptimizer {
		return 0
	}
	n := stageParams(p, stage)
	if zeroStage(p).ShardsOptimizer() {
		n /= float64(c.DP)
	}
	perParam := 0.0
	if c.Precision != topology.PrecisionFP32 && !c.MainGradsFP32 {
		perParam += 4
	}
	if c.Optimizer == topology.OptimizerMultiTensor {
		perParam += 4
	}
	return n * perParam
}

// fp8WeightCache returns the fp8 copies of the layers' weights that
// Transformer Engine casts on a step's first micro-batch and keeps for the
// others: the weight and its transpose (the backward pass multiplies by
// W^T), one byte each per parameter of the stage's layers, sharded with
// the weights under ZeRO 3. Zero outside fp8.
func fp8WeightCache(p *topology.Plan) float64 {
	m, c := p.Model, p.Config
	if c.Precision != topology.PrecisionFP8 || m.Bare() {
		return 0
	}
	n := 2 * float64(m.Layers/c.PP) * m.LayerParams() / float64(c.TP)
	if zeroStage(p).ShardsParams() {
		n /= float64(c.DP)
	}
	return n
}

// StageMemory returns the memory of one GPU of pipeline stage stage.
func StageMemory(p *topology.Plan, stage, inflight int) (gpu Memory, hostOptimizer float64) {
	c := p.Config
	w, g, o := ModelStates(stageParams(p, stage), c.DP, zeroStage(p), c.Precision)
	_, bg, _ := bytesPerParam(c.Precision)
	g *= gradBytes(c) / bg // fp32 main gradients: twice the 16-bit ones
	w += fp8WeightCache(p)
	if c.OffloadOptimizer {
		hostOptimizer, o = o, 0
	}
	act := stageActivations(p, stage, inflight)
	gpu = Memory{Params: w, Grads: g, Optimizer: o, Activations: act, Transient: max(transientBytes(p, stage), updateBytes(p, stage)-act)}
	alloc := gpu.Params + gpu.Grads + gpu.Optimizer + gpu.Activations + gpu.Transient
	gpu.Other = otherBytes(p, alloc)
	gpu.Total = alloc + gpu.Other
	return gpu, hostOptimizer
}
