package schedule

import "fmt"

// MaxPasses bounds stages*microbatches*virtual, the number of (micro-batch,
// virtual stage) forward passes in one schedule, so that a typo cannot ask
// Build for gigabytes of op lists.
const MaxPasses = 1 << 20

// Schedule is a pipeline schedule as data: for each pipeline rank the ordered
// list of ops it executes in one training step.
//
// Rank r holds model chunks 0..Virtual-1; chunk c of rank r is virtual stage
// c*Stages + r, so a forward pass visits ranks 0..p-1 for chunk 0, then
// 0..p-1 again for chunk 1, and so on (Megatron-LM's layout). Every op names
// its micro-batch and chunk, and sends and receives name their peer rank and
// the peer's chunk, which is everything an executor needs.
//
// A Schedule is plain data: safe for concurrent reads, and callers may build
// or edit one by hand (Validate then says whether it can run).
type Schedule struct {
	// Kind is the schedule's name.
	Kind Kind
	// Stages is the pipeline-parallel degree p.
	Stages int
	// MicroBatches is the number m of micro-batches per step.
	MicroBatches int
	// Virtual is the number v of model chunks per rank (1 unless Interleaved).
	Virtual int
	// Ranks holds one op list per pipeline rank, Ranks[r][k] being rank r's
	// k-th op.
	Ranks [][]Op
}

// Build returns the op lists of kind for stages pipeline ranks, microbatches
// micro-batches and virtual model chunks per rank. virtual must be 1 unless
// kind is Interleaved, which needs virtual >= 2 and microbatches % stages ==
// 0. Errors wrap ErrUnknownKind or ErrBadShape and name the value and the
// rule it breaks.
//
// Sends are placed right after the pass that produces the tensor and receives
// before the pass that consumes it, in an order that is deadlock-free even
// when every send blocks until its receive is posted (see Validate and
// docs/SCHEDULES.md). Build's output passes Validate; Build does not call it.
func Build(kind Kind, stages, microbatches, virtual int) (*Schedule, error) {
	if err := CheckShape(kind, stages, microbatches, virtual); err != nil {
		return nil, err
	}
	s := &Schedule{Kind: kind, Stages: stages, MicroBatches: microbatches, Virtual: virtual}
	compute := make([][]Op, stages)
	for r := range compute {
		compute[r] = computeOrder(kind, r, stages, microbatches, virtual)
	}
	ranks, err := placeComm(s, compute)
	if err != nil {
		return nil, err
	}
	s.Ranks = ranks
	return s, nil
}

// CheckShape returns the error Build would return for kind on p stages, m
// micro-batches and v model chunks per rank, without building the op lists;
// nil when Build accepts the shape. topology.NewShape calls it, so a layout
// the planner, the coordinator or the engine accepts is one Build runs.
func CheckShape(kind Kind, p, m, v int) error {
	switch kind {
	case GPipe, OneFOneB, Interleaved, ZBH1:
	default:
		return fmt.Errorf("%w %q: want one of %s", ErrUnknownKind, string(kind), kindList())
	}
	if p < 1 {
		return fmt.Errorf("%w: stages %d: need at least 1", ErrBadShape, p)
	}
	if m < 1 {
		return fmt.Errorf("%w: microbatches %d: need at least 1", ErrBadShape, m)
	}
	if v < 1 {
		return fmt.Errorf("%w: virtual %d: need at least 1", ErrBadShape, v)
	}
	if kind == Interleaved {
		if v < 2 {
			return fmt.Errorf("%w: interleaved needs virtual >= 2 model chunks per rank, got %d (use 1f1b for one chunk)", ErrBadShape, v)
		}
		if m%p != 0 {
			return fmt.Errorf("%w: interleaved needs microbatches %% stages == 0, got microbatches %d, stages %d", ErrBadShape, m, p)
		}
	} else if v != 1 {
		return fmt.Errorf("%w: %s needs virtual 1, got %d (only interleaved runs several model chunks per rank)", ErrBadShape, kind, v)
	}
	if p > MaxPasses || m > MaxPasses || v > MaxPasses || p*m*v > MaxPasses {
		return fmt.Errorf("%w: stages*microbatches*virtual = %d*%d*%d exceeds MaxPasses %d", ErrBadShape, p, m, v, MaxPasses)
	}
	return nil
}

func compute(k OpKind, mb, chunk int) Op {
	return Op{Kind: k, MicroBatch: mb, Chunk: chunk, Peer: -1, PeerChunk: -1}
}

// computeOrder returns rank r's forward, backward and weight-gradient passes
// in execution order, without communication.
func computeOrder(kind Kind, r, p, m, v int) []Op {
	n := 2 * m * v
	if kind.SplitBackward() {
		n = 3 * m * v
	}
	ops := make([]Op, 0, n)
	switch kind {
	case GPipe:
		for i := range m {
			ops = append(ops, compute(Forward, i, 0))
		}
		for i := range m {
			ops = append(ops, compute(Backward, i, 0))
		}
	case OneFOneB, ZBH1:
		// Megatron's warm-up: rank r runs p-1-r forwards before its first
		// backward, so it never holds more than p-r activations.
		warm := min(p-1-r, m)
		for i := range warm {
			ops = append(ops, compute(Forward, i, 0))
		}
		// ZB-H1 keeps 1F1B's warm-up (so its peak activations) and defers W
		// passes into the cool-down (Qi et al. 2023, section 3.1). Our order
		// is built from those two rules, not copied from the paper's figure:
		// the W of micro-batch j runs right after the B of micro-batch j+r,
		// so rank r carries r+1 W passes past its last B and the chain of B
		// passes reaches rank 0 without waiting for the ranks behind it.
		// TestZBH1 checks the makespan against the paper's formula.
		nextW := 0
		for j := range m {
			if j+warm < m {
				ops = append(ops, compute(Forward, j+warm, 0))
			}
			ops = append(ops, compute(Backward, j, 0))
			if kind == ZBH1 && j >= r {
				ops = append(ops, compute(WeightGrad, nextW, 0))
				nextW++
			}
		}
		if kind == ZBH1 {
			for ; nextW < m; nextW++ {
				ops = append(ops, compute(WeightGrad, nextW, 0))
			}
		}
	case Interleaved:
		// Megatron-LM's interleaved 1F1B (schedules.py,
		// forward_backward_pipelining_with_interleaving): forwards visit
		// micro-batches in groups of p, chunk 0 for the whole group, then
		// chunk 1, ...; backwards use the same table with the chunk order
		// reversed. Warm-up: (p-1-r)*2 + (v-1)*p forwards, capped at m*v.
		total := m * v
		warm := min((p-1-r)*2+(v-1)*p, total)
		fwd := func(k int) Op {
			mb, c := interleavedSlot(k, p, v)
			return compute(Forward, mb, c)
		}
		bwd := func(k int) Op {
			mb, c := interleavedSlot(k, p, v)
			return compute(Backward, mb, v-1-c)
		}
		for k := range warm {
			ops = append(ops, fwd(k))
		}
		for k := range total - warm {
			ops = append(ops, fwd(warm+k), bwd(k))
		}
		for k := total - warm; k < total; k++ {
			ops = append(ops, bwd(k))
		}
	}
	return ops
}

// interleavedSlot maps the k-th forward of an interleaved rank to its
// (micro-batch, chunk): groups of p micro-batches, every chunk per group.
func interleavedSlot(k, p, v int) (mb, chunk int) {
	group := k / (p * v)
	inGroup := k % (p * v)
	return group*p + inGroup%p, inGroup / p
}

// VirtualStage returns the virtual stage of chunk on rank: chunk*Stages+rank.
func (s *Schedule) VirtualStage(rank, chunk int) int { return chunk*s.Stages + rank }

// Locate returns the rank and chunk that hold virtual stage vs.
func (s *Schedule) Locate(vs int) (rank, chunk int) { return vs % s.Stages, vs / s.Stages }

// commEvent is one send, stamped with the time its tensor is produced in the
// unit-cost timeline and a global tie-break id.
type commEvent struct {
	t  float64
	id int
	op Op // the sender's SendAct or SendGrad
}

// before orders transfers globally: by time, then by id.
func (a commEvent) before(b commEvent) bool { return a.t < b.t || (a.t == b.t && a.id < b.id) }

// recvOf returns the receive that matches send e, as seen by its peer.
func (e commEvent) recvOf(from int) Op {
	k := RecvAct
	if e.op.Kind == SendGrad {
		k = RecvGrad
	}
	return Op{Kind: k, MicroBatch: e.op.MicroBatch, Chunk: e.op.PeerChunk, Peer: from, PeerChunk: e.op.Chunk}
}

// placeComm inserts the sends and receives into the compute orders and
// appends each rank's OptimizerStep.
//
// It times the compute orders once with fixed unit costs (F=1, B=2 or B=W=1)
// and gives every transfer the time T its tensor is produced. Each rank's ops
// are then merged by time: a compute pass at its start time, a send or
// receive at T, transfers before passes at equal times, transfers among
// themselves by (T, id). Every rank therefore meets its transfers in one
// global order, (T, id), and a receive always precedes the pass that consumes
// it (that pass starts at or after T) while a send follows the pass that
// produces it (which starts before T). With one global order of transfers,
// blocking sends cannot deadlock: the smallest unfinished transfer always has
// both of its ranks ready for it.
//
// A rank's sends are in its compute order, so already sorted by T, and so
// are the sends each neighbour addresses to it; the merge is linear.
func placeComm(s *Schedule, compute [][]Op) ([][]Op, error) {
	p, m, v := s.Stages, s.MicroBatches, s.Virtual
	c := Costs{F: 1, B: 2}
	if s.Kind.SplitBackward() {
		c = Costs{F: 1, B: 1, W: 1}
	}
	spans, err := timeline(s, compute, c)
	if err != nil {
		// computeOrder builds every pass once in dependency order; a failure
		// here is a bug in this package, not bad input.
		return nil, fmt.Errorf("schedule: internal error timing %s p=%d m=%d v=%d: %w", s.Kind, p, m, v, err)
	}
	V := p * v
	n := m * V
	sends := make([][]commEvent, p)
	for r := range p {
		// At most one send per pass (its activation or its gradient).
		sends[r] = make([]commEvent, 0, len(compute[r]))
		for k, op := range compute[r] {
			vs := s.VirtualStage(r, op.Chunk)
			var q, qc, id int
			var kind OpKind
			switch {
			case op.Kind == Forward && vs+1 < V:
				q, qc = s.Locate(vs + 1)
				kind, id = SendAct, op.MicroBatch*V+vs
			case op.Kind == Backward && vs > 0:
				q, qc = s.Locate(vs - 1)
				kind, id = SendGrad, n+op.MicroBatch*V+vs
			default:
				continue
			}
			if q == r {
				continue // the tensor stays on the rank
			}
			sends[r] = append(sends[r], commEvent{spans[r][k].End, id, Op{kind, op.MicroBatch, op.Chunk, q, qc}})
		}
	}
	out := make([][]Op, p)
	for r := range p {
		// The streams: r's own sends, then what each neighbour sends to r.
		streams := [][]commEvent{sends[r]}
		from := []int{r}
		for _, q := range []int{(r + p - 1) % p, (r + 1) % p} {
			if q != r && (len(from) < 2 || from[1] != q) {
				streams, from = append(streams, sends[q]), append(from, q)
			}
		}
		heads := make([]int, len(streams))
		// next returns the stream holding the smallest pending transfer
		// that involves r, or -1.
		next := func() int {
			best := -1
			for i, st := range streams {
				for i > 0 && heads[i] < len(st) && st[heads[i]].op.Peer != r {
					heads[i]++ // a send of the neighbour to someone else
				}
				if heads[i] < len(st) && (best < 0 || st[heads[i]].before(streams[best][heads[best]])) {
					best = i
				}
			}
			return best
		}
		emit := func(ops []Op, i int) []Op {
			e := streams[i][heads[i]]
			heads[i]++
			if i == 0 {
				return append(ops, e.op)
			}
			return append(ops, e.recvOf(from[i]))
		}
		ops := make([]Op, 0, len(compute[r])+2*len(sends[r])+1)
		for k, op := range compute[r] {
			for i := next(); i >= 0 && streams[i][heads[i]].t <= spans[r][k].Start; i = next() {
				ops = emit(ops, i)
			}
			ops = append(ops, op)
		}
		for i := next(); i >= 0; i = next() {
			ops = emit(ops, i)
		}
		out[r] = append(ops, Op{Kind: OptimizerStep, MicroBatch: -1, Chunk: -1, Peer: -1, PeerChunk: -1})
	}
	return out, nil
}
