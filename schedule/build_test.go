package schedule

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// shapes lists every (kind, p, m, v) the property tests below sweep.
func shapes() []struct {
	kind    Kind
	p, m, v int
} {
	var out []struct {
		kind    Kind
		p, m, v int
	}
	add := func(k Kind, p, m, v int) {
		out = append(out, struct {
			kind    Kind
			p, m, v int
		}{k, p, m, v})
	}
	for _, k := range []Kind{GPipe, OneFOneB, ZBH1} {
		for _, p := range []int{1, 2, 3, 4, 8} {
			for _, m := range []int{1, 2, 3, 4, 7, 8, 16} {
				add(k, p, m, 1)
			}
		}
	}
	for _, p := range []int{1, 2, 3, 4, 8} {
		for _, v := range []int{2, 3, 4} {
			for _, g := range []int{1, 2, 3} {
				add(Interleaved, p, g*p, v)
			}
		}
	}
	return out
}

func TestParseKind(t *testing.T) {
	tests := []struct {
		in      string
		want    Kind
		wantErr error
	}{
		{in: "gpipe", want: GPipe},
		{in: "1F1B", want: OneFOneB},
		{in: " interleaved ", want: Interleaved},
		{in: "ZB-H1", want: ZBH1},
		{in: "zbh1", wantErr: ErrUnknownKind},
		{in: "", wantErr: ErrUnknownKind},
		{in: "pipedream", wantErr: ErrUnknownKind},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseKind(tc.in)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ParseKind(%q) err = %v, want %v", tc.in, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("ParseKind(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if err != nil && !strings.Contains(err.Error(), "gpipe, 1f1b, interleaved, zb-h1") {
				t.Errorf("error %q does not list the valid kinds", err)
			}
		})
	}
}

func TestBuildRejects(t *testing.T) {
	tests := []struct {
		name    string
		kind    Kind
		p, m, v int
		wantErr error
		mention string // the error must name the offending value and rule
	}{
		{"unknown kind", "chimera", 4, 8, 1, ErrUnknownKind, `"chimera"`},
		{"zero stages", OneFOneB, 0, 8, 1, ErrBadShape, "stages 0"},
		{"negative micro-batches", GPipe, 4, -1, 1, ErrBadShape, "microbatches -1"},
		{"zero virtual", ZBH1, 4, 8, 0, ErrBadShape, "virtual 0"},
		{"virtual on 1f1b", OneFOneB, 4, 8, 2, ErrBadShape, "1f1b needs virtual 1, got 2"},
		{"virtual on zb-h1", ZBH1, 4, 8, 3, ErrBadShape, "zb-h1 needs virtual 1, got 3"},
		{"interleaved one chunk", Interleaved, 4, 8, 1, ErrBadShape, "virtual >= 2"},
		{"interleaved m not multiple of p", Interleaved, 4, 6, 2, ErrBadShape, "microbatches % stages == 0, got microbatches 6, stages 4"},
		{"too large", GPipe, 1 << 11, 1 << 11, 1, ErrBadShape, "MaxPasses"},
		{"overflowing", Interleaved, 2, 1 << 40, 1 << 40, ErrBadShape, "MaxPasses"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Build(tc.kind, tc.p, tc.m, tc.v)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Build err = %v, want %v", err, tc.wantErr)
			}
			if s != nil {
				t.Errorf("Build returned a schedule with an error")
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

// TestBuildValid checks every built schedule against Validate under both
// blocking and buffered sends, and the pass order the executor relies on.
func TestBuildValid(t *testing.T) {
	for _, sh := range shapes() {
		t.Run(fmt.Sprintf("%s/p%d_m%d_v%d", sh.kind, sh.p, sh.m, sh.v), func(t *testing.T) {
			s, err := Build(sh.kind, sh.p, sh.m, sh.v)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Validate(); err != nil {
				t.Fatalf("Validate (rendezvous): %v", err)
			}
			x, err := newValidator(s)
			if err != nil {
				t.Fatal(err)
			}
			if err := x.execute(false); err != nil {
				t.Fatalf("buffered execution: %v", err)
			}
			checkPassOrder(t, s)
		})
	}
}

// checkPassOrder checks, independently of Validate, that on every rank each
// (micro-batch, chunk) has one F, then one B, then (split schedules only) one
// W, that sends follow the pass producing their tensor and receives precede
// the pass consuming theirs.
func checkPassOrder(t *testing.T, s *Schedule) {
	t.Helper()
	type key struct{ mb, chunk int }
	for r, ops := range s.Ranks {
		pos := map[OpKind]map[key]int{}
		for k, op := range ops {
			if pos[op.Kind] == nil {
				pos[op.Kind] = map[key]int{}
			}
			kk := key{op.MicroBatch, op.Chunk}
			if _, dup := pos[op.Kind][kk]; dup {
				t.Fatalf("rank %d: %v twice", r, op)
			}
			pos[op.Kind][kk] = k
		}
		for mb := range s.MicroBatches {
			for c := range s.Virtual {
				kk := key{mb, c}
				f, okF := pos[Forward][kk]
				b, okB := pos[Backward][kk]
				if !okF || !okB || f > b {
					t.Errorf("rank %d mb %d chunk %d: F at %d (%v), B at %d (%v): want F before B", r, mb, c, f, okF, b, okB)
				}
				w, okW := pos[WeightGrad][kk]
				if okW != s.Kind.SplitBackward() || (okW && w < b) {
					t.Errorf("rank %d mb %d chunk %d: W at %d (present %v), B at %d", r, mb, c, w, okW, b)
				}
				if k, ok := pos[SendAct][kk]; ok && k < f {
					t.Errorf("rank %d: SendAct of mb %d chunk %d at %d before its F at %d", r, mb, c, k, f)
				}
				if k, ok := pos[SendGrad][kk]; ok && k < b {
					t.Errorf("rank %d: SendGrad of mb %d chunk %d at %d before its B at %d", r, mb, c, k, b)
				}
				if k, ok := pos[RecvAct][kk]; ok && k > f {
					t.Errorf("rank %d: RecvAct of mb %d chunk %d at %d after its F at %d", r, mb, c, k, f)
				}
				if k, ok := pos[RecvGrad][kk]; ok && k > b {
					t.Errorf("rank %d: RecvGrad of mb %d chunk %d at %d after its B at %d", r, mb, c, k, b)
				}
			}
		}
	}
}

// TestOneFOneBOps pins the op lists of a small 1F1B schedule, worked out by
// hand from the unit-cost timeline Build uses (F=1, B=2): rank 1 posts the
// receive of micro-batch k+1's activation before it sends micro-batch k's
// gradient, in the same order rank 0 sends activation k+1 before it receives
// gradient k. The naive order (send gradient k, then receive activation k+1)
// deadlocks with blocking sends; TestValidateRejects checks that Validate
// catches it.
func TestOneFOneBOps(t *testing.T) {
	s, err := Build(OneFOneB, 2, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := `rank 0: F(mb=0,c=0) SendAct(mb=0,c=0 -> rank 1 c=0) F(mb=1,c=0) SendAct(mb=1,c=0 -> rank 1 c=0) RecvGrad(mb=0,c=0 <- rank 1 c=0) B(mb=0,c=0) F(mb=2,c=0) SendAct(mb=2,c=0 -> rank 1 c=0) RecvGrad(mb=1,c=0 <- rank 1 c=0) B(mb=1,c=0) RecvGrad(mb=2,c=0 <- rank 1 c=0) B(mb=2,c=0) OptimizerStep
rank 1: RecvAct(mb=0,c=0 <- rank 0 c=0) F(mb=0,c=0) RecvAct(mb=1,c=0 <- rank 0 c=0) B(mb=0,c=0) SendGrad(mb=0,c=0 -> rank 0 c=0) F(mb=1,c=0) B(mb=1,c=0) RecvAct(mb=2,c=0 <- rank 0 c=0) SendGrad(mb=1,c=0 -> rank 0 c=0) F(mb=2,c=0) B(mb=2,c=0) SendGrad(mb=2,c=0 -> rank 0 c=0) OptimizerStep
`
	if got := s.String(); got != want {
		t.Errorf("op lists:\n%s\nwant:\n%s", got, want)
	}
}

// TestInterleavedOrder checks the chunk order against Megatron-LM's schedule
// table, worked out by hand for p=2, m=4, v=2 on rank 0: warm-up
// (2-0-1)*2 + (2-1)*2 = 4 forwards over micro-batches 0,1 of chunk 0 then
// chunk 1, then 1F1B pairs; backwards run chunk 1 before chunk 0.
func TestInterleavedOrder(t *testing.T) {
	s, err := Build(Interleaved, 2, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range s.Ranks[0] {
		if op.Kind.IsCompute() {
			got = append(got, fmt.Sprintf("%c%d.%d", kindLetter(op.Kind), op.MicroBatch, op.Chunk))
		}
	}
	want := "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("rank 0 passes:\n got %s\nwant %s", g, want)
	}
}
