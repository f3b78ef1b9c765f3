package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/schedule"
)

// TestNewConfigValidates: NewConfig resolves a shape with topology.NewShape
// and refuses what it refuses, with ErrInvalidJob. tinyJob has hidden 8,
// blocks 4 and a global batch of 16 in micro-batches of 2.
func TestNewConfigValidates(t *testing.T) {
	tests := []struct {
		name        string
		shape       Shape
		dp, virtual int
		kind        schedule.Kind
		want        string // the error, "" for none
	}{
		{name: "np 8 = 2*2*dp: dp 2", shape: Shape{NP: 8, TP: 2, PP: 2}, dp: 2, virtual: 1, kind: schedule.OneFOneB},
		{name: "no np: dp 1", shape: Shape{TP: 2, PP: 2}, dp: 1, virtual: 1, kind: schedule.OneFOneB},
		{name: "interleaved: 2 chunks, 16/(2*2) = 4 micro-batches", shape: Shape{NP: 4, TP: 1, PP: 2, Schedule: schedule.Interleaved},
			dp: 2, virtual: 2, kind: schedule.Interleaved},
		{name: "np 3 % 2", shape: Shape{NP: 3, TP: 2, PP: 1}, want: "np 3 is not divisible by tp*pp = 2 (tp 2 x pp 1)"},
		{name: "2*2*3 = 12, not 8", shape: Shape{NP: 8, TP: 2, PP: 2, DP: 3}, want: "dp 3: tp*pp*dp = 12 must equal the world size 8"},
		{name: "16 % (2*16)", shape: Shape{NP: 16, TP: 1, PP: 1}, want: "global batch 16 is not divisible by micro-batch*dp = 32"},
		{name: "interleaved: 16/(2*2) = 4, 4 % 3 = 1", shape: Shape{NP: 6, TP: 1, PP: 3, Schedule: schedule.Interleaved},
			want: "interleaved schedule: 4 micro-batches per replica"},
		{name: "interleaved on one stage", shape: Shape{TP: 1, PP: 1, Schedule: schedule.Interleaved}, want: "schedule interleaved needs pp of at least 2"},
		{name: "8 % 3: the model's rule", shape: Shape{TP: 3, PP: 1}, want: "model.hidden 8 is not divisible by tp 3"},
		{name: "ZeRO stage 4", shape: Shape{TP: 1, PP: 1, Zero: 4}, want: "ZeRO stage 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := NewConfig(tinyJob(LossCrossEntropy), tc.shape)
			if tc.want != "" {
				if !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("err = %v, want ErrInvalidJob with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.DP != tc.dp || cfg.Virtual != tc.virtual || cfg.Schedule != tc.kind {
				t.Errorf("dp %d, %d virtual stages, %s; want dp %d, %d, %s", cfg.DP, cfg.Virtual, cfg.Schedule, tc.dp, tc.virtual, tc.kind)
			}
		})
	}

	// A Config made by hand holds resolved values.
	cfg := DefaultConfig(tinyJob(LossCrossEntropy))
	cfg.DP = 0
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), "dp 0 and virtual stages 1 must be at least 1") {
		t.Errorf("dp 0: err = %v", err)
	}
}
