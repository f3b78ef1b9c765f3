package topology

import (
	"fmt"
	"strings"

	"github.com/gpucoord/gpucoord/schedule"
)

// SearchSpace bounds the layouts Candidates enumerates.
type SearchSpace struct {
	// MaxMicroBatch is the largest micro-batch tried (powers of two from 1).
	MaxMicroBatch int
	// MaxVirtual is the largest number of virtual stages tried per rank.
	MaxVirtual int
	// Recompute lists the recomputation policies tried.
	Recompute []Recompute
	// Fixed holds what the user fixed: the search varies only the rest.
	Fixed Fixed
	// Allow, when set, passes over the layouts it refuses (a job's limits,
	// what its program can split).
	Allow func(Config) bool
}

// Fixed are constraints on a search: a nil field is free. `plan --auto`
// fixes what its flags give.
type Fixed struct {
	TP, PP, DP, VPP, Zero, MicroBatch *int
	Schedule                          *schedule.Kind
	Recompute                         *Recompute
}

// allows reports whether c satisfies every fixed field.
func (f Fixed) allows(c Config) bool {
	eq := func(p *int, v int) bool { return p == nil || *p == v }
	return eq(f.TP, c.TP) && eq(f.PP, c.PP) && eq(f.DP, c.DP) && eq(f.VPP, c.VPP) && eq(f.Zero, c.Zero) &&
		eq(f.MicroBatch, c.MicroBatch) && (f.Schedule == nil || *f.Schedule == c.Schedule) &&
		(f.Recompute == nil || *f.Recompute == c.Recompute)
}

// String lists the fixed fields, "tp 8, zero 0, schedule gpipe"; empty
// when none is.
func (f Fixed) String() string {
	var parts []string
	for _, x := range []struct {
		name string
		v    *int
	}{{"tp", f.TP}, {"pp", f.PP}, {"dp", f.DP}, {"vpp", f.VPP}, {"zero", f.Zero}, {"micro-batch", f.MicroBatch}} {
		if x.v != nil {
			parts = append(parts, fmt.Sprintf("%s %d", x.name, *x.v))
		}
	}
	if f.Schedule != nil {
		parts = append(parts, "schedule "+string(*f.Schedule))
	}
	if f.Recompute != nil {
		parts = append(parts, "recompute "+string(*f.Recompute))
	}
	return strings.Join(parts, ", ")
}

// DefaultSearchSpace returns the space `gpucoord plan --auto` searches.
func DefaultSearchSpace() SearchSpace {
	return SearchSpace{MaxMicroBatch: 8, MaxVirtual: 8,
		Recompute: []Recompute{RecomputeNone, RecomputeSelective, RecomputeFull}}
}

// Candidates calls visit with every valid Plan of m on cl that varies tp,
// pp (hence dp), virtual stages, ZeRO stage, micro-batch and recomputation
// around base; the other fields (global batch, precision, flash attention,
// offload, order) are kept; a zero global batch becomes DefaultGlobalBatch, so
// that every candidate trains the same batch. Sequence parallelism is turned on wherever tp >
// 1: it only removes memory and traffic. Virtual stages above 1 use the
// interleaved schedule; otherwise base's schedule (1F1B if base asks for
// interleaved). ZeRO stages above 0 are tried only with dp > 1, where they
// differ from stage 0. It returns the number of layouts visited; stop early
// by returning false from visit.
func Candidates(cl Cluster, m Model, base Config, space SearchSpace, visit func(*Plan) bool) int {
	world := cl.World()
	if base.GlobalBatch == 0 {
		base.GlobalBatch = DefaultGlobalBatch(cl, base.MicroBatch)
	}
	n := 0
	flat := base.Schedule
	if flat == schedule.Interleaved {
		flat = schedule.OneFOneB
	}
	if f := space.Fixed.Schedule; f != nil && *f != schedule.Interleaved {
		flat = *f
	}
	for _, tp := range divisors(world) {
		if tp > cl.Domain() || (!m.Bare() && m.Heads%tp != 0) {
			continue
		}
		for _, pp := range divisors(world / tp) {
			if !m.Bare() && m.Layers%pp != 0 {
				continue
			}
			dp := world / (tp * pp)
			for v := 1; v <= space.MaxVirtual; v++ {
				if v > 1 && (pp == 1 || m.Bare() || m.Layers%(pp*v) != 0) {
					continue
				}
				for zero := 0; zero <= 3; zero++ {
					if zero > 0 && dp == 1 {
						break
					}
					for mb := 1; mb <= space.MaxMicroBatch; mb *= 2 {
						for _, rc := range space.Recompute {
							if m.Bare() && rc != RecomputeNone {
								continue
							}
							c := base
							c.TP, c.PP, c.DP, c.VPP, c.Zero, c.MicroBatch, c.Recompute = tp, pp, dp, v, zero, mb, rc
							c.SequenceParallel = tp > 1
							c.Schedule = flat
							if v > 1 {
								c.Schedule = schedule.Interleaved
							}
							if !space.Fixed.allows(c) || space.Allow != nil && !space.Allow(c) {
								continue
							}
							p, err := New(cl, m, c)
							if err != nil {
								continue
							}
							n++
							if !visit(p) {
								return n
							}
						}
					}
				}
			}
		}
	}
	return n
}

// divisors returns the divisors of n in increasing order.
func divisors(n int) []int {
	var small, large []int
	for d := 1; d*d <= n; d++ {
		if n%d == 0 {
			small = append(small, d)
			if d != n/d {
				large = append(large, n/d)
			}
		}
	}
	for i := len(large) - 1; i >= 0; i-- {
		small = append(small, large[i])
	}
	return small
}
