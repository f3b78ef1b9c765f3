package topology

import (
	"github.com/gpucoord/gpucoord/schedule"

	"errors"
	"reflect"
	"strings"
	"testing"
)

func cluster(nodes, gpn int) Cluster {
	c, _ := ClusterPreset("dgx-h100")
	c.Nodes, c.GPUsPerNode = nodes, gpn
	return c
}

func mustPlan(t *testing.T, cl Cluster, m Model, mod func(*Config)) *Plan {
	t.Helper()
	cfg := DefaultConfig()
	mod(&cfg)
	p, err := New(cl, m, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func ranks(groups ...[]int) [][]Rank {
	out := make([][]Rank, len(groups))
	for i, g := range groups {
		for _, r := range g {
			out[i] = append(out[i], Rank(r))
		}
	}
	return out
}

// TestGroupsMegatronDocstring checks the 16-GPU example in the docstring of
// Megatron-LM's initialize_model_parallel (tp=2, pp=4, hence dp=2).
func TestGroupsMegatronDocstring(t *testing.T) {
	m, _ := ModelPreset("gpt-1.7b")
	p := mustPlan(t, cluster(2, 8), m, func(c *Config) { c.TP, c.PP = 2, 4 })
	g := p.Groups()
	wantDP := ranks([]int{0, 2}, []int{1, 3}, []int{4, 6}, []int{5, 7}, []int{8, 10}, []int{9, 11}, []int{12, 14}, []int{13, 15})
	wantTP := ranks([]int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}, []int{8, 9}, []int{10, 11}, []int{12, 13}, []int{14, 15})
	wantPP := ranks([]int{0, 4, 8, 12}, []int{1, 5, 9, 13}, []int{2, 6, 10, 14}, []int{3, 7, 11, 15})
	if !reflect.DeepEqual(g.DP, wantDP) {
		t.Errorf("DP groups = %v, want %v", g.DP, wantDP)
	}
	if !reflect.DeepEqual(g.TP, wantTP) {
		t.Errorf("TP groups = %v, want %v", g.TP, wantTP)
	}
	if !reflect.DeepEqual(g.PP, wantPP) {
		t.Errorf("PP groups = %v, want %v", g.PP, wantPP)
	}
}

// TestGroupsMatchNaive checks the groups, formed from their bases by
// strides, against their definition: one per rank whose coordinate on the
// axis is zero, in rank order, that rank's Group. It also appends to every
// group, which must not write into the next (they share an array).
func TestGroupsMatchNaive(t *testing.T) {
	for _, order := range []string{"tp-cp-dp-pp", "tp-dp-pp", "pp-tp-dp", "dp-pp-tp", "pp-dp-tp", "dp-tp-pp"} {
		for _, sz := range [][3]int{{1, 1, 1}, {2, 4, 2}, {8, 1, 3}, {1, 5, 1}, {4, 3, 7}, {2, 2, 16}} {
			l, err := NewLayout(sz[0], sz[1], sz[2], order)
			if err != nil {
				t.Fatalf("NewLayout(%v, %s): %v", sz, order, err)
			}
			got := l.Groups()
			for _, ax := range []struct {
				a   Axis
				got [][]Rank
			}{{AxisTP, got.TP}, {AxisPP, got.PP}, {AxisDP, got.DP}} {
				var want [][]Rank
				for r := range l.World() {
					if l.Coord(Rank(r)).get(ax.a) == 0 {
						want = append(want, l.Group(ax.a, Rank(r)))
					}
				}
				if !reflect.DeepEqual(ax.got, want) {
					t.Errorf("%s %v %s groups = %v, want %v", order, sz, ax.a, ax.got, want)
				}
				for i := range ax.got {
					_ = append(ax.got[i], -1)
				}
				if !reflect.DeepEqual(ax.got, want) {
					t.Errorf("%s %v %s groups after appending = %v, want %v", order, sz, ax.a, ax.got, want)
				}
			}
		}
	}
}

func TestGroupsHandWorked(t *testing.T) {
	m, _ := ModelPreset("gpt-1.7b") // 24 heads, 24 layers
	tests := []struct {
		name           string
		nodes, gpn     int
		tp, pp         int
		order          string
		wantTP, wantPP [][]Rank
		wantDP         [][]Rank
	}{
		{name: "8 GPUs tp=2 pp=2", nodes: 1, gpn: 8, tp: 2, pp: 2,
			wantTP: ranks([]int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}),
			wantPP: ranks([]int{0, 4}, []int{1, 5}, []int{2, 6}, []int{3, 7}),
			wantDP: ranks([]int{0, 2}, []int{1, 3}, []int{4, 6}, []int{5, 7})},
		{name: "8 GPUs tp=4 pp=1", nodes: 2, gpn: 4, tp: 4, pp: 1,
			wantTP: ranks([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}),
			wantPP: ranks([]int{0}, []int{1}, []int{2}, []int{3}, []int{4}, []int{5}, []int{6}, []int{7}),
			wantDP: ranks([]int{0, 4}, []int{1, 5}, []int{2, 6}, []int{3, 7})},
		{name: "12 GPUs tp=2 pp=3", nodes: 3, gpn: 4, tp: 2, pp: 3,
			wantTP: ranks([]int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}, []int{8, 9}, []int{10, 11}),
			wantPP: ranks([]int{0, 4, 8}, []int{1, 5, 9}, []int{2, 6, 10}, []int{3, 7, 11}),
			wantDP: ranks([]int{0, 2}, []int{1, 3}, []int{4, 6}, []int{5, 7}, []int{8, 10}, []int{9, 11})},
		{name: "8 GPUs tp=2 pp=2 order tp-pp-dp", nodes: 1, gpn: 8, tp: 2, pp: 2, order: "tp-pp-dp",
			wantTP: ranks([]int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}),
			wantPP: ranks([]int{0, 2}, []int{1, 3}, []int{4, 6}, []int{5, 7}),
			wantDP: ranks([]int{0, 4}, []int{1, 5}, []int{2, 6}, []int{3, 7})},
		{name: "8 GPUs DeepSpeed pipe-data-model equals Megatron", nodes: 1, gpn: 8, tp: 2, pp: 2, order: "pipe-data-model",
			wantTP: ranks([]int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}),
			wantPP: ranks([]int{0, 4}, []int{1, 5}, []int{2, 6}, []int{3, 7}),
			wantDP: ranks([]int{0, 2}, []int{1, 3}, []int{4, 6}, []int{5, 7})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mustPlan(t, cluster(tc.nodes, tc.gpn), m, func(c *Config) {
				c.TP, c.PP = tc.tp, tc.pp
				if tc.order != "" {
					c.Order = tc.order
				}
			})
			g := p.Groups()
			if !reflect.DeepEqual(g.TP, tc.wantTP) {
				t.Errorf("TP = %v, want %v", g.TP, tc.wantTP)
			}
			if !reflect.DeepEqual(g.PP, tc.wantPP) {
				t.Errorf("PP = %v, want %v", g.PP, tc.wantPP)
			}
			if !reflect.DeepEqual(g.DP, tc.wantDP) {
				t.Errorf("DP = %v, want %v", g.DP, tc.wantDP)
			}
			// Every rank round-trips through its coordinates, and the
			// default order satisfies Megatron's formula.
			for _, ri := range p.RankMap() {
				if got := p.Rank(ri.Coord); got != ri.Rank {
					t.Fatalf("Rank(Coord(%d)) = %d", ri.Rank, got)
				}
				if tc.order == "" {
					if want := ri.TP + tc.tp*ri.DP + tc.tp*p.Config.DP*ri.PP; int(ri.Rank) != want {
						t.Fatalf("rank %d at %+v, Megatron formula gives %d", ri.Rank, ri.Coord, want)
					}
				}
				if ri.Node != int(ri.Rank)/tc.gpn || ri.LocalGPU != int(ri.Rank)%tc.gpn {
					t.Fatalf("rank %d placed on node %d gpu %d", ri.Rank, ri.Node, ri.LocalGPU)
				}
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	gpt, _ := ModelPreset("gpt-1.7b") // 24 heads, 24 layers
	tests := []struct {
		name    string
		cl      Cluster
		mod     func(*Config)
		wantMsg string
	}{
		{"world not divisible", cluster(3, 2), func(c *Config) { c.TP, c.PP = 4, 1 }, "world size 6 (3 nodes x 2 GPUs) is not divisible by tp*pp = 4"},
		{"tp beyond nvlink", cluster(2, 8), func(c *Config) { c.TP = 16 }, "tp 16 is larger than the NVLink domain of 8 GPUs"},
		{"layers by pp*vpp", cluster(2, 8), func(c *Config) { c.PP = 4; c.VPP = 4; c.Schedule = schedule.Interleaved }, "layers 24 is not divisible by pp*vpp = 16"},
		{"interleaved microbatches", cluster(1, 8), func(c *Config) {
			c.PP, c.VPP, c.Schedule, c.GlobalBatch = 4, 2, schedule.Interleaved, 6
		}, "interleaved schedule: 3 micro-batches per replica"},
		{"global batch", cluster(1, 8), func(c *Config) { c.GlobalBatch = 7; c.MicroBatch = 2 }, "global batch 7 is not divisible by micro-batch*dp = 16"},
		{"dp mismatch", cluster(1, 8), func(c *Config) { c.DP = 3 }, "dp 3: tp*pp*dp = 3 must equal the world size 8"},
		{"vpp without interleaved", cluster(1, 8), func(c *Config) { c.PP, c.VPP = 2, 2 }, "vpp 2: virtual pipeline stages need --schedule interleaved"},
		{"bad zero", cluster(1, 8), func(c *Config) { c.Zero = 4 }, "zero 4: ZeRO stage must be 0, 1, 2 or 3"},
		{"bad schedule", cluster(1, 8), func(c *Config) { c.Schedule = "2f2b" }, `schedule "2f2b"`},
		{"tp across domains", cluster(2, 4), func(c *Config) { c.TP, c.Order = 2, "dp-tp-pp" }, "across NVLink domains"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.mod(&cfg)
			_, err := New(tc.cl, gpt, cfg)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("err = %q, want it to contain %q", err, tc.wantMsg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %q: want one line", err)
			}
		})
	}
}

func TestHeadsAndLayersRules(t *testing.T) {
	m := Model{Layers: 30, Hidden: 3072, Heads: 24, Vocab: 100, Seq: 8}
	cfg := DefaultConfig()
	cfg.TP = 16
	_, err := New(cluster(1, 16), m, cfg)
	if err == nil || !strings.Contains(err.Error(), "heads 24 is not divisible by tp 16") {
		t.Errorf("err = %v, want heads rule", err)
	}
	cfg = DefaultConfig()
	cfg.PP = 4
	_, err = New(cluster(1, 16), m, cfg)
	if err == nil || !strings.Contains(err.Error(), "layers 30 is not divisible by pp*vpp = 4") {
		t.Errorf("err = %v, want layers rule", err)
	}
}

func TestNVL72TensorParallelAcrossNodes(t *testing.T) {
	cl, _ := ClusterPreset("gb200-nvl72")
	m, _ := ModelPreset("gpt-1t")
	cfg := DefaultConfig()
	cfg.TP = 8 // two 4-GPU trays, one NVLink domain
	cfg.PP = 1
	if _, err := New(cl, m, cfg); err != nil {
		t.Fatalf("tp 8 on NVL72 must be allowed across trays: %v", err)
	}
	dgx := cluster(2, 4)
	if _, err := New(dgx, m, cfg); err == nil {
		t.Fatal("tp 8 over two 4-GPU nodes without a shared NVLink domain must be refused")
	}
}

func TestModelParams(t *testing.T) {
	// Narayanan et al. 2021 Table 1 parameter counts (billions), which use
	// P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)).
	tests := []struct {
		preset string
		want   float64
	}{
		{"gpt-1.7b", 1.7}, {"gpt-3.6b", 3.6}, {"gpt-7.5b", 7.5}, {"gpt-18b", 18.4}, {"gpt-39b", 39.1},
		{"gpt-76b", 76.1}, {"gpt-145b", 145.6}, {"gpt-310b", 310.1}, {"gpt-530b", 529.6}, {"gpt-1t", 1008.0},
		{"llama-7b", 6.74}, {"llama-70b", 68.98},
	}
	for _, tc := range tests {
		m, err := ModelPreset(tc.preset)
		if err != nil {
			t.Fatal(err)
		}
		got := m.TotalParams() / 1e9
		// The paper rounds to one decimal: allow that rounding, no more.
		if d := got - tc.want; d > 0.05 || d < -0.05 {
			t.Errorf("%s: %.3fB params, want %.2fB within 0.05B", tc.preset, got, tc.want)
		}
	}
}
