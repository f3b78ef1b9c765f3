package gossip

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// domainResult is what one run of pools domain pools of n members each
// measured; a zero field was not reached.
type domainResult struct {
	pools, n          int
	converge, settle  time.Duration
	joinErr           string
	detect            []detection
	toldOutside       int // Dead events for a killed member from members of other pools
	crossSeen         int // members that counted a member of another pool, at the end of the joins or of the run
	falseDeaths       int
	falseLater        int
	procCores         float64
	otherCores        float64
	sentMean, sentMax float64
	pktSent           float64
	streamSent        float64
	pushPulls         int64
	window            time.Duration
}

func (r domainResult) row() string {
	total := r.pools * r.n
	if r.converge == 0 {
		return fmt.Sprintf("| %d x %d | %d | did not converge: %s | | | %d | %d | | | | | |", r.pools, r.n, total, r.joinErr, r.crossSeen, r.falseDeaths)
	}
	var det []string
	for _, d := range r.detect {
		s := fmt.Sprintf("%s / %s", fmtSec(d.median), fmtSec(d.max))
		if d.heard < d.want {
			s += fmt.Sprintf(" (%d of %d told within %s)", d.heard, d.want, scaleDetectLimit)
		}
		det = append(det, s)
	}
	return fmt.Sprintf("| %d x %d | %d | %s | %s | %d | %d | %d (%d after converging) | %.2g | %.0f / %.0f | %.0f / %.0f | %.2f | %.2f |", r.pools, r.n, total,
		fmtSec(r.converge), strings.Join(det, "; "), r.toldOutside, r.crossSeen, r.falseDeaths, r.falseLater, r.procCores/float64(total),
		r.sentMean, r.sentMax, r.pktSent, r.streamSent, r.procCores, r.otherCores)
}

const domainHeader = "| pools x members | members in all | converge | detection in the victim's pool, median / max (each kill) | told outside its pool | members that saw another pool's | false deaths | CPU per member (cores) | bytes/s per member sent, mean / max | packet / stream B/s per member sent | process CPU (cores) | others (cores) |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|"

// domainPoolsRun measures pools pools of n members each, all in this
// process at once, each pool under its own label (DomainLabel of the
// cluster label "bench" and its domain, rack-00, rack-01, ...) and all
// with one key, as the agents of as many failure domains of one cluster
// are: the members of each pool join two random members of their own,
// in batches of scaleJoinBatch per pool; converge is until every member
// counts n; then the same steady window as poolScaleRun, per member over
// every pool; then one member killed in each of the first
// min(scaleKills, pools) pools, one after the other, and detection as
// told to the other members of its pool. A member of another pool that
// is told of the death, or that counts a member of another pool at any
// time, is a leak between pools.
func domainPoolsRun(t *testing.T, pools, n int, window time.Duration) (r domainResult) {
	r.pools, r.n = pools, n
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	deaths := newDeathLog()
	logs := &scaleLog{suspects: map[string]int{}}
	rng := rand.New(rand.NewPCG(2, uint64(pools*n)))
	var peers sync.Map
	var all []*scaleMember
	poolOf := map[string]int{}
	members := make([][]*scaleMember, pools)
	t.Cleanup(func() {
		deaths.stop()
		for _, m := range all {
			m.ml.Shutdown()
		}
	})
	for p := range pools {
		sec := Secure{Keys: [][]byte{key}, Label: DomainLabel("bench", fmt.Sprintf("rack-%02d", p))}
		for i := range n {
			var id [8]byte
			binary.BigEndian.PutUint64(id[:], rng.Uint64())
			name := MemberName(fmt.Sprintf("node-%05d", p*n+i), hex.EncodeToString(id[:]))
			ml, tr, err := newCountedMember(name, DefaultTuning(), sec, deathObserver{name, deaths}, logs, &peers)
			if err != nil {
				t.Fatalf("member %d of pool %d: %v", i, p, err)
			}
			m := &scaleMember{name: name, ml: ml, tr: tr}
			members[p], all, poolOf[name] = append(members[p], m), append(all, m), p
		}
	}
	created := time.Now()
	crossSeen := func() int {
		seen := 0
		for _, m := range all {
			for _, o := range m.ml.Members() {
				if poolOf[o.Name] != poolOf[m.name] {
					seen++
					break
				}
			}
		}
		return seen
	}

	// Joins: pool after pool, each in batches with a wait until the
	// process is quiet after each (poolScaleRun's way). Joining every
	// pool's batch at once (16 batches of 8 at 16 x 32) saturated both
	// cores of the test machine with the joins' gossip, and the pools
	// collapsed: probes timed out, and the false deaths fed on themselves.
	start := time.Now()
	stopProgress := progress(t, 10*time.Second, func() string {
		f, _, names := deaths.falseDeaths()
		return fmt.Sprintf("false deaths %d (%d members), packets sent %d", f, len(names), sumPackets(all))
	})
	defer stopProgress()
	var joined []*scaleMember // the members of the pools joined so far, and of this one: waitQuiet's budget is their probing
	for p := 0; p < pools && err == nil; p++ {
		joined = append(joined, members[p][0])
		for b := 1; b < n && err == nil; b += scaleJoinBatch {
			if time.Since(start) > scaleConvergeLimit {
				f, _, names := deaths.falseDeaths()
				err = fmt.Errorf("joins not done after %s: pool %d of %d at %d of %d, %d false deaths of %d members so far", scaleConvergeLimit, p, pools, b, n, f, len(names))
				break
			}
			for i := b; i < min(n, b+scaleJoinBatch) && err == nil; i++ {
				seeds := []string{members[p][rng.IntN(i)].ml.LocalNode().Address(), members[p][rng.IntN(i)].ml.LocalNode().Address()}
				for attempt := range scaleJoinAttempts {
					if _, err = members[p][i].ml.Join(seeds); err == nil {
						break
					}
					if attempt == scaleJoinAttempts-1 {
						err = fmt.Errorf("%s joining pool %d, %d tries: %w", members[p][i].name, p, scaleJoinAttempts, err)
					}
				}
			}
			joined = append(joined, members[p][b:min(n, b+scaleJoinBatch)]...)
			waitQuiet(joined, DefaultTuning(), 10*time.Second)
		}
	}
	if err != nil {
		r.joinErr = strings.Join(strings.Fields(err.Error()), " ")
		r.falseDeaths, _, _ = deaths.falseDeaths()
		t.Error(err)
		return r
	}
	for {
		short := 0
		for _, m := range all {
			if m.ml.NumMembers() != n {
				short++
			}
		}
		if short == 0 {
			break
		}
		if time.Since(start) > scaleConvergeLimit {
			r.joinErr = fmt.Sprintf("after %s %d members did not count %d", scaleConvergeLimit, short, n)
			r.falseDeaths, _, _ = deaths.falseDeaths()
			r.crossSeen = crossSeen()
			t.Error(r.joinErr)
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.converge = time.Since(start)
	r.crossSeen = crossSeen()
	deaths.converged()
	stopProgress()
	t.Logf("%d pools of %d: every member counts %d at %s; %d members counted one of another pool", pools, n, n, fmtSec(r.converge), r.crossSeen)

	// Settle, then the steady window (see TestPoolScale).
	settleStart := time.Now()
	prev, last := -1.0, sumSent(all)
	for steady := 0; steady < 2 && time.Since(settleStart) < scaleSettleMax; {
		time.Sleep(time.Second)
		cur := sumSent(all)
		rate := float64(cur - last)
		if prev >= 0 && rate >= 0.9*prev {
			steady++
		} else {
			steady = 0
		}
		prev, last = rate, cur
	}
	r.settle = time.Since(settleStart)
	r.window = window
	if window == 0 {
		r.window = pushPullPeriod(n)
		time.Sleep(time.Until(created.Add(memberlist.DefaultLANConfig().PushPullInterval)))
	}
	before := snapshot(all)
	cpu0, busy0, pp0 := processCPU(t), machineBusy(), logs.pushPulls.Load()
	time.Sleep(r.window)
	cpu1, busy1 := processCPU(t), machineBusy()
	after := snapshot(all)
	w := r.window.Seconds()
	r.procCores = (cpu1 - cpu0).Seconds() / w
	r.otherCores = max(0, (busy1-busy0-(cpu1-cpu0)).Seconds()/w)
	r.pushPulls = logs.pushPulls.Load() - pp0
	total := float64(len(all))
	for i := range all {
		d := after[i].minus(before[i])
		sent := float64(d.pktOut+d.streamOut) / w
		r.sentMean += sent / total
		r.sentMax = max(r.sentMax, sent)
		r.pktSent += float64(d.pktOut) / w / total
		r.streamSent += float64(d.streamOut) / w / total
	}
	t.Logf("window %s: %.2f cores for %d members (%.2g a member; other processes %.2f), %d push-pulls, %d goroutines",
		fmtSec(r.window), r.procCores, len(all), r.procCores/total, r.otherCores, r.pushPulls, runtime.NumGoroutine())

	// Detection: a member of each of the first pools killed, one after
	// the other, without Leave.
	for p := range min(scaleKills, pools) {
		v := rng.IntN(n)
		victim := members[p][v]
		alive := slices.Delete(slices.Clone(members[p]), v, v+1)
		killedAt := time.Now()
		deaths.kill(victim.name)
		if err := victim.ml.Shutdown(); err != nil {
			t.Fatal(err)
		}
		deadline := killedAt.Add(scaleDetectLimit)
		for deaths.heard(victim.name) < len(alive) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Second) // for a member of another pool to be told, were it to be
		var delays []time.Duration
		for _, m := range alive {
			if at, ok := deaths.heardAt(victim.name, m.name); ok {
				delays = append(delays, at.Sub(killedAt))
			}
		}
		outside := deaths.heard(victim.name) - len(delays)
		r.toldOutside += outside
		slices.Sort(delays)
		d := detection{heard: len(delays), want: len(alive)}
		if len(delays) > 0 {
			d.median, d.max = delays[len(delays)/2], delays[len(delays)-1]
		}
		r.detect = append(r.detect, d)
		t.Logf("kill %d: %s of pool %d; %d of %d members of its pool told, median %s, max %s; %d members of other pools told",
			p+1, victim.name, p, d.heard, d.want, fmtSec(d.median), fmtSec(d.max), outside)
	}
	r.falseDeaths, r.falseLater, _ = deaths.falseDeaths()
	r.crossSeen = max(r.crossSeen, crossSeen())
	if r.toldOutside > 0 || r.crossSeen > 0 {
		t.Errorf("pools mixed: %d members of other pools told of a death, %d members counted a member of another pool", r.toldOutside, r.crossSeen)
	}
	return r
}
