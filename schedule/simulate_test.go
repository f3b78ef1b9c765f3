package schedule

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

const eps = 1e-9

func mustSimulate(t testing.TB, kind Kind, p, m, v int, c Costs) Result {
	t.Helper()
	s, err := Build(kind, p, m, v)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBubble checks the bubble against Narayanan et al. 2021: (p-1)/m for
// GPipe and 1F1B, (p-1)/(v*m) for interleaved 1F1B, for any F and B with no
// weight-gradient split and no communication cost, and the makespan against
// the same formula, (m+p-1)(F+B) without interleaving.
func TestBubble(t *testing.T) {
	tests := []struct {
		kind    Kind
		p, m, v int
	}{
		{GPipe, 1, 4, 1}, {GPipe, 2, 1, 1}, {GPipe, 4, 8, 1}, {GPipe, 8, 3, 1}, {GPipe, 8, 64, 1},
		{OneFOneB, 1, 4, 1}, {OneFOneB, 2, 2, 1}, {OneFOneB, 4, 4, 1}, {OneFOneB, 4, 8, 1},
		{OneFOneB, 4, 2, 1}, {OneFOneB, 8, 32, 1}, {OneFOneB, 16, 5, 1},
		{Interleaved, 2, 2, 2}, {Interleaved, 2, 4, 4}, {Interleaved, 4, 8, 2}, {Interleaved, 4, 4, 2},
		{Interleaved, 4, 12, 3}, {Interleaved, 8, 16, 4}, {Interleaved, 8, 64, 2}, {Interleaved, 3, 9, 3},
	}
	for _, c := range []Costs{{F: 1, B: 1}, {F: 1, B: 2}, {F: 0.5, B: 1.25}} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/p%d_m%d_v%d/F%g_B%g", tc.kind, tc.p, tc.m, tc.v, c.F, c.B), func(t *testing.T) {
				res := mustSimulate(t, tc.kind, tc.p, tc.m, tc.v, c)
				want := float64(tc.p-1) / float64(tc.m*tc.v)
				if math.Abs(res.BubbleFraction-want) > eps {
					t.Errorf("bubble = %v, want (p-1)/(v*m) = %v", res.BubbleFraction, want)
				}
				wantSpan := float64(tc.m*tc.v)*(c.F+c.B) + float64(tc.p-1)*(c.F+c.B)
				if math.Abs(res.Makespan-wantSpan) > eps {
					t.Errorf("makespan = %v, want %v", res.Makespan, wantSpan)
				}
				for r, busy := range res.Busy {
					if math.Abs(busy-res.Ideal) > eps {
						t.Errorf("rank %d busy %v, want ideal %v", r, busy, res.Ideal)
					}
				}
			})
		}
	}
}

// TestGPipeComm checks the communication latency against the closed form: the
// last forward leaves rank 0 at m*F and crosses p-1 hops of F+Comm, then the
// backward wave does the same: makespan = (m+p-1)(F+B) + 2(p-1)Comm.
func TestGPipeComm(t *testing.T) {
	for _, tc := range []struct{ p, m int }{{2, 4}, {4, 8}, {8, 3}} {
		c := Costs{F: 1, B: 2, Comm: 0.25}
		res := mustSimulate(t, GPipe, tc.p, tc.m, 1, c)
		want := float64(tc.m+tc.p-1)*(c.F+c.B) + 2*float64(tc.p-1)*c.Comm
		if math.Abs(res.Makespan-want) > eps {
			t.Errorf("p=%d m=%d: makespan %v, want %v", tc.p, tc.m, res.Makespan, want)
		}
	}
}

// TestPeakInFlight checks the activations each rank holds at its peak:
// GPipe m, 1F1B and ZB-H1 min(p-r, m) (Megatron's p-r-1 warm-up forwards plus
// one), interleaved min(m*v, 2(p-r-1) + (v-1)p + 1) (Megatron's warm-up count
// plus one). ZB-H1's W passes lag their B passes by r steps, so rank r has at
// most min(r+1, ...) weight gradients pending.
func TestPeakInFlight(t *testing.T) {
	for _, sh := range shapes() {
		t.Run(fmt.Sprintf("%s/p%d_m%d_v%d", sh.kind, sh.p, sh.m, sh.v), func(t *testing.T) {
			s, err := Build(sh.kind, sh.p, sh.m, sh.v)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Simulate(s, Costs{F: 1, B: 1, W: 1})
			if err != nil {
				t.Fatal(err)
			}
			for r := range sh.p {
				var want int
				switch sh.kind {
				case GPipe:
					want = sh.m
				case OneFOneB, ZBH1:
					want = min(sh.p-r, sh.m)
				case Interleaved:
					want = min(sh.m*sh.v, 2*(sh.p-r-1)+(sh.v-1)*sh.p+1)
				}
				if got := res.PeakInFlight[r]; got != want {
					t.Errorf("rank %d: peak in-flight %d, want %d", r, got, want)
				}
				wantW := 0
				if sh.kind == ZBH1 {
					wantW = min(r+1, sh.m)
				}
				if got := res.PeakPendingW[r]; got != wantW {
					t.Errorf("rank %d: peak pending W %d, want %d", r, got, wantW)
				}
			}
			if got := s.PeakInFlight(); fmt.Sprint(got) != fmt.Sprint(res.PeakInFlight) {
				t.Errorf("Schedule.PeakInFlight %v != Result.PeakInFlight %v", got, res.PeakInFlight)
			}
		})
	}
}

// TestZBH1 checks ZB-H1 against Qi et al. 2023: its makespan is
// m(F+B+W) + (p-1)(F+B-W) when W <= min(F, B) and m >= p, so with F=B=W its
// bubble is a third of 1F1B's; and with any costs it is never worse than
// 1F1B given the same total backward time.
func TestZBH1(t *testing.T) {
	costs := []Costs{
		{F: 1, B: 1, W: 1}, {F: 2, B: 2, W: 1}, {F: 1, B: 2, W: 1}, {F: 2, B: 1, W: 1}, {F: 1, B: 1, W: 0.5},
		{F: 1, B: 1, W: 2}, {F: 1, B: 2, W: 2}, {F: 1, B: 1, W: 1, Comm: 0.5}, {F: 3, B: 2, W: 1, Comm: 0.1},
	}
	for _, c := range costs {
		for _, pm := range [][2]int{{2, 2}, {2, 8}, {4, 4}, {4, 8}, {8, 8}, {8, 32}, {6, 3}} {
			p, m := pm[0], pm[1]
			t.Run(fmt.Sprintf("p%d_m%d/F%g_B%g_W%g_C%g", p, m, c.F, c.B, c.W, c.Comm), func(t *testing.T) {
				zb := mustSimulate(t, ZBH1, p, m, 1, c)
				ob := mustSimulate(t, OneFOneB, p, m, 1, c)
				if zb.Makespan >= ob.Makespan {
					t.Errorf("zb-h1 makespan %v not below 1f1b %v", zb.Makespan, ob.Makespan)
				}
				if c.Comm == 0 && c.W <= min(c.F, c.B) && m >= p {
					want := float64(m)*(c.F+c.B+c.W) + float64(p-1)*(c.F+c.B-c.W)
					if math.Abs(zb.Makespan-want) > eps {
						t.Errorf("zb-h1 makespan %v, want m(F+B+W)+(p-1)(F+B-W) = %v", zb.Makespan, want)
					}
				}
				if c.Comm == 0 && c.F == c.B && c.B == c.W && m >= p {
					if math.Abs(3*zb.BubbleFraction-ob.BubbleFraction) > eps {
						t.Errorf("zb-h1 bubble %v, want a third of 1f1b's %v", zb.BubbleFraction, ob.BubbleFraction)
					}
				}
				for r := range p {
					if zb.PeakInFlight[r] != ob.PeakInFlight[r] {
						t.Errorf("rank %d: zb-h1 peak %d != 1f1b peak %d", r, zb.PeakInFlight[r], ob.PeakInFlight[r])
					}
				}
			})
		}
	}
}

// naiveTimeline is the reference simulator: integer costs, one clock tick at
// a time, every idle rank starts its next pass as soon as the tensors it
// reads exist (comm ticks after they were produced on another rank).
func naiveTimeline(s *Schedule, f, b, w, comm int) [][]Span {
	type pass struct {
		kind   OpKind
		mb, vs int
	}
	end := map[pass]int{}
	p := s.Stages
	V := p * s.Virtual
	ops := make([][]Op, p)
	for r := range p {
		for _, op := range s.Ranks[r] {
			if op.Kind.IsCompute() {
				ops[r] = append(ops[r], op)
			}
		}
	}
	dur := map[OpKind]int{Forward: f, Backward: b + w}
	if s.Kind.SplitBackward() {
		dur[Backward], dur[WeightGrad] = b, w
	}
	out := make([][]Span, p)
	busy := make([]int, p)
	next := make([]int, p)
	// ready reports whether pass q produced on rank from is usable on rank r
	// at tick t.
	ready := func(q pass, r, t int) bool {
		e, ok := end[q]
		if !ok {
			return false
		}
		if q.vs%p != r {
			e += comm
		}
		return e <= t
	}
	left := 0
	for r := range p {
		left += len(ops[r])
	}
	for t := 0; left > 0; t++ {
		for r := range p {
			// A zero-length pass (W when W=0) frees the rank in the same
			// tick, so keep going while the rank is idle.
			for busy[r] <= t && next[r] < len(ops[r]) {
				op := ops[r][next[r]]
				vs := op.Chunk*p + r
				var deps []pass
				switch op.Kind {
				case Forward:
					if vs > 0 {
						deps = append(deps, pass{Forward, op.MicroBatch, vs - 1})
					}
				case Backward:
					deps = append(deps, pass{Forward, op.MicroBatch, vs})
					if vs < V-1 {
						deps = append(deps, pass{Backward, op.MicroBatch, vs + 1})
					}
				case WeightGrad:
					deps = append(deps, pass{Backward, op.MicroBatch, vs})
				}
				ok := true
				for _, d := range deps {
					ok = ok && ready(d, r, t)
				}
				if !ok {
					break
				}
				e := t + dur[op.Kind]
				end[pass{op.Kind, op.MicroBatch, vs}] = e
				out[r] = append(out[r], Span{Kind: op.Kind, MicroBatch: op.MicroBatch, Chunk: op.Chunk, Start: float64(t), End: float64(e)})
				busy[r] = e
				next[r]++
				left--
			}
		}
	}
	return out
}

// TestSimulateMatchesNaive compares every span Simulate places with the
// tick-by-tick reference, for every kind and shape in the sweep.
func TestSimulateMatchesNaive(t *testing.T) {
	for _, c := range [][4]int{{1, 1, 0, 0}, {2, 3, 1, 1}, {1, 2, 2, 3}} {
		for _, sh := range shapes() {
			t.Run(fmt.Sprintf("%s/p%d_m%d_v%d/%v", sh.kind, sh.p, sh.m, sh.v, c), func(t *testing.T) {
				s, err := Build(sh.kind, sh.p, sh.m, sh.v)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Simulate(s, Costs{F: float64(c[0]), B: float64(c[1]), W: float64(c[2]), Comm: float64(c[3])})
				if err != nil {
					t.Fatal(err)
				}
				want := naiveTimeline(s, c[0], c[1], c[2], c[3])
				for r := range want {
					if len(res.Timeline[r]) != len(want[r]) {
						t.Fatalf("rank %d: %d spans, want %d", r, len(res.Timeline[r]), len(want[r]))
					}
					for k := range want[r] {
						if res.Timeline[r][k] != want[r][k] {
							t.Fatalf("rank %d span %d: %+v, want %+v", r, k, res.Timeline[r][k], want[r][k])
						}
					}
				}
			})
		}
	}
}

func TestSimulateRejects(t *testing.T) {
	good, err := Build(OneFOneB, 2, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	noB, _ := Build(OneFOneB, 2, 2, 1)
	noB.Ranks[1][find(t, noB, 1, Backward, 1)] = compute(Forward, 1, 0) // F twice, no B
	early, _ := Build(OneFOneB, 2, 2, 1)
	f, b := find(t, early, 1, Forward, 0), find(t, early, 1, Backward, 0)
	early.Ranks[1][f], early.Ranks[1][b] = early.Ranks[1][b], early.Ranks[1][f]
	oob, _ := Build(GPipe, 2, 2, 1)
	oob.Ranks[0][0].Chunk = 1
	tests := []struct {
		name    string
		s       *Schedule
		c       Costs
		wantErr error
		mention string
	}{
		{"zero forward", good, Costs{F: 0, B: 1}, ErrBadCosts, "F = 0 must be > 0"},
		{"negative W", good, Costs{F: 1, B: 1, W: -1}, ErrBadCosts, "W = -1 must be >= 0"},
		{"NaN comm", good, Costs{F: 1, B: 1, Comm: math.NaN()}, ErrBadCosts, "Comm = NaN is not a finite number"},
		{"infinite B", good, Costs{F: 1, B: math.Inf(1)}, ErrBadCosts, "B = +Inf"},
		{"nil schedule", nil, Costs{F: 1, B: 1}, ErrInvalid, "nil schedule"},
		{"missing backward", noB, Costs{F: 1, B: 1}, ErrInvalid, "never produced"},
		{"backward before forward", early, Costs{F: 1, B: 1}, ErrInvalid, "rank 1 at op 1 B(mb=0,c=0)"},
		{"chunk out of range", oob, Costs{F: 1, B: 1}, ErrInvalid, "out of range"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Simulate(tc.s, tc.c)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

// TestPeakHeld: without a split backward PeakHeld is PeakInFlight; for ZB-H1
// it counts a pass until its WeightGrad, which on rank r of p is at most
// p - r + r = p passes (1F1B's stage-0 peak) and at least PeakInFlight.
func TestPeakHeld(t *testing.T) {
	for _, k := range []Kind{GPipe, OneFOneB, ZBH1} {
		for _, pm := range [][2]int{{4, 8}, {4, 16}, {8, 8}, {2, 1}} {
			s, err := Build(k, pm[0], pm[1], 1)
			if err != nil {
				t.Fatal(err)
			}
			held, in := s.PeakHeld(), s.PeakInFlight()
			for r := range held {
				switch {
				case k != ZBH1 && held[r] != in[r]:
					t.Errorf("%s p=%d m=%d rank %d: held %d != in flight %d", k, pm[0], pm[1], r, held[r], in[r])
				case k == ZBH1 && (held[r] < in[r] || held[r] > min(pm[0], pm[1])):
					t.Errorf("zb-h1 p=%d m=%d rank %d: held %d, want in [%d, %d]", pm[0], pm[1], r, held[r], in[r], min(pm[0], pm[1]))
				}
			}
		}
	}
}
