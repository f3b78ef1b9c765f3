package engine

import (
	"fmt"
	"math"
	"slices"
)

// Cadence chooses how many steps apart checkpoints are, so that what they
// add to the training time stays within Budget (0.05: 5%) of it, as
// Check-N-Run and Gemini choose theirs: from a measured step time without
// checkpoints (T) and a measured cost of one checkpoint (C), the interval
// is the least k with C/(k*T) <= Budget, at most Max; the work a loss
// throws away is then at most k steps. It is a pure function of what it
// is told: every rank of a job tells it the same (the world's largest
// step times, all-reduced), so every rank checkpoints the same steps.
//
// The first Probe steps take no checkpoint (they measure T); the next Probe
// take one each (they measure C at an interval of 1), or fewer: the probe
// ends at the first checkpoint that alone costs more than the budget. From
// then on each
// interval's window of steps, from a checkpoint to the step before the
// next, gives C again (the window's time less k*T) and T from its steps
// after the first two (those the checkpoint's write and copy have left
// alone), and the interval is chosen again.
type Cadence struct {
	Budget float64
	Max    int
	Probe  int

	steps    int       // the last step observed
	interval int       // 0 until the probe ends
	last     int       // the step of the last checkpoint
	plain    []float64 // step times without a checkpoint's cost, recent
	window   []float64 // the current window's step times
	costs    []float64 // recent costs of a checkpoint
}

// NewCadence is a Cadence for a budget (0 < budget < 1) with Max 100 and
// Probe 5.
func NewCadence(budget float64) *Cadence {
	return &Cadence{Budget: budget, Max: 100, Probe: 5}
}

const cadenceKeep = 25 // samples each median is taken over

// Due says whether step n (counted from 1, the steps of this run) takes a
// checkpoint.
func (c *Cadence) Due(n int) bool {
	switch {
	case n <= c.Probe:
		return false
	case c.interval == 0:
		return true // the probe's checkpoint-every-step half
	}
	return n-c.last >= c.interval
}

// Observe is told step n's time (seconds; the world's largest) and
// whether it took a checkpoint, in step order.
func (c *Cadence) Observe(n int, seconds float64, checkpointed bool) {
	c.steps = n
	switch {
	case n <= c.Probe:
		c.plain = keep(c.plain, seconds)
	case c.interval == 0:
		// Every step checkpoints: each costs its excess over the plain
		// steps' time.
		// It ends as soon as one checkpoint alone is over the budget (a
		// checkpoint at every step is then ruled out: the windows measure
		// the rest), else after Probe of them.
		cost := max(0, seconds-median(c.plain))
		c.costs = keep(c.costs, cost)
		if n >= 2*c.Probe || cost > c.Budget*median(c.plain) {
			c.choose()
			c.last, c.window = n, []float64{seconds}
		}
	case checkpointed:
		// The window since the checkpoint before, [that step, n-1], is
		// complete: its steps after the first two are plain, and its time
		// beyond k plain steps is what the checkpoint cost.
		k := len(c.window)
		if k > 2 {
			for _, s := range c.window[2:] {
				c.plain = keep(c.plain, s)
			}
		}
		total := 0.0
		for _, s := range c.window {
			total += s
		}
		c.costs = keep(c.costs, max(0, total-float64(k)*median(c.plain)))
		c.choose()
		c.last, c.window = n, append(c.window[:0], seconds)
	default:
		c.window = append(c.window, seconds)
	}
}

// choose sets the interval from the medians: the least within the budget
// when the current one is over it (or none is set), or when the current
// one spends under half the budget; otherwise the interval stays (no
// flapping on a noisy machine).
func (c *Cadence) choose() {
	t, cost := median(c.plain), median(c.costs)
	k := 1
	if t > 0 && cost > 0 {
		k = int(math.Ceil(cost / (c.Budget * t)))
	}
	k = min(max(k, 1), c.Max)
	if c.interval > 0 && t > 0 {
		share := cost / (float64(c.interval) * t)
		if share <= c.Budget && share >= c.Budget/2 {
			return
		}
	}
	c.interval = k
}

// Interval is the interval chosen (0 while probing).
func (c *Cadence) Interval() int { return c.interval }

// String says the choice and its lost-work bound: "a checkpoint every 6
// steps: one costs 30 ms against a 100 ms step, 5.0% of the time (budget
// 5%); a loss redoes at most 6 steps".
func (c *Cadence) String() string {
	t, cost := median(c.plain), median(c.costs)
	if c.interval == 0 {
		return "probing the cost of a checkpoint"
	}
	share := 0.0
	if t > 0 {
		share = cost / (float64(c.interval) * t)
	}
	return fmt.Sprintf("a checkpoint every %d step%s: one costs %.3g ms against a %.3g ms step, %.1f%% of the time (budget %.0f%%); a loss redoes at most %d step%s",
		c.interval, plural(c.interval), 1000*cost, 1000*t, 100*share, 100*c.Budget, c.interval, plural(c.interval))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func keep(xs []float64, x float64) []float64 {
	xs = append(xs, x)
	if len(xs) > cadenceKeep {
		xs = xs[len(xs)-cadenceKeep:]
	}
	return xs
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
