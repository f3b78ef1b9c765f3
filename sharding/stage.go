package sharding

import "fmt"

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

// ShardsOptimizer reports whether each data-parallel rank keeps only its
// block of the master weights and optimizer moments (stages 1-3). It is
// false for a stage outside 0-3.
func (s Stage) ShardsOptimizer() bool { return s.spec().OptState == Sharded }

// ShardsGradients reports whether each data-parallel rank keeps only its
// block of the gradients between micro-batches (stages 2 and 3). It is
// false for a stage outside 0-3.
func (s Stage) ShardsGradients() bool { return s.spec().Grads == Sharded }

// ShardsParams reports whether each data-parallel rank keeps only its block
// of the working parameters between uses, gathering the rest before each
// forward and backward (stage 3). It is false for a stage outside 0-3.
func (s Stage) ShardsParams() bool { return s.spec().Params == Sharded }

// spec is Spec with the zero StageSpec (nothing sharded) for an invalid
// stage, for the predicates.
func (s Stage) spec() StageSpec {
	sp, _ := s.Spec()
	return sp
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
