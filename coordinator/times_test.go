package coordinator

import (
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

func TestRound3(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{
		{0.011, 0.011}, {0.0123456, 0.0123}, {0.09951, 0.0995}, {0.09996, 0.1},
		{1234.5, 1230}, {99.95, 100}, {7, 7}, {0, 0}, {-1, 0}, {math.NaN(), 0}, {math.Inf(1), 0},
	} {
		if got := round3(tc.in); got != tc.want {
			t.Errorf("round3(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestHistMedian(t *testing.T) {
	for _, tc := range []struct {
		hist  map[float64]int32
		want  float64
		count int
	}{
		{nil, 0, 0},
		{map[float64]int32{1: 1, 2: 1, 3: 1}, 2, 3},
		{map[float64]int32{1: 1, 3: 1}, 2, 2},
		{map[float64]int32{5: 3, 9: 1}, 5, 4},
		{map[float64]int32{1: 2, 4: 2}, 2.5, 4},
		{map[float64]int32{0.01: 131071, 0.05: 1}, 0.01, 131072},
	} {
		if got, n := histMedian(tc.hist); got != tc.want || n != tc.count {
			t.Errorf("histMedian(%v) = %v, %d; want %v, %d", tc.hist, got, n, tc.want, tc.count)
		}
	}
}

// history is a node's windows: per rank, its mean in each window.
func history(ranks map[int32][]float64) *nodeTimes {
	n := &nodeTimes{}
	for i := 0; ; i++ {
		w := &pb.RankTimes{}
		for r, secs := range ranks {
			if i < len(secs) {
				w.Add(r, secs[i], 10)
			}
		}
		if w.Len() == 0 {
			return n
		}
		n.push(w, 3)
	}
}

func TestSummarize(t *testing.T) {
	even := func(first int32, secs ...float64) map[int32][]float64 {
		m := map[int32][]float64{}
		for r := range int32(4) {
			m[first+r] = secs
		}
		return m
	}
	many := map[string]*nodeTimes{}
	for i := range 300 {
		many[fmt.Sprintf("m%03d", i)] = history(map[int32][]float64{int32(i): {.05, .05, .05}})
	}
	slowRanks := func(s *pb.TimesSummary) []string {
		var out []string
		for _, r := range s.Slow {
			out = append(out, fmt.Sprintf("%s/%d/%g/%g", r.Node, r.Rank, r.Fastest, r.Latest))
		}
		return out
	}
	tests := []struct {
		name   string
		nodes  map[string]*nodeTimes
		others []*pb.TimesSummary
		every  bool
		latest []float64
		counts []int32
		slow   []string
		nslow  int // how many are listed, where slow names none
		ranks  int
	}{
		{name: "no times", nodes: map[string]*nodeTimes{}},
		{name: "two ranks: no median to judge by",
			nodes:  map[string]*nodeTimes{"a": history(map[int32][]float64{0: {.01, .01, .01}, 1: {.09, .09, .09}})},
			latest: []float64{.01, .09}, counts: []int32{1, 1}},
		{name: "one slow in every window, one in two of three: the first listed, with its fastest and newest",
			nodes: map[string]*nodeTimes{
				"a": history(even(0, .0101, .0102, .0099)),
				"b": history(map[int32][]float64{4: {.05, .04, .06}, 5: {.05, .01, .05}, 6: {.01, .01, .01}, 7: {.01, .01, .01}})},
			latest: []float64{.0099, .01, .05, .06}, counts: []int32{4, 2, 1, 1},
			slow: []string{"b/4/0.04/0.06"}},
		{name: "listed from three quarters of the threshold: 1.6x the median at a factor of 2",
			nodes:  map[string]*nodeTimes{"a": history(map[int32][]float64{0: {.01, .01, .01}, 1: {.01, .01, .01}, 2: {.01, .01, .01}, 3: {.016, .016, .016}, 4: {.0149, .0149, .0149}})},
			latest: []float64{.01, .0149, .016}, counts: []int32{3, 1, 1},
			slow: []string{"a/3/0.016/0.016"}},
		{name: "fewer windows than the check needs: counted, not listed",
			nodes:  map[string]*nodeTimes{"a": history(even(0, .01, .01, .01)), "b": history(map[int32][]float64{9: {.09, .09}})},
			latest: []float64{.01, .09}, counts: []int32{4, 1}},
		{name: "every node here slow: the other coordinators' histograms give the median",
			nodes:  map[string]*nodeTimes{"a": history(even(0, .05, .05, .05))},
			others: []*pb.TimesSummary{{Latest: []float64{.01}, LatestCount: []int32{12}}},
			latest: []float64{.05}, counts: []int32{4},
			slow: []string{"a/0/0.05/0.05", "a/1/0.05/0.05", "a/2/0.05/0.05", "a/3/0.05/0.05"}},
		{name: "every rank's newest mean in a small job",
			nodes: map[string]*nodeTimes{"a": history(even(0, .01, .012345)), "b": history(even(4, .02))}, every: true,
			latest: []float64{.0123, .02}, counts: []int32{4, 4}, ranks: 8},
		{name: "at most 256 listed, the slowest",
			nodes:  many,
			others: []*pb.TimesSummary{{Latest: []float64{.01}, LatestCount: []int32{1000}}},
			latest: []float64{.05}, counts: []int32{300}, nslow: maxSlow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := summarize(tc.nodes, tc.others, 3, 2, tc.every)
			if fmt.Sprint(s.Latest) != fmt.Sprint(tc.latest) || fmt.Sprint(s.LatestCount) != fmt.Sprint(tc.counts) {
				t.Errorf("histogram %v %v, want %v %v", s.Latest, s.LatestCount, tc.latest, tc.counts)
			}
			if len(s.Ranks) != tc.ranks {
				t.Errorf("%d ranks' means, want %d", len(s.Ranks), tc.ranks)
			}
			if tc.nslow > 0 {
				if len(s.Slow) != tc.nslow {
					t.Errorf("%d listed, want %d", len(s.Slow), tc.nslow)
				}
				return
			}
			if got := slowRanks(s); fmt.Sprint(got) != fmt.Sprint(tc.slow) {
				t.Errorf("slow %v, want %v", got, tc.slow)
			}
		})
	}
}

// TestMergeTimes: histograms add up; a rank listed by two summaries (its
// node moved) is the later one's.
func TestMergeTimes(t *testing.T) {
	a := &pb.TimesSummary{Latest: []float64{.01, .05}, LatestCount: []int32{3, 1}, Slow: []*pb.SlowRank{{Node: "x", Rank: 3, Fastest: .05, Latest: .05}}}
	b := &pb.TimesSummary{Latest: []float64{.01, .06}, LatestCount: []int32{4, 1}, Slow: []*pb.SlowRank{{Node: "x", Rank: 3, Fastest: .06, Latest: .06}, {Node: "y", Rank: 1, Fastest: .07}}}
	m := mergeTimes([]*pb.TimesSummary{a, b})
	if fmt.Sprint(m.latest) != "map[0.01:7 0.05:1 0.06:1]" {
		t.Errorf("latest %v", m.latest)
	}
	if len(m.slow) != 2 || m.slow[0].Rank != 1 || m.slow[1].Fastest != .06 {
		t.Errorf("slow %v", m.slow)
	}
}

type fakeTimesJobs struct {
	running_ map[timesKey]bool
	others   []*pb.TimesSummary
	world    int32
}

func (f fakeTimesJobs) running(job string, gen int64) bool { return f.running_[timesKey{job, gen}] }
func (f fakeTimesJobs) timesOf(string, int64, string) ([]*pb.TimesSummary, int32) {
	return f.others, f.world
}

// TestTimesTake: a summary is written when it changed; a node that stops
// reporting leaves it after three of its intervals; an ended generation
// is forgotten.
func TestTimesTake(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	b := newTimesBuffer(3, 2)
	jobs := fakeTimesJobs{running_: map[timesKey]bool{{"j", 1}: true}, world: 8}
	w := func(rank int32, secs float64) *pb.RankTimes {
		return pb.NewRankTimes(&pb.RankTime{Rank: rank, ComputeSeconds: secs})
	}
	read := func(ws []timesWrite) []string {
		var out []string
		for _, x := range ws {
			s := &pb.TimesSummary{}
			if err := proto.Unmarshal([]byte(x.value), s); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s/%d %v", x.key.job, x.key.gen, s.Latest))
		}
		return out
	}
	sec := time.Second
	for i := range 3 {
		at := t0.Add(time.Duration(i) * 2 * sec) // every 2 s
		b.add("j", 1, "a", w(0, .01), at)
		b.add("j", 1, "b", w(1, .02), at)
		b.add("old", 1, "a", w(0, .01), at)
	}
	steps := []struct {
		at   time.Duration
		add  bool // a reports again
		want string
	}{
		{4 * sec, false, "[j/1 [0.01 0.02]]"},
		{5 * sec, false, "[]"}, // nothing new
		{6 * sec, true, "[]"},  // a reported the same: the same summary
		{10 * sec, true, "[]"}, // b's last was at 4 s, 2 s apart: not yet 6 s
		{11 * sec, true, "[j/1 [0.01]]"},
	}
	for _, s := range steps {
		if s.add {
			b.add("j", 1, "a", w(0, .01), t0.Add(s.at))
		}
		if got := fmt.Sprint(read(b.take(t0.Add(s.at), sec, jobs, "c"))); got != s.want {
			t.Errorf("at %s: %s, want %s", s.at, got, s.want)
		}
	}
	if _, ok := b.gens[timesKey{"old", 1}]; ok {
		t.Error("the generation that no longer runs is still held")
	}
	b.again(timesKey{"j", 1})
	if got := fmt.Sprint(read(b.take(t0.Add(12*sec), sec, jobs, "c"))); got != "[j/1 [0.01]]" {
		t.Errorf("after a failed write: %s, want it again", got)
	}
}

// BenchmarkTimesFlush16384 is a second of a 16,384-node job's compute
// times at a coordinator: every node's window of its 8 ranks, then the
// flush's summary. A few ranks are slow, so the summary lists them.
func BenchmarkTimesFlush16384(b *testing.B) {
	const nodes, gpus = 16384, 8
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
	}
	buf := newTimesBuffer(3, 2)
	jobs := fakeTimesJobs{running_: map[timesKey]bool{{"j", 1}: true}, world: nodes * gpus}
	window := func(node, sec int) *pb.RankTimes {
		w := &pb.RankTimes{}
		for g := range gpus {
			secs := .010 + float64((node*gpus+g+sec)%7)*.0001
			if node%1000 == 0 {
				secs *= 3
			}
			w.Add(int32(node*gpus+g), secs, 10)
		}
		return w
	}
	t0 := time.Unix(1e9, 0)
	sec := 0
	for b.Loop() {
		at := t0.Add(time.Duration(sec) * time.Second)
		for i, n := range names {
			buf.add("j", 1, n, window(i, sec), at)
		}
		if len(buf.take(at, time.Second, jobs, "c")) != 1 {
			b.Fatal("no summary")
		}
		sec++
	}
}
