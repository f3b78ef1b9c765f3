package gossip

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"
)

// The benchmark's fixed parts: how many members are killed one after the
// other, how many state exchanges are sampled, and how long each phase may
// take before the size is reported as not holding.
const (
	scaleKills         = 3
	scaleExchanges     = 8
	scaleConvergeLimit = 4 * time.Minute
	scaleDetectLimit   = 60 * time.Second
	scaleSettleMax     = 60 * time.Second
	scaleJoinBatch     = 8
	scaleJoinAttempts  = 5
	scaleGOGC          = 800
)

// TestPoolScale measures the pool as it grows: N members in this process,
// each its own memberlist on 127.0.0.1 over real UDP and TCP, configured by
// configure as New configures them (DefaultTuning, one 32-byte key, a
// label), each on a transport that counts its bytes. Per size it reports
// the time to converge (every member sees N), the process's CPU and each
// member's bytes per second over a steady window, and, for members killed
// one at a time without Leave, how long until every other member was told
// the victim is dead; any other member declared dead is a false death.
// Opt in with GPUCOORD_BENCH_GOSSIP=8,32,64,128 (make bench-gossip); the
// rows go in docs/BENCHMARKS.md. An entry PxN (16x32) runs P pools of N
// members side by side instead, each under its failure domain's label, as
// the agents of P racks gossip (domainPoolsRun). On a 2-core machine pools of 140 to 230
// members and more may collapse while forming (see the joins in
// poolScaleRun).
//
// The steady window is one push-pull period (memberlist's PushPullInterval,
// 30 s, times its scale for n members: 180 s at 1,024), starting at least
// 30 s after the last member was created: each member's first push-pull
// comes a random stagger under 30 s plus one period after it starts, so
// such a window holds exactly one push-pull started by each member.
// GPUCOORD_BENCH_GOSSIP_WINDOW=10s measures a shorter window at once
// instead, which then holds few or no push-pulls (its stream column says
// how many). Either way a few state exchanges are then started by hand
// (Join on a member already in the pool does one) to measure the bytes
// and CPU of one exchange at this size. One process holds the
// whole pool, so the process's cores are shared by every member: a size at
// which it needs about all of the machine's cores measures the machine.
func TestPoolScale(t *testing.T) {
	sizes := os.Getenv("GPUCOORD_BENCH_GOSSIP")
	if sizes == "" {
		t.Skip("a benchmark: set GPUCOORD_BENCH_GOSSIP=8,32,64,128 (make bench-gossip)")
	}
	ignore := goleak.IgnoreCurrent()
	defer func() {
		// A member's stream handlers may outlive its Shutdown by up to
		// its TCP timeout (2 s); anything later is a leak.
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			err := goleak.Find(ignore)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines left after every member's Shutdown: %v", err)
				break
			}
		}
	}()
	var window time.Duration
	if w := os.Getenv("GPUCOORD_BENCH_GOSSIP_WINDOW"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil || d < time.Second {
			t.Fatalf("GPUCOORD_BENCH_GOSSIP_WINDOW=%q: want a duration of at least 1s", w)
		}
		window = d
	}
	gc := "GOGC from the environment"
	if os.Getenv("GOGC") == "" {
		// One heap holds every member's view of every other (n² entries)
		// and about 9 goroutines' stacks per member, and every packet
		// sent allocates LZW's 64 KiB table (even a ping's, which then
		// goes uncompressed): with GOGC=100 a steady pool of 121 used
		// 0.27 cores, a third of it marking (half of that as assists,
		// which delay acks toward their 100 ms). A member alone in its
		// process has a heap of a few MB and collects it cheaply.
		// Collecting only at a memory limit is worse: once the heap is
		// there (8 GiB after 20 s of 256 joining) the collector runs
		// back to back and the pool collapses. Let the heap grow to 9
		// times the live one, unless GOGC says otherwise.
		defer debug.SetGCPercent(debug.SetGCPercent(scaleGOGC))
		gc = fmt.Sprintf("GOGC=%d (GOGC=100 to measure with the default)", scaleGOGC)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("machine: %d CPUs, GOMAXPROCS %d, load average at start %s; %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), strings.TrimSpace(string(load)), gc)
	var rows, details, domains []string
	for _, s := range strings.Split(sizes, ",") {
		s = strings.TrimSpace(s)
		if ps, ns, ok := strings.Cut(s, "x"); ok { // pools of a failure domain each
			pools, perr := strconv.Atoi(ps)
			n, err := strconv.Atoi(ns)
			if perr != nil || err != nil || pools < 1 || n < 4 {
				t.Fatalf("GPUCOORD_BENCH_GOSSIP: %q: want POOLSxMEMBERS, at least 1 pool of at least 4", s)
			}
			t.Run(s, func(t *testing.T) {
				r := domainPoolsRun(t, pools, n, window)
				domains = append(domains, r.row())
				t.Logf("%s\n%s", domainHeader, r.row())
			})
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 4 {
			t.Fatalf("GPUCOORD_BENCH_GOSSIP: %q: want member counts of at least 4, or POOLSxMEMBERS", s)
		}
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			r := poolScaleRun(t, n, window)
			rows, details = append(rows, r.row()), append(details, r.detail())
			t.Logf("| members | converge | detection median / max | false deaths | CPU per member (cores) | bytes/s per member sent (mean/max) | process CPU (cores) |\n%s\n%s\n%s", r.row(), detailHeader, r.detail())
		})
	}
	if len(rows) > 0 {
		t.Logf("memberlist pool at scale:\n| members | converge | detection median / max (each kill) | false deaths | CPU per member (cores) | bytes/s per member sent (mean/max) | process CPU (cores) |\n|---|---|---|---|---|---|---|\n%s",
			strings.Join(rows, "\n"))
		t.Logf("details:\n%s\n%s", detailHeader, strings.Join(details, "\n"))
	}
	if len(domains) > 0 {
		t.Logf("pools of failure domains side by side:\n%s\n%s", domainHeader, strings.Join(domains, "\n"))
	}
}

const detailHeader = "| members | join retries | settle | window | other processes (cores) | GC share of CPU | packets/s per member sent | packet B/s per member sent | stream B/s per member sent | push-pulls in window | push-pull period | one exchange, both ways (sampled) | CPU per exchange | false suspicions (refuted) | suspicion floor | live heap MB | goroutines |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// scaleResult is what one size measured; a zero field was not reached.
type scaleResult struct {
	n                       int
	converge                time.Duration
	joinErr                 string // why the size stopped early, "" if it ran through
	detect                  []detection
	falseDeaths, falseLater int // Dead events for live members: all, and those after converging
	joinRetries             int64
	joinPeak                float64       // the process's most cores over a quarter second while joining
	joinHeld                time.Duration // joins held back by waitQuiet, in all
	falseNames              []string
	refutes                 int64
	steady
	exchangeBytes float64 // one push-pull, both ways, sampled
	exchangeCPU   time.Duration
	heapMB        float64 // marked live by a collection at the end
	goroutines    int
}

// detection is one kill: how long the other members took to be told.
type detection struct {
	median, max time.Duration
	heard, want int
}

// detectCells is each kill's detection as a table shows it: median / max,
// and how many were told when not all were.
func detectCells(ds []detection) []string {
	var det []string
	for _, d := range ds {
		s := fmt.Sprintf("%s / %s", fmtSec(d.median), fmtSec(d.max))
		if d.heard < d.want {
			s += fmt.Sprintf(" (%d of %d told within %s)", d.heard, d.want, scaleDetectLimit)
		}
		det = append(det, s)
	}
	return det
}

func (r scaleResult) row() string {
	if r.converge == 0 {
		return fmt.Sprintf("| %d | did not converge: %s | | %d (%d members) | | | |", r.n, r.joinErr, r.falseDeaths, len(r.falseNames))
	}
	det := detectCells(r.detect)
	if r.joinErr != "" {
		det = append(det, r.joinErr)
	}
	falseCell := strconv.Itoa(r.falseDeaths)
	if r.falseDeaths > 0 {
		names := r.falseNames
		if len(names) > 4 {
			names = append(names[:4:4], "…")
		}
		falseCell += fmt.Sprintf(" (%d after converging; %d members: %s)", r.falseLater, len(r.falseNames), strings.Join(names, ", "))
	}
	return fmt.Sprintf("| %d | %s | %s | %s | %.2g | %.0f / %.0f | %.2f |", r.n, fmtSec(r.converge), strings.Join(det, "; "),
		falseCell, r.procCores/float64(r.n), r.sentMean, r.sentMax, r.procCores)
}

func (r scaleResult) detail() string {
	return fmt.Sprintf("| %d | %d | %s | %s | %.2f | %.0f%% | %.1f | %.0f | %.0f | %d | %s | %.0f B | %.2f ms | %d | %s | %.0f | %d |", r.n, r.joinRetries, fmtSec(r.settle), fmtSec(r.window), r.otherCores, 100*r.gcShare,
		r.pkts, r.pktSent, r.streamSent, r.pushPulls, fmtSec(pushPullPeriod(r.n)), r.exchangeBytes, float64(r.exchangeCPU)/1e6,
		r.refutes, fmtSec(suspicionFloor(DefaultTuning(), r.n)), r.heapMB, r.goroutines)
}

// pushPullPeriod is how often each member starts a push-pull in a pool of
// n (memberlist's pushPullScale, util.go): PushPullInterval until 32
// members, then one more interval each time n doubles.
func pushPullPeriod(n int) time.Duration {
	interval := memberlist.DefaultLANConfig().PushPullInterval
	if n <= 32 {
		return interval
	}
	return time.Duration(math.Ceil(math.Log2(float64(n))-math.Log2(32))+1) * interval
}

func fmtSec(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// suspicionFloor is memberlist's shortest suspicion (its suspicionTimeout,
// util.go): SuspicionMult * max(1, log10 n) probe intervals, reached once
// SuspicionMult-2 other members confirm the suspicion; without them the
// timer runs to SuspicionMaxTimeoutMult (6) times as long.
func suspicionFloor(tu Tuning, n int) time.Duration {
	return time.Duration(float64(tu.SuspicionMult) * math.Max(1, math.Log10(float64(n))) * float64(tu.ProbeInterval))
}

// scaleMember is one member of the pool under test.
type scaleMember struct {
	name string
	ml   *memberlist.Memberlist
	tr   *countingTransport
}

func poolScaleRun(t *testing.T, n int, window time.Duration) (r scaleResult) {
	r.n = n
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	sec := Secure{Keys: [][]byte{key}, Label: "bench"}
	deaths := newDeathLog()
	logs := &scaleLog{suspects: map[string]int{}}
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	members := make([]*scaleMember, 0, n)
	var peers sync.Map
	t.Cleanup(func() {
		deaths.stop()
		var g errgroup.Group
		g.SetLimit(16)
		for _, m := range members {
			g.Go(m.ml.Shutdown) // no Leave: a Leave per member would be N broadcasts to N-1 members
		}
		if err := g.Wait(); err != nil {
			t.Error(err)
		}
	})
	for i := range n {
		var id [8]byte
		binary.BigEndian.PutUint64(id[:], rng.Uint64())
		name := MemberName(fmt.Sprintf("node-%05d", i), hex.EncodeToString(id[:]))
		ml, tr, err := newCountedMember(name, DefaultTuning(), sec, deathObserver{name, deaths}, logs, &peers)
		if err != nil {
			t.Fatalf("member %d of %d: %v", i, n, err)
		}
		members = append(members, &scaleMember{name: name, ml: ml, tr: tr})
	}
	created := time.Now()

	// Join in batches of scaleJoinBatch, one member after the other, and
	// wait after each batch until the pool is quiet again. Each member
	// joins two members already in the pool, picked at random, so that no
	// one member answers every join's state exchange; a join that fails
	// (its exchange timed out, TCPTimeout is 10 probe intervals) is tried
	// again with other seeds, as an agent would. Every join is an alive
	// message that every member gossips (to 3 members every 100 ms, each
	// message 4*ceil(log10(n+1)) times), and this one process does all
	// the members' gossip on the machine's cores: joining as fast as Join
	// returns (128 members in 0.15 s), or 20 a second one by one (at
	// about 140 members), saturates two cores, probes time out after their
	// 100 ms and false deaths feed on themselves; a batch's alive messages
	// share gossip packets. A cluster's members would each have their own
	// cores: the time to converge here is this machine's.
	var (
		inMu    sync.Mutex
		in      = []*scaleMember{members[0]}
		retries int64
	)
	seeds := func() []string {
		inMu.Lock()
		defer inMu.Unlock()
		a := rng.IntN(len(in))
		b := (a + 1 + rng.IntN(max(1, len(in)-1))) % len(in)
		return []string{in[a].ml.LocalNode().Address(), in[b].ml.LocalNode().Address()}
	}
	start := time.Now()
	stopProgress := progress(t, 10*time.Second, func() string {
		inMu.Lock()
		joined := len(in)
		inMu.Unlock()
		f, _, names := deaths.falseDeaths()
		gcs := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/memory/classes/heap/objects:bytes"}}
		metrics.Read(gcs)
		return fmt.Sprintf("%d joined, false deaths %d (%d members), refuted suspicions %d, packets sent %d, GC cycles %d, heap %d MiB",
			joined, f, len(names), logs.refutes.Load(), sumPackets(members), gcs[0].Value.Uint64(), gcs[1].Value.Uint64()>>20)
	})
	defer stopProgress()
	for b := 1; b < n && err == nil; b += scaleJoinBatch {
		if time.Since(start) > scaleConvergeLimit {
			f, _, names := deaths.falseDeaths()
			err = fmt.Errorf("joins not done after %s: %d of %d in, %d false deaths of %d members so far", scaleConvergeLimit, b, n, f, len(names))
			break
		}
		for _, m := range members[b:min(n, b+scaleJoinBatch)] {
			for attempt := range scaleJoinAttempts {
				if _, err = m.ml.Join(seeds()); err == nil {
					break
				}
				retries++
				if attempt == scaleJoinAttempts-1 {
					err = fmt.Errorf("%s joining, %d tries: %w", m.name, scaleJoinAttempts, err)
				}
			}
			if err != nil {
				break
			}
			inMu.Lock()
			in = append(in, m)
			inMu.Unlock()
		}
		waited, peak := waitQuiet(members[:min(n, b+scaleJoinBatch)], DefaultTuning(), 10*time.Second)
		r.joinHeld += waited
		r.joinPeak = max(r.joinPeak, peak)
	}
	joinedAt := time.Since(start)
	r.joinRetries = retries
	if err != nil {
		r.joinErr = strings.Join(strings.Fields(err.Error()), " ") // one table row
		r.falseDeaths, _, r.falseNames = deaths.falseDeaths()
		t.Error(err)
		return r
	}
	for {
		short, least := countShort(members, n)
		if short == 0 {
			break
		}
		if time.Since(start) > joinedAt+scaleConvergeLimit {
			r.joinErr = fmt.Sprintf("%s after the joins (done at %s) %d members saw fewer than %d, the fewest %d", scaleConvergeLimit, fmtSec(joinedAt), short, n, least)
			r.falseDeaths, _, r.falseNames = deaths.falseDeaths()
			t.Error(r.joinErr)
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.converge = time.Since(start)
	deaths.converged()
	stopProgress()
	t.Logf("%d members: joins done at %s (process at most %.2f cores, joins held back %s in all), every member saw %d at %s",
		n, fmtSec(joinedAt), r.joinPeak, fmtSec(r.joinHeld), n, fmtSec(r.converge))

	r.steady = measureSteady(t, members, n, window, created, logs)
	r.goroutines = runtime.NumGoroutine()

	// One state exchange's bytes (both ways, as its initiator counts
	// them) and CPU (both ends, less the pool's steady CPU meanwhile),
	// from exchanges started one after the other.
	var exBytes int64
	exStart, exCPU := time.Now(), processCPU(t)
	for range scaleExchanges {
		a, b := members[rng.IntN(n)], members[rng.IntN(n)]
		for a == b {
			b = members[rng.IntN(n)]
		}
		c0 := a.tr.count.streamOut.Load() + a.tr.count.streamIn.Load()
		if _, err := a.ml.Join([]string{b.ml.LocalNode().Address()}); err != nil {
			t.Fatalf("state exchange %s with %s: %v", a.name, b.name, err)
		}
		exBytes += a.tr.count.streamOut.Load() + a.tr.count.streamIn.Load() - c0
	}
	exWall, exUsed := time.Since(exStart), processCPU(t)-exCPU
	r.exchangeBytes = float64(exBytes) / scaleExchanges
	r.exchangeCPU = (exUsed - time.Duration(r.procCores*float64(exWall))) / scaleExchanges

	// Detection: kill one member at a time, abruptly, and wait until
	// every other live member has been told.
	alive := slices.Clone(members)
	for k := range scaleKills {
		v := rng.IntN(len(alive))
		victim := alive[v]
		alive = slices.Delete(alive, v, v+1)
		d := detect(t, deaths, victim, alive, 0)
		r.detect = append(r.detect, d)
		t.Logf("kill %d: %s; %d of %d members told, median %s, max %s", k+1, victim.name, d.heard, d.want, fmtSec(d.median), fmtSec(d.max))
	}
	r.falseDeaths, r.falseLater, r.falseNames = deaths.falseDeaths()
	deaths.stop() // a collection of a large heap may delay acks: not the pool's doing
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	r.heapMB = float64(live[0].Value.Uint64()) / (1 << 20)
	r.refutes = logs.refutes.Load()
	suspected, suspicions := 0, 0
	logs.mu.Lock()
	for name, c := range logs.suspects {
		if !deaths.wasKilled(name) {
			suspected, suspicions = suspected+1, suspicions+c
		}
	}
	logs.mu.Unlock()
	t.Logf("live members suspected: %d, %d suspicions raised in all (each by one member), %d refuted by the suspect", suspected, suspicions, r.refutes)
	return r
}

// countShort is how many of members count other than n members, and
// the fewest any counts.
func countShort(members []*scaleMember, n int) (short, least int) {
	least = n
	for _, m := range members {
		if k := m.ml.NumMembers(); k != n {
			short, least = short+1, min(least, k)
		}
	}
	return short, least
}

// steady is what measureSteady measured over the members of this process
// (one pool's, or several pools' side by side).
type steady struct {
	settle, window            time.Duration
	procCores                 float64
	otherCores                float64 // other processes' cores in the window (the machine's busy time less this process's)
	gcShare                   float64 // of the process's CPU in the window (the runtime's estimate)
	sentMean, sentMax         float64 // bytes per second per member, packets and streams
	pktSent, streamSent, pkts float64 // per member per second, means
	pushPulls                 int64   // started in the window
}

// measureSteady waits for members, converged, to settle, then measures
// them over the steady window: window, or (0) one push-pull period of a
// pool of n from 30 s after the last member was created at created (see
// TestPoolScale). Bytes are per member of members; logs counts the
// push-pulls.
func measureSteady(t *testing.T, members []*scaleMember, n int, window time.Duration, created time.Time, logs *scaleLog) (s steady) {
	t.Helper()
	// Settle: the joins' alive messages are gossiped for a while after
	// every member knows every other; measure once the packet rate has
	// stopped falling (two seconds in a row within 10% of the one
	// before), so that the window sees probes and push-pulls.
	settleStart := time.Now()
	prev, last := -1.0, sumSent(members)
	for quiet := 0; quiet < 2 && time.Since(settleStart) < scaleSettleMax; {
		time.Sleep(time.Second)
		cur := sumSent(members)
		rate := float64(cur - last)
		if prev >= 0 && rate >= 0.9*prev {
			quiet++
		} else {
			quiet = 0
		}
		prev, last = rate, cur
	}
	s.settle = time.Since(settleStart)

	// Steady window: one push-pull period from 30 s after the last
	// member was created (see TestPoolScale), or the window asked for.
	s.window = window
	if window == 0 {
		s.window = pushPullPeriod(n)
		time.Sleep(time.Until(created.Add(memberlist.DefaultLANConfig().PushPullInterval)))
	}
	before := snapshot(members)
	cpu0, gc0, busy0 := processCPU(t), gcCPU(), machineBusy()
	pp0 := logs.pushPulls.Load()
	time.Sleep(s.window)
	cpu1, gc1, busy1 := processCPU(t), gcCPU(), machineBusy()
	s.otherCores = max(0, (busy1-busy0-(cpu1-cpu0)).Seconds()/s.window.Seconds())
	if used := (cpu1 - cpu0).Seconds(); used > 0 {
		s.gcShare = (gc1 - gc0) / used
	}
	after := snapshot(members)
	s.pushPulls = logs.pushPulls.Load() - pp0
	w := s.window.Seconds()
	s.procCores = (cpu1 - cpu0).Seconds() / w
	total := float64(len(members))
	for i := range members {
		d := after[i].minus(before[i])
		sent := float64(d.pktOut+d.streamOut) / w
		s.sentMean += sent / total
		s.sentMax = max(s.sentMax, sent)
		s.pktSent += float64(d.pktOut) / w / total
		s.streamSent += float64(d.streamOut) / w / total
		s.pkts += float64(d.pkts) / w / total
	}
	return s
}

// detect kills victim abruptly (no Leave), waits until every member of
// alive has been told it is dead (at most scaleDetectLimit), then linger
// longer, and returns when they were told.
func detect(t *testing.T, deaths *deathLog, victim *scaleMember, alive []*scaleMember, linger time.Duration) detection {
	t.Helper()
	killedAt := time.Now()
	deaths.kill(victim.name)
	if err := victim.ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	deadline := killedAt.Add(scaleDetectLimit)
	for deaths.heard(victim.name) < len(alive) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(linger)
	var delays []time.Duration
	for _, m := range alive {
		if at, ok := deaths.heardAt(victim.name, m.name); ok {
			delays = append(delays, at.Sub(killedAt))
		}
	}
	slices.Sort(delays)
	d := detection{heard: len(delays), want: len(alive)}
	if len(delays) > 0 {
		d.median, d.max = delays[len(delays)/2], delays[len(delays)-1]
	}
	return d
}

// newCountedMember is New on 127.0.0.1 (a port the kernel picks, the same
// for UDP and TCP) with a transport that counts the member's bytes; the
// configuration is configure's, as New's.
func newCountedMember(name string, tu Tuning, sec Secure, events Events, logw io.Writer, peers *sync.Map) (*memberlist.Memberlist, *countingTransport, error) {
	if err := tu.Validate(); err != nil {
		return nil, nil, err
	}
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		return nil, nil, err
	}
	tr := &countingTransport{nt: nt, peers: peers}
	c := memberlist.DefaultLANConfig()
	port := nt.GetAutoBindPort()
	peers.Store(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), &tr.count)
	c.BindAddr, c.BindPort, c.AdvertiseAddr, c.AdvertisePort = "127.0.0.1", port, "127.0.0.1", port
	c.Transport = tr
	if err := configure(c, name, tu, sec, events, logw); err != nil {
		tr.Shutdown()
		return nil, nil, err
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		tr.Shutdown()
		return nil, nil, err
	}
	return ml, tr, nil
}

// traffic is one member's bytes as they cross the socket: after
// memberlist's label, encryption and compression, without UDP, TCP and IP
// headers.
type traffic struct {
	pktOut, pktIn, pkts, streamOut, streamIn, dials atomic.Int64
}

// trafficCount is a copy of a traffic's counters at one moment.
type trafficCount struct{ pktOut, pktIn, pkts, streamOut, streamIn, dials int64 }

func (a trafficCount) minus(b trafficCount) trafficCount {
	return trafficCount{a.pktOut - b.pktOut, a.pktIn - b.pktIn, a.pkts - b.pkts, a.streamOut - b.streamOut, a.streamIn - b.streamIn, a.dials - b.dials}
}

func snapshot(ms []*scaleMember) []trafficCount {
	out := make([]trafficCount, len(ms))
	for i, m := range ms {
		c := &m.tr.count
		out[i] = trafficCount{c.pktOut.Load(), c.pktIn.Load(), c.pkts.Load(), c.streamOut.Load(), c.streamIn.Load(), c.dials.Load()}
	}
	return out
}

func sumPackets(ms []*scaleMember) int64 {
	var s int64
	for _, m := range ms {
		s += m.tr.count.pkts.Load()
	}
	return s
}

// progress logs every period how long it has run, the process's cores
// since the last line, and what state says, until the returned func is
// called (more calls do nothing).
func progress(t *testing.T, every time.Duration, state func() string) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		start, at := time.Now(), time.Now()
		last, _ := rusageCPU()
		lastBusy := machineBusy()
		for {
			select {
			case <-quit:
				return
			case now := <-tick.C:
				cpu, _ := rusageCPU()
				busy := machineBusy()
				secs := now.Sub(at).Seconds()
				t.Logf("%s: %.2f cores (other processes %.2f); %s", fmtSec(now.Sub(start)), (cpu-last).Seconds()/secs,
					max(0, (busy-lastBusy-(cpu-last)).Seconds()/secs), state())
				last, lastBusy, at = cpu, busy, now
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

func sumSent(ms []*scaleMember) int64 {
	var s int64
	for _, m := range ms {
		s += m.tr.count.pktOut.Load()
	}
	return s
}

// countingTransport is a memberlist.NetTransport that counts every packet
// and stream byte its member sends, and credits the member it sends to
// (found in peers by address) with receiving them: every member is in this
// process, so counting at the sender counts both ends without a hop
// between the socket and memberlist. A packet the kernel drops is still
// counted as received.
type countingTransport struct {
	nt    *memberlist.NetTransport
	count traffic
	peers *sync.Map // "127.0.0.1:port" -> *traffic
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)

func (t *countingTransport) peer(addr string) *traffic {
	if p, ok := t.peers.Load(addr); ok {
		return p.(*traffic)
	}
	return &traffic{} // not a member: counted for no one
}

func (t *countingTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.nt.FinalAdvertiseAddr(ip, port)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *countingTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	at, err := t.nt.WriteToAddress(b, addr)
	if err == nil {
		t.count.pktOut.Add(int64(len(b)))
		t.count.pkts.Add(1)
		t.peer(addr.Addr).pktIn.Add(int64(len(b)))
	}
	return at, err
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.nt.PacketCh() }

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *countingTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.nt.DialAddressTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	t.count.dials.Add(1)
	return &countedConn{Conn: c, self: &t.count, peer: t.peer(addr.Addr)}, nil
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.nt.StreamCh() }

func (t *countingTransport) Shutdown() error { return t.nt.Shutdown() }

// countedConn counts a stream's bytes for the member that dialed it
// (self) and the member it dialed (peer).
type countedConn struct {
	net.Conn
	self, peer *traffic
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.self.streamIn.Add(int64(n))
	c.peer.streamOut.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.self.streamOut.Add(int64(n))
	c.peer.streamIn.Add(int64(n))
	return n, err
}

// deathLog records every Dead event of every member: those for a killed
// member are its detection, any other is a false death.
type deathLog struct {
	mu      sync.Mutex
	stopped bool
	killed  map[string]bool
	told    map[string]map[string]time.Time // victim -> observer -> first told
	falsely map[string]int                  // member -> times declared dead though alive
	later   int                             // of those, after converged
	settled bool
}

func newDeathLog() *deathLog {
	return &deathLog{killed: map[string]bool{}, told: map[string]map[string]time.Time{}, falsely: map[string]int{}}
}

func (d *deathLog) dead(observer, name string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.stopped:
	case d.killed[name]:
		if _, ok := d.told[name][observer]; !ok {
			d.told[name][observer] = at
		}
	default:
		d.falsely[name]++
		if d.settled {
			d.later++
		}
	}
}

// kill records name as killed; call it before stopping the member.
func (d *deathLog) kill(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.killed[name], d.told[name] = true, map[string]time.Time{}
}

func (d *deathLog) wasKilled(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.killed[name]
}

func (d *deathLog) heard(victim string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.told[victim])
}

func (d *deathLog) heardAt(victim, observer string) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.told[victim][observer]
	return at, ok
}

// converged marks the end of the joins: false deaths from now on are
// counted apart too.
func (d *deathLog) converged() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.settled = true
}

// falseDeaths returns the number of Dead events for members not killed,
// those of them after converged, and the members they named.
func (d *deathLog) falseDeaths() (total, later int, names []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, c := range d.falsely {
		total += c
		names = append(names, name)
	}
	slices.Sort(names)
	return total, d.later, names
}

// stop ignores every event from now on: the pool's own shutdown.
func (d *deathLog) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
}

// deathObserver is one member's Events.
type deathObserver struct {
	self string
	log  *deathLog
}

func (o deathObserver) Dead(name string) { o.log.dead(o.self, name, time.Now()) }

// scaleLog reads every member's memberlist log (one Write per line) for
// the push-pulls each initiates, the suspicions it raises and the
// suspicions of itself it refutes.
type scaleLog struct {
	pushPulls, refutes atomic.Int64
	mu                 sync.Mutex
	suspects           map[string]int
}

var (
	logPushPull = []byte("Initiating push/pull sync")
	logRefute   = []byte("Refuting a suspect message")
	logSuspect  = []byte("] memberlist: Suspect ")
)

func (l *scaleLog) Write(p []byte) (int, error) {
	switch {
	case bytes.Contains(p, logPushPull):
		l.pushPulls.Add(1)
	case bytes.Contains(p, logRefute):
		l.refutes.Add(1)
	case bytes.Contains(p, logSuspect):
		_, rest, _ := bytes.Cut(p, logSuspect)
		name, _, _ := bytes.Cut(rest, []byte(" has failed"))
		l.mu.Lock()
		l.suspects[string(name)]++
		l.mu.Unlock()
	}
	return len(p), nil
}

// gcCPU is the runtime's estimate of the CPU seconds its garbage
// collector has used so far (updated as each collection ends).
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64()
}

// processCPU is the user and system time this process has used.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	d, err := rusageCPU()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func rusageCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// machineBusy is the time all the machine's CPUs have spent busy (all
// but idle and iowait in /proc/stat), or 0 where it cannot be read.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// waitQuiet waits until members are quiet: their packets over a quarter
// second within a quarter of what probing alone sends (a ping and an ack
// per member per probe interval), and a quarter of the machine's CPUs
// idle (other processes' too); at most most. It returns how long it
// waited and the most cores this process used over a quarter second.
func waitQuiet(members []*scaleMember, tu Tuning, most time.Duration) (waited time.Duration, peak float64) {
	const step = 250 * time.Millisecond
	probing := 2 * float64(len(members)) * step.Seconds() / tu.ProbeInterval.Seconds()
	limit := 0.75 * float64(runtime.NumCPU())
	start := time.Now()
	for {
		p0, c0, b0, at := sumPackets(members), mustCPU(), machineBusy(), time.Now()
		time.Sleep(step)
		secs := time.Since(at).Seconds()
		cores := (mustCPU() - c0).Seconds() / secs
		peak = max(peak, cores)
		quiet := float64(sumPackets(members)-p0) <= 1.25*probing*secs/step.Seconds() && (machineBusy()-b0).Seconds()/secs <= limit
		if quiet || time.Since(start) >= most {
			return time.Since(start), peak
		}
	}
}

func mustCPU() time.Duration {
	d, _ := rusageCPU()
	return d
}
