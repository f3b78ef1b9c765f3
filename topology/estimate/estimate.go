package estimate

import (
	"fmt"

	"gpucoord/schedule"
	"gpucoord/topology"
)

// Efficiency model: the fractions of datasheet peaks a real step reaches.
// docs/PLANNING.md gives their grounds; they are the model's only free
// parameters.
const (
	// ComputeEfficiency is the fraction of dense bf16 peak that a very wide
	// transformer layer sustains; see computeRate for how it falls with h.
	ComputeEfficiency = 0.68
	// elementwiseHidden is h0 in computeRate: the hidden size at which the
	// non-GEMM work of a layer (layer norms, softmax, GeLU, dropout,
	// residuals: O(sbh) memory-bound work against the GEMMs' O(sbh^2))
	// would take as long as the GEMMs.
	elementwiseHidden = 835
	// LinkEfficiency is the fraction of a link's bandwidth a ring collective
	// or a pipeline send sustains (NCCL bus bandwidth over link rate).
	LinkEfficiency = 0.8
	// hopLatency is the fixed cost of one message hop, in seconds.
	hopLatency = 8e-6
)

// computeRate returns the FLOP/s one GPU sustains on the layers of model m:
// peak * ComputeEfficiency * h/(h + h0). The two constants were fitted to
// the TFLOP/s per GPU of Narayanan et al. 2021 Table 1 (A100, h from 2304
// to 25600); TestTable1Throughput keeps the fit honest.
func computeRate(p *topology.Plan) float64 {
	h := float64(p.Model.Hidden)
	return p.Cluster.PeakTFLOPS * 1e12 * ComputeEfficiency * h / (h + elementwiseHidden)
}

// Report is the full estimate of a Plan.
type Report struct {
	// Memory is the worst stage's per-GPU memory.
	Memory Memory `json:"per_gpu_bytes"`
	// WorstStage is the pipeline stage Memory belongs to.
	WorstStage int `json:"worst_stage"`
	// Stages holds every pipeline stage's per-GPU memory.
	Stages []Memory `json:"stages"`
	// CapacityBytes is one GPU's memory.
	CapacityBytes float64 `json:"capacity_bytes"`
	// HostOptimizerBytes is the optimizer state offloaded per node.
	HostOptimizerBytes float64 `json:"host_optimizer_bytes_per_node,omitempty"`
	// Pipeline is the schedule's shape and bubble.
	Pipeline Pipeline `json:"pipeline"`
	// Traffic lists the communication of one step per process group.
	Traffic []Traffic `json:"traffic"`
	// Step is the estimated cost of one training step.
	Step Step `json:"step"`
	// Fits reports whether every stage fits in GPU (and host) memory.
	Fits bool `json:"fits"`
	// Reasons says, in plain language, why the plan does not fit.
	Reasons []string `json:"reasons"`
}

// Pipeline describes the pipeline schedule of a plan.
type Pipeline struct {
	Schedule       schedule.Kind `json:"schedule"`
	Stages         int           `json:"stages"`
	Virtual        int           `json:"virtual"`
	Microbatches   int           `json:"microbatches"`
	BubbleFraction float64       `json:"bubble_fraction"`
	// PeakInFlight is, per stage, the most (micro-batch, chunk) forward
	// activations held at once.
	PeakInFlight []int `json:"peak_in_flight"`
}

// Traffic is one kind of communication in one step, seen from one GPU.
type Traffic struct {
	// Group is the process group axis: tp, pp or dp.
	Group string `json:"group"`
	// Collective is the operation, e.g. all-reduce or send/recv.
	Collective string `json:"collective"`
	// Count is how many times one GPU runs it per step.
	Count int `json:"count"`
	// MessageBytes is the size of one operation's buffer.
	MessageBytes float64 `json:"message_bytes"`
	// BytesPerGPU is what one GPU sends per step for this row.
	BytesPerGPU float64 `json:"bytes_per_gpu"`
	// Link is the slowest link the group crosses: nvlink or inter-node.
	Link string `json:"link"`
	// Seconds is the row's time per step on that link.
	Seconds float64 `json:"seconds"`
}

// Step is the estimated cost of one training step.
type Step struct {
	// FLOPs counts the whole step over the global batch (recomputation included).
	FLOPs float64 `json:"flops"`
	// Seconds is the estimated wall time of one step.
	Seconds float64 `json:"seconds"`
	// TFLOPSPerGPU is FLOPs / (Seconds * world) / 1e12.
	TFLOPSPerGPU float64 `json:"tflops_per_gpu"`
	// PipelineSeconds is the simulated schedule makespan (compute, TP
	// communication and pipeline sends, bubble included).
	PipelineSeconds float64 `json:"pipeline_seconds"`
	// DPSeconds is the data-parallel gradient (and ZeRO) communication,
	// taken as not overlapped with compute.
	DPSeconds float64 `json:"dp_seconds"`
	// TokensPerSecond is the global batch's tokens over Seconds.
	TokensPerSecond float64 `json:"tokens_per_second"`
}

// Simulator runs a pipeline schedule; Evaluate's callers may share a
// caching one across many plans. NewSimulator returns the default.
type Simulator interface {
	Simulate(kind schedule.Kind, stages, microbatches, virtual int, c schedule.Costs) (schedule.Result, error)
}

// direct simulates without caching.
type direct struct{}

func (direct) Simulate(kind schedule.Kind, p, m, v int, c schedule.Costs) (schedule.Result, error) {
	s, err := schedule.Build(kind, p, m, v)
	if err != nil {
		return schedule.Result{}, err
	}
	return schedule.Simulate(s, c)
}

// Evaluate estimates p with a fresh simulator.
func Evaluate(p *topology.Plan) (Report, error) { return EvaluateWith(p, direct{}) }

// EvaluateWith estimates p, running its pipeline schedule on sim.
func EvaluateWith(p *topology.Plan, sim Simulator) (Report, error) {
	c := p.Config
	kind := c.Schedule
	links := linksOf(p)
	costs := stageCosts(p, links, kind)
	res, err := sim.Simulate(kind, c.PP, p.Microbatches(), c.VPP, costs)
	if err != nil {
		return Report{}, fmt.Errorf("schedule %s: %w", kind, err)
	}
	r := Report{
		CapacityBytes: p.Cluster.CapacityBytes(),
		Pipeline: Pipeline{Schedule: kind, Stages: c.PP, Virtual: c.VPP, Microbatches: p.Microbatches(),
			BubbleFraction: res.BubbleFraction, PeakInFlight: res.PeakInFlight},
	}
	var hostPerGPU float64
	for st := 0; st < c.PP; st++ {
		mem, host := StageMemory(p, st, res.PeakInFlight[st])
		r.Stages = append(r.Stages, mem)
		if mem.Total > r.Memory.Total {
			r.Memory, r.WorstStage = mem, st
		}
		hostPerGPU = max(hostPerGPU, host)
	}
	r.HostOptimizerBytes = hostPerGPU * float64(p.Cluster.GPUsPerNode)
	r.Traffic = traffic(p, links)
	r.Step = step(p, res, r.Traffic)
	r.Reasons = reasons(p, r)
	r.Fits = len(r.Reasons) == 0
	return r, nil
}
