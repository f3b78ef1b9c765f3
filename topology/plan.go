package topology

import "fmt"

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

// New validates a layout and returns its Plan. The rules of the parallel
// shape are NewShape's; New adds the cluster's, the model's and the
// estimate's. Every rejection wraps ErrInvalid and names the value and the
// rule it breaks.
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
	if cfg.MicroBatch < 1 {
		return nil, invalid("micro-batch %d: must be at least 1", cfg.MicroBatch)
	}
	world := cl.World()
	spec := ShapeSpec{TP: cfg.TP, PP: cfg.PP, DP: cfg.DP, Order: cfg.Order, GlobalBatch: cfg.GlobalBatch, MicroBatch: cfg.MicroBatch,
		Schedule: cfg.Schedule, Virtual: cfg.VPP,
		WorldName: fmt.Sprintf("world size %d (%s x %s)", world, plural(cl.Nodes, "node", "nodes"), plural(cl.GPUsPerNode, "GPU", "GPUs"))}
	if spec.GlobalBatch == 0 {
		spec.GlobalBatch = DefaultGlobalBatch(cl, cfg.MicroBatch)
	}
	sh, err := NewShape(world, spec)
	if err != nil {
		return nil, err
	}
	cfg.DP, cfg.VPP, cfg.GlobalBatch, cfg.Schedule = sh.DP, sh.Virtual, sh.GlobalBatch, sh.Schedule
	if d := cl.Domain(); cfg.TP > d {
		return nil, tpBeyondDomain(cfg.TP, d)
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
	p := &Plan{Cluster: cl, Model: m, Config: cfg, Layout: sh.Layout}
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

// DefaultGlobalBatch is the global batch a plan trains when none is given,
// manual or searched alike: a micro-batch of microBatch sequences per GPU
// (the --micro-batch given; a search keeps it for every layout it tries),
// the same for every layout of the cluster, so that layouts are compared
// on the same work.
func DefaultGlobalBatch(cl Cluster, microBatch int) int { return cl.World() * max(1, microBatch) }
