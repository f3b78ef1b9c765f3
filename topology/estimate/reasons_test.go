package estimate

import (
	"slices"
	"strings"
	"testing"

	"gpucoord/topology"
)

// TestRemediesFollowStage checks that the ZeRO remedies come from the
// stage's semantics: --zero 1 is offered for the optimizer state only when
// it is not sharded yet (stage 0), --zero 2 for gradients below stage 2,
// --zero 3 for parameters below stage 3, and none with a single replica.
func TestRemediesFollowStage(t *testing.T) {
	tests := []struct {
		zero, dp              int
		optimizer, grads, prm string // the --zero tip offered, "" for none
	}{
		{0, 8, "--zero 1", "--zero 2", "--zero 3"},
		{1, 8, "", "--zero 2", "--zero 3"},
		{2, 8, "", "", "--zero 3"},
		{3, 8, "", "", ""},
		{0, 1, "", "", ""},
	}
	for _, tc := range tests {
		p := plan(t, "dgx-h100", "gpt-13b", func(c *topology.Config) { c.TP, c.Zero, c.DP = 8/tc.dp, tc.zero, tc.dp })
		for _, part := range []struct{ name, want string }{{"optimizer", tc.optimizer}, {"grads", tc.grads}, {"params", tc.prm}} {
			tips := remedies(p, part.name)
			var got string
			for _, tip := range tips {
				if strings.HasPrefix(tip, "--zero ") {
					got = tip
				}
			}
			if got != part.want {
				t.Errorf("zero %d dp %d, %s: tips %q, want the ZeRO tip %q", tc.zero, tc.dp, part.name, tips, part.want)
			}
			if !slices.Contains(tips, "more --tp or --pp") && len(tips) < 3 {
				t.Errorf("zero %d dp %d, %s: tips %q lack the model-parallel remedy", tc.zero, tc.dp, part.name, tips)
			}
		}
	}
}
