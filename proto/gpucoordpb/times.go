package gpucoordpb

import "fmt"

// Add appends rank's mean compute time per step, secs, over steps.
func (t *RankTimes) Add(rank int32, secs float64, steps int32) {
	t.Rank = append(t.Rank, rank)
	t.ComputeSeconds = append(t.ComputeSeconds, secs)
	t.Steps = append(t.Steps, steps)
}

// Len is how many ranks t holds.
func (t *RankTimes) Len() int { return len(t.GetRank()) }

// Check refuses lists of different lengths: a rank's number, mean and
// steps are at the same place in each.
func (t *RankTimes) Check() error {
	if n := len(t.GetRank()); len(t.GetComputeSeconds()) != n || len(t.GetSteps()) != n {
		return fmt.Errorf("rank times: %d ranks, %d means, %d step counts: want as many of each", n, len(t.GetComputeSeconds()), len(t.GetSteps()))
	}
	return nil
}

// NewRankTimes packs ranks (RankTime, as summaries list them) into one
// window.
func NewRankTimes(ranks ...*RankTime) *RankTimes {
	t := &RankTimes{}
	for _, r := range ranks {
		t.Add(r.GetRank(), r.GetComputeSeconds(), r.GetSteps())
	}
	return t
}
