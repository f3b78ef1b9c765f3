package schedule

import (
	"fmt"
	"math"
	"strings"
)

// Costs are the durations the simulator gives each pass, per micro-batch and
// per model chunk, in any time unit (the results are in the same unit).
type Costs struct {
	// F is the forward pass of one chunk for one micro-batch. Must be > 0.
	F float64
	// B is the backward pass. When W is 0 it is the whole backward pass;
	// when W > 0 it is the input-gradient part only. Must be > 0.
	B float64
	// W is the weight-gradient part of the backward pass, or 0 when B already
	// includes it. Schedules that do not split the backward pass run B+W in
	// one Backward op, so every kind is charged the same compute.
	W float64
	// Comm is the point-to-point latency of one hop between two ranks: a
	// pass that needs a tensor from another rank starts no earlier than Comm
	// after the producing pass ends. Transfers between chunks on the same
	// rank are free.
	Comm float64
	// Seconds says the costs are seconds (the planner's); false means
	// abstract units. Renderers label times accordingly.
	Seconds bool
}

// Validate names the first field that cannot work.
func (c Costs) Validate() error {
	for _, f := range []struct {
		name string
		val  float64
		pos  bool
	}{{"F", c.F, true}, {"B", c.B, true}, {"W", c.W, false}, {"Comm", c.Comm, false}} {
		switch {
		case math.IsNaN(f.val) || math.IsInf(f.val, 0):
			return fmt.Errorf("%w: %s = %v is not a finite number", ErrBadCosts, f.name, f.val)
		case f.pos && f.val <= 0:
			return fmt.Errorf("%w: %s = %v must be > 0", ErrBadCosts, f.name, f.val)
		case f.val < 0:
			return fmt.Errorf("%w: %s = %v must be >= 0", ErrBadCosts, f.name, f.val)
		}
	}
	return nil
}

// Span is one compute pass placed in time by Simulate.
type Span struct {
	Kind       OpKind // Forward, Backward or WeightGrad
	MicroBatch int
	Chunk      int
	Start, End float64
}

// Result is what Simulate computes for one schedule and one set of costs.
type Result struct {
	// Kind, Stages, MicroBatches and Virtual describe the schedule.
	Kind                          Kind
	Stages, MicroBatches, Virtual int
	// Costs are the costs simulated.
	Costs Costs
	// Makespan is the time from the first pass's start to the last pass's end.
	Makespan float64
	// Ideal is one rank's compute time, m*v*(F+B+W): the makespan of a
	// pipeline without bubbles. Every rank does the same amount of compute.
	Ideal float64
	// BubbleFraction is (Makespan-Ideal)/Ideal: bubble time over ideal
	// compute time, the definition of Narayanan et al. 2021, which gives
	// (p-1)/m for GPipe and 1F1B and (p-1)/(v*m) for interleaved 1F1B when
	// F=B and W=Comm=0.
	BubbleFraction float64
	// Busy is each rank's compute time (equal to Ideal for every rank; kept
	// per rank for renderers and for callers that sum across ranks).
	Busy []float64
	// PeakInFlight is, per rank, the largest number of (micro-batch, chunk)
	// forward activations held at once: counted from the Forward until the
	// Backward of the same micro-batch and chunk, for every kind (for ZB-H1
	// the Backward, the input-gradient pass, frees the bulk of the
	// activations; see PeakPendingW and docs/SCHEDULES.md).
	PeakInFlight []int
	// PeakPendingW is, per rank, the largest number of (micro-batch, chunk)
	// whose Backward has run but whose WeightGrad has not: each still holds
	// the layer inputs and output gradients the weight gradient needs. Zero
	// for kinds that do not split the backward pass.
	PeakPendingW []int
	// Timeline holds, per rank, its compute passes in execution order.
	Timeline [][]Span
}

// Simulate places every compute pass of s in time under costs c and returns
// the makespan, bubble, busy time, peak in-flight activations and timeline.
//
// The model: each rank runs its compute passes one at a time in op-list
// order; a pass starts when the rank is free and its inputs are there (the
// producing pass's end, plus c.Comm when it ran on another rank). Sends and
// receives take no time and never hold a rank up: they model asynchronous
// transfers (posted early, completed by a communication stream or goroutine).
// OptimizerStep takes no time. Simulate checks the op lists only as far as it
// needs to (ranges, one of each pass, no cyclic wait between passes); run
// Validate for the full check. Errors wrap ErrBadCosts or ErrInvalid.
func Simulate(s *Schedule, c Costs) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	if s == nil {
		return Result{}, fmt.Errorf("%w: nil schedule", ErrInvalid)
	}
	if err := CheckShape(s.Kind, s.Stages, s.MicroBatches, s.Virtual); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	spans, err := timeline(s, s.Ranks, c)
	if err != nil {
		return Result{}, err
	}
	p, m, v := s.Stages, s.MicroBatches, s.Virtual
	res := Result{
		Kind: s.Kind, Stages: p, MicroBatches: m, Virtual: v, Costs: c,
		Ideal:    float64(m*v) * (c.F + c.B + c.W),
		Busy:     make([]float64, p),
		Timeline: spans,
	}
	for r, row := range spans {
		for _, sp := range row {
			res.Busy[r] += sp.End - sp.Start
			res.Makespan = max(res.Makespan, sp.End)
		}
	}
	res.BubbleFraction = (res.Makespan - res.Ideal) / res.Ideal
	res.PeakInFlight, res.PeakPendingW = s.peaks()
	return res, nil
}

// PeakInFlight returns, per rank, the largest number of (micro-batch, chunk)
// forward activations held at once, counted from each Forward to the
// Backward of the same micro-batch and chunk. It depends only on the op
// order, not on costs.
func (s *Schedule) PeakInFlight() []int {
	in, _ := s.peaks()
	return in
}

// PeakHeld returns, per rank, the largest number of (micro-batch, chunk)
// passes whose Forward has run and whose backward work has not all run: up
// to the WeightGrad for kinds that split the backward, else up to the
// Backward. It is the count that bounds activation memory when a split
// backward keeps the weight-gradient inputs until W (Qi et al. 2023 count
// memory this way). Without a split it equals PeakInFlight.
func (s *Schedule) PeakHeld() []int {
	held := make([]int, len(s.Ranks))
	for r, ops := range s.Ranks {
		n := 0
		for _, op := range ops {
			switch {
			case op.Kind == Forward:
				n++
				held[r] = max(held[r], n)
			case op.Kind == Backward && !s.Kind.SplitBackward(), op.Kind == WeightGrad:
				n--
			}
		}
	}
	return held
}

// peaks counts, per rank, the peak of Forward-done-Backward-not and of
// Backward-done-WeightGrad-not.
func (s *Schedule) peaks() (inFlight, pendingW []int) {
	inFlight = make([]int, len(s.Ranks))
	pendingW = make([]int, len(s.Ranks))
	for r, ops := range s.Ranks {
		held, pend := 0, 0
		for _, op := range ops {
			switch op.Kind {
			case Forward:
				held++
				inFlight[r] = max(inFlight[r], held)
			case Backward:
				held--
				if s.Kind.SplitBackward() {
					pend++
					pendingW[r] = max(pendingW[r], pend)
				}
			case WeightGrad:
				pend--
			}
		}
	}
	return inFlight, pendingW
}

// timeline places the compute passes of ranks (s gives the shape) in time.
// Non-compute ops are skipped. It runs in time linear in the number of ops:
// a rank that reaches a pass whose input is not ready parks on that input and
// is woken by the pass that produces it.
func timeline(s *Schedule, ranks [][]Op, c Costs) ([][]Span, error) {
	p, m, v := s.Stages, s.MicroBatches, s.Virtual
	if len(ranks) != p {
		return nil, fmt.Errorf("%w: %d op lists for %d stages", ErrInvalid, len(ranks), p)
	}
	split := s.Kind.SplitBackward()
	durF, durB, durW := c.F, c.B+c.W, 0.0
	perPass := 2
	if split {
		durB, durW = c.B, c.W
		perPass = 3
	}
	V := p * v
	n := m * V
	// fEnd[i*V+vs] and bEnd[...] are the end times of F and B of micro-batch
	// i on virtual stage vs, or -1 while not yet run.
	fEnd := make([]float64, n)
	bEnd := make([]float64, n)
	for i := range fEnd {
		fEnd[i], bEnd[i] = -1, -1
	}
	spans := make([][]Span, p)
	for r, ops := range ranks {
		count := 0
		for k, op := range ops {
			if op.Kind.IsCompute() {
				if op.MicroBatch < 0 || op.MicroBatch >= m || op.Chunk < 0 || op.Chunk >= v {
					return nil, fmt.Errorf("%w: rank %d op %d %v: micro-batch or chunk out of range (m=%d, v=%d)", ErrInvalid, r, k, op, m, v)
				}
				if op.Kind == WeightGrad && !split {
					return nil, fmt.Errorf("%w: rank %d op %d %v: %s does not split the backward pass", ErrInvalid, r, k, op, s.Kind)
				}
				count++
			}
		}
		if want := perPass * m * v; count != want {
			return nil, fmt.Errorf("%w: rank %d has %d compute passes, want %d (%d per micro-batch and chunk)", ErrInvalid, r, count, want, perPass)
		}
		spans[r] = make([]Span, 0, count)
	}

	pc := make([]int, p)
	free := make([]float64, p)
	parked := make([]int, p) // key a parked rank waits for, -1 if not parked
	queue := make([]int, p)
	for r := range p {
		queue[r] = r
		parked[r] = -1
	}
	wake := func(q, key int) {
		if parked[q] == key {
			parked[q] = -1
			queue = append(queue, q)
		}
	}
	for len(queue) > 0 {
		r := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
	run:
		for pc[r] < len(ranks[r]) {
			op := ranks[r][pc[r]]
			if !op.Kind.IsCompute() {
				pc[r]++
				continue
			}
			vs := op.Chunk*p + r
			idx := op.MicroBatch*V + vs
			ready := free[r]
			var dur float64
			switch op.Kind {
			case Forward:
				if vs > 0 {
					t := fEnd[idx-1]
					if t < 0 {
						parked[r] = idx - 1
						break run
					}
					if (vs-1)%p != r {
						t += c.Comm
					}
					ready = max(ready, t)
				}
				dur = durF
			case Backward:
				if fEnd[idx] < 0 {
					parked[r] = idx
					break run
				}
				if vs+1 < V {
					t := bEnd[idx+1]
					if t < 0 {
						parked[r] = n + idx + 1
						break run
					}
					if (vs+1)%p != r {
						t += c.Comm
					}
					ready = max(ready, t)
				}
				dur = durB
			case WeightGrad:
				if bEnd[idx] < 0 {
					parked[r] = n + idx
					break run
				}
				dur = durW
			}
			end := ready + dur
			spans[r] = append(spans[r], Span{Kind: op.Kind, MicroBatch: op.MicroBatch, Chunk: op.Chunk, Start: ready, End: end})
			free[r] = end
			pc[r]++
			switch op.Kind {
			case Forward:
				fEnd[idx] = end
				if vs+1 < V {
					wake((vs+1)%p, idx)
				}
			case Backward:
				bEnd[idx] = end
				if vs > 0 {
					wake((vs-1)%p, n+idx)
				}
			}
		}
	}
	var stuck []string
	for r := range p {
		if pc[r] < len(ranks[r]) {
			stuck = append(stuck, fmt.Sprintf("rank %d at op %d %v", r, pc[r], ranks[r][pc[r]]))
		}
	}
	if len(stuck) > 0 {
		return nil, fmt.Errorf("%w: passes wait on inputs that are never produced: %s", ErrInvalid, strings.Join(stuck, "; "))
	}
	return spans, nil
}
