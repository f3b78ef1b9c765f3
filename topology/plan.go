package topology

import (
	"fmt"

	"github.com/gpucoord/gpucoord/schedule"
)

// Plan is a validated parallel layout of a model on a cluster: the rank
// order, every rank's coordinates and placement, and the process groups.
// A Plan is immutable; its methods may be called concurrently.
type Plan struct {
	// Cluster is the hardware the plan is laid out on.
	Cluster Cluster
	// Model is the model being trained.
	Model Model
	// Config is the resolved configuration: DP, VPP and GlobalBatch set.
	Config Config
	// Layout is the rank layout: coordinates and groups of every rank.
	Layout
}

// axisIndex maps the three grid axes onto array indices.
func axisIndex(a Axis) int {
	switch a {
	case AxisTP:
		return 0
	case AxisPP:
		return 1
	case AxisDP:
		return 2
	}
	panic("topology: no index for axis " + string(a))
}

// New validates a layout and returns its Plan. Every rejection wraps
// ErrInvalid and names the value and the rule it breaks.
func New(cl Cluster, m Model, cfg Config) (*Plan, error) {
	if err := cl.Validate(); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.validateEnums(); err != nil {
		return nil, err
	}
	if _, err := ParseOrder(cfg.Order); err != nil {
		return nil, err
	}
	world := cl.World()
	if cfg.TP < 1 {
		return nil, invalid("tp %d: must be at least 1", cfg.TP)
	}
	if cfg.PP < 1 {
		return nil, invalid("pp %d: must be at least 1", cfg.PP)
	}
	if world%(cfg.TP*cfg.PP) != 0 {
		return nil, invalid("world size %d (%s x %s) is not divisible by tp*pp = %d (tp %d x pp %d)",
			world, plural(cl.Nodes, "node", "nodes"), plural(cl.GPUsPerNode, "GPU", "GPUs"), cfg.TP*cfg.PP, cfg.TP, cfg.PP)
	}
	if cfg.DP == 0 {
		cfg.DP = world / (cfg.TP * cfg.PP)
	}
	if cfg.DP < 1 || cfg.TP*cfg.PP*cfg.DP != world {
		return nil, invalid("dp %d: tp*pp*dp = %d must equal the world size %d (omit --dp to derive it)",
			cfg.DP, cfg.TP*cfg.PP*cfg.DP, world)
	}
	if d := cl.Domain(); cfg.TP > d {
		return nil, invalid("tp %d is larger than the NVLink domain of %s: a tensor-parallel group must stay inside one NVLink domain", cfg.TP, plural(d, "GPU", "GPUs"))
	}
	if cfg.VPP == 0 {
		cfg.VPP = 1
	}
	if cfg.VPP < 1 {
		return nil, invalid("vpp %d: must be at least 1", cfg.VPP)
	}
	if cfg.VPP > 1 && cfg.Schedule != schedule.Interleaved {
		return nil, invalid("vpp %d: virtual pipeline stages need --schedule interleaved (schedule is %s)", cfg.VPP, cfg.Schedule)
	}
	if cfg.Schedule == schedule.Interleaved && cfg.PP < 2 {
		return nil, invalid("schedule interleaved needs pp of at least 2 (pp is %d)", cfg.PP)
	}
	if !m.Bare() {
		if m.Heads%cfg.TP != 0 {
			return nil, invalid("heads %d is not divisible by tp %d: each tensor-parallel rank needs whole attention heads", m.Heads, cfg.TP)
		}
		if kv := m.KVHeadCount(); kv%cfg.TP != 0 {
			return nil, invalid("kv_heads %d is not divisible by tp %d: each tensor-parallel rank needs whole key/value heads", kv, cfg.TP)
		}
		if m.FFNSize()%cfg.TP != 0 {
			return nil, invalid("ffn %d is not divisible by tp %d", m.FFNSize(), cfg.TP)
		}
		if m.Layers%(cfg.PP*cfg.VPP) != 0 {
			return nil, invalid("layers %d is not divisible by pp*vpp = %d (pp %d x vpp %d): every model chunk needs the same number of layers",
				m.Layers, cfg.PP*cfg.VPP, cfg.PP, cfg.VPP)
		}
	}
	if !(cfg.HeadroomGiB >= 0 && cfg.HeadroomGiB < cl.GPUMemoryGiB) {
		return nil, invalid("headroom %g GiB: want at least 0 and less than the GPU's %g GiB", cfg.HeadroomGiB, cl.GPUMemoryGiB)
	}
	if cfg.Precision == PrecisionFP8 && cl.PeakFP8TFLOPS == 0 {
		return nil, invalid("precision fp8 needs fp8 tensor cores: cluster %s has no peak_fp8_tflops", cl.Name)
	}
	if cfg.MicroBatch < 1 {
		return nil, invalid("micro-batch %d: must be at least 1", cfg.MicroBatch)
	}
	if cfg.GlobalBatch == 0 {
		cfg.GlobalBatch = cfg.MicroBatch * cfg.DP * 4 * cfg.PP
	}
	if cfg.GlobalBatch < 1 {
		return nil, invalid("global batch %d: must be at least 1 sequence", cfg.GlobalBatch)
	}
	if cfg.GlobalBatch%(cfg.MicroBatch*cfg.DP) != 0 {
		return nil, invalid("global batch %d is not divisible by micro-batch*dp = %d (micro-batch %d x dp %d)",
			cfg.GlobalBatch, cfg.MicroBatch*cfg.DP, cfg.MicroBatch, cfg.DP)
	}
	mb := cfg.GlobalBatch / (cfg.MicroBatch * cfg.DP)
	if cfg.Schedule == schedule.Interleaved && mb%cfg.PP != 0 {
		return nil, invalid("interleaved schedule: %s per replica (global batch %d / (micro-batch %d x dp %d)) is not a multiple of pp %d",
			plural(mb, "micro-batch", "micro-batches"), cfg.GlobalBatch, cfg.MicroBatch, cfg.DP, cfg.PP)
	}
	layout, err := NewLayout(cfg.TP, cfg.PP, cfg.DP, cfg.Order)
	if err != nil {
		return nil, err
	}
	p := &Plan{Cluster: cl, Model: m, Config: cfg, Layout: layout}
	if err := p.checkTPDomains(); err != nil {
		return nil, err
	}
	return p, nil
}

// Microbatches returns the number of micro-batches per replica per step.
func (p *Plan) Microbatches() int {
	return p.Config.GlobalBatch / (p.Config.MicroBatch * p.Config.DP)
}

// Node returns the node hosting rank r; ranks fill nodes in order.
func (p *Plan) Node(r Rank) int { return int(r) / p.Cluster.GPUsPerNode }

// LocalGPU returns rank r's GPU index on its node.
func (p *Plan) LocalGPU(r Rank) int { return int(r) % p.Cluster.GPUsPerNode }

// NVLinkDomain returns the NVLink domain holding rank r.
func (p *Plan) NVLinkDomain(r Rank) int { return int(r) / p.Cluster.Domain() }

// RankInfo is one row of the rank map.
type RankInfo struct {
	Rank     Rank `json:"rank"`
	Node     int  `json:"node"`
	LocalGPU int  `json:"local_gpu"`
	Coord
}

// RankMap returns every rank's placement and coordinates, by rank.
func (p *Plan) RankMap() []RankInfo {
	out := make([]RankInfo, p.World())
	for i := range out {
		r := Rank(i)
		out[i] = RankInfo{Rank: r, Node: p.Node(r), LocalGPU: p.LocalGPU(r), Coord: p.Coord(r)}
	}
	return out
}

// checkTPDomains refuses a layout whose TP group spans NVLink domains.
func (p *Plan) checkTPDomains() error { return p.Layout.CheckDomains(p.Cluster.Domain()) }

// plural formats n with the singular or plural noun: "1 GPU", "8 GPUs".
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
