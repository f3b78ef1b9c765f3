package topology

import (
	"fmt"

	"github.com/gpucoord/gpucoord/schedule"
)

// ShapeSpec is a parallel shape as a user states it: the degrees, the rank
// order, the batch and the pipeline schedule. Zero fields are derived by
// NewShape.
type ShapeSpec struct {
	// TP and PP are the tensor- and pipeline-parallel degrees; at least 1.
	TP, PP int
	// DP is the data-parallel degree; 0 derives it: world / (TP*PP).
	DP int
	// Order is the rank order, fastest axis first ("" is DefaultOrder).
	Order string
	// GlobalBatch is the batch of one optimizer step over every replica and
	// MicroBatch the batch of one pipeline pass, in samples. GlobalBatch 0
	// states no batch (a user's program batches itself): the batch rules and
	// the schedule's rules on micro-batches do not apply.
	GlobalBatch, MicroBatch int
	// Schedule is the pipeline schedule, in any case; "" states none (a
	// user's program), which allows no virtual stages.
	Schedule schedule.Kind
	// Virtual is the number of model chunks per pipeline rank; 0 means 2
	// with the interleaved schedule and 1 otherwise.
	Virtual int
	// WorldName is how errors name the world size, e.g. "np 8" or "world
	// size 16 (2 nodes x 8 GPUs)"; "" is "world size N".
	WorldName string
}

// Shape is a parallel shape that keeps every rule of NewShape: its rank
// Layout (TP, PP, DP, Order) and the resolved batch and schedule. A Shape
// is a value; its methods may be called concurrently.
type Shape struct {
	// Layout holds the degrees, DP resolved, and the rank order.
	Layout
	// GlobalBatch and MicroBatch are as stated; GlobalBatch 0 states no batch.
	GlobalBatch, MicroBatch int
	// Schedule is the parsed schedule, "" for none.
	Schedule schedule.Kind
	// Virtual is the number of model chunks per pipeline rank, resolved.
	Virtual int
}

// Microbatches returns the number of micro-batches each replica runs per
// step, GlobalBatch / (MicroBatch*DP); 0 without a batch.
func (s Shape) Microbatches() int {
	if s.GlobalBatch == 0 {
		return 0
	}
	return s.GlobalBatch / (s.MicroBatch * s.DP)
}

// NewShape checks s on world ranks and returns it resolved: DP derived, the
// schedule parsed, the virtual stages defaulted and the ranks laid out. It
// is the one statement of the rules of a parallel shape, which the planner
// (New), the engine (engine.NewConfig and Config.Validate) and the
// coordinator (coordinator.Layout, so ValidateSpec and every generation)
// apply alike:
//
//   - tp and pp at least 1; world a multiple of tp*pp; dp derived from it
//     or, when given, tp*pp*dp equal to world;
//   - virtual stages above 1 only with the interleaved schedule, which
//     needs pp of at least 2;
//   - with a batch: the global batch divisible by micro-batch*dp and,
//     interleaved, the micro-batches per replica a multiple of pp
//     (Megatron-LM's rule); then whatever else schedule.CheckShape refuses
//     for (schedule, pp, micro-batches per replica, virtual stages).
//
// The rules of a model (whole heads or layers per rank), of a cluster
// (Layout.CheckDomains) and of a job stay with them. Every rejection wraps
// ErrInvalid (and schedule.ErrUnknownKind or schedule.ErrBadShape where
// the schedule package refused) and names the value and the rule.
func NewShape(world int, s ShapeSpec) (Shape, error) {
	worldName := s.WorldName
	if worldName == "" {
		worldName = fmt.Sprintf("world size %d", world)
	}
	switch {
	case s.TP < 1:
		return Shape{}, invalid("tp %d: must be at least 1", s.TP)
	case s.PP < 1:
		return Shape{}, invalid("pp %d: must be at least 1", s.PP)
	case s.DP < 0:
		return Shape{}, invalid("dp %d: must not be negative (0 derives it)", s.DP)
	case world < 1:
		return Shape{}, invalid("%s: want at least 1 rank", worldName)
	case s.TP > world || s.PP > world || world%(s.TP*s.PP) != 0:
		return Shape{}, invalid("%s is not divisible by tp*pp = %d (tp %d x pp %d)", worldName, s.TP*s.PP, s.TP, s.PP)
	}
	dp := world / (s.TP * s.PP)
	if s.DP != 0 && s.DP != dp {
		return Shape{}, invalid("dp %d: tp*pp*dp = %d must equal the world size %d (dp 0 derives it)", s.DP, s.TP*s.PP*s.DP, world)
	}

	kind := s.Schedule
	if kind != "" {
		k, err := schedule.ParseKind(string(kind))
		if err != nil {
			return Shape{}, invalidErr(err)
		}
		kind = k
	}
	v := s.Virtual
	switch {
	case v < 0:
		return Shape{}, invalid("vpp %d: must not be negative (0 is 2 with the interleaved schedule, else 1)", v)
	case v == 0 && kind == schedule.Interleaved:
		v = 2
	case v == 0:
		v = 1
	}
	if v > 1 && kind != schedule.Interleaved {
		named := string(kind)
		if kind == "" {
			named = "none"
		}
		return Shape{}, invalid("vpp %d: virtual pipeline stages need --schedule interleaved (schedule is %s)", v, named)
	}
	if kind == schedule.Interleaved && s.PP < 2 {
		return Shape{}, invalid("schedule interleaved needs pp of at least 2 (pp is %d)", s.PP)
	}

	g, m := s.GlobalBatch, s.MicroBatch
	switch {
	case g < 0 || m < 0:
		return Shape{}, invalid("global batch %d and micro-batch %d: must not be negative", g, m)
	case g > 0 && m < 1:
		return Shape{}, invalid("global batch %d needs a micro-batch of at least 1 (micro-batch is %d)", g, m)
	case g > 0 && (m > g || g%(m*dp) != 0):
		return Shape{}, invalid("global batch %d is not divisible by micro-batch*dp = %d (micro-batch %d x dp %d)", g, m*dp, m, dp)
	}
	if g > 0 {
		mb := g / (m * dp)
		if kind == schedule.Interleaved && mb%s.PP != 0 {
			return Shape{}, invalid("interleaved schedule: %s per replica (global batch %d / (micro-batch %d x dp %d)) is not a multiple of pp %d",
				plural(mb, "micro-batch", "micro-batches"), g, m, dp, s.PP)
		}
		if kind != "" {
			if err := schedule.CheckShape(kind, s.PP, mb, v); err != nil {
				return Shape{}, invalidErr(err)
			}
		}
	}

	l, err := NewLayout(s.TP, s.PP, dp, s.Order)
	if err != nil {
		return Shape{}, err
	}
	return Shape{Layout: l, GlobalBatch: g, MicroBatch: m, Schedule: kind, Virtual: v}, nil
}
