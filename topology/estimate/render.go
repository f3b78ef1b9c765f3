package estimate

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpucoord/gpucoord/topology"
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
	fmt.Fprintf(b, "plan     %s (%.2fB params) on %s: %s x %s, %.4g GiB each, NVLink domain %s\n",
		name, m.TotalParams()/1e9, cl.Name, plural(cl.Nodes, "node", "nodes"), plural(cl.GPUsPerNode, "GPU", "GPUs"), cl.GPUMemoryGiB, plural(cl.Domain(), "GPU", "GPUs"))
	fmt.Fprintf(b, "layout   tp %d x pp %d x dp %d = %s, order %s, vpp %d, ZeRO %d, %s, schedule %s\n",
		c.TP, c.PP, c.DP, plural(p.World(), "GPU", "GPUs"), c.Order, c.VPP, c.Zero, c.Precision, c.Schedule)
	fmt.Fprintf(b, "batch    global %d, micro-batch %d, %s per replica; recompute %s, sequence parallel %s, flash attention %s, optimizer offload %s\n",
		c.GlobalBatch, c.MicroBatch, plural(p.Microbatches(), "micro-batch", "micro-batches"), c.Recompute, onOff(c.SequenceParallel), onOff(c.FlashAttention), onOff(c.OffloadOptimizer))

	b.WriteString("\nrank map (ranks fill nodes in order)\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  node\tranks\ttp\tpp\tdp")
	rm := p.RankMap()
	g := cl.GPUsPerNode
	for node := 0; node < cl.Nodes; node++ {
		if cl.Nodes > maxListed && node == maxListed-2 {
			fmt.Fprintf(tw, "  ...\t%s more\t\t\t\n", plural(cl.Nodes-maxListed, "node", "nodes"))
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
		fmt.Fprintf(b, "  %s  %s of %d over %s:", ax.name, plural(len(ax.gs), "group", "groups"), len(ax.gs[0]), ax.link)
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
	if mr.UsableBytes < mr.CapacityBytes {
		fmt.Fprintf(b, "\nmemory per GPU (GiB; capacity %.1f, %.1f kept free as headroom; %s loss)\n", mr.CapacityBytes/topology.GiB, (mr.CapacityBytes-mr.UsableBytes)/topology.GiB, lossName(c))
	} else {
		fmt.Fprintf(b, "\nmemory per GPU (GiB; capacity %.1f; %s loss)\n", mr.CapacityBytes/topology.GiB, lossName(c))
	}
	tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  stage\tparams\tgrads\toptimizer\tactivations\ttransient\tother\ttotal\tin flight\t")
	for st := 0; st < len(mr.Stages); st++ {
		if len(mr.Stages) > maxListed && st == maxListed-2 {
			fmt.Fprintf(tw, "  ...\t\t\t\t\t\t\t\t\t\n")
			st = len(mr.Stages) - 2
		}
		sm := mr.Stages[st]
		mark := ""
		if st == mr.WorstStage {
			mark = " worst"
		}
		fmt.Fprintf(tw, "  %d%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t\n", st, mark, sm.Params/topology.GiB, sm.Grads/topology.GiB,
			sm.Optimizer/topology.GiB, sm.Activations/topology.GiB, sm.Transient/topology.GiB, sm.Other/topology.GiB, sm.Total/topology.GiB, r.Pipeline.PeakInFlight[st])
	}
	tw.Flush()
	if mr.HostOptimizerBytes > 0 {
		fmt.Fprintf(b, "  optimizer offloaded: %.1f GiB of host memory per node\n", mr.HostOptimizerBytes/topology.GiB)
	}

	fmt.Fprintf(b, "\npipeline %s, %s x %d virtual, %s: bubble %.1f%% of ideal compute\n",
		r.Pipeline.Schedule, plural(c.PP, "stage", "stages"), c.VPP, plural(r.Pipeline.Microbatches, "micro-batch", "micro-batches"), 100*r.Pipeline.BubbleFraction)
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
		fmt.Fprintf(b, "\nstep     %.3g FLOPs, %.3f s (pipeline %.3f s + output layer %.3f s + data-parallel %.3f s + optimizer %.3f s, %s), %.0f TFLOP/s per GPU (MFU %.1f%%), %.0f tokens/s\n",
			st.FLOPs, st.Seconds, st.PipelineSeconds, st.OutputSeconds, st.DPSeconds, st.OptimizerSeconds, optimizerName(p.Config), st.TFLOPSPerGPU, 100*st.MFU, st.TokensPerSecond)
	} else {
		b.WriteString("\nstep     no time estimate for a bare parameter count (give an architecture)\n")
	}
	if r.Fits {
		fmt.Fprintf(b, "fits     yes: worst stage %d uses %.1f of %.1f GiB\n", mr.WorstStage, mr.PerGPU.Total/topology.GiB, mr.UsableBytes/topology.GiB)
	} else {
		b.WriteString("fits     NO\n")
		for _, why := range r.Reasons {
			b.WriteString("  - " + why + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// SearchPlan is one ranked plan in the JSON form of a search
// (`gpucoord plan --auto --json`).
type SearchPlan struct {
	// Rank is the plan's place, 1 for the fastest.
	Rank int `json:"rank"`
	// Parallel is the plan's layout and training setup.
	Parallel topology.Config `json:"parallel"`
	// Memory is the plan's per-GPU memory.
	Memory MemoryReport `json:"memory"`
	// Pipeline is the schedule's shape and bubble.
	Pipeline Pipeline `json:"pipeline"`
	// Step is the estimated cost of one training step.
	Step Step `json:"step"`
	// Traffic lists the communication of one step per process group.
	Traffic []Traffic `json:"traffic"`
	// Fits reports whether the plan fits (always true for a ranked plan).
	Fits bool `json:"fits"`
	// Command plans this layout alone, every setting given (gpucoord plan
	// ...); absent when the caller set none.
	Command string `json:"command,omitempty"`
}

// SearchDocument is the JSON form of a SearchResult, the shape scripts read
// from `gpucoord plan --auto --json`.
type SearchDocument struct {
	// Candidates is the number of valid layouts evaluated.
	Candidates int `json:"candidates"`
	// Fitting is how many of them fit.
	Fitting int `json:"fitting"`
	// Why explains why the first plan wins over the runner-up.
	Why string `json:"why"`
	// Fixed lists what the search was not allowed to change (the flags
	// given with --auto); empty when nothing was fixed.
	Fixed string `json:"fixed,omitempty"`
	// Plans holds the ranked plans, fastest first; empty, not null, when
	// nothing fits.
	Plans []SearchPlan `json:"plans"`
}

// NewSearchDocument assembles the JSON document of res.
func NewSearchDocument(res SearchResult) SearchDocument {
	doc := SearchDocument{Candidates: res.Candidates, Fitting: res.Fitting, Why: res.Why, Fixed: res.Fixed, Plans: []SearchPlan{}}
	for i, t := range res.Top {
		doc.Plans = append(doc.Plans, SearchPlan{Rank: i + 1, Parallel: t.Plan.Config, Memory: t.Report.Memory,
			Pipeline: t.Report.Pipeline, Step: t.Report.Step, Traffic: t.Report.Traffic, Fits: t.Report.Fits, Command: t.Command})
	}
	return doc
}

// WriteSearchJSON writes the document of res, indented.
func WriteSearchJSON(w io.Writer, res SearchResult) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(NewSearchDocument(res))
}

// WriteSearchText writes res, a search of model m on cluster cl, as a
// table of the top plans and why the first wins, or a line saying that no
// layout fits.
func WriteSearchText(w io.Writer, cl topology.Cluster, m topology.Model, res SearchResult) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "searched %s of %s on %s; %d fit\n", plural(res.Candidates, "valid layout", "valid layouts"), m.Name, plural(cl.World(), "GPU", "GPUs"), res.Fitting)
	if res.Fixed != "" {
		fmt.Fprintf(b, "fixed by the flags given: %s\n", res.Fixed)
	}
	b.WriteString("\n")
	if len(res.Top) == 0 {
		fmt.Fprintf(b, "no layout fits: %s\n", res.NoFit)
	} else {
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "#\ttp\tpp\tdp\tvpp\tzero\tmb\trecompute\tschedule\tstep s\tTFLOP/s/GPU\tMFU\tbubble\tmem GiB")
		for i, t := range res.Top {
			c := t.Plan.Config
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%.3f\t%.0f\t%.1f%%\t%.1f%%\t%.1f\n", i+1, c.TP, c.PP, c.DP, c.VPP, c.Zero, c.MicroBatch,
				c.Recompute, c.Schedule, t.Report.Step.Seconds, t.Report.Step.TFLOPSPerGPU, 100*t.Report.Step.MFU, 100*t.Report.Pipeline.BubbleFraction,
				t.Report.Memory.PerGPU.Total/topology.GiB)
		}
		tw.Flush()
		fmt.Fprintf(b, "\nwhy: %s\n", res.Why)
		for i, t := range res.Top {
			if t.Command == "" {
				continue
			}
			if i == 0 {
				b.WriteString("\neach plan alone, every setting given:\n")
			}
			fmt.Fprintf(b, "  %d  %s\n", i+1, t.Command)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// plural formats n with the singular or plural noun: "1 rank", "2 ranks".
func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
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

// lossName names the cross-entropy implementation the memory assumes.
func lossName(c topology.Config) string {
	if c.Loss == "" {
		return string(topology.LossUnfused)
	}
	return string(c.Loss)
}

// optimizerName says which Adam the step time assumes.
func optimizerName(c topology.Config) string {
	switch {
	case c.OffloadOptimizer:
		return "offloaded, not timed"
	case c.Optimizer == topology.OptimizerMultiTensor:
		return "multi-tensor Adam"
	}
	return "fused Adam"
}
