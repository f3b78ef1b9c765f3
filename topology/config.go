package topology

import "github.com/gpucoord/gpucoord/schedule"

// Recompute is the activation recomputation policy.
type Recompute string

// Recomputation policies (Korthikanti et al. 2022).
const (
	RecomputeNone      Recompute = "none"      // keep every activation
	RecomputeSelective Recompute = "selective" // recompute the attention core (QK^T, softmax, dropout, xV)
	RecomputeFull      Recompute = "full"      // keep only each layer's input; rerun its forward
)

// Precision is the training precision.
type Precision string

// Precisions. Mixed precision keeps 16-bit weights and gradients and an fp32
// master copy in the optimizer.
const (
	PrecisionBF16 Precision = "bf16" // bf16 mixed precision
	PrecisionFP16 Precision = "fp16" // fp16 mixed precision
	PrecisionFP32 Precision = "fp32" // fp32 throughout
	// PrecisionFP8 is Transformer Engine's fp8 training: the transformer
	// layers' matrix multiplies in fp8 (E4M3 forward, E5M2 gradients,
	// Micikevicius et al. 2022), everything else as bf16 mixed precision.
	PrecisionFP8 Precision = "fp8"
)

// Loss names how the cross-entropy loss is computed, for its memory peak.
type Loss string

// The loss implementations the planner counts.
const (
	// LossUnfused is PyTorch's cross_entropy over an fp32 copy of the
	// logits: 12 bytes per logit at the start of the backward pass.
	LossUnfused Loss = "unfused"
	// LossFused is Megatron-LM's vocabulary-parallel cross entropy, which
	// keeps the fp32 softmax and turns it into the gradient in place: 6
	// bytes per logit.
	LossFused Loss = "fused"
)

// Config is the parallel layout and training setup of a plan. Start from
// DefaultConfig.
type Config struct {
	// TP, PP and DP are the tensor-, pipeline- and data-parallel degrees. DP
	// zero means world / (TP*PP).
	TP int `json:"tp"`
	PP int `json:"pp"`
	DP int `json:"dp"`
	// VPP is the number of virtual pipeline stages (model chunks) per
	// pipeline rank; above 1 it needs the interleaved schedule. Zero means
	// 2 with the interleaved schedule and 1 otherwise.
	VPP int `json:"vpp"`
	// Zero is the ZeRO stage, 0-3.
	Zero int `json:"zero"`
	// MicroBatch is the micro-batch size in sequences.
	MicroBatch int `json:"micro_batch"`
	// GlobalBatch is the global batch in sequences; zero means
	// DefaultGlobalBatch, a micro-batch per GPU.
	GlobalBatch int `json:"global_batch"`
	// Schedule is the pipeline schedule.
	Schedule schedule.Kind `json:"schedule"`
	// Recompute is the activation recomputation policy.
	Recompute Recompute `json:"recompute"`
	// SequenceParallel splits layer-norm and dropout activations across the
	// TP group (Korthikanti et al. 2022).
	SequenceParallel bool `json:"sequence_parallel"`
	// FlashAttention avoids materialising the s x s attention scores.
	FlashAttention bool `json:"flash_attention"`
	// OffloadOptimizer keeps optimizer state in host memory.
	OffloadOptimizer bool `json:"offload_optimizer"`
	// MainGradsFP32 keeps and reduces gradients in fp32 in mixed-precision
	// training, as Megatron-LM does (its main_grad buffers, reduced in fp32
	// with --accumulate-allreduce-grads-in-fp32, the default with bf16):
	// 4 bytes a parameter instead of 2, in memory and in the gradient
	// reduction.
	MainGradsFP32 bool `json:"main_grads_fp32,omitempty"`
	// Optimizer is the Adam implementation timed: OptimizerFused (one
	// kernel, as Megatron-LM's and DeepSpeed's) or OptimizerMultiTensor
	// (PyTorch's default foreach Adam, several passes over the state).
	Optimizer Optimizer `json:"optimizer"`
	// Loss is the cross-entropy implementation, for the loss layer's
	// memory peak ("" is LossUnfused).
	Loss Loss `json:"loss"`
	// HeadroomGiB is GPU memory a plan must leave free to fit (for the
	// allocator, fragmentation, what the model does not count).
	HeadroomGiB float64 `json:"headroom_gib,omitempty"`
	// Precision is the training precision.
	Precision Precision `json:"precision"`
	// Order is the rank order, fastest axis first (see ParseOrder).
	Order string `json:"order"`
}

// DefaultConfig returns the defaults: bf16 mixed precision with Adam, ZeRO 0,
// 1F1B, micro-batch 1, no recomputation, flash attention on, Megatron order.
func DefaultConfig() Config {
	return Config{TP: 1, PP: 1, VPP: 1, MicroBatch: 1, Schedule: schedule.OneFOneB,
		Recompute: RecomputeNone, FlashAttention: true, Precision: PrecisionBF16, Order: DefaultOrder, Optimizer: OptimizerFused, Loss: LossUnfused}
}

// Optimizer names an Adam implementation, for its time.
type Optimizer string

// The Adam implementations the planner times.
const (
	OptimizerFused       Optimizer = "fused"
	OptimizerMultiTensor Optimizer = "multi-tensor"
)

// validateEnums checks the enumerated fields.
func (c Config) validateEnums() error {
	switch c.Optimizer {
	case OptimizerFused, OptimizerMultiTensor, "": // "" is fused
	default:
		return invalid("optimizer %q: want fused or multi-tensor", c.Optimizer)
	}
	switch c.Loss {
	case LossUnfused, LossFused, "": // "" is unfused
	default:
		return invalid("loss %q: want unfused or fused", c.Loss)
	}
	switch c.Recompute {
	case RecomputeNone, RecomputeSelective, RecomputeFull:
	default:
		return invalid("recompute %q: must be none, selective or full", c.Recompute)
	}
	switch c.Precision {
	case PrecisionBF16, PrecisionFP16, PrecisionFP32, PrecisionFP8:
	default:
		return invalid("precision %q: must be bf16, fp16, fp32 or fp8", c.Precision)
	}
	if _, err := schedule.ParseKind(string(c.Schedule)); err != nil {
		return invalid("schedule %q: must be one of %v", c.Schedule, schedule.Kinds())
	}
	// Only the range: what each stage shards is sharding.Stage's, a layer
	// above this package, which topology/estimate and the engine use.
	if c.Zero < 0 || c.Zero > 3 {
		return invalid("zero %d: ZeRO stage must be 0, 1, 2 or 3", c.Zero)
	}
	return nil
}
