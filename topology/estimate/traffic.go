package estimate

import (
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// Link names.
const (
	LinkNVLink    = "nvlink"
	LinkInterNode = "inter-node"
)

// link is a named bandwidth in bytes per second.
type link struct {
	name string
	bw   float64
}

// groupLinks holds the slowest link each group axis crosses.
type groupLinks struct{ tp, pp, dp link }

// linksOf finds, for each axis, the slowest link any of its groups
// crosses: inter-node when some group has members in two NVLink domains.
// Every group is looked at, not only rank 0's: groups of one axis need not
// look alike (on 80 GPUs in domains of 72, PP [0 40] stays inside and
// [39 79] crosses).
func linksOf(p *topology.Plan) groupLinks {
	nv := link{LinkNVLink, p.Cluster.NVLinkGBps * 1e9}
	ib := link{LinkInterNode, p.Cluster.InterNodeGBps * 1e9}
	pick := func(a topology.Axis) link {
		if p.Crosses(a, p.Cluster.Domain()) {
			return ib
		}
		return nv
	}
	return groupLinks{tp: pick(topology.AxisTP), pp: pick(topology.AxisPP), dp: pick(topology.AxisDP)}
}

// ringAllReduce returns the bytes one GPU sends and the time of a ring
// all-reduce of n bytes over k ranks: reduce-scatter then all-gather, each
// sending (k-1)/k of the buffer in k-1 steps (Patarasuk and Yuan 2009).
func ringAllReduce(n float64, k int, l link) (sent, seconds float64) {
	if k <= 1 {
		return 0, 0
	}
	sent = 2 * float64(k-1) / float64(k) * n
	return sent, sent/(l.bw*LinkEfficiency) + 2*float64(k-1)*hopLatency
}

// hopTime is the time of one point-to-point message of n bytes on l.
func hopTime(n float64, l link) float64 { return n/(l.bw*LinkEfficiency) + hopLatency }

// ringHalf is one half of ringAllReduce: a reduce-scatter or an all-gather.
func ringHalf(n float64, k int, l link) (sent, seconds float64) {
	sent, seconds = ringAllReduce(n, k, l)
	return sent / 2, seconds / 2
}

// tpMessage is the bytes of one tensor-parallel all-reduce: the b x s x h
// activation (Megatron's g operator after attention and after the MLP).
func tpMessage(p *topology.Plan) float64 {
	m, c := p.Model, p.Config
	return float64(c.MicroBatch) * float64(m.Seq) * float64(m.Hidden) * activationBytes(c.Precision)
}

// tpAllReducesPerLayer counts TP all-reduces per layer per micro-batch: two
// in the forward pass, two in the backward (Narayanan et al. 2021 Sec.
// 3.3), and two more when full recomputation reruns the forward. With
// sequence parallelism each becomes an all-gather plus a reduce-scatter of
// the same total volume (Korthikanti et al. 2022 Sec. 4.2.2).
func tpAllReducesPerLayer(r topology.Recompute) int {
	if r == topology.RecomputeFull {
		return 6
	}
	return 4
}

// ppMessage is the bytes of one pipeline send: the b x s x h boundary
// activation, split across the TP group by Megatron's scatter/gather
// optimisation (Narayanan et al. 2021 Sec. 4.1) when tp > 1.
func ppMessage(p *topology.Plan) float64 {
	return tpMessage(p) / float64(p.Config.TP)
}

// stageCosts returns the per-chunk, per-micro-batch times the schedule is
// simulated with: F is the forward compute plus its TP all-reduces, B the
// backward (twice the forward's compute, plus recomputation), W the
// weight-gradient half of B for split-backward schedules, Comm one
// pipeline hop. Compute runs at computeRate with constants eff.
func stageCosts(p *topology.Plan, l groupLinks, kind schedule.Kind, eff efficiency) schedule.Costs {
	m, c := p.Model, p.Config
	if m.Bare() {
		return schedule.Costs{F: 1, B: 2}
	}
	layers := float64(m.Layers / (c.PP * c.VPP))
	perGPU := float64(c.MicroBatch) * layers / float64(c.TP)
	fwd := perGPU * layerForwardSeconds(p, eff, layerForwardFLOPs(m))
	re := perGPU * layerForwardSeconds(p, eff, recomputeFLOPs(m, c.Recompute))
	_, ar := ringAllReduce(tpMessage(p), c.TP, l.tp)
	fComm := 2 * layers * ar
	bComm := float64(tpAllReducesPerLayer(c.Recompute)-2) * layers * ar
	var hop float64
	if c.PP > 1 {
		hop = hopTime(ppMessage(p), l.pp)
	}
	costs := schedule.Costs{F: fwd + fComm, B: 2*fwd + re + bComm, Comm: hop, Seconds: true}
	if kind.SplitBackward() {
		// The input-gradient pass does half the backward matmuls; the
		// weight-gradient pass the other half (Qi et al. 2023, Sec. 2).
		costs.B, costs.W = fwd+re+bComm, fwd
	}
	return costs
}

// traffic lists one GPU's communication per step, with spec the semantics
// of the plan's ZeRO stage. Message sizes are those of a first-stage GPU;
// counts cover every micro-batch.
func traffic(p *topology.Plan, l groupLinks, spec sharding.StageSpec) []Traffic {
	c := p.Config
	mbs := p.Microbatches()
	var out []Traffic
	if c.TP > 1 && !p.Model.Bare() {
		n := tpAllReducesPerLayer(c.Recompute) * (p.Model.Layers / c.PP) * mbs
		sent, sec := ringAllReduce(tpMessage(p), c.TP, l.tp)
		op := "all-reduce"
		if c.SequenceParallel {
			op = "all-gather+reduce-scatter"
		}
		out = append(out, Traffic{Group: "tp", Collective: op, Count: n, MessageBytes: tpMessage(p),
			BytesPerGPU: float64(n) * sent, Link: l.tp.name, Seconds: float64(n) * sec})
	}
	if c.PP > 1 && !p.Model.Bare() {
		// Each micro-batch crosses each chunk boundary forward (activation)
		// and backward (gradient): 2*v sends per micro-batch per rank.
		n := 2 * c.VPP * mbs
		msg := ppMessage(p)
		out = append(out, Traffic{Group: "pp", Collective: "send/recv", Count: n, MessageBytes: msg,
			BytesPerGPU: float64(n) * msg, Link: l.pp.name, Seconds: float64(n) * hopTime(msg, l.pp)})
	}
	if c.DP > 1 {
		bw, _, _ := bytesPerParam(c.Precision)
		grads := gradBytes(c) * stageParams(p, 0)
		params := bw * stageParams(p, 0)
		switch spec.GradSync {
		case sharding.AllReduce:
			sent, sec := ringAllReduce(grads, c.DP, l.dp)
			out = append(out, Traffic{Group: "dp", Collective: "all-reduce", Count: 1, MessageBytes: grads, BytesPerGPU: sent, Link: l.dp.name, Seconds: sec})
		case sharding.ReduceScatter:
			// Reduce-scatter the gradients, all-gather the updated weights:
			// the all-reduce's volume (Rajbhandari et al. 2020 Sec. 7).
			sent, sec := ringHalf(grads, c.DP, l.dp)
			out = append(out, Traffic{Group: "dp", Collective: "reduce-scatter", Count: 1, MessageBytes: grads, BytesPerGPU: sent, Link: l.dp.name, Seconds: sec})
		}
		if gathers := paramGathers(spec.Gather); gathers > 0 {
			sent, sec := ringHalf(params, c.DP, l.dp)
			out = append(out, Traffic{Group: "dp", Collective: "all-gather", Count: gathers, MessageBytes: params,
				BytesPerGPU: float64(gathers) * sent, Link: l.dp.name, Seconds: float64(gathers) * sec})
		}
	}
	return out
}

// paramGathers counts the all-gathers of the parameters per step under
// gather policy g: none for replicated parameters, one after the optimizer
// step (ZeRO 1-2), two when they live as shards and are gathered before use,
// once for the forward and again for the backward (ZeRO 3: 1.5x the
// all-reduce volume in all, Rajbhandari et al. 2020 Sec. 7).
func paramGathers(g sharding.ParamSync) int {
	switch g {
	case sharding.GatherAfterStep:
		return 1
	case sharding.GatherBeforeUse:
		return 2
	}
	return 0
}

// step combines the simulated pipeline with the data-parallel traffic and
// the output layer (computed at computeRate with constants eff) into the
// step estimate.
func step(p *topology.Plan, makespan float64, tr []Traffic, eff efficiency) Step {
	s := Step{FLOPs: StepFLOPs(p), PipelineSeconds: makespan}
	for _, t := range tr {
		if t.Group == "dp" {
			s.DPSeconds += t.Seconds
		}
	}
	if p.Model.Bare() {
		// No architecture, no time: the schedule ran on unit costs.
		return Step{DPSeconds: s.DPSeconds}
	}
	// The output layer (3 x 2shV per sequence) runs on the last stage
	// outside the uniform per-chunk costs the schedule is simulated with.
	m, c := p.Model, p.Config
	rate := computeRate(p, eff) * float64(c.TP)
	s.OutputSeconds = float64(p.Microbatches()*c.MicroBatch) * 3 * logitFLOPs(m) / rate
	s.OptimizerSeconds = optimizerSeconds(p)
	s.Seconds = s.PipelineSeconds + s.OutputSeconds + s.DPSeconds + s.OptimizerSeconds
	s.TFLOPSPerGPU = s.FLOPs / (s.Seconds * float64(p.World())) / 1e12
	if p.Cluster.PeakTFLOPS > 0 {
		s.MFU = s.TFLOPSPerGPU / p.Cluster.PeakTFLOPS
	}
	s.TokensPerSecond = float64(c.GlobalBatch*m.Seq) / s.Seconds
	return s
}

// Bytes of GPU memory one Adam update moves per parameter, by
// implementation. The fused step (one Adam kernel: Megatron-LM's and
// DeepSpeed's) makes the passes fusedAdamBytes counts, at fusedEfficiency
// of the bandwidth: 0.69 is what the reference PyTorch GPT's fused update
// took on an H100 (23.8 ms for 1.32 billion parameters, 42 bytes each, at
// 3.35 TB/s; docs/GPU.md). PyTorch's default multi-tensor (foreach) Adam
// makes several passes; 112.6 effective bytes per parameter is what it
// took on an H100: 31-151 ms per step for 0.85-4.5 billion parameters,
// 33.6 ps per parameter, in reference runs of a PyTorch GPT
// (docs/PLANNING.md).
const (
	fusedEfficiency         = 0.69
	multiTensorBytesPerParm = 33.6e-12 * 3350e9
)

// fusedAdamBytes is what a mixed-precision update with a fused Adam
// moves per parameter: 16-bit gradients cast to fp32 (read g, write 4),
// the kernel itself (read the fp32 master weight, m, v and the fp32
// gradient, write the first three: 28), the model's gradients zeroed
// (write g) and the masters copied into the 16-bit weights (read 4, write
// w). With fp32 gradients there is no cast (38 bytes); in fp32 training
// the weights are the masters, so no copy either (32).
func fusedAdamBytes(c topology.Config) float64 {
	g := gradBytes(c)
	moved := 28 + g
	if c.Precision == topology.PrecisionFP32 {
		return moved
	}
	if g < 4 {
		moved += g + 4
	}
	weight, _, _ := bytesPerParam(c.Precision)
	return moved + 4 + weight
}

// optimizerSeconds is the Adam update of the stage with the most optimizer
// state on one GPU: its parameters (its share under ZeRO) times the bytes
// the implementation moves per parameter, over the GPU's memory bandwidth.
// Offloaded optimizer state is updated on the host: not timed here.
func optimizerSeconds(p *topology.Plan) float64 {
	bw := p.Cluster.MemoryGBps * 1e9
	if bw == 0 || p.Config.OffloadOptimizer || p.Model.Bare() {
		return 0
	}
	params := 0.0
	for st := range p.Config.PP {
		params = max(params, stageParams(p, st))
	}
	if zeroStage(p).ShardsOptimizer() {
		params /= float64(p.Config.DP)
	}
	if p.Config.Optimizer == topology.OptimizerMultiTensor {
		return params * multiTensorBytesPerParm / bw
	}
	return params * fusedAdamBytes(p.Config) / (bw * fusedEfficiency)
}
