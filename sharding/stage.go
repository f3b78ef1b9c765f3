package sharding

import (
	"fmt"
	"math"
)

// Stage is a ZeRO stage (Rajbhandari et al. 2020, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models"): 0 is plain data
// parallelism, 1 shards the optimizer state (P_os), 2 also the gradients
// (P_os+g), 3 also the parameters (P_os+g+p).
type Stage int

// The ZeRO stages.
const (
	Stage0 Stage = iota // replicated everything: plain data parallelism
	Stage1              // optimizer state sharded
	Stage2              // optimizer state and gradients sharded
	Stage3              // optimizer state, gradients and parameters sharded
)

// Validate reports a stage outside 0-3.
func (s Stage) Validate() error {
	if s < Stage0 || s > Stage3 {
		return fmt.Errorf("%w: ZeRO stage %d is not in 0-3", ErrInvalid, int(s))
	}
	return nil
}

// String returns "zero-<n>".
func (s Stage) String() string { return fmt.Sprintf("zero-%d", int(s)) }

// Placement says whether a rank keeps a whole buffer or only its shard.
type Placement int

// Placements.
const (
	// Replicated: every data-parallel rank holds the whole buffer.
	Replicated Placement = iota + 1
	// Sharded: each rank holds only its Partition block of the buffer.
	Sharded
)

// String returns "replicated" or "sharded".
func (p Placement) String() string {
	switch p {
	case Replicated:
		return "replicated"
	case Sharded:
		return "sharded"
	}
	return fmt.Sprintf("Placement(%d)", int(p))
}

// GradSync is how gradients are reduced across the data-parallel group.
type GradSync int

// Gradient reductions.
const (
	// AllReduce leaves the whole reduced gradient on every rank.
	AllReduce GradSync = iota + 1
	// ReduceScatter leaves on each rank only its block of the reduced
	// gradient, which is all its optimizer shard needs.
	ReduceScatter
)

// String returns "all-reduce" or "reduce-scatter".
func (g GradSync) String() string {
	switch g {
	case AllReduce:
		return "all-reduce"
	case ReduceScatter:
		return "reduce-scatter"
	}
	return fmt.Sprintf("GradSync(%d)", int(g))
}

// ParamSync is when the parameters are all-gathered from their shards.
type ParamSync int

// Parameter gathers.
const (
	// NoGather: every rank updates its whole replica; nothing to gather.
	NoGather ParamSync = iota + 1
	// GatherAfterStep: each rank updates its block, then the updated blocks
	// are all-gathered into every rank's full parameter buffer.
	GatherAfterStep
	// GatherBeforeUse: parameters live only as shards; each layer's
	// parameters are all-gathered just before its forward and backward and
	// freed right after.
	GatherBeforeUse
)

// String returns "none", "after-step" or "before-use".
func (p ParamSync) String() string {
	switch p {
	case NoGather:
		return "none"
	case GatherAfterStep:
		return "after-step"
	case GatherBeforeUse:
		return "before-use"
	}
	return fmt.Sprintf("ParamSync(%d)", int(p))
}

// StageSpec is what a ZeRO stage means for one data-parallel rank: which
// buffers it keeps whole and which as its shard, and which collectives
// keep them consistent.
type StageSpec struct {
	// Params is the placement of the working parameters between steps.
	Params Placement
	// Grads is the placement of the gradient buffer the rank keeps through
	// the backward pass. Stage 1 keeps the whole buffer even though only its
	// block of the reduced gradient feeds its optimizer shard; stage 2 keeps
	// only the block and frees the rest as each bucket is reduce-scattered.
	Grads Placement
	// OptState is the placement of the master weights and optimizer moments.
	OptState Placement
	// GradSync is how gradients are reduced across the group.
	GradSync GradSync
	// Gather is when the parameters are all-gathered from their shards.
	Gather ParamSync
}

// Spec returns the stage's semantics, or an error for a stage outside 0-3.
func (s Stage) Spec() (StageSpec, error) {
	switch s {
	case Stage0:
		return StageSpec{Replicated, Replicated, Replicated, AllReduce, NoGather}, nil
	case Stage1:
		return StageSpec{Replicated, Replicated, Sharded, ReduceScatter, GatherAfterStep}, nil
	case Stage2:
		return StageSpec{Replicated, Sharded, Sharded, ReduceScatter, GatherAfterStep}, nil
	case Stage3:
		return StageSpec{Sharded, Sharded, Sharded, ReduceScatter, GatherBeforeUse}, nil
	}
	return StageSpec{}, s.Validate()
}

// Precision is the number of bytes a training state keeps per parameter.
type Precision struct {
	// ParamBytes per parameter for the working parameters (2 for bf16/fp16).
	ParamBytes int
	// GradBytes per parameter for the gradients (2 for bf16/fp16).
	GradBytes int
	// OptStateBytes per parameter for everything the optimizer keeps: K in
	// the ZeRO paper, 12 for mixed-precision Adam (fp32 master weights,
	// momentum and variance).
	OptStateBytes int
}

// MixedPrecisionAdam returns the ZeRO paper's accounting: 2 + 2 + 12 bytes
// per parameter (bf16 weights and gradients, fp32 master weights, m and v).
func MixedPrecisionAdam() Precision { return Precision{ParamBytes: 2, GradBytes: 2, OptStateBytes: 12} }

// Float32Adam returns the accounting of a pure float32 Adam, as the native
// engine runs it: 4 + 4 + 8 bytes per parameter (weights, gradients, m, v;
// the weights are their own master copy).
func Float32Adam() Precision { return Precision{ParamBytes: 4, GradBytes: 4, OptStateBytes: 8} }

// Memory is the model-state bytes one data-parallel rank holds. Activations,
// temporary buffers and fragmentation are not included.
type Memory struct {
	Params   int64 // working parameters
	Grads    int64 // gradients
	OptState int64 // master weights and optimizer moments
}

// Total returns Params+Grads+OptState.
func (m Memory) Total() int64 { return m.Params + m.Grads + m.OptState }

// StageMemory returns the model-state bytes per rank for params parameters
// at data-parallel degree d and ZeRO stage s: a replicated buffer costs
// params*bytes, a sharded one ceil(params/d)*bytes, the largest block when d
// does not divide params. (A Partition's alignment adds fewer than Align
// elements per rank on top.) For the ZeRO paper's Figure 1 case, 7.5e9
// parameters at d = 64 with MixedPrecisionAdam, the totals are 120, 31.4,
// 16.6 and 1.9 GB for stages 0-3.
func StageMemory(params int64, d int, s Stage, prec Precision) (Memory, error) {
	spec, err := s.Spec()
	if err != nil {
		return Memory{}, err
	}
	if params < 0 {
		return Memory{}, fmt.Errorf("%w: parameter count %d is negative", ErrInvalid, params)
	}
	if d < 1 {
		return Memory{}, fmt.Errorf("%w: data-parallel degree %d is below 1", ErrInvalid, d)
	}
	if prec.ParamBytes < 0 || prec.GradBytes < 0 || prec.OptStateBytes < 0 {
		return Memory{}, fmt.Errorf("%w: negative bytes per parameter in %+v", ErrInvalid, prec)
	}
	shard := params / int64(d)
	if params%int64(d) != 0 {
		shard++
	}
	bytes := func(pl Placement, per int) (int64, error) {
		n := params
		if pl == Sharded {
			n = shard
		}
		if per != 0 && n > math.MaxInt64/int64(per) {
			return 0, fmt.Errorf("%w: %d parameters at %d bytes overflow", ErrInvalid, n, per)
		}
		return n * int64(per), nil
	}
	var m Memory
	if m.Params, err = bytes(spec.Params, prec.ParamBytes); err != nil {
		return Memory{}, err
	}
	if m.Grads, err = bytes(spec.Grads, prec.GradBytes); err != nil {
		return Memory{}, err
	}
	if m.OptState, err = bytes(spec.OptState, prec.OptStateBytes); err != nil {
		return Memory{}, err
	}
	if m.Params > math.MaxInt64-m.Grads || m.Params+m.Grads > math.MaxInt64-m.OptState {
		return Memory{}, fmt.Errorf("%w: total bytes for %d parameters overflow", ErrInvalid, params)
	}
	return m, nil
}
