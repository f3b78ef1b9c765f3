package sharding

import (
	"errors"
	"fmt"
	"testing"
)

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

// TestStagePredicates checks the predicates against Rajbhandari et al. 2020,
// Sec. 5: P_os shards the optimizer state, P_os+g also the gradients,
// P_os+g+p also the parameters; a stage outside 0-3 shards nothing.
func TestStagePredicates(t *testing.T) {
	tests := []struct {
		stage                   Stage
		optimizer, grads, param bool
	}{
		{Stage0, false, false, false},
		{Stage1, true, false, false},
		{Stage2, true, true, false},
		{Stage3, true, true, true},
		{Stage(-1), false, false, false},
		{Stage(4), false, false, false},
	}
	for _, tc := range tests {
		got := [3]bool{tc.stage.ShardsOptimizer(), tc.stage.ShardsGradients(), tc.stage.ShardsParams()}
		if want := [3]bool{tc.optimizer, tc.grads, tc.param}; got != want {
			t.Errorf("stage %d: shards optimizer, grads, params = %v, want %v", int(tc.stage), got, want)
		}
	}
}
