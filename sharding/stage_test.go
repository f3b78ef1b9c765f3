package sharding

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// TestStageMemoryZeROFigure1 checks the ZeRO paper's Figure 1 (Rajbhandari
// et al. 2020): 7.5B parameters, N_d = 64, K = 12, GB = 1e9 bytes.
func TestStageMemoryZeROFigure1(t *testing.T) {
	const psi = 7_500_000_000
	tests := []struct {
		stage  Stage
		wantGB string  // as the figure prints it
		want   float64 // exact: (2+2+K)psi, 4psi+K psi/Nd, 2psi+(2+K)psi/Nd, (2+2+K)psi/Nd
	}{
		{Stage0, "120.0", 120e9},
		{Stage1, "31.4", 31.40625e9},
		{Stage2, "16.6", 16.640625e9},
		{Stage3, "1.9", 1.875e9},
	}
	for _, tc := range tests {
		t.Run(tc.stage.String(), func(t *testing.T) {
			m, err := StageMemory(psi, 64, tc.stage, MixedPrecisionAdam())
			if err != nil {
				t.Fatal(err)
			}
			if float64(m.Total()) != tc.want {
				t.Errorf("total = %d bytes, want %.0f", m.Total(), tc.want)
			}
			if got := fmt.Sprintf("%.1f", float64(m.Total())/1e9); got != tc.wantGB {
				t.Errorf("total = %s GB, want %s GB", got, tc.wantGB)
			}
		})
	}
}

func TestStageMemoryParts(t *testing.T) {
	tests := []struct {
		name   string
		params int64
		d      int
		stage  Stage
		prec   Precision
		want   Memory
	}{
		// 10 params over 4 ranks: the largest block holds ceil(10/4) = 3.
		{"stage 0 float32", 10, 4, Stage0, Float32Adam(), Memory{40, 40, 80}},
		{"stage 1 float32", 10, 4, Stage1, Float32Adam(), Memory{40, 40, 24}},
		{"stage 2 float32", 10, 4, Stage2, Float32Adam(), Memory{40, 12, 24}},
		{"stage 3 float32", 10, 4, Stage3, Float32Adam(), Memory{12, 12, 24}},
		{"stage 3 one rank is stage 0", 10, 1, Stage3, MixedPrecisionAdam(), Memory{20, 20, 120}},
		{"no parameters", 0, 8, Stage2, MixedPrecisionAdam(), Memory{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StageMemory(tc.params, tc.d, tc.stage, tc.prec)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("StageMemory = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestStageMemoryErrors(t *testing.T) {
	tests := []struct {
		name   string
		params int64
		d      int
		stage  Stage
		prec   Precision
	}{
		{"stage 4", 10, 2, Stage(4), MixedPrecisionAdam()},
		{"stage -1", 10, 2, Stage(-1), MixedPrecisionAdam()},
		{"negative params", -1, 2, Stage1, MixedPrecisionAdam()},
		{"degree 0", 10, 0, Stage1, MixedPrecisionAdam()},
		{"negative bytes", 10, 2, Stage1, Precision{2, -2, 12}},
		{"one part overflows", math.MaxInt64 / 2, 1, Stage0, MixedPrecisionAdam()},
		{"total overflows", math.MaxInt64 / 13, 1, Stage0, MixedPrecisionAdam()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := StageMemory(tc.params, tc.d, tc.stage, tc.prec); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestStageSpec(t *testing.T) {
	tests := []struct {
		stage Stage
		want  string
	}{
		{Stage0, "params replicated, grads replicated, optimizer replicated, all-reduce, gather none"},
		{Stage1, "params replicated, grads replicated, optimizer sharded, reduce-scatter, gather after-step"},
		{Stage2, "params replicated, grads sharded, optimizer sharded, reduce-scatter, gather after-step"},
		{Stage3, "params sharded, grads sharded, optimizer sharded, reduce-scatter, gather before-use"},
	}
	for _, tc := range tests {
		t.Run(tc.stage.String(), func(t *testing.T) {
			s, err := tc.stage.Spec()
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("params %s, grads %s, optimizer %s, %s, gather %s", s.Params, s.Grads, s.OptState, s.GradSync, s.Gather)
			if got != tc.want {
				t.Errorf("Spec = %s, want %s", got, tc.want)
			}
		})
	}
	if _, err := Stage(7).Spec(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Stage(7).Spec err = %v, want ErrInvalid", err)
	}
}
