package topology

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
)

// TestNewShapeLayout: valid shapes come back resolved. The numbers are
// worked by hand: dp = world / (tp*pp), micro-batches per replica =
// global / (micro*dp), virtual 0 is 2 when interleaved and 1 otherwise.
func TestNewShapeLayout(t *testing.T) {
	tests := []struct {
		name  string
		world int
		spec  ShapeSpec
		// want: resolved dp, virtual stages, schedule and micro-batches
		// per replica.
		dp, virtual, mbs int
		kind             schedule.Kind
	}{
		{name: "program, dp derived: 8/(2*2)", world: 8, dp: 2, virtual: 1, mbs: 0,
			spec: ShapeSpec{TP: 2, PP: 2}},
		{name: "dp given and right: 2*4*2 = 16, 64/(2*2) = 16 micro-batches, 16 % 4 == 0", world: 16, dp: 2, virtual: 2, mbs: 16, kind: schedule.Interleaved,
			spec: ShapeSpec{TP: 2, PP: 4, DP: 2, GlobalBatch: 64, MicroBatch: 2, Schedule: schedule.Interleaved}},
		{name: "1f1b: 12/(1*3) = 4, 24/(2*4) = 3 micro-batches", world: 12, dp: 4, virtual: 1, mbs: 3, kind: schedule.OneFOneB,
			spec: ShapeSpec{TP: 1, PP: 3, GlobalBatch: 24, MicroBatch: 2, Schedule: schedule.OneFOneB}},
		{name: "interleaved, 3 chunks: 8/(1*2) = 4, 32/(1*4) = 8, 8 % 2 == 0", world: 8, dp: 4, virtual: 3, mbs: 8, kind: schedule.Interleaved,
			spec: ShapeSpec{TP: 1, PP: 2, GlobalBatch: 32, MicroBatch: 1, Schedule: schedule.Interleaved, Virtual: 3}},
		{name: "schedule in any case: ZB-H1, 4/(1*4) = 1, 4/(1*1) = 4", world: 4, dp: 1, virtual: 1, mbs: 4, kind: schedule.ZBH1,
			spec: ShapeSpec{TP: 1, PP: 4, GlobalBatch: 4, MicroBatch: 1, Schedule: "ZB-H1"}},
		{name: "one rank, gpipe", world: 1, dp: 1, virtual: 1, mbs: 1, kind: schedule.GPipe,
			spec: ShapeSpec{TP: 1, PP: 1, GlobalBatch: 3, MicroBatch: 3, Schedule: schedule.GPipe}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sh, err := NewShape(tc.world, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if sh.TP != tc.spec.TP || sh.PP != tc.spec.PP || sh.DP != tc.dp || sh.World() != tc.world {
				t.Errorf("tp %d pp %d dp %d (world %d), want tp %d pp %d dp %d (world %d)",
					sh.TP, sh.PP, sh.DP, sh.World(), tc.spec.TP, tc.spec.PP, tc.dp, tc.world)
			}
			if sh.Virtual != tc.virtual || sh.Schedule != tc.kind || sh.Microbatches() != tc.mbs {
				t.Errorf("virtual %d, schedule %q, %d micro-batches; want %d, %q, %d",
					sh.Virtual, sh.Schedule, sh.Microbatches(), tc.virtual, tc.kind, tc.mbs)
			}
		})
	}
}

// TestNewShapeOrder: the layout is laid out in the order given. With
// dp-tp-pp on tp 2, pp 1, dp 3, dp varies fastest: rank 1 is dp 1, rank 3
// is tp 1, dp 0.
func TestNewShapeOrder(t *testing.T) {
	sh, err := NewShape(6, ShapeSpec{TP: 2, PP: 1, Order: "dp-tp-pp"})
	if err != nil {
		t.Fatal(err)
	}
	if got := sh.Coord(1); got != (Coord{TP: 0, PP: 0, DP: 1}) {
		t.Errorf("rank 1 at %+v, want dp 1", got)
	}
	if got := sh.Coord(3); got != (Coord{TP: 1, PP: 0, DP: 0}) {
		t.Errorf("rank 3 at %+v, want tp 1", got)
	}
}

// TestNewShapeValidates: each rule refuses with ErrInvalid, in one line
// that names the values and the rule.
func TestNewShapeValidates(t *testing.T) {
	tests := []struct {
		name    string
		world   int
		spec    ShapeSpec
		want    string
		wantErr error // besides ErrInvalid; nil for none
	}{
		{"tp 0", 8, ShapeSpec{TP: 0, PP: 1}, "tp 0: must be at least 1", nil},
		{"pp negative", 8, ShapeSpec{TP: 1, PP: -1}, "pp -1: must be at least 1", nil},
		{"dp negative", 8, ShapeSpec{TP: 1, PP: 1, DP: -2}, "dp -2: must not be negative", nil},
		{"no ranks", 0, ShapeSpec{TP: 1, PP: 1}, "world size 0: want at least 1 rank", nil},
		{"6 % (4*1) = 2", 6, ShapeSpec{TP: 4, PP: 1}, "world size 6 is not divisible by tp*pp = 4 (tp 4 x pp 1)", nil},
		{"world named by the caller", 6, ShapeSpec{TP: 2, PP: 2, WorldName: "np 6"}, "np 6 is not divisible by tp*pp = 4 (tp 2 x pp 2)", nil},
		{"tp above the world", 8, ShapeSpec{TP: 16, PP: 1}, "world size 8 is not divisible by tp*pp = 16", nil},
		{"2*2*3 = 12, not 8", 8, ShapeSpec{TP: 2, PP: 2, DP: 3}, "dp 3: tp*pp*dp = 12 must equal the world size 8", nil},
		{"unknown schedule", 8, ShapeSpec{TP: 1, PP: 2, Schedule: "2f2b"}, `unknown schedule kind "2f2b"`, schedule.ErrUnknownKind},
		{"vpp negative", 8, ShapeSpec{TP: 1, PP: 2, Schedule: schedule.Interleaved, Virtual: -1}, "vpp -1: must not be negative", nil},
		{"vpp on 1f1b", 8, ShapeSpec{TP: 1, PP: 2, Schedule: schedule.OneFOneB, Virtual: 2},
			"vpp 2: virtual pipeline stages need --schedule interleaved (schedule is 1f1b)", nil},
		{"vpp without a schedule", 8, ShapeSpec{TP: 1, PP: 2, Virtual: 2},
			"vpp 2: virtual pipeline stages need --schedule interleaved (schedule is none)", nil},
		{"interleaved on one stage", 8, ShapeSpec{TP: 1, PP: 1, Schedule: schedule.Interleaved},
			"schedule interleaved needs pp of at least 2 (pp is 1)", nil},
		{"negative batch", 8, ShapeSpec{TP: 1, PP: 1, GlobalBatch: -8, MicroBatch: 1},
			"global batch -8 and micro-batch 1: must not be negative", nil},
		{"no micro-batch", 8, ShapeSpec{TP: 1, PP: 1, GlobalBatch: 8},
			"global batch 8 needs a micro-batch of at least 1 (micro-batch is 0)", nil},
		{"7 < 2*8", 8, ShapeSpec{TP: 1, PP: 1, GlobalBatch: 7, MicroBatch: 2},
			"global batch 7 is not divisible by micro-batch*dp = 16 (micro-batch 2 x dp 8)", nil},
		{"30 % (2*2) = 2", 8, ShapeSpec{TP: 2, PP: 2, GlobalBatch: 30, MicroBatch: 2},
			"global batch 30 is not divisible by micro-batch*dp = 4 (micro-batch 2 x dp 2)", nil},
		{"interleaved: 24/(2*2) = 6, 6 % 4 = 2", 16, ShapeSpec{TP: 2, PP: 4, GlobalBatch: 24, MicroBatch: 2, Schedule: schedule.Interleaved},
			"interleaved schedule: 6 micro-batches per replica (global batch 24 / (micro-batch 2 x dp 2)) is not a multiple of pp 4", nil},
		{"interleaved with one chunk", 4, ShapeSpec{TP: 1, PP: 2, GlobalBatch: 8, MicroBatch: 1, Schedule: schedule.Interleaved, Virtual: 1},
			"interleaved needs virtual >= 2", schedule.ErrBadShape},
		{"2 stages x 2^21 micro-batches > MaxPasses", 2, ShapeSpec{TP: 1, PP: 2, GlobalBatch: 1 << 21, MicroBatch: 1, Schedule: schedule.GPipe},
			"exceeds MaxPasses", schedule.ErrBadShape},
		{"bad order", 8, ShapeSpec{TP: 2, PP: 2, Order: "tp-xx-pp"}, `order "tp-xx-pp"`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewShape(tc.world, tc.spec)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("err = %v, want it to wrap %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %q, want one line with %q", err, tc.want)
			}
		})
	}
}
