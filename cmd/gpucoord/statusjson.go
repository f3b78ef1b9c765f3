package main

import (
	"cmp"
	"encoding/json"
	"io"

	"github.com/gpucoord/gpucoord/coordinator"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// statusSchema names the shape of status --json (docs/LAUNCH.md, "status
// --json"); a change that removes or retypes a field takes a new number.
const statusSchema = "gpucoord.status/1"

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

// layoutJSON is the job's layout: as its current generation runs it, else
// as it would run on --nodes.
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
			Command: spec.GetCommand(), CommittedStep: j.CommittedStep,
			Layout: layoutJSON{Nodes: spec.GetNodes(), GPUsPerNode: spec.GetGpusPerNode(), TP: spec.GetTp(), PP: spec.GetPp(),
				Zero: spec.GetZero(), Schedule: spec.GetSchedule()}}
		if g := j.Generation; g != nil {
			x.Layout.Nodes, x.Layout.World, x.Layout.DP = int32(len(g.Members)), g.World, g.Dp
			gj := &generationJSON{Number: g.Number, ResumeStep: g.ResumeStep, Reason: g.Reason, Hangs: g.Hangs}
			for _, m := range g.Members {
				gj.Nodes = append(gj.Nodes, m.Node)
			}
			x.Generation = gj
		} else if l, err := coordinator.Layout(spec, int(spec.GetNodes())); err == nil {
			x.Layout.World, x.Layout.DP = int32(l.World()), int32(l.DP)
		}
		if s := j.LastStep; s != nil {
			x.Step = &launchStep{Generation: s.Generation, DP: int(s.Dp)}
			x.Step.Step, x.Step.Loss, x.Step.Seconds, x.Step.SamplesPerSec = int(s.Step), s.Loss, s.Seconds, s.SamplesPerSec
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
