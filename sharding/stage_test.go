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
