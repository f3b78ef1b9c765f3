package coordinator

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Straggler detection reads every rank's compute times, but etcd never
// holds them: each coordinator keeps the last StragglerWindows windows of
// the nodes that report to it, in memory, and writes a summary of them per
// job generation (jobs/<id>/times/<gen>/<coordinator>) every flush. A
// summary is the histogram of every rank's newest mean (to three
// significant figures: a few hundred distinct values however many ranks
// there are) and the ranks that may be stragglers, so its size and the
// leader's work grow with the spread of the times and the slow ranks, not
// with the nodes. The leader takes the job's median from the histograms
// and flags a listed rank whose fastest window exceeds the factor times
// it (stragglers, in decide.go).
//
// A coordinator lists a rank as slow when its fastest window exceeds
// three quarters of the threshold at the median it sees (its own
// histogram with the other coordinators' as its cache has them): the
// quarter covers the median moving between its write and the leader's
// read.
const (
	// slowSlack is the fraction of the straggler threshold above which a
	// rank is listed.
	slowSlack = 0.75
	// maxSlow bounds the ranks one summary lists, slowest first.
	maxSlow = 256
	// smallJob is the largest job whose summaries carry every rank's
	// newest mean, for the dashboard.
	smallJob = 1024
	// staleReports is how many of its own report intervals a node may
	// miss before its times leave this coordinator's summary (it moved to
	// another, or left).
	staleReports = 3
)

// timesBuffer holds the compute-time windows agents reported to this
// coordinator, per job generation and node, and writes each generation's
// summary every flush. A window not yet summarised when the coordinator
// stops is lost; the straggler check waits for the next ones.
//
// # Concurrency
//
// add may be called from any goroutine; run flushes.
type timesBuffer struct {
	mu     sync.Mutex
	keep   int     // windows kept per node: StragglerWindows
	factor float64 // StragglerFactor
	gens   map[timesKey]*timesEntry
}

type timesKey struct {
	job string
	gen int64
}

type timesEntry struct {
	nodes map[string]*nodeTimes
	dirty bool
	last  string // the summary last written
}

// nodeTimes is one node's last windows, newest last, and when its last
// two reports came. ranks is what a summary reads of them, worked out as
// each window comes (push): a summary reads every node every flush, and
// working out each node's there was a tenth of a 16,384-node
// coordinator's time.
type nodeTimes struct {
	windows []*pb.RankTimes
	ranks   []rankTimes
	at      time.Time
	every   time.Duration
}

// rankTimes is a rank of a node's newest window: its newest mean (and
// that to three significant figures, the histogram's) over steps, and
// the fastest of its means in the windows kept and how many of them hold
// it.
type rankTimes struct {
	rank, steps     int32
	latest, latest3 float64
	fastest         float64
	windows         int
}

// push appends window w, keeping the newest keep, and works out ranks.
// A rank missing from the newest window is in no summary's check: the
// check wants a rank in every window kept.
func (n *nodeTimes) push(w *pb.RankTimes, keep int) {
	n.windows = append(n.windows, w)
	if len(n.windows) > keep {
		n.windows = n.windows[len(n.windows)-keep:]
	}
	n.ranks = n.ranks[:0]
	for i := range ranksOf(w) {
		secs := w.ComputeSeconds[i]
		x := rankTimes{rank: w.Rank[i], steps: w.Steps[i], latest: secs, latest3: round3(secs), fastest: math.Inf(1)}
		for _, old := range n.windows {
			for j := range ranksOf(old) {
				if old.Rank[j] == x.rank {
					x.fastest = min(x.fastest, old.ComputeSeconds[j])
					x.windows++
				}
			}
		}
		n.ranks = append(n.ranks, x)
	}
}

// ranksOf is how many ranks w holds in all three of its lists (a report's
// are checked to be as long: pb.RankTimes.Check).
func ranksOf(w *pb.RankTimes) int {
	return min(len(w.GetRank()), len(w.GetComputeSeconds()), len(w.GetSteps()))
}

func newTimesBuffer(keep int, factor float64) *timesBuffer {
	return &timesBuffer{keep: keep, factor: factor, gens: map[timesKey]*timesEntry{}}
}

// add appends node's window, received at now, to its history in job's
// generation gen.
func (b *timesBuffer) add(job string, gen int64, node string, w *pb.RankTimes, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := timesKey{job, gen}
	e := b.gens[k]
	if e == nil {
		e = &timesEntry{nodes: map[string]*nodeTimes{}}
		b.gens[k] = e
	}
	n := e.nodes[node]
	if n == nil {
		n = &nodeTimes{}
		e.nodes[node] = n
	} else {
		n.every = now.Sub(n.at)
	}
	n.at = now
	n.push(w, b.keep)
	e.dirty = true
}

// timesJobs is what a flush asks of the coordinator's view.
type timesJobs interface {
	// running reports whether gen is job's current generation, running.
	running(job string, gen int64) bool
	// timesOf returns the summaries of job's generation gen that
	// coordinators other than name wrote, and the generation's ranks.
	timesOf(job string, gen int64, name string) ([]*pb.TimesSummary, int32)
}

// timesWrite is one summary to write.
type timesWrite struct {
	key   timesKey
	value string
}

// take returns the summaries that changed since the last take, as the
// coordinator named name at now: it drops the generations that no longer
// run and the nodes that stopped reporting (staleReports of their
// intervals, and at least of flush).
func (b *timesBuffer) take(now time.Time, flush time.Duration, jobs timesJobs, name string) []timesWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []timesWrite
	for k, e := range b.gens {
		if !jobs.running(k.job, k.gen) {
			delete(b.gens, k)
			continue
		}
		for node, n := range e.nodes {
			if now.Sub(n.at) > staleReports*max(n.every, flush) {
				delete(e.nodes, node)
				e.dirty = true
			}
		}
		if !e.dirty {
			continue
		}
		e.dirty = false
		others, world := jobs.timesOf(k.job, k.gen, name)
		s := summarize(e.nodes, others, b.keep, b.factor, world <= smallJob)
		v := encode(s)
		if v == e.last {
			continue
		}
		e.last = v
		out = append(out, timesWrite{k, v})
	}
	return out
}

// again has key's summary written at the next flush (this one failed).
func (b *timesBuffer) again(key timesKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.gens[key]; e != nil {
		e.dirty, e.last = true, ""
	}
}

// summarize is the summary of nodes' windows: the histogram of their
// ranks' newest means, the ranks whose fastest of keep windows exceeds
// slowSlack of the threshold at the median of this histogram and others'
// (at most maxSlow, slowest first), and, with every, each rank's newest
// mean.
func summarize(nodes map[string]*nodeTimes, others []*pb.TimesSummary, keep int, factor float64, every bool) *pb.TimesSummary {
	s := &pb.TimesSummary{}
	own := map[float64]int32{}
	for _, n := range nodes {
		for _, r := range n.ranks {
			own[r.latest3]++
			if every {
				s.Ranks = append(s.Ranks, &pb.RankTime{Rank: r.rank, ComputeSeconds: r.latest, Steps: r.steps})
			}
		}
	}
	for _, v := range slices.Sorted(maps.Keys(own)) {
		s.Latest = append(s.Latest, v)
		s.LatestCount = append(s.LatestCount, own[v])
	}
	median, count := histMedian(mergeTimes(append([]*pb.TimesSummary{s}, others...)).latest)
	slices.SortFunc(s.Ranks, func(a, b *pb.RankTime) int { return cmp.Compare(a.Rank, b.Rank) })
	if count < 3 || median <= 0 {
		return s // a median of two says nothing about which is slow
	}
	bar := slowSlack * factor * median
	for node, n := range nodes {
		for _, r := range n.ranks {
			if r.windows >= keep && r.fastest > bar {
				s.Slow = append(s.Slow, &pb.SlowRank{Node: node, Rank: r.rank, Fastest: r.fastest, Latest: r.latest})
			}
		}
	}
	slices.SortFunc(s.Slow, func(a, b *pb.SlowRank) int {
		return cmp.Or(cmp.Compare(b.Fastest, a.Fastest), cmp.Compare(a.Rank, b.Rank))
	})
	if len(s.Slow) > maxSlow {
		s.Slow = s.Slow[:maxSlow]
	}
	return s
}

// histMedian is the median of the values hist counts, and how many there
// are (the mean of the middle two when even).
func histMedian(hist map[float64]int32) (float64, int) {
	n := 0
	for _, c := range hist {
		n += int(c)
	}
	if n == 0 {
		return 0, 0
	}
	// The values at sorted positions lo and hi (equal when n is odd).
	lo, hi := (n-1)/2, n/2
	var a, b float64
	seen := 0
	for _, v := range slices.Sorted(maps.Keys(hist)) {
		c := int(hist[v])
		if seen <= lo && lo < seen+c {
			a = v
		}
		if seen <= hi && hi < seen+c {
			b = v
			break
		}
		seen += c
	}
	return (a + b) / 2, n
}

// round3 rounds v to three significant figures (0 for what is not a
// positive number).
func round3(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	// Both factors are whole powers of ten, so the division is correctly
	// rounded: 0.011 stays the double nearest 0.011.
	k := 2 - int(math.Floor(math.Log10(v)))
	if k >= 0 {
		p := math.Pow10(k)
		return math.Round(v*p) / p
	}
	p := math.Pow10(-k)
	return math.Round(v/p) * p
}

// timesView is a job generation's compute times as the coordinators'
// summaries give them.
type timesView struct {
	latest map[float64]int32 // every rank's newest mean, counted
	slow   []*pb.SlowRank    // one per rank, from the newest summary listing it
	ranks  map[int32]float64 // each rank's newest mean, in a small job
}

// mergeTimes merges summaries, oldest first: a rank listed by two (its
// node moved between coordinators) is taken from the later.
func mergeTimes(summaries []*pb.TimesSummary) timesView {
	t := timesView{latest: map[float64]int32{}, ranks: map[int32]float64{}}
	slow := map[int32]*pb.SlowRank{}
	for _, s := range summaries {
		for i, v := range s.Latest {
			if i < len(s.LatestCount) {
				t.latest[v] += s.LatestCount[i]
			}
		}
		for _, r := range s.Slow {
			slow[r.Rank] = r
		}
		for _, r := range s.Ranks {
			t.ranks[r.Rank] = r.ComputeSeconds
		}
	}
	t.slow = slices.SortedFunc(maps.Values(slow), func(a, b *pb.SlowRank) int { return cmp.Compare(a.Rank, b.Rank) })
	return t
}

// run writes the changed summaries every interval until ctx ends, as the
// coordinator named name.
func (b *timesBuffer) run(ctx context.Context, cli *clientv3.Client, k keys, jobs timesJobs, name string, every time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	key := strings.ReplaceAll(name, "/", "_")
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			for _, w := range b.take(now, every, jobs, key) {
				wctx, cancel := context.WithTimeout(ctx, every)
				_, err := cli.Put(wctx, k.times(w.key.job, w.key.gen, key), w.value)
				cancel()
				if err != nil && ctx.Err() == nil {
					log.Warn("writing compute times", "job", w.key.job, "generation", w.key.gen, "err", err)
					b.again(w.key)
				}
			}
		}
	}
}
