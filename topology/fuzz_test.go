package topology

import (
	"errors"
	"testing"
)

// FuzzParseCluster: any document either parses into a valid cluster or is
// refused with ErrInvalid or ErrUnknownPreset in one line without Go type
// names; never a panic.
func FuzzParseCluster(f *testing.F) {
	f.Add([]byte("preset: dgx-h100\nnodes: 4\n"))
	f.Add([]byte("nodes: 16\ngpus_per_node: 8\nnvlink_domain: 8\ngpu_memory_gib: 80\npeak_tflops: 312\nnvlink_gbps: 300\ninter_node_gbps: 25\n"))
	f.Add([]byte("nodes: [1\n"))
	f.Add([]byte("preset: nope\n"))
	f.Add([]byte("nodes: 1\ngpus_per_node: many\ncolour: red\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCluster(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnknownPreset) {
				t.Fatalf("unclassified error %v", err)
			}
			checkOneLine(t, err)
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed cluster fails Validate: %v", err)
		}
	})
}

// FuzzParseModel: likewise for model specs.
func FuzzParseModel(f *testing.F) {
	f.Add([]byte("preset: llama-70b\nseq: 8192\n"))
	f.Add([]byte("layers: 40\nhidden: 5120\nheads: 40\nvocab: 51200\nseq: 2048\n"))
	f.Add([]byte("params: 7.5e9\n"))
	f.Add([]byte("hidden: 7\nheads: 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseModel(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnknownPreset) {
				t.Fatalf("unclassified error %v", err)
			}
			checkOneLine(t, err)
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("parsed model fails Validate: %v", err)
		}
		if m.TotalParams() <= 0 {
			t.Fatalf("model %+v has %g params", m, m.TotalParams())
		}
	})
}

// FuzzFactorize: for any cluster shape and degrees, New either refuses with
// ErrInvalid or returns a plan whose TP, PP and DP groups each partition the
// ranks exactly once, whose coordinates round-trip, and whose TP groups stay
// inside one NVLink domain.
func FuzzFactorize(f *testing.F) {
	f.Add(uint8(2), uint8(8), uint8(0), uint8(2), uint8(4), uint8(0), uint8(0))
	f.Add(uint8(3), uint8(4), uint8(12), uint8(4), uint8(3), uint8(2), uint8(1))
	f.Add(uint8(5), uint8(6), uint8(0), uint8(3), uint8(5), uint8(1), uint8(2))
	orders := []string{DefaultOrder, "tp-pp-dp", "dp-tp-pp", "pp-dp-tp", "pipe-data-model", "tp-tp-pp"}
	f.Fuzz(func(t *testing.T, nodes, gpn, domain, tp, pp, dp, order uint8) {
		cl := Cluster{Name: "fuzz", Nodes: int(nodes%9) + 1, GPUsPerNode: int(gpn%9) + 1, NVLinkDomain: int(domain % 40),
			GPUMemoryGiB: 80, PeakTFLOPS: 100, NVLinkGBps: 100, InterNodeGBps: 10}
		m := Model{Layers: 24, Hidden: 720, Heads: 24, Vocab: 1000, Seq: 64}
		cfg := DefaultConfig()
		cfg.TP, cfg.PP, cfg.DP = int(tp%13), int(pp%13), int(dp%13)
		cfg.Order = orders[int(order)%len(orders)]
		cfg.GlobalBatch = 24 * 24
		p, err := New(cl, m, cfg)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		world := cl.World()
		for i, gs := range [][][]Rank{p.Groups().TP, p.Groups().PP, p.Groups().DP} {
			seen := make([]int, world)
			for _, g := range gs {
				for _, r := range g {
					seen[r]++
				}
			}
			for r, n := range seen {
				if n != 1 {
					t.Fatalf("axis %d: rank %d in %d groups", i, r, n)
				}
			}
		}
		for _, g := range p.Groups().TP {
			for _, r := range g {
				if p.NVLinkDomain(r) != p.NVLinkDomain(g[0]) {
					t.Fatalf("TP group %v spans NVLink domains", g)
				}
			}
		}
		for r := 0; r < world; r++ {
			if got := p.Rank(p.Coord(Rank(r))); got != Rank(r) {
				t.Fatalf("rank %d round-trips to %d", r, got)
			}
		}
	})
}
