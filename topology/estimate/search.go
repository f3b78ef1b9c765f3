package estimate

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gpucoord/gpucoord/topology"
)

// Ranked is one evaluated candidate of a search.
type Ranked struct {
	// Command is the command line that plans this layout alone, for the
	// caller to set (gpucoord plan fills it); rendered when not empty.
	Command string
	Plan    *topology.Plan
	Report  Report

	bound float64 // lowerBound of the step time
	built built
}

// SearchResult is the outcome of Search.
type SearchResult struct {
	// Candidates is the number of valid layouts evaluated.
	Candidates int
	// Fitting is how many of them fit.
	Fitting int
	// Top holds the fastest fitting plans, fastest first.
	Top []Ranked
	// Why explains why Top[0] wins over the runner-up.
	Why string
	// Fixed lists what the search was not allowed to change.
	Fixed string
	// NoFit says what could help when no layout fits: remedies not already
	// in use.
	NoFit string
}

// Search evaluates every candidate layout (topology.Candidates) and returns
// the top fitting ones by estimated step time; ties go to the plan with
// less memory. progress, if not nil, is called every 1000 candidates.
func Search(cl topology.Cluster, m topology.Model, base topology.Config, space topology.SearchSpace, top int, progress func(done int)) (SearchResult, error) {
	res := SearchResult{Fixed: space.Fixed.String()}
	tips := []string{"more GPUs", "a larger --global-batch split"}
	if !base.OffloadOptimizer {
		tips = append(tips, "--offload-optimizer")
	}
	if base.Recompute != topology.RecomputeFull && space.Fixed.Recompute != nil {
		tips = append(tips, "--recompute full")
	}
	res.NoFit = "try " + strings.Join(tips[:len(tips)-1], ", ") + ", or " + tips[len(tips)-1]
	var fits []Ranked
	var firstErr error
	e := newEvaluator()
	seen := 0
	res.Candidates = topology.Candidates(cl, m, base, space, func(p *topology.Plan) bool {
		r, b, err := e.memory(p)
		if err != nil {
			firstErr = err
			return false
		}
		if r.Fits {
			fits = append(fits, Ranked{Plan: p, Report: r, bound: e.lowerBound(p, r), built: b})
		}
		if seen++; progress != nil && seen%1000 == 0 {
			progress(seen)
		}
		return true
	})
	if firstErr != nil {
		return res, firstErr
	}
	res.Fitting = len(fits)
	// Simulate in order of the lower bound, and stop once the bound alone
	// is slower than the top-th best simulated plan: branch and bound.
	sort.SliceStable(fits, func(i, j int) bool { return fits[i].bound < fits[j].bound })
	// Keep at least two, so the winner is explained against the runner-up
	// even when only one is shown.
	keep := max(top, 2)
	var done []Ranked
	for _, f := range fits {
		if len(done) >= keep && f.bound > done[keep-1].Report.Step.Seconds {
			break
		}
		if err := e.timing(f.Plan, f.built, &f.Report); err != nil {
			return res, err
		}
		done = append(done, f)
		sort.SliceStable(done, func(i, j int) bool { return better(done[i], done[j]) })
	}
	if len(done) > keep {
		done = done[:keep]
	}
	res.Why = why(done)
	res.Top = done[:min(top, len(done))]
	return res, nil
}

// better orders by step time (bare models: by memory), then memory.
func better(a, b Ranked) bool {
	sa, sb := a.Report.Step.Seconds, b.Report.Step.Seconds
	if sa != sb {
		return sa < sb
	}
	return a.Report.Memory.PerGPU.Total < b.Report.Memory.PerGPU.Total
}

// Label names a plan's layout in one short line.
func Label(p *topology.Plan) string {
	c := p.Config
	s := fmt.Sprintf("tp %d pp %d dp %d", c.TP, c.PP, c.DP)
	if c.VPP > 1 {
		s += fmt.Sprintf(" vpp %d", c.VPP)
	}
	return s + fmt.Sprintf(" zero %d mb %d recompute %s", c.Zero, c.MicroBatch, c.Recompute)
}

// why explains the winner against the runner-up, naming the terms of the
// step time where it gains the most.
func why(top []Ranked) string {
	if len(top) == 0 {
		return ""
	}
	a := top[0]
	if len(top) == 1 {
		return fmt.Sprintf("%s is the only layout that fits", Label(a.Plan))
	}
	b := top[1]
	sa, sb := a.Report.Step, b.Report.Step
	if sa.Seconds == 0 {
		return fmt.Sprintf("%s needs the least memory per GPU (%s vs %s)", Label(a.Plan),
			gib(a.Report.Memory.PerGPU.Total), gib(b.Report.Memory.PerGPU.Total))
	}
	if sb.Seconds-sa.Seconds <= 1e-3*sb.Seconds {
		return fmt.Sprintf("%s wins: it ties on step time (%.3f s) with the runner-up (%s) and needs less memory per GPU (%s vs %s)",
			Label(a.Plan), sa.Seconds, Label(b.Plan), gib(a.Report.Memory.PerGPU.Total), gib(b.Report.Memory.PerGPU.Total))
	}
	var gains []string
	if d := sb.PipelineSeconds - sa.PipelineSeconds; d > 0 {
		gains = append(gains, fmt.Sprintf("its pipeline (compute, TP traffic, bubble %.1f%% vs %.1f%%) takes %.3f s less",
			100*a.Report.Pipeline.BubbleFraction, 100*b.Report.Pipeline.BubbleFraction, d))
	}
	if d := sb.DPSeconds - sa.DPSeconds; d > 0 {
		gains = append(gains, fmt.Sprintf("its data-parallel traffic takes %.3f s less", d))
	}
	if fa, fb := sa.FLOPs, sb.FLOPs; fa < fb {
		gains = append(gains, fmt.Sprintf("it recomputes less (%.1f%% fewer FLOPs)", 100*(fb-fa)/fb))
	}
	msg := fmt.Sprintf("%s wins: %.3f s per step vs %.3f s for the runner-up (%s)", Label(a.Plan), sa.Seconds, sb.Seconds, Label(b.Plan))
	if len(gains) > 0 {
		msg += ": " + strings.Join(gains, "; ")
	}
	return msg
}
