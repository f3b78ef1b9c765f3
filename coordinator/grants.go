package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// A node's conns key names the stream that serves it: the agent's session
// number (WatchRequest.session, zero-padded so that etcd's byte order is
// the numbers' order), a space, and the stream's id (coordinator/seq). A
// stream's key is put only over a lower session's, so a stream the agent
// has left behind never takes the key back, whatever the order the puts
// reach etcd in. A stream the agent dropped leaves its key marked closed
// (connClosed: the node is disconnected), so that a later session's is
// still told from it. connFenced, above every session, is the key of a
// node a coordinator fenced by its window (fenceWindow): no stream serves
// that run again.
const (
	connFenced = "~fenced"
	connClosed = " closed"
)

// connOpen says whether a conns key names a stream that is open.
func connOpen(v string) bool { return v != connFenced && !strings.HasSuffix(v, connClosed) }

// connValue is the conns key of session's stream id.
func connValue(session uint64, id string) string { return fmt.Sprintf("%020d %s", session, id) }

// connBy is the coordinator whose stream a conns key names ("session
// coordinator/seq"), "" for none (fenced).
func connBy(v string) string {
	_, id, _ := strings.Cut(v, " ")
	by, _, _ := strings.Cut(id, "/")
	return by
}

// putConn is the operation that puts the conns key of session's stream id
// under lease, unless a stream of the same or a later session holds it,
// or its run was fenced. Its outcome is connPut's.
func putConn(key string, session uint64, id string, lease clientv3.LeaseID) clientv3.Op {
	put := clientv3.OpPut(key, connValue(session, id), clientv3.WithLease(lease))
	// A value compare fails on a missing key: the first stream of a run
	// is the Else of "the key exists".
	later := clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "<", connValue(session, ""))}, []clientv3.Op{put}, nil)
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, []clientv3.Op{put}, []clientv3.Op{later})
}

// connPut says whether putConn's operation, answered r, put the key.
func connPut(r *clientv3.TxnResponse, i int) bool {
	t := r.Responses[i].GetResponseTxn()
	if t.GetSucceeded() {
		return true
	}
	for _, o := range t.GetResponses() {
		return o.GetResponseTxn().GetSucceeded()
	}
	return false
}

// grants are the deadlines this coordinator's Watch streams have given
// their nodes' runs, by node: what a fence by the window waits out.
//
// A run's ranks may run until the latest deadline any stream gave it. A
// stream gives deadlines only while it is not stopped, and records each
// before it is sent; what the run's earlier streams (on any coordinator)
// gave, its agent says as it opens this one (WatchRequest's
// deadline_left_ms: the agent keeps its ranks to it). So once a stream is
// stopped, its bound (the latest it gave, or what was left before it when
// later) is the latest the run can stop at, provided this stream is still
// the run's newest: what the fence's transaction compares (the conns
// key).
//
// # Concurrency
//
// Every method may be called from any goroutine.
type grants struct {
	mu sync.RWMutex // read-locked by live, which every stream asks at every look
	m  map[string]*grant
	// ver counts the changes of which streams give deadlines (opened,
	// closed, stopped, forgotten): windowLoop works out its renewers again
	// when it moves.
	ver atomic.Uint64
}

// grant is one stream's.
type grant struct {
	mu      sync.Mutex
	conn    string           // the stream's conns key
	session uint64           // the agent's number for the stream (WatchRequest.session)
	lease   clientv3.LeaseID // the run's lease
	floor   time.Time        // what the run's earlier streams gave
	end     time.Time        // the latest deadline given
	stopped bool
	// renewed is when etcd last renewed the lease, for leaseTTL: no
	// deadline given runs past renewed+leaseTTL (windowTTL).
	renewed  time.Time
	leaseTTL time.Duration
	// tick is the stream's turn to send a window renewal (windowLoop);
	// a turn missed while the stream is busy is dropped.
	tick chan turn
	// key is the stream's relay key (Assignment.relay_key): what its
	// assignments through a relay are checked by.
	key []byte
	// delivered is the newest revision of an assignment a relay
	// delivered to this stream's agent (Delivered).
	delivered atomic.Int64
	// relayed is the newest revision of an assignment sent through a
	// relay for this stream (no delivery is taken beyond it), and
	// relayedAt when (Unix nanoseconds).
	relayed, relayedAt atomic.Int64
	// asleep says the stream leaves its job's changes to its relay and
	// waits only for its route to change (cache.memberRoute) or late;
	// late wakes it when its relay has not delivered the newest in time
	// (relaySweep), or its relay's stream here ended.
	asleep atomic.Bool
	late   chan struct{}
}

// wake has the stream look at its assignment again, unless a wake waits
// already.
func (g *grant) wake() {
	select {
	case g.late <- struct{}{}:
	default:
	}
}

// offered records that a relay's message carries the assignment of rev
// for this stream, sent at now.
func (g *grant) offered(rev int64, now time.Time) {
	for {
		cur := g.relayed.Load()
		if rev < cur {
			return
		}
		// The time first: whoever reads relayed, then relayedAt, sees
		// this time or a later one with rev.
		g.relayedAt.Store(now.UnixNano())
		if g.relayed.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// markDelivered records that a relay delivered the assignment of rev, or
// of the newest one a relay was given when that is older.
func (g *grant) markDelivered(rev int64) {
	rev = min(rev, g.relayed.Load())
	for {
		cur := g.delivered.Load()
		if rev <= cur || g.delivered.CompareAndSwap(cur, rev) {
			return
		}
	}
}

func newGrants() *grants { return &grants{m: map[string]*grant{}} }

// open records node's stream session, whose conns key is conn, of the run
// on lease whose earlier streams gave it until floor; etcd renewed the
// lease for leaseTTL at renewed.
func (gs *grants) open(node, conn string, session uint64, lease clientv3.LeaseID, floor, renewed time.Time, leaseTTL time.Duration) *grant {
	g := &grant{conn: conn, session: session, lease: lease, floor: floor, renewed: renewed, leaseTTL: leaseTTL, tick: make(chan turn, 1),
		key: newRelayKey(), late: make(chan struct{}, 1)}
	gs.mu.Lock()
	gs.m[node] = g
	gs.mu.Unlock()
	gs.ver.Add(1)
	return g
}

// live is node's stream on this coordinator while it gives deadlines;
// nil for none.
func (gs *grants) live(node string) *grant {
	gs.mu.RLock()
	g := gs.m[node]
	gs.mu.RUnlock()
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil
	}
	return g
}

// close ends g, node's stream: it gives nothing more, and its bound stays
// for a fence until forget has passed (the lease it renewed has surely
// ended or been renewed by another stream by then), unless another
// stream took its place.
func (gs *grants) close(node string, g *grant, forget time.Duration) {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	gs.ver.Add(1)
	time.AfterFunc(forget, func() { gs.forget(node, g) })
}

// forget forgets g, node's stream, unless another took its place.
func (gs *grants) forget(node string, g *grant) {
	gs.mu.Lock()
	if gs.m[node] == g {
		delete(gs.m, node)
	}
	gs.mu.Unlock()
	gs.ver.Add(1)
}

// stop stops the stream of node's run on lease from giving deadlines, and
// returns the latest the run can stop at and the stream's conns key; ok is
// false when this coordinator serves no such stream.
func (gs *grants) stop(node string, lease clientv3.LeaseID) (bound time.Time, conn string, ok bool) {
	gs.mu.Lock()
	g := gs.m[node]
	gs.mu.Unlock()
	if g == nil || g.lease != lease {
		return time.Time{}, "", false
	}
	defer gs.ver.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	if g.end.After(g.floor) {
		return g.end, g.conn, true
	}
	return g.floor, g.conn, true
}

// renewed says etcd renewed the lease for ttl at now.
func (g *grant) leaseRenewed(now time.Time, ttl time.Duration) {
	g.mu.Lock()
	g.renewed, g.leaseTTL = now, ttl
	g.mu.Unlock()
}

// renewal records the deadline a renewal sent at now carries with a
// fence window of window (windowTTL), before it is sent, and returns its
// TTL: false when none is to be sent (the stream stopped, when it must
// send none, or the lease's time is up).
func (g *grant) renewal(window time.Duration, now time.Time) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ttl := windowTTL(window, g.leaseTTL, g.renewed, now)
	if ttl <= 0 || g.stopped {
		return 0, false
	}
	if d := now.Add(ttl); d.After(g.end) {
		g.end = d
	}
	return ttl, true
}

// Through relays. With a fence window, each stream would send a renewal
// every third of it: three messages a second a node at 1 s, more than a
// coordinator of 16,384 nodes can send. A running job's members are
// renewed through their block's relay instead (Assignment.relay, the
// first of each block of pb.RelayBlock): on the relay's renewal, its
// stream gives each member whose own stream this coordinator serves its
// deadline, recorded in the member's grant before it is sent as for the
// member's own, and its agent forwards them (relayed_renewals). The
// members' own streams send no window renewals while their relay has a
// stream here (windowRenewers, the one place of that rule); their lease renewals, and everything else,
// they send as before. So a block costs the coordinator one message a
// third of the window, and a member's bound is its own grant's either way.
// A relay that stalls stops its block's ranks with its own: the job loses
// the relay, as it would anyway.

// turn is a stream's turn to send a window renewal, at now: a relay's
// with the members of its block it renews (relayed).
type turn struct {
	now     time.Time
	relayed []relayedMember
}

// relayedMember is a member a relay's stream renews, with its stream's
// grant here as windowRenewers found it: a grant replaced since is
// stopped, and gives nothing.
type relayedMember struct {
	m *pb.Member
	g *grant
}

// relayedRenewals are the renewals of members, given at now, that a
// relay's stream carries: each member's whose stream is still here.
func (s *server) relayedRenewals(members []relayedMember, now time.Time) []*pb.RelayedRenewal {
	var out []*pb.RelayedRenewal
	for _, x := range members {
		if ttl, ok := x.g.renewal(s.cfg.FenceWindow, now); ok {
			out = append(out, &pb.RelayedRenewal{Node: x.m.Node, Session: x.g.session, LeaseTtlMs: ttl.Milliseconds(), Addr: x.m.CheckpointAddr})
		}
	}
	return out
}

// windowLoop, with a fence window, gives each stream that sends window
// renewals its turn every third of the window, until ctx ends: one clock
// for the coordinator, not a timer a stream, so that a round wakes the
// streams that send (a block's relay, a node renewed by no relay), not
// every stream. Which streams those are is worked out again only when
// the running jobs or the streams here change: at 16,384 nodes, looking
// up every member's grant three times a second was 3% of the
// coordinator's time.
func (s *server) windowLoop(ctx context.Context) error {
	if s.cfg.FenceWindow <= 0 {
		return nil
	}
	t := time.NewTicker(s.cfg.FenceWindow / 3)
	defer t.Stop()
	var (
		renewers map[*grant][]relayedMember
		changed  <-chan struct{} // closed once the running jobs change
		ver      uint64          // the streams' (grants.ver)
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			stale := renewers == nil || s.grants.ver.Load() != ver
			select {
			case <-changed:
				stale = true
			default:
			}
			if stale {
				// What changes while they are worked out is seen at
				// the next turn.
				ver, changed = s.grants.ver.Load(), s.cache.assignmentsChanged()
				renewers = s.windowRenewers()
			}
			for g, relayed := range renewers {
				select {
				case g.tick <- turn{now: now, relayed: relayed}:
				default:
				}
			}
		}
	}
}

// windowRenewers are the grants of the streams that send window renewals
// now, each with the members it renews through its agent: each running
// job's members with a stream here, but those renewed through their
// block's relay (both with a node server, the relay's stream here). A
// node that runs no job gets none: it has no ranks to stop, and the
// assignment that gives it a job carries a deadline.
func (s *server) windowRenewers() map[*grant][]relayedMember {
	out := map[*grant][]relayedMember{}
	for _, ms := range s.cache.runningMembers() {
		for r := 0; r < len(ms); r += pb.RelayBlock {
			b := ms[r:min(r+pb.RelayBlock, len(ms))]
			rg := s.grants.live(b[0].Node)
			var relayed []relayedMember
			for _, m := range b[1:] {
				g := s.grants.live(m.Node)
				switch {
				case g == nil:
				case rg != nil && throughRelay(b[0], m):
					relayed = append(relayed, relayedMember{m, g})
				default:
					out[g] = nil
				}
			}
			if rg != nil {
				out[rg] = relayed
			}
		}
	}
	return out
}

// windowTTL is how long a renewal sent at now gives a node whose lease
// (of leaseTTL) was last renewed at renewed: the lease's time left, or the
// window when shorter (0: none).
func windowTTL(window, leaseTTL time.Duration, renewed, now time.Time) time.Duration {
	left := renewed.Add(leaseTTL).Sub(now)
	if window > 0 && window < left {
		return window
	}
	return max(left, 0)
}
