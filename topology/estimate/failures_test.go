package estimate

import (
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/topology"
)

// TestFailures: gpt-13b on four DGX H100 nodes, a global batch of 16.
//   - With nothing lost the row is --auto's best layout.
//   - Three nodes (24 GPUs) hold no layout: dp must divide 16, so tp x pp
//     is 3, 6, 12 or 24, and neither 40 layers nor 40 heads split by 3 (by
//     hand: tp 1/2/4/8 with pp 3/6/12/24, or tp 3/6 with 40 heads): a
//     re-plan runs on two of them, as the coordinator uses the most nodes a
//     layout fits.
//   - With tp 8 and pp 4 fixed (a dp 1 job), one lost node leaves 24 GPUs
//     for a 32-GPU model replica: every row after the first pauses.
//   - --failures 4 would leave no node: refused.
func TestFailures(t *testing.T) {
	cl, err := topology.ClusterPreset("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	cl.Nodes = 4
	m, err := topology.ModelPreset("gpt-13b")
	if err != nil {
		t.Fatal(err)
	}
	base := topology.DefaultConfig()
	base.GlobalBatch = 16
	space := topology.DefaultSearchSpace()
	fs, err := Failures(cl, m, base, space, 3)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Search(cl, m, base, space, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 4 || fs[0].Best == nil || Label(fs[0].Best.Plan) != Label(res.Top[0].Plan) || fs[0].Used != 4 {
		t.Fatalf("row 0 = %+v, want --auto's %s on 4 nodes", fs[0], Label(res.Top[0].Plan))
	}
	if f := fs[1]; f.Nodes != 3 || f.Used != 2 || f.Best == nil {
		t.Errorf("1 lost: %d left, %d used, %v; want 2 of 3 used", f.Nodes, f.Used, f.Best)
	}
	for _, f := range fs {
		if f.Best == nil {
			t.Errorf("%d lost: pauses; every size from 1 to 4 nodes holds gpt-13b at global batch 16", f.Lost)
			continue
		}
		if c := f.Best.Plan.Config; c.GlobalBatch != 16 || c.TP*c.PP*c.DP != f.Used*8 {
			t.Errorf("%d lost: %s on %d nodes, global batch %d", f.Lost, Label(f.Best.Plan), f.Used, c.GlobalBatch)
		}
		if f.Lost > 0 && f.Best.Report.Step.Seconds < fs[0].Best.Report.Step.Seconds {
			t.Errorf("%d lost: %.3f s, faster than on every node (%.3f s)", f.Lost, f.Best.Report.Step.Seconds, fs[0].Best.Report.Step.Seconds)
		}
	}

	tp, pp := 8, 4
	space.Fixed.TP, space.Fixed.PP = &tp, &pp
	fixed, err := Failures(cl, m, base, space, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fixed {
		if (f.Best == nil) != (f.Lost > 0) {
			t.Errorf("tp 8 pp 4, %d lost: %v", f.Lost, f.Best)
		}
	}
	var b strings.Builder
	if err := WriteFailuresText(&b, cl, m, fixed); err != nil || strings.Count(b.String(), "pauses: no layout fits") != 3 {
		t.Errorf("text:\n%s%v", b.String(), err)
	}

	if _, err := Failures(cl, m, base, topology.DefaultSearchSpace(), 4); err == nil {
		t.Error("--failures 4 of 4 nodes was taken")
	}
}
