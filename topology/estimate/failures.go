package estimate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpucoord/gpucoord/topology"
)

// Failure is what a re-plan would run on the nodes left after Lost of a
// cluster's nodes are gone: the fastest layout that fits the most of them
// it can use, training the same global batch, or none (the job would
// pause).
type Failure struct {
	// Lost is how many nodes are gone; Nodes how many are left; Used how
	// many of those Best runs on (as the coordinator does, the most that a
	// layout fits: the global batch or the model's shape may not split
	// over all of them).
	Lost, Nodes, Used int
	// Candidates is how many valid layouts the Used nodes allow.
	Candidates int
	// Best is the layout a re-plan would choose; nil when none fits.
	Best *Ranked
}

// Failures searches, for 0 to k lost nodes, the fastest layout that fits
// the nodes left, as Search does for the whole cluster (space bounds each
// search). Every row trains the global batch of the whole cluster (base's,
// else DefaultGlobalBatch of cl), so that a re-plan keeps the job's
// optimisation where it was. k is at most cl.Nodes - 1.
func Failures(cl topology.Cluster, m topology.Model, base topology.Config, space topology.SearchSpace, k int) ([]Failure, error) {
	if k < 0 || k >= cl.Nodes {
		return nil, fmt.Errorf("%w: --failures %d: the cluster has %d nodes; at least one must be left", topology.ErrInvalid, k, cl.Nodes)
	}
	if base.GlobalBatch == 0 {
		base.GlobalBatch = topology.DefaultGlobalBatch(cl, base.MicroBatch)
	}
	var out []Failure
	for lost := 0; lost <= k; lost++ {
		f := Failure{Lost: lost, Nodes: cl.Nodes - lost}
		for used := f.Nodes; used >= 1 && f.Best == nil; used-- {
			on := cl
			on.Nodes = used
			res, err := Search(on, m, base, space, 1, nil)
			if err != nil {
				return nil, err
			}
			if used == f.Nodes {
				f.Candidates = res.Candidates
			}
			if len(res.Top) > 0 {
				f.Best, f.Used, f.Candidates = &res.Top[0], used, res.Candidates
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// FailureJSON is one row of plan --failures --json.
type FailureJSON struct {
	Lost       int     `json:"lost"`
	Nodes      int     `json:"nodes"`
	Used       int     `json:"used,omitempty"`
	Candidates int     `json:"candidates"`
	Pauses     bool    `json:"pauses"`
	Layout     string  `json:"layout,omitempty"`
	TP         int     `json:"tp,omitempty"`
	PP         int     `json:"pp,omitempty"`
	DP         int     `json:"dp,omitempty"`
	VPP        int     `json:"vpp,omitempty"`
	Zero       int     `json:"zero"`
	MicroBatch int     `json:"micro_batch,omitempty"`
	MemoryGPU  float64 `json:"memory_per_gpu_bytes,omitempty"`
	Capacity   float64 `json:"capacity_bytes,omitempty"`
	StepSec    float64 `json:"step_seconds,omitempty"`
}

// NewFailuresJSON turns Failures' rows into their JSON.
func NewFailuresJSON(fs []Failure) []FailureJSON {
	out := make([]FailureJSON, len(fs))
	for i, f := range fs {
		j := FailureJSON{Lost: f.Lost, Nodes: f.Nodes, Used: f.Used, Candidates: f.Candidates, Pauses: f.Best == nil}
		if b := f.Best; b != nil {
			c := b.Plan.Config
			j.Layout, j.TP, j.PP, j.DP, j.VPP, j.Zero, j.MicroBatch = Label(b.Plan), c.TP, c.PP, c.DP, c.VPP, c.Zero, c.MicroBatch
			j.MemoryGPU, j.Capacity, j.StepSec = b.Report.Memory.PerGPU.Total, b.Report.Memory.UsableBytes, b.Report.Step.Seconds
		}
		out[i] = j
	}
	return out
}

// WriteFailuresText renders Failures' rows: one line per number of lost
// nodes, with the layout a re-plan would run, its memory per GPU and its
// step time against the whole cluster's, or that the job would pause.
func WriteFailuresText(w io.Writer, cl topology.Cluster, m topology.Model, fs []Failure) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "%s on %d nodes of %d GPUs: what a re-plan would run after losing nodes (same global batch)\n\n", m.Name, cl.Nodes, cl.GPUsPerNode)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "lost\tnodes left\tused\tlayout\tmem GiB/GPU\tstep s\tvs. all nodes")
	var full float64
	for _, f := range fs {
		if f.Best == nil {
			fmt.Fprintf(tw, "%d\t%d\t-\tpauses: no layout fits any of them\t\t\t\n", f.Lost, f.Nodes)
			continue
		}
		r := f.Best.Report
		if f.Lost == 0 {
			full = r.Step.Seconds
		}
		vs := "-"
		if full > 0 && r.Step.Seconds > 0 {
			vs = fmt.Sprintf("%.2fx", r.Step.Seconds/full)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%.1f of %.1f\t%.3f\t%s\n", f.Lost, f.Nodes, f.Used, Label(f.Best.Plan), r.Memory.PerGPU.Total/topology.GiB,
			r.Memory.UsableBytes/topology.GiB, r.Step.Seconds, vs)
	}
	tw.Flush()
	_, err := io.WriteString(w, b.String())
	return err
}
