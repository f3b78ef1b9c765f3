package estimate

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"gpucoord/topology"
)

// Document is the JSON form of a plan and its estimate, the shape scripts
// read from `gpucoord plan --json`.
type Document struct {
	WorldSize int                 `json:"world_size"`
	Cluster   topology.Cluster    `json:"cluster"`
	Model     ModelSummary        `json:"model"`
	Order     string              `json:"order"`
	Parallel  topology.Config     `json:"parallel"`
	Ranks     []topology.RankInfo `json:"ranks"`
	Groups    topology.Groups     `json:"groups"`
	Report
}

// ModelSummary names the model and its size.
type ModelSummary struct {
	topology.Model
	TotalParams float64 `json:"total_params"`
}

// NewDocument assembles the JSON document of p and r.
func NewDocument(p *topology.Plan, r Report) Document {
	return Document{
		WorldSize: p.World(), Cluster: p.Cluster,
		Model: ModelSummary{Model: p.Model, TotalParams: p.Model.TotalParams()},
		Order: p.Config.Order, Parallel: p.Config,
		Ranks: p.RankMap(), Groups: p.Groups(), Report: r,
	}
}

// WriteJSON writes the document of p and r, indented.
func WriteJSON(w io.Writer, p *topology.Plan, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(NewDocument(p, r))
}

// maxListed bounds how many nodes and groups the text form lists before
// summarising.
const maxListed = 8

// WriteText writes a readable summary of p and r: a rank map per node and a
// few groups per axis on big clusters rather than one line per rank.
func WriteText(w io.Writer, p *topology.Plan, r Report) error {
	b := &strings.Builder{}
	cl, m, c := p.Cluster, p.Model, p.Config
	name := m.Name
	if name == "" {
		name = "model"
	}
	fmt.Fprintf(b, "plan     %s (%.2fB params) on %s: %d nodes x %d GPUs, %.0f GiB each, NVLink domain %d GPUs\n",
		name, m.TotalParams()/1e9, cl.Name, cl.Nodes, cl.GPUsPerNode, cl.GPUMemoryGiB, cl.Domain())
	fmt.Fprintf(b, "layout   tp %d x pp %d x dp %d = %d GPUs, order %s, vpp %d, ZeRO %d, %s, schedule %s\n",
		c.TP, c.PP, c.DP, p.World(), c.Order, c.VPP, c.Zero, c.Precision, c.Schedule)
	fmt.Fprintf(b, "batch    global %d, micro-batch %d, %d micro-batches per replica; recompute %s, sequence parallel %s, flash attention %s, optimizer offload %s\n",
		c.GlobalBatch, c.MicroBatch, p.Microbatches(), c.Recompute, onOff(c.SequenceParallel), onOff(c.FlashAttention), onOff(c.OffloadOptimizer))

	b.WriteString("\nrank map (ranks fill nodes in order)\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  node\tranks\ttp\tpp\tdp")
	rm := p.RankMap()
	g := cl.GPUsPerNode
	for node := 0; node < cl.Nodes; node++ {
		if cl.Nodes > maxListed && node == maxListed-2 {
			fmt.Fprintf(tw, "  ...\t%d more nodes\t\t\t\n", cl.Nodes-maxListed)
			node = cl.Nodes - 2
		}
		rows := rm[node*g : (node+1)*g]
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", node, span(rows, func(ri topology.RankInfo) int { return int(ri.Rank) }),
			span(rows, func(ri topology.RankInfo) int { return ri.TP }),
			span(rows, func(ri topology.RankInfo) int { return ri.PP }),
			span(rows, func(ri topology.RankInfo) int { return ri.DP }))
	}
	tw.Flush()

	b.WriteString("\nprocess groups\n")
	l := linksOf(p)
	groups := p.Groups()
	for _, ax := range []struct {
		name string
		gs   [][]topology.Rank
		link string
	}{{"tp", groups.TP, l.tp.name}, {"pp", groups.PP, l.pp.name}, {"dp", groups.DP, l.dp.name}} {
		fmt.Fprintf(b, "  %s  %d groups of %d over %s:", ax.name, len(ax.gs), len(ax.gs[0]), ax.link)
		for i, gr := range ax.gs {
			if i == 4 && len(ax.gs) > 5 {
				b.WriteString(" ... " + rankList(ax.gs[len(ax.gs)-1]))
				break
			}
			b.WriteString(" " + rankList(gr))
		}
		b.WriteString("\n")
	}

	mr := r.Memory
	fmt.Fprintf(b, "\nmemory per GPU (GiB; capacity %.1f)\n", mr.CapacityBytes/topology.GiB)
	tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  stage\tparams\tgrads\toptimizer\tactivations\tother\ttotal\tin flight\t")
	for st := 0; st < len(mr.Stages); st++ {
		if len(mr.Stages) > maxListed && st == maxListed-2 {
			fmt.Fprintf(tw, "  ...\t\t\t\t\t\t\t\t\n")
			st = len(mr.Stages) - 2
		}
		sm := mr.Stages[st]
		mark := ""
		if st == mr.WorstStage {
			mark = " worst"
		}
		fmt.Fprintf(tw, "  %d%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t\n", st, mark, sm.Params/topology.GiB, sm.Grads/topology.GiB,
			sm.Optimizer/topology.GiB, sm.Activations/topology.GiB, sm.Other/topology.GiB, sm.Total/topology.GiB, r.Pipeline.PeakInFlight[st])
	}
	tw.Flush()
	if mr.HostOptimizerBytes > 0 {
		fmt.Fprintf(b, "  optimizer offloaded: %.1f GiB of host memory per node\n", mr.HostOptimizerBytes/topology.GiB)
	}

	fmt.Fprintf(b, "\npipeline %s, %d stages x %d virtual, %d micro-batches: bubble %.1f%% of ideal compute\n",
		r.Pipeline.Schedule, c.PP, c.VPP, r.Pipeline.Microbatches, 100*r.Pipeline.BubbleFraction)
	if len(r.Traffic) > 0 {
		b.WriteString("\ntraffic per step, per GPU\n")
		tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  group\top\tcount\tmessage\tsent\tlink\ttime")
		for _, t := range r.Traffic {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%.3f s\n", t.Group, t.Collective, t.Count, size(t.MessageBytes), size(t.BytesPerGPU), t.Link, t.Seconds)
		}
		tw.Flush()
	}
	if st := r.Step; st.Seconds > 0 {
		fmt.Fprintf(b, "\nstep     %.3g FLOPs, %.3f s (pipeline %.3f s + data-parallel %.3f s), %.0f TFLOP/s per GPU, %.0f tokens/s\n",
			st.FLOPs, st.Seconds, st.PipelineSeconds, st.DPSeconds, st.TFLOPSPerGPU, st.TokensPerSecond)
	} else {
		b.WriteString("\nstep     no time estimate for a bare parameter count (give an architecture)\n")
	}
	if r.Fits {
		fmt.Fprintf(b, "fits     yes: worst stage %d uses %.1f of %.1f GiB\n", mr.WorstStage, mr.PerGPU.Total/topology.GiB, mr.CapacityBytes/topology.GiB)
	} else {
		b.WriteString("fits     NO\n")
		for _, why := range r.Reasons {
			b.WriteString("  - " + why + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// size formats bytes with a binary unit.
func size(n float64) string {
	switch {
	case n >= topology.GiB:
		return fmt.Sprintf("%.2f GiB", n/topology.GiB)
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%.0f B", n)
}

// rankList formats a group compactly.
func rankList(g []topology.Rank) string {
	parts := make([]string, 0, min(len(g), 9))
	for i, r := range g {
		if i == 8 && len(g) > 9 {
			parts = append(parts, "...", fmt.Sprint(g[len(g)-1]))
			break
		}
		parts = append(parts, fmt.Sprint(r))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// span formats the distinct values of f over rows as "a", "a-b" or a list.
func span(rows []topology.RankInfo, f func(topology.RankInfo) int) string {
	seen := map[int]bool{}
	var vals []int
	lo, hi := int(^uint(0)>>1), -1
	for _, r := range rows {
		v := f(r)
		if !seen[v] {
			seen[v] = true
			vals = append(vals, v)
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	switch {
	case len(vals) == 1:
		return fmt.Sprint(vals[0])
	case hi-lo+1 == len(vals):
		return fmt.Sprintf("%d-%d", lo, hi)
	}
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}
