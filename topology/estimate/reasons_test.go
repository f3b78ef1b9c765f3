package estimate

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/topology"
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
			more := "more --tp or --pp"
			if p.Config.TP == p.Cluster.Domain() {
				more = "more --pp" // tp already fills the NVLink domain
			}
			if !slices.Contains(tips, more) && len(tips) < 3 {
				t.Errorf("zero %d dp %d, %s: tips %q lack the model-parallel remedy %q", tc.zero, tc.dp, part.name, tips, more)
			}
			for _, tip := range tips {
				if p.Config.TP == p.Cluster.Domain() && strings.Contains(tip, "--tp") {
					t.Errorf("zero %d dp %d, %s: tip %q suggests more tp, but tp %d fills the node", tc.zero, tc.dp, part.name, tip, p.Config.TP)
				}
			}
		}
	}
}
