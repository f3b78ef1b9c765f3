package estimate

import (
	"fmt"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
)

// Efficiency model: the fractions of datasheet peaks a real step reaches.
// docs/PLANNING.md gives their grounds; they are the model's only free
// parameters.
const (
	// ComputeEfficiency is the fraction of dense bf16 peak that a very wide
	// transformer layer sustains; see computeRate for how it falls with h.
	// Fitted with elementwiseHidden to the 1.7B, 7.5B, 39.1B, 145.6B and
	// 1008B rows of Narayanan et al. 2021 Table 1 (TestTable1Fit).
	ComputeEfficiency = 0.663
	// elementwiseHidden is h0 in computeRate: the hidden size at which the
	// non-GEMM work of a layer (layer norms, softmax, GeLU, dropout,
	// residuals: O(sbh) memory-bound work against the GEMMs' O(sbh^2))
	// would take as long as the GEMMs.
	elementwiseHidden = 734
	// LinkEfficiency is the fraction of a link's bandwidth a ring collective
	// or a pipeline send sustains (NCCL bus bandwidth over link rate).
	LinkEfficiency = 0.8
	// hopLatency is the fixed cost of one message hop, in seconds.
	hopLatency = 8e-6
)

// efficiency holds the compute model's two constants, so that the fit in
// the tests can evaluate plans with other values than the fitted ones.
type efficiency struct {
	compute float64 // ComputeEfficiency
	hidden0 float64 // elementwiseHidden
}

// fitted is the efficiency every exported function uses.
var fitted = efficiency{compute: ComputeEfficiency, hidden0: elementwiseHidden}

// computeRate returns the FLOP/s one GPU sustains on the layers of p's
// model: peak * compute * h/(h + h0). ComputeEfficiency and
// elementwiseHidden were fitted to the TFLOP/s per GPU of five rows of
// Narayanan et al. 2021 Table 1 (A100; the 1.7B, 7.5B, 39.1B, 145.6B and
// 1008B models, h from 2304 to 25600); TestTable1Fit redoes that fit and
// TestTable1HeldOut checks the five other rows, which the fit never saw.
func computeRate(p *topology.Plan, eff efficiency) float64 {
	h := float64(p.Model.Hidden)
	return p.Cluster.PeakTFLOPS * 1e12 * eff.compute * h / (h + eff.hidden0)
}

// layerForwardSeconds returns the time of flops of one layer's forward
// work on one GPU, with constants eff: flops at computeRate. In fp8 the
// matrix multiplies other than the attention core run at the fp8 peak
// instead of the bf16 one, with the same efficiency (Transformer Engine
// keeps the attention core and the elementwise work, computeRate's h0
// share, in bf16).
func layerForwardSeconds(p *topology.Plan, eff efficiency, flops float64) float64 {
	t := flops / computeRate(p, eff)
	if p.Config.Precision != topology.PrecisionFP8 {
		return t
	}
	gemm := flops - min(flops, attentionCoreFLOPs(p.Model))
	return t - gemm/(p.Cluster.PeakTFLOPS*1e12*eff.compute) + gemm/(p.Cluster.PeakFP8TFLOPS*1e12*eff.compute)
}

// Report is the full estimate of a Plan.
type Report struct {
	// Memory is the per-GPU memory of the plan.
	Memory MemoryReport `json:"memory"`
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
	// Timeline is the simulated schedule, for rendering.
	Timeline schedule.Result `json:"-"`
}

// MemoryReport is the per-GPU memory of every pipeline stage.
type MemoryReport struct {
	// PerGPU is the worst stage's per-GPU memory.
	PerGPU Memory `json:"per_gpu_bytes"`
	// WorstStage is the pipeline stage PerGPU belongs to.
	WorstStage int `json:"worst_stage"`
	// Stages holds every pipeline stage's per-GPU memory.
	Stages []Memory `json:"stages"`
	// CapacityBytes is one GPU's memory.
	CapacityBytes float64 `json:"capacity_bytes"`
	// UsableBytes is what a plan may use: CapacityBytes less the headroom
	// asked for. Fits compares against it.
	UsableBytes float64 `json:"usable_bytes"`
	// HostOptimizerBytes is the optimizer state offloaded per node.
	HostOptimizerBytes float64 `json:"host_optimizer_bytes_per_node,omitempty"`
}

// Pipeline describes the pipeline schedule of a plan.
type Pipeline struct {
	Schedule       schedule.Kind `json:"schedule"`
	Stages         int           `json:"stages"`
	Virtual        int           `json:"virtual"`
	Microbatches   int           `json:"microbatches"`
	BubbleFraction float64       `json:"bubble_fraction"`
	// PeakInFlight is, per stage, the most (micro-batch, chunk) passes whose
	// activations are held at once: from the forward to the end of the
	// backward (to the weight-gradient pass for ZB-H1; schedule.PeakHeld).
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
	// FLOPs counts the whole step over the global batch (recomputation
	// included). It, Seconds, TFLOPSPerGPU, PipelineSeconds,
	// OutputSeconds and TokensPerSecond are absent from the JSON for a
	// bare parameter count, which has no architecture to time.
	FLOPs float64 `json:"flops,omitempty"`
	// Seconds is the estimated wall time of one step: PipelineSeconds +
	// OutputSeconds + DPSeconds + OptimizerSeconds.
	Seconds float64 `json:"seconds,omitempty"`
	// TFLOPSPerGPU is FLOPs / (Seconds * world) / 1e12.
	TFLOPSPerGPU float64 `json:"tflops_per_gpu,omitempty"`
	// MFU is the model FLOPs utilisation: TFLOPSPerGPU over the cluster's
	// dense bf16/fp16 peak per GPU (PaLM's definition, Chowdhery et al.
	// 2022, App. B, with recomputation counted as Eq. 3 counts it).
	MFU float64 `json:"mfu,omitempty"`
	// PipelineSeconds is the simulated schedule makespan (compute, TP
	// communication and pipeline sends, bubble included).
	PipelineSeconds float64 `json:"pipeline_seconds,omitempty"`
	// OutputSeconds is the output layer's logits on the last stage, which
	// the schedule's uniform per-chunk costs leave out.
	OutputSeconds float64 `json:"output_seconds,omitempty"`
	// OptimizerSeconds is the Adam update of the stage with the most
	// optimizer state, bound by GPU memory bandwidth (0 when the cluster
	// gives none, or the state is offloaded to the host).
	OptimizerSeconds float64 `json:"optimizer_seconds,omitempty"`
	// DPSeconds is the data-parallel gradient (and ZeRO) communication,
	// taken as not overlapped with compute.
	DPSeconds float64 `json:"dp_seconds"`
	// TokensPerSecond is the global batch's tokens over Seconds.
	TokensPerSecond float64 `json:"tokens_per_second,omitempty"`
}

// shape identifies a schedule's op lists.
type shape struct {
	kind        schedule.Kind
	stages, mbs int
	virtual     int
}

// built is a schedule and its structural peaks.
type built struct {
	sched    *schedule.Schedule
	inFlight []int
}

// evaluator estimates plans with efficiency eff, building each schedule
// shape once. It is not safe for concurrent use.
type evaluator struct {
	shapes map[shape]built
	eff    efficiency
}

func newEvaluator() *evaluator { return &evaluator{shapes: map[shape]built{}, eff: fitted} }

// build returns the schedule of p and its peak in-flight counts.
func (e *evaluator) build(p *topology.Plan) (built, error) {
	c := p.Config
	k := shape{c.Schedule, c.PP, p.Microbatches(), c.VPP}
	if b, ok := e.shapes[k]; ok {
		return b, nil
	}
	s, err := schedule.Build(k.kind, k.stages, k.mbs, k.virtual)
	if err != nil {
		return built{}, fmt.Errorf("schedule %s: %w", k.kind, err)
	}
	b := built{sched: s, inFlight: s.PeakHeld()}
	e.shapes[k] = b
	return b, nil
}

// Evaluate estimates p: memory by stage, traffic, the simulated schedule
// and the step time, and whether it fits.
func Evaluate(p *topology.Plan) (Report, error) {
	e := newEvaluator()
	r, b, err := e.memory(p)
	if err != nil {
		return r, err
	}
	return r, e.timing(p, b, &r)
}

// memory fills the parts of a Report that need only the schedule's
// structure: memory by stage, fit and reasons, traffic.
func (e *evaluator) memory(p *topology.Plan) (Report, built, error) {
	c := p.Config
	b, err := e.build(p)
	if err != nil {
		return Report{}, b, err
	}
	spec, err := zeroStage(p).Spec()
	if err != nil {
		return Report{}, b, fmt.Errorf("%w: %w", topology.ErrInvalid, err)
	}
	r := Report{
		Memory: MemoryReport{CapacityBytes: p.Cluster.CapacityBytes(), UsableBytes: p.Cluster.CapacityBytes() - p.Config.HeadroomGiB*topology.GiB},
		Pipeline: Pipeline{Schedule: c.Schedule, Stages: c.PP, Virtual: c.VPP, Microbatches: p.Microbatches(),
			PeakInFlight: b.inFlight},
	}
	mr := &r.Memory
	var hostPerGPU float64
	for st := 0; st < c.PP; st++ {
		mem, host := StageMemory(p, st, b.inFlight[st])
		mr.Stages = append(mr.Stages, mem)
		if mem.Total > mr.PerGPU.Total {
			mr.PerGPU, mr.WorstStage = mem, st
		}
		hostPerGPU = max(hostPerGPU, host)
	}
	mr.HostOptimizerBytes = hostPerGPU * float64(p.Cluster.GPUsPerNode)
	r.Traffic = traffic(p, linksOf(p), spec)
	r.Reasons = reasons(p, r)
	r.Fits = len(r.Reasons) == 0
	return r, b, nil
}

// timing simulates the schedule with p's costs and fills the bubble, the
// timeline and the step estimate.
func (e *evaluator) timing(p *topology.Plan, b built, r *Report) error {
	res, err := schedule.Simulate(b.sched, stageCosts(p, linksOf(p), p.Config.Schedule, e.eff))
	if err != nil {
		return fmt.Errorf("schedule %s: %w", p.Config.Schedule, err)
	}
	r.Pipeline.BubbleFraction = res.BubbleFraction
	r.Timeline = res
	r.Step = step(p, res.Makespan, r.Traffic, e.eff)
	return nil
}

// lowerBound is a step time no schedule can beat: every rank's compute
// without a bubble, plus what step adds outside the pipeline.
func (e *evaluator) lowerBound(p *topology.Plan, r Report) float64 {
	c := stageCosts(p, linksOf(p), p.Config.Schedule, e.eff)
	ideal := float64(p.Microbatches()*p.Config.VPP) * (c.F + c.B + c.W)
	return step(p, ideal, r.Traffic, e.eff).Seconds
}
