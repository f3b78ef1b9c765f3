package main

import (
	"cmp"
	"encoding/json"
	"io"

	"github.com/gpucoord/gpucoord/coordinator"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/worker/engine"
)

// The JSON that gpucoord prints for scripts shares one schema family
// (docs/LAUNCH.md, "JSON output"): each document, or the first line of a
// stream, names its schema; the objects they have in common (a layout, a
// step, a phase) have one shape, defined here. A change that removes or
// retypes a field takes a new number.
const (
	statusSchema     = "gpucoord.status/1"      // status --json
	launchSchema     = "gpucoord.launch/1"      // launch --json, follow --json: JSON lines
	planSchema       = "gpucoord.plan/1"        // plan --json
	planSearchSchema = "gpucoord.plan-search/1" // plan --auto --json
)

// statusJSON is what status --json prints: numbers as JSON numbers, phases
// spelled as the text output spells them, a job's layout as it runs, and
// nothing opaque.
type statusJSON struct {
	Schema string     `json:"schema"`
	Leader string     `json:"leader"`
	Nodes  []nodeJSON `json:"nodes"`
	Jobs   []jobJSON  `json:"jobs"`
}

type nodeJSON struct {
	Name     string `json:"name"`
	Host     string `json:"host"`
	Instance string `json:"instance"` // this run of its agent
	GPUs     int32  `json:"gpus"`
	Domain   string `json:"failure_domain,omitempty"`
	Job      string `json:"job,omitempty"` // the job it runs; absent when idle
}

type jobJSON struct {
	ID      string     `json:"id"`
	Phase   string     `json:"phase"` // pending, running, succeeded, failed, cancelled
	Reason  string     `json:"reason,omitempty"`
	Native  bool       `json:"native"` // the native engine, else command
	Command []string   `json:"command,omitempty"`
	Layout  layoutJSON `json:"layout"`
	// Generation is the current one (absent before the first).
	Generation *generationJSON `json:"generation,omitempty"`
	// Step is rank 0's last step, as a launch --json step line.
	Step          *launchStep     `json:"step,omitempty"`
	CommittedStep int64           `json:"committed_step"`
	Members       []memberJSON    `json:"members,omitempty"`
	Stragglers    []stragglerJSON `json:"stragglers,omitempty"`
	Failure       *failureJSON    `json:"failure,omitempty"`
}

// layoutJSON is a layout: a job's as its current generation runs it, else
// as it would run on --nodes (status, launch), or a plan's.
type layoutJSON struct {
	Nodes       int32  `json:"nodes"`
	GPUsPerNode int32  `json:"gpus_per_node"`
	World       int32  `json:"world"`
	TP          int32  `json:"tp"`
	PP          int32  `json:"pp"`
	DP          int32  `json:"dp"`
	Zero        int32  `json:"zero"`
	Schedule    string `json:"schedule,omitempty"`
}

// jobLayout is spec's layout as generation g runs it (nil: as it would
// run on spec's nodes).
func jobLayout(spec *pb.JobSpec, g *pb.Generation) layoutJSON {
	l := layoutJSON{Nodes: spec.GetNodes(), GPUsPerNode: spec.GetGpusPerNode(), TP: spec.GetTp(), PP: spec.GetPp(),
		Zero: spec.GetZero(), Schedule: spec.GetSchedule()}
	if g != nil {
		grid := pb.GenerationGrid(spec, g)
		l.Nodes, l.World, l.DP, l.TP, l.PP, l.Zero = int32(len(g.Members)), g.World, g.Dp, grid.TP, grid.PP, grid.Zero
	} else if sh, err := coordinator.Layout(spec, int(spec.GetNodes())); err == nil {
		l.World, l.DP = int32(sh.World()), int32(sh.DP)
	}
	return l
}

// planLayout is plan p's layout.
func planLayout(p *topology.Plan) layoutJSON {
	c := p.Config
	return layoutJSON{Nodes: int32(p.Cluster.Nodes), GPUsPerNode: int32(p.Cluster.GPUsPerNode), World: int32(p.World()),
		TP: int32(c.TP), PP: int32(c.PP), DP: int32(c.DP), Zero: int32(c.Zero), Schedule: string(c.Schedule)}
}

// generationOf is g as status --json and launch --json show it.
func generationOf(g *pb.Generation) *generationJSON {
	gj := &generationJSON{Number: g.Number, ResumeStep: g.ResumeStep, Reason: g.Reason, Hangs: g.Hangs}
	for _, m := range g.Members {
		gj.Nodes = append(gj.Nodes, m.Node)
	}
	return gj
}

type generationJSON struct {
	Number     int64    `json:"number"`
	Nodes      []string `json:"nodes"`
	ResumeStep int64    `json:"resume_step"`
	Reason     string   `json:"reason,omitempty"`
	Hangs      int32    `json:"hangs"`
}

type memberJSON struct {
	Node      string `json:"node"`
	FirstRank int32  `json:"first_rank"`
	Ranks     int32  `json:"ranks"`
	State     string `json:"state"` // alive, disconnected, lost
}

type stragglerJSON struct {
	Rank      int32   `json:"rank"`
	Node      string  `json:"node"`
	LocalRank int32   `json:"local_rank"`
	Ratio     float64 `json:"ratio"`
}

type failureJSON struct {
	Rank      int32    `json:"rank"` // -1: no rank (a node lost)
	Node      string   `json:"node,omitempty"`
	ExitCode  int32    `json:"exit_code"`
	Output    string   `json:"output,omitempty"`
	LostNodes []string `json:"lost_nodes,omitempty"`
}

// writeStatusJSON prints s as statusJSON.
func writeStatusJSON(w io.Writer, s *pb.StatusResponse) error {
	out := statusJSON{Schema: statusSchema, Leader: s.Leader, Nodes: []nodeJSON{}, Jobs: []jobJSON{}}
	for _, n := range s.Nodes {
		out.Nodes = append(out.Nodes, nodeJSON{Name: n.Node.GetName(), Host: n.Node.GetHost(), Instance: n.Node.GetInstance(), GPUs: n.Node.GetGpus(),
			Domain: cmp.Or(n.Node.GetFailureDomain(), n.Node.GetNvlinkDomain()), Job: n.Job})
	}
	for _, j := range s.Jobs {
		spec, st := j.Spec, j.State
		x := jobJSON{ID: spec.GetId(), Phase: phaseWord(st.GetPhase()), Reason: st.GetReason(), Native: len(spec.GetCommand()) == 0,
			Command: spec.GetCommand(), CommittedStep: j.CommittedStep, Layout: jobLayout(spec, j.Generation)}
		if g := j.Generation; g != nil {
			x.Generation = generationOf(g)
		}
		if s := j.LastStep; s != nil {
			x.Step = stepOf(s)
		}
		for _, m := range j.Members {
			x.Members = append(x.Members, memberJSON{Node: m.Node, FirstRank: m.FirstRank, Ranks: m.Ranks, State: m.State})
		}
		for _, s := range j.Stragglers {
			x.Stragglers = append(x.Stragglers, stragglerJSON{Rank: s.Rank, Node: s.Node, LocalRank: s.LocalRank, Ratio: s.Ratio})
		}
		if st.GetPhase() == pb.JobState_FAILED {
			x.Failure = &failureJSON{Rank: st.FailedRank, Node: st.FailedNode, ExitCode: st.ExitCode, Output: st.Output, LostNodes: st.LostNodes}
		}
		out.Jobs = append(out.Jobs, x)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// launchStep is a step: rank 0's, as a line of launch --json (train
// --json's fields plus the generation and the data-parallel degree that
// trained it) and as status --json's job.step.
type launchStep struct {
	engine.StepResult
	Generation int64 `json:"generation"`
	DP         int   `json:"dp"`
}

func stepOf(s *pb.Step) *launchStep {
	x := &launchStep{Generation: s.Generation, DP: int(s.Dp)}
	x.Step, x.Loss, x.Seconds, x.SamplesPerSec = int(s.Step), s.Loss, s.Seconds, s.SamplesPerSec
	return x
}

// launchCommit is the part of a commit line of launch --json that names
// the step every rank's checkpoint holds, with its copies in place.
type launchCommit struct {
	Committed  int64 `json:"committed"`
	Generation int64 `json:"generation"`
	Backup     bool  `json:"backup,omitempty"`
}

// launchEvent is a line of launch --json (and follow --json) other than
// a step's or a commit's: submitted (or following: the first line, with
// the schema), generation, or end.
type launchEvent struct {
	Schema     string          `json:"schema,omitempty"`
	Event      string          `json:"event"`
	Job        string          `json:"job,omitempty"`
	Generation *generationJSON `json:"generation,omitempty"`
	Layout     *layoutJSON     `json:"layout,omitempty"`
	Phase      string          `json:"phase,omitempty"` // end: as status spells it
	Reason     string          `json:"reason,omitempty"`
	ExitCode   *int32          `json:"exit_code,omitempty"`
}

// stepEvent and commitEvent are the lines of a step and of a commit: they
// start {"step": and {"committed":, as train --json's step lines do.
type stepEvent struct {
	launchStep
	Event string `json:"event"`
}

type commitEvent struct {
	launchCommit
	Event string `json:"event"`
}
