package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/topology/estimate"
)

// Re-planning modes (Replan.mode).
const (
	ReplanAuto   = "auto"
	ReplanDPOnly = "dp-only"
	ReplanOff    = "off"
)

// DefaultGrowGain is the estimated speed-up a running job needs before it
// grows into more nodes under re-planning (Replan.grow_gain 0).
const DefaultGrowGain = 0.1

// PlannerInput is Replan.planner's JSON: what the leader gives the planner
// when it re-plans a job. The cluster's node count and GPUs per node are
// the generation's; the search keeps the base's global batch, micro-batch,
// schedule, recomputation and precision, and varies tp and pp (and vpp and
// zero where Limits allow them) as `gpucoord plan --auto` does.
type PlannerInput struct {
	Cluster topology.Cluster `json:"cluster"`
	Model   topology.Model   `json:"model"`
	Config  topology.Config  `json:"config"`
	Limits  Limits           `json:"limits,omitzero"`
}

// Limits are the degrees a re-plan may choose: a list allows those values
// alone; an empty one allows any for tp, pp and dp, and the spec's own for
// vpp and zero.
type Limits struct {
	TP   []int `json:"tp,omitempty"`
	PP   []int `json:"pp,omitempty"`
	DP   []int `json:"dp,omitempty"`
	VPP  []int `json:"vpp,omitempty"`
	Zero []int `json:"zero,omitempty"`
}

// ReplanMode is spec's re-planning mode, "" resolved: auto with a
// planner, else dp-only.
func ReplanMode(spec *pb.JobSpec) string {
	r := spec.GetReplan()
	if r.GetMode() != "" {
		return r.GetMode()
	}
	if len(r.GetPlanner()) > 0 {
		return ReplanAuto
	}
	return ReplanDPOnly
}

// checkReplan is ValidateSpec's part for the replan field.
func checkReplan(j *pb.JobSpec, name func(string) string) error {
	r := j.GetReplan()
	switch mode := ReplanMode(j); {
	case r == nil:
		return nil
	case mode != ReplanAuto && mode != ReplanDPOnly && mode != ReplanOff:
		return fmt.Errorf("%s %q: want auto, dp-only or off", name("replan.mode"), r.GetMode())
	case mode == ReplanAuto && len(r.GetPlanner()) == 0:
		return fmt.Errorf("%s auto needs a model to plan with (%s)", name("replan.mode"), name("replan.planner"))
	case mode == ReplanAuto && j.GetDp() > 0:
		return fmt.Errorf("%s auto changes dp with the nodes: give no %s", name("replan.mode"), name("dp"))
	case r.GetGrowGain() < 0 || r.GetMinSamplesPerSecond() < 0:
		return fmt.Errorf("%s %g and %s %g: want both >= 0", name("replan.grow_gain"), r.GetGrowGain(),
			name("replan.min_samples_per_second"), r.GetMinSamplesPerSecond())
	}
	if len(r.GetPlanner()) > 0 {
		if _, err := parsePlanner(r.GetPlanner()); err != nil {
			return fmt.Errorf("%s: %w", name("replan.planner"), err)
		}
	}
	return nil
}

func parsePlanner(b []byte) (PlannerInput, error) {
	var in PlannerInput
	if err := json.Unmarshal(b, &in); err != nil {
		return in, err
	}
	in.Cluster.Nodes = max(in.Cluster.Nodes, 1)
	if err := in.Cluster.Validate(); err != nil {
		return in, err
	}
	if err := in.Model.Validate(); err != nil {
		return in, err
	}
	return in, nil
}

// choice is a layout the planner estimated for a number of nodes.
type choice struct {
	grid    pb.Grid
	dp      int
	stepSec float64 // estimated seconds a step
	memGiB  float64 // estimated peak memory of one GPU
	capGiB  float64 // one GPU's usable memory
	samples float64 // estimated samples (sequences) a second
}

// String is "41.2 of 80 GiB per GPU, 1.31 s/step estimated".
func (c choice) String() string {
	return fmt.Sprintf("%.1f of %.0f GiB per GPU, %.3g s/step estimated", c.memGiB, c.capGiB, c.stepSec)
}

// planner is what decide asks when it re-plans a job: the fastest layout
// the job may run on n nodes, and the estimate for a given one. Its
// answers are decide's input like the view (tests give a table).
type planner interface {
	best(n int) (choice, bool)
	estimate(n int, g pb.Grid) (choice, bool)
}

// searchPlanner is the leader's planner: package topology/estimate's
// search over one job's PlannerInput, each answer kept (the input never
// changes for a job).
type searchPlanner struct {
	spec *pb.JobSpec
	in   PlannerInput

	mu    sync.Mutex
	bests map[int]*choice
}

func newSearchPlanner(spec *pb.JobSpec) (*searchPlanner, error) {
	in, err := parsePlanner(spec.GetReplan().GetPlanner())
	if err != nil {
		return nil, err
	}
	return &searchPlanner{spec: spec, in: in, bests: map[int]*choice{}}, nil
}

func (p *searchPlanner) cluster(n int) topology.Cluster {
	cl := p.in.Cluster
	cl.Nodes, cl.GPUsPerNode = n, int(p.spec.GetGpusPerNode())
	return cl
}

func (p *searchPlanner) choiceOf(r estimate.Report, c topology.Config) choice {
	ch := choice{grid: gridOf(c), dp: c.DP,
		stepSec: r.Step.Seconds, memGiB: r.Memory.PerGPU.Total / topology.GiB, capGiB: r.Memory.UsableBytes / topology.GiB}
	if r.Step.Seconds > 0 {
		ch.samples = float64(c.GlobalBatch) / r.Step.Seconds
	}
	return ch
}

// allows reports whether the job may run grid g on n nodes: the limits,
// and the job's own layout rules (global batch, micro-batch, domains).
func (p *searchPlanner) allows(c topology.Config, n int) bool {
	in := func(list []int, v int, dflt int) bool {
		if len(list) == 0 {
			return dflt < 0 || v == dflt
		}
		return slices.Contains(list, v)
	}
	vpp := int(p.spec.GetVpp())
	if vpp == 0 {
		vpp = 1
		if p.spec.GetSchedule() == string(schedule.Interleaved) {
			vpp = 2 // topology.ShapeSpec's default for interleaved
		}
	}
	if !in(p.in.Limits.TP, c.TP, -1) || !in(p.in.Limits.PP, c.PP, -1) || !in(p.in.Limits.DP, c.DP, -1) || !in(p.in.Limits.VPP, max(c.VPP, 1), vpp) ||
		!in(p.in.Limits.Zero, c.Zero, int(p.spec.GetZero())) {
		return false
	}
	_, err := LayoutOn(p.spec, gridOf(c), n)
	return err == nil
}

// gridOf is the grid of a planner's configuration.
func gridOf(c topology.Config) pb.Grid {
	return pb.Grid{TP: int32(c.TP), PP: int32(c.PP), VPP: int32(max(c.VPP, 1)), Zero: int32(c.Zero)}
}

func (p *searchPlanner) best(n int) (choice, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.bests[n]; ok {
		return deref(c)
	}
	base := p.in.Config
	space := topology.DefaultSearchSpace()
	mb, rc := base.MicroBatch, base.Recompute
	space.Fixed.MicroBatch, space.Fixed.Recompute = &mb, &rc
	space.Allow = func(c topology.Config) bool { return p.allows(c, n) }
	var best *choice
	if res, err := estimate.Search(p.cluster(n), p.in.Model, base, space, 1, nil); err == nil && len(res.Top) > 0 {
		c := p.choiceOf(res.Top[0].Report, res.Top[0].Plan.Config)
		best = &c
	}
	p.bests[n] = best
	return deref(best)
}

func deref(c *choice) (choice, bool) {
	if c == nil {
		return choice{}, false
	}
	return *c, true
}

func (p *searchPlanner) estimate(n int, g pb.Grid) (choice, bool) {
	c := p.in.Config
	c.TP, c.PP, c.VPP, c.Zero = int(g.TP), int(g.PP), max(int(g.VPP), 1), int(g.Zero)
	world := n * int(p.spec.GetGpusPerNode())
	if world%(c.TP*c.PP) != 0 {
		return choice{}, false
	}
	c.DP = world / (c.TP * c.PP)
	c.SequenceParallel = c.TP > 1
	plan, err := topology.New(p.cluster(n), p.in.Model, c)
	if err != nil {
		return choice{}, false
	}
	r, err := estimate.Evaluate(plan)
	if err != nil || !r.Fits {
		return choice{}, false
	}
	return p.choiceOf(r, plan.Config), true
}
