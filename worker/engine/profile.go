package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
)

// Profile is what one measured step of an in-process run shows.
type Profile struct {
	// Memory is each pipeline stage's peak accounting during the step, for
	// TP rank 0 of DP replica 0.
	Memory []Memory
	// Params is each stage's parameter count on one TP rank (the sum of its
	// chunks before ZeRO padding).
	Params []int
	// MeasuredBubble is (makespan - busy)/busy averaged over the stages of
	// replica 0, TP rank 0, where busy is a stage's time in forward, backward
	// and weight passes and makespan runs from the first pass's start to the
	// last pass's end over all stages: Narayanan et al. 2021's definition.
	MeasuredBubble float64
	// SimulatedBubble is the schedule simulator's bubble for the mean
	// measured F, B and W times.
	SimulatedBubble float64
	// F, B and W are the mean measured pass times per chunk.
	F, B, W time.Duration
	// Stats averages every rank's time split of the step.
	Stats StepStats
}

// ProfileInProc runs warm steps of the job in process, then one more step
// with the timeline on, and returns that step's profile.
func ProfileInProc(ctx context.Context, cfg *Config, warm int) (*Profile, error) {
	c, job := *cfg, *cfg.Job
	job.Steps = warm + 1
	c.Job, c.Timeline = &job, true
	res, err := RunInProc(ctx, &c, nil)
	if err != nil {
		return nil, err
	}
	layout, err := c.Layout()
	if err != nil {
		return nil, err
	}
	sched, err := c.schedule()
	if err != nil {
		return nil, err
	}
	p := &Profile{}
	stages := make([]*Rank, c.PP)
	var first, last time.Time
	var sums [3]time.Duration
	var counts [3]int
	busy := make([]time.Duration, c.PP)
	for s := range stages {
		r := res.Ranks[layout.Rank(topology.Coord{PP: s})]
		p.Memory = append(p.Memory, r.stepMem)
		n := 0
		for _, cs := range r.chunks {
			n += cs.n
		}
		p.Params = append(p.Params, n)
		for _, sp := range r.spans {
			i := strings.Index("FBW", sp.Op)
			if len(sp.Op) != 1 || i < 0 {
				continue
			}
			st, en := r.t0.Add(sp.Start), r.t0.Add(sp.End)
			if first.IsZero() || st.Before(first) {
				first = st
			}
			if en.After(last) {
				last = en
			}
			busy[s] += sp.End - sp.Start
			sums[i] += sp.End - sp.Start
			counts[i]++
		}
	}
	makespan := last.Sub(first)
	for _, b := range busy {
		p.MeasuredBubble += float64(makespan-b) / float64(b) / float64(c.PP)
	}
	for i, d := range []*time.Duration{&p.F, &p.B, &p.W} {
		if counts[i] > 0 {
			*d = sums[i] / time.Duration(counts[i])
		}
	}
	sim, err := schedule.Simulate(sched, schedule.Costs{F: p.F.Seconds(), B: p.B.Seconds(), W: p.W.Seconds()})
	if err != nil {
		return nil, fmt.Errorf("engine: simulate: %w", err)
	}
	p.SimulatedBubble = sim.BubbleFraction
	var sum StepStats
	for _, r := range res.Ranks {
		sum.Wall += r.stats.Wall
		sum.Compute += r.stats.Compute
		sum.TP += r.stats.TP
		sum.DP += r.stats.DP
		sum.Send += r.stats.Send
		sum.Recv += r.stats.Recv
	}
	n := time.Duration(len(res.Ranks))
	p.Stats = StepStats{Wall: sum.Wall / n, Compute: sum.Compute / n, TP: sum.TP / n,
		DP: sum.DP / n, Send: sum.Send / n, Recv: sum.Recv / n}
	return p, nil
}
