package schedule

import (
	"fmt"
	"strings"
)

// Kind names a pipeline schedule.
type Kind string

// The schedules Build knows.
const (
	// GPipe runs every micro-batch's forward pass, then every backward pass
	// (Huang et al. 2019). Each stage holds m activations at its peak.
	GPipe Kind = "gpipe"
	// OneFOneB is the non-interleaved 1F1B schedule of PipeDream-Flush and
	// Megatron-LM: p-1-rank warm-up forwards, then one forward and one
	// backward in turn, then the remaining backwards.
	OneFOneB Kind = "1f1b"
	// Interleaved is Megatron-LM's interleaved 1F1B over v model chunks per
	// rank (Narayanan et al. 2021). It needs v >= 2 and m % p == 0.
	Interleaved Kind = "interleaved"
	// ZBH1 is the ZB-H1 schedule of Qi et al. 2023 ("Zero Bubble Pipeline
	// Parallelism"): 1F1B with the backward split into an input-gradient pass
	// (Backward) and a weight-gradient pass (WeightGrad) whose W passes are
	// delayed to fill the cool-down bubble.
	ZBH1 Kind = "zb-h1"
)

// Kinds returns every schedule kind, in a stable order.
func Kinds() []Kind { return []Kind{GPipe, OneFOneB, Interleaved, ZBH1} }

// ParseKind returns the Kind named by s, ignoring case and surrounding spaces.
// It returns an error wrapping ErrUnknownKind that lists the valid names.
func ParseKind(s string) (Kind, error) {
	k := Kind(strings.ToLower(strings.TrimSpace(s)))
	for _, known := range Kinds() {
		if k == known {
			return k, nil
		}
	}
	return "", fmt.Errorf("%w %q: want one of %s", ErrUnknownKind, s, kindList())
}

// SplitBackward reports whether the kind splits the backward pass into
// Backward (input gradient) and WeightGrad (weight gradient) ops.
func (k Kind) SplitBackward() bool { return k == ZBH1 }

func kindList() string {
	names := make([]string, 0, len(Kinds()))
	for _, k := range Kinds() {
		names = append(names, string(k))
	}
	return strings.Join(names, ", ")
}
