package schedule

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Validate checks that s can run: shape within Build's rules, every op in
// range, each rank's passes present exactly once, each pass after its inputs
// (a Forward after the activation it reads was received or computed, a
// Backward after its own Forward and its output gradient, a WeightGrad after
// its Backward, a send after the pass that produces its tensor), every send
// matched by exactly one receive on the named peer with sends and receives in
// the same order on every link, OptimizerStep last, and no deadlock.
//
// The deadlock check executes the op lists with rendezvous semantics: a send
// completes only together with the matching receive, and a receive only
// together with its send. A schedule that passes also runs with buffered
// (non-blocking) sends and on transports that deliver each link in order: a
// rendezvous run is one of the buffered runs, and because each rank's
// program is fixed and receives name their message, every buffered run ends
// the same way.
//
// Errors wrap ErrInvalid or ErrDeadlock and name the rank, the op index and
// the op.
func (s *Schedule) Validate() error {
	if s == nil {
		return fmt.Errorf("%w: nil schedule", ErrInvalid)
	}
	v, err := newValidator(s)
	if err != nil {
		return err
	}
	if err := v.structure(); err != nil {
		return err
	}
	if err := v.links(); err != nil {
		return err
	}
	return v.execute(true)
}

// validator holds the bookkeeping of one Validate call. Passes and transfers
// are indexed by i*V+vs for micro-batch i on virtual stage vs; a transfer is
// indexed by the virtual stage that produces its tensor.
type validator struct {
	s       *Schedule
	p, m, v int
	V, n    int
	split   bool
}

func newValidator(s *Schedule) (*validator, error) {
	if err := CheckShape(s.Kind, s.Stages, s.MicroBatches, s.Virtual); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(s.Ranks) != s.Stages {
		return nil, fmt.Errorf("%w: %d op lists for %d stages", ErrInvalid, len(s.Ranks), s.Stages)
	}
	V := s.Stages * s.Virtual
	return &validator{s: s, p: s.Stages, m: s.MicroBatches, v: s.Virtual, V: V, n: s.MicroBatches * V, split: s.Kind.SplitBackward()}, nil
}

// msgID identifies the tensor a send or receive carries: activations are
// 0..n-1 and gradients n..2n-1, each indexed by the producing pass.
func (x *validator) msgID(r int, op Op) int {
	vs := op.Chunk*x.p + r
	switch op.Kind {
	case SendAct:
		return op.MicroBatch*x.V + vs
	case RecvAct:
		return op.MicroBatch*x.V + vs - 1
	case SendGrad:
		return x.n + op.MicroBatch*x.V + vs
	case RecvGrad:
		return x.n + op.MicroBatch*x.V + vs + 1
	}
	return -1
}

// describe names the tensor of message id for error messages.
func (x *validator) describe(id int) string {
	kind := "activation"
	if id >= x.n {
		kind, id = "gradient", id-x.n
	}
	r, c := id%x.V%x.p, id%x.V/x.p
	return fmt.Sprintf("%s of micro-batch %d from rank %d chunk %d", kind, id/x.V, r, c)
}

// structure checks ranges, peers and that every pass and transfer appears
// exactly once.
func (x *validator) structure() error {
	p, m, v, V, n := x.p, x.m, x.v, x.V, x.n
	passes := make([]uint8, 3*n) // F, B, W counts
	sends := make([]uint8, 2*n)
	recvs := make([]uint8, 2*n)
	for r, ops := range x.s.Ranks {
		if len(ops) == 0 || ops[len(ops)-1].Kind != OptimizerStep {
			return fmt.Errorf("%w: rank %d: last op must be OptimizerStep", ErrInvalid, r)
		}
		for k, op := range ops {
			bad := func(format string, args ...any) error {
				return fmt.Errorf("%w: rank %d op %d %v: %s", ErrInvalid, r, k, op, fmt.Sprintf(format, args...))
			}
			if op.Kind == OptimizerStep {
				if k != len(ops)-1 {
					return bad("OptimizerStep must be the last op, found at %d of %d", k, len(ops))
				}
				continue
			}
			if op.Kind < Forward || op.Kind > OptimizerStep {
				return bad("unknown op kind")
			}
			if op.MicroBatch < 0 || op.MicroBatch >= m {
				return bad("micro-batch %d out of range [0,%d)", op.MicroBatch, m)
			}
			if op.Chunk < 0 || op.Chunk >= v {
				return bad("chunk %d out of range [0,%d)", op.Chunk, v)
			}
			vs := op.Chunk*p + r
			idx := op.MicroBatch*V + vs
			if op.Kind.IsCompute() {
				if op.Kind == WeightGrad && !x.split {
					return bad("%s does not split the backward pass; Backward includes the weight gradient", x.s.Kind)
				}
				slot := int(op.Kind-Forward)*n + idx
				if passes[slot]++; passes[slot] > 1 {
					return bad("pass appears twice")
				}
				continue
			}
			// A send or receive: the peer must hold the neighbouring virtual
			// stage in the tensor's direction, on another rank.
			nb := vs + 1
			if op.Kind == RecvAct || op.Kind == SendGrad {
				nb = vs - 1
			}
			if nb < 0 || nb >= V {
				return bad("virtual stage %d has no neighbour in this direction", vs)
			}
			q, qc := x.s.Locate(nb)
			if q == r {
				return bad("neighbouring virtual stage %d is on the same rank; the tensor is passed locally, not sent", nb)
			}
			if op.Peer != q || op.PeerChunk != qc {
				return bad("peer must be rank %d chunk %d (virtual stage %d)", q, qc, nb)
			}
			id := x.msgID(r, op)
			counts := recvs
			if op.Kind.IsSend() {
				counts = sends
			}
			if counts[id]++; counts[id] > 1 {
				return bad("transfer appears twice")
			}
		}
	}
	kinds := []OpKind{Forward, Backward, WeightGrad}
	for slot, c := range passes {
		kind := kinds[slot/n]
		if c == 0 && (kind != WeightGrad || x.split) {
			idx := slot % n
			r, ch := x.s.Locate(idx % V)
			return fmt.Errorf("%w: rank %d has no %v", ErrInvalid, r, compute(kind, idx/V, ch))
		}
	}
	// Every tensor that crosses ranks needs one send and one receive.
	for id := range 2 * n {
		idx := id % n
		vs := idx % V
		to := vs + 1
		if id >= n {
			to = vs - 1
		}
		if to < 0 || to >= V || to%p == vs%p {
			continue
		}
		if sends[id] == 0 {
			return fmt.Errorf("%w: no send of the %s to rank %d", ErrInvalid, x.describe(id), to%p)
		}
		if recvs[id] == 0 {
			return fmt.Errorf("%w: rank %d has no receive of the %s", ErrInvalid, to%p, x.describe(id))
		}
	}
	return nil
}

// links checks that on every link a->b, a's sends to b and b's receives from
// a name the same tensors in the same order, as an in-order transport needs.
func (x *validator) links() error {
	type link struct{ from, to int }
	sent := map[link][]int{}
	got := map[link][]int{}
	for r, ops := range x.s.Ranks {
		for _, op := range ops {
			switch {
			case op.Kind.IsSend():
				l := link{r, op.Peer}
				sent[l] = append(sent[l], x.msgID(r, op))
			case op.Kind.IsRecv():
				l := link{op.Peer, r}
				got[l] = append(got[l], x.msgID(r, op))
			}
		}
	}
	// Report the first bad link in (from, to) order, not map order.
	keys := make([]link, 0, len(sent))
	for l := range sent {
		keys = append(keys, l)
	}
	slices.SortFunc(keys, func(a, b link) int {
		if c := cmp.Compare(a.from, b.from); c != 0 {
			return c
		}
		return cmp.Compare(a.to, b.to)
	})
	for _, l := range keys {
		ids, rec := sent[l], got[l]
		for k, id := range ids {
			if k < len(rec) && rec[k] != id {
				return fmt.Errorf("%w: link %d->%d out of order: send #%d carries the %s but receive #%d expects the %s",
					ErrInvalid, l.from, l.to, k, x.describe(id), k, x.describe(rec[k]))
			}
		}
	}
	return nil
}

// execute runs the op lists as a blocking executor would: with rendezvous
// sends when rendezvous is true, with buffered sends otherwise. It reports
// passes that run before their inputs and, when no rank can move, the cycle
// of ranks waiting on each other.
func (x *validator) execute(rendezvous bool) error {
	p, V, n := x.p, x.V, x.n
	ranks := x.s.Ranks
	done := make([]bool, 3*n) // F, B, W done, by pass index
	arrived := make([]bool, 2*n)
	inbox := make([]bool, 2*n) // buffered mode: sent, not yet received
	pc := make([]int, p)
	passes := make([]int, p)
	want := 2 * x.m * x.v
	if x.split {
		want = 3 * x.m * x.v
	}
	queue := make([]int, 0, p)
	for r := range p {
		queue = append(queue, r)
	}
	order := func(r int, op Op, format string, args ...any) error {
		return fmt.Errorf("%w: rank %d op %d %v runs before %s", ErrInvalid, r, pc[r], op, fmt.Sprintf(format, args...))
	}
	// input reports whether the tensor a pass on rank r reads is there: the
	// pass fromIdx (a Forward for activations, a Backward for gradients) when
	// it ran on r, else the transfer msg.
	input := func(r, fromIdx int, kind OpKind, msg int) bool {
		if fromIdx%V%p == r {
			return done[int(kind-Forward)*n+fromIdx]
		}
		return arrived[msg]
	}
	// pre checks that a send's tensor exists.
	pre := func(r int, op Op) error {
		idx := op.MicroBatch*V + op.Chunk*p + r
		if op.Kind == SendAct && !done[idx] {
			return order(r, op, "the Forward that produces its activation")
		}
		if op.Kind == SendGrad && !done[n+idx] {
			return order(r, op, "the Backward that produces its gradient")
		}
		return nil
	}
	for len(queue) > 0 {
		r := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
	step:
		for pc[r] < len(ranks[r]) {
			op := ranks[r][pc[r]]
			vs := op.Chunk*p + r
			idx := op.MicroBatch*V + vs
			switch {
			case op.Kind == Forward:
				if vs > 0 && !input(r, idx-1, Forward, idx-1) {
					return order(r, op, "its input activation is received or computed")
				}
				done[idx] = true
			case op.Kind == Backward:
				if !done[idx] {
					return order(r, op, "its Forward")
				}
				if vs+1 < V && !input(r, idx+1, Backward, n+idx+1) {
					return order(r, op, "its output gradient is received or computed")
				}
				done[n+idx] = true
			case op.Kind == WeightGrad:
				if !done[n+idx] {
					return order(r, op, "its Backward")
				}
				done[2*n+idx] = true
			case op.Kind == OptimizerStep:
				if passes[r] != want {
					return order(r, op, "all of the rank's passes")
				}
			case op.Kind.IsSend():
				if err := pre(r, op); err != nil {
					return err
				}
				id := x.msgID(r, op)
				if !rendezvous {
					inbox[id] = true
					if q := op.Peer; pc[q] < len(ranks[q]) && ranks[q][pc[q]].Kind.IsRecv() && x.msgID(q, ranks[q][pc[q]]) == id {
						queue = append(queue, q)
					}
					break
				}
				q := op.Peer
				if pc[q] >= len(ranks[q]) || !ranks[q][pc[q]].Kind.IsRecv() || x.msgID(q, ranks[q][pc[q]]) != id {
					break step // wait for q to reach the receive
				}
				arrived[id] = true
				pc[q]++
				queue = append(queue, q)
			case op.Kind.IsRecv():
				id := x.msgID(r, op)
				if !rendezvous {
					if !inbox[id] {
						break step
					}
					arrived[id] = true
					break
				}
				q := op.Peer
				if pc[q] >= len(ranks[q]) || !ranks[q][pc[q]].Kind.IsSend() || x.msgID(q, ranks[q][pc[q]]) != id {
					break step // wait for q to reach the send
				}
				if err := pre(q, ranks[q][pc[q]]); err != nil {
					return err
				}
				arrived[id] = true
				pc[q]++
				queue = append(queue, q)
			}
			if op.Kind.IsCompute() {
				passes[r]++
			}
			pc[r]++
		}
	}
	return x.deadlock(pc)
}

// deadlock returns nil when every rank finished, else the wait cycle.
func (x *validator) deadlock(pc []int) error {
	ranks := x.s.Ranks
	first := -1
	for r := range x.p {
		if pc[r] < len(ranks[r]) {
			first = r
			break
		}
	}
	if first < 0 {
		return nil
	}
	// Every stuck rank is at a send or receive and waits for its peer;
	// follow the waits until a rank repeats.
	seen := map[int]int{}
	var path []string
	r := first
	for {
		if at, ok := seen[r]; ok {
			return fmt.Errorf("%w: cyclic wait: %s", ErrDeadlock, strings.Join(path[at:], "; "))
		}
		if pc[r] >= len(ranks[r]) {
			return fmt.Errorf("%w: %s; rank %d has finished", ErrDeadlock, strings.Join(path, "; "), r)
		}
		op := ranks[r][pc[r]]
		seen[r] = len(path)
		path = append(path, fmt.Sprintf("rank %d blocked at op %d %v", r, pc[r], op))
		r = op.Peer
	}
}
