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
)

// domainResult is what one run of pools domain pools of n members each
// measured; a zero field was not reached.
type domainResult struct {
	pools, n    int
	converge    time.Duration
	joinErr     string
	detect      []detection
	toldOutside int // Dead events for a killed member from members of other pools
	crossSeen   int // members that counted a member of another pool, at the end of the joins or of the run
	falseDeaths int
	falseLater  int
	steady      // per member over every pool
}

func (r domainResult) row() string {
	total := r.pools * r.n
	if r.converge == 0 {
		return fmt.Sprintf("| %d x %d | %d | did not converge: %s | | | %d | %d | | | | | |", r.pools, r.n, total, r.joinErr, r.crossSeen, r.falseDeaths)
	}
	det := detectCells(r.detect)
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
// counts n; then the same steady window as poolScaleRun (measureSteady), per member over
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
		short, _ := countShort(all, n)
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
	r.steady = measureSteady(t, all, n, window, created, logs)
	total := float64(len(all))
	t.Logf("window %s: %.2f cores for %d members (%.2g a member; other processes %.2f), %d push-pulls, %d goroutines",
		fmtSec(r.window), r.procCores, len(all), r.procCores/total, r.otherCores, r.pushPulls, runtime.NumGoroutine())

	// Detection: a member of each of the first pools killed, one after
	// the other, without Leave.
	for p := range min(scaleKills, pools) {
		v := rng.IntN(n)
		victim := members[p][v]
		alive := slices.Delete(slices.Clone(members[p]), v, v+1)
		d := detect(t, deaths, victim, alive, time.Second) // a second more for a member of another pool to be told, were it to be
		outside := deaths.heard(victim.name) - d.heard
		r.toldOutside += outside
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
