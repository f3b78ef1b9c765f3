package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestWindowTTL: a renewal gives the window, or the lease's time left when
// that is shorter, never less than nothing.
func TestWindowTTL(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name          string
		window, lease time.Duration
		renewedAgo    time.Duration
		want          time.Duration
	}{
		{"no window: the lease's time left", 0, 5 * time.Second, 2 * time.Second, 3 * time.Second},
		{"no window, just renewed", 0, 5 * time.Second, 0, 5 * time.Second},
		{"the window", time.Second, 5 * time.Second, 2 * time.Second, time.Second},
		{"the lease ends sooner than the window", time.Second, 5 * time.Second, 4500 * time.Millisecond, 500 * time.Millisecond},
		{"the lease has ended", time.Second, 5 * time.Second, 6 * time.Second, 0},
	} {
		if got := windowTTL(c.window, c.lease, t0.Add(-c.renewedAgo), t0); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestGrantBound: a stopped stream gives nothing more, and its bound is the
// latest deadline it gave, or what the run's earlier streams gave when
// later.
func TestGrantBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	gs := newGrants()
	if _, _, ok := gs.stop("n", 7); ok {
		t.Fatal("a node no stream serves was stopped")
	}
	g := gs.open("n", "conn", 1, 7, t0.Add(5*time.Second), t0, time.Minute)
	if !give(g, t0.Add(6*time.Second), time.Second) || !give(g, t0.Add(6500*time.Millisecond), 300*time.Millisecond) {
		t.Fatal("a running stream refused to give")
	}
	if _, _, ok := gs.stop("n", 8); ok {
		t.Error("another lease's stream was stopped")
	}
	bound, conn, ok := gs.stop("n", 7)
	if !ok || conn != "conn" || !bound.Equal(t0.Add(7*time.Second)) {
		t.Errorf("bound %v %q %v, want start+7s (the latest given) \"conn\" true", bound.Sub(t0), conn, ok)
	}
	if give(g, t0.Add(7*time.Second), time.Second) {
		t.Error("a stopped stream gave a deadline")
	}
	young := gs.open("m", "c2", 1, 9, t0.Add(5*time.Second), t0, time.Minute)
	give(young, t0.Add(time.Second), time.Second)
	if bound, _, _ := gs.stop("m", 9); !bound.Equal(t0.Add(5 * time.Second)) {
		t.Errorf("a young stream's bound is start+%s, want start+5s (what its earlier streams gave)", bound.Sub(t0))
	}
	// A stream that ends gives nothing more, and its bound stays for a
	// fence until it is forgotten; forgetting it leaves a newer stream of
	// its node alone.
	closed := gs.open("k", "c4", 1, 3, t0, t0, time.Minute)
	give(closed, t0.Add(time.Second), time.Second)
	gs.close("k", closed, time.Hour)
	if give(closed, t0.Add(2*time.Second), time.Second) {
		t.Error("a closed stream gave a deadline")
	}
	if bound, conn, ok := gs.stop("k", 3); !ok || conn != "c4" || !bound.Equal(t0.Add(2*time.Second)) {
		t.Errorf("a closed stream's bound: start+%s %q %v, want start+2s \"c4\" true", bound.Sub(t0), conn, ok)
	}
	newer := gs.open("m", "c3", 1, 9, t0, t0, time.Minute)
	gs.forget("m", young)
	if _, conn, ok := gs.stop("m", 9); !ok || conn != "c3" {
		t.Errorf("the newer stream was forgotten with the older: %q %v", conn, ok)
	}
	gs.forget("m", newer)
	if _, _, ok := gs.stop("m", 9); ok {
		t.Error("a forgotten stream was stopped")
	}
}

// TestConnSessions: a node's conns key keeps the highest session, whatever
// order the puts reach etcd in; a key fenced by the window takes no
// stream's put; one node's refusal in a group leaves the others written.
func TestConnSessions(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	cli := co.srv.cli
	l, err := cli.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	value := func(node string) string {
		t.Helper()
		resp, err := cli.Get(t.Context(), co.srv.k.conn(node))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	writes := 0
	write := func(node string, session uint64, id string) error {
		t.Helper()
		writes++
		items := map[string]connItem{node: {id: id, session: session, lease: l.ID}}
		for i := range 3 { // group companions, each its first stream
			items[fmt.Sprintf("other%d-%d", i, writes)] = connItem{id: "c/x", session: 1, lease: l.ID}
		}
		out := co.srv.writeConns(t.Context(), items)
		for n, err := range out {
			if n != node && err != nil {
				t.Errorf("%s beside %s: %v", n, node, err)
			}
		}
		return out[node]
	}
	for _, c := range []struct {
		session uint64
		id      string
		want    codes.Code
		holds   string
	}{
		{2, "c/2", codes.OK, connValue(2, "c/2")},
		{1, "c/1", codes.Aborted, connValue(2, "c/2")}, // the stream the agent left, written late
		{2, "d/9", codes.Aborted, connValue(2, "c/2")}, // the same session twice
		{10, "d/10", codes.OK, connValue(10, "d/10")},  // 10 after 2: by number, not text
		{9, "c/9", codes.Aborted, connValue(10, "d/10")},
	} {
		if err := write("n", c.session, c.id); status.Code(err) != c.want || value("n") != c.holds {
			t.Errorf("session %d: %v, key %q; want %s, key %q", c.session, err, value("n"), c.want, c.holds)
		}
	}
	// A stream the agent dropped leaves its key closed: a later session
	// takes it, an earlier one does not.
	if _, err := cli.Put(t.Context(), co.srv.k.conn("n"), connValue(10, "d/10")+connClosed, clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	if err := write("n", 9, "c/9"); status.Code(err) != codes.Aborted || value("n") != connValue(10, "d/10")+connClosed {
		t.Errorf("session 9 over 10's closed key: %v, key %q", err, value("n"))
	}
	if err := write("n", 11, "d/11"); err != nil || value("n") != connValue(11, "d/11") {
		t.Errorf("session 11 over 10's closed key: %v, key %q", err, value("n"))
	}
	// The window's fence (fenceWindow's transaction) takes the key from
	// the stream that holds it; no later session takes it back.
	co.srv.grants.open("n", connValue(11, "d/11"), 11, l.ID, time.Now().Add(time.Minute), time.Now(), time.Minute)
	if ok, err := co.fenceWindow(t.Context(), "n", "i1", l.ID); err != nil || !ok {
		t.Fatalf("fence by the window: %v %v", ok, err)
	}
	if err := write("n", 12, "c/12"); status.Code(err) != codes.Aborted || value("n") != connFenced {
		t.Errorf("a stream after the fence: %v, key %q; want Aborted, fenced", err, value("n"))
	}
}

// TestFenceWindow: the fence written for a dead node's run is its serving
// stream's last deadline when that stream is the run's newest, and nothing
// (the lease's time left, by revokeMember) when another stream holds the
// node's conns key.
func TestFenceWindow(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	cli := co.srv.cli
	l, err := cli.Grant(t.Context(), 60)
	if err != nil {
		t.Fatal(err)
	}
	fenceOf := func(node string) (f fence, ok bool) {
		t.Helper()
		resp, err := cli.Get(t.Context(), co.srv.k.fence(node))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return f, false
		}
		if err := json.Unmarshal(resp.Kvs[0].Value, &f); err != nil {
			t.Fatal(err)
		}
		return f, true
	}
	start := time.Now().Add(-time.Minute)
	for _, node := range []string{"served", "moved", "dropped"} {
		if err := co.srv.writeConns(t.Context(), map[string]connItem{node: {id: "c/1", session: 1, lease: l.ID}})[node]; err != nil {
			t.Fatal(err)
		}
		g := co.srv.grants.open(node, connValue(1, "c/1"), 1, l.ID, start.Add(5*time.Second), start, time.Minute)
		give(g, start.Add(30*time.Second), 800*time.Millisecond)
	}
	// The agent of "moved" opened a stream on another coordinator.
	if err := co.srv.writeConns(t.Context(), map[string]connItem{"moved": {id: "other/4", session: 2, lease: l.ID}})["moved"]; err != nil {
		t.Fatal(err)
	}
	ok, err := co.fenceWindow(t.Context(), "served", "i1", l.ID)
	if f, written := fenceOf("served"); err != nil || !ok || !written || !f.Window || f.Instance != "i1" || f.UntilMs != start.Add(30800*time.Millisecond).UnixMilli() {
		t.Errorf("served: %v %v, fence %+v %v; want the window's fence until the last deadline given", ok, err, f, written)
	}
	// The agent of "dropped" went away (a killed host's does): its stream
	// closed, its key marked so; a later session of the run still wins
	// over it, and the fence still takes it.
	if _, err := cli.Put(t.Context(), co.srv.k.conn("dropped"), connValue(1, "c/1")+connClosed, clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	co.srv.grants.close("dropped", co.srv.grants.m["dropped"], time.Hour)
	ok, err = co.fenceWindow(t.Context(), "dropped", "i1", l.ID)
	if f, written := fenceOf("dropped"); err != nil || !ok || !written || !f.Window || f.UntilMs != start.Add(30800*time.Millisecond).UnixMilli() {
		t.Errorf("dropped: %v %v, fence %+v %v; want the window's fence until the last deadline given", ok, err, f, written)
	}
	ok, err = co.fenceWindow(t.Context(), "moved", "i1", l.ID)
	if f, written := fenceOf("moved"); err != nil || ok || written {
		t.Errorf("moved: %v %v, fence %+v %v; want no fence by this coordinator's window", ok, err, f, written)
	}
	if _, _, again := co.srv.grants.stop("moved", clientv3.LeaseID(l.ID)); !again {
		t.Error("the grant was forgotten")
	}
}

// blockNode is a node of blockOfFour: its lease and its stream.
type blockNode struct {
	name  string
	lease int64
	ch    <-chan *pb.Assignment
	drop  context.CancelFunc
}

// blockOfFour registers n0 to n3, each with 4 GPUs and a node server but
// n2, and watches each: one block, whose relay a job of the four makes n0.
func blockOfFour(t *testing.T, c pb.CoordinatorClient) []blockNode {
	t.Helper()
	var out []blockNode
	for i, name := range []string{"n0", "n1", "n2", "n3"} {
		n := node(name, 4)
		if name != "n2" {
			n.CheckpointAddr = fmt.Sprintf("127.0.0.1:%d", 9000+i)
		}
		resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
		if err != nil {
			t.Fatal(err)
		}
		ch, drop := watch(t, c, name, resp.LeaseId, 0)
		out = append(out, blockNode{name, resp.LeaseId, ch, drop})
	}
	return out
}

// TestRelayedRenewals: with a fence window, a running job's members are
// renewed through their block's relay: the relay's stream carries each
// member's renewal, given as the member's own (recorded in its grant
// before it is sent), for the member's stream; a member without a node
// server (n2), or whose relay's stream is gone, renews itself; a member
// fenced (n1) is renewed no more; a node without a job gets none.
func TestRelayedRenewals(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.FenceWindow = 300 * time.Millisecond })
	c := client(t, co.Addr())
	var chans []<-chan *pb.Assignment
	var drop []context.CancelFunc
	for _, n := range blockOfFour(t, c) {
		chans, drop = append(chans, n.ch), append(drop, n.drop)
	}
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 4, 4)}); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		// A node given a job gets a window deadline with it.
		if a := next(t, ch, func(a *pb.Assignment) bool { return a.Job == "j" }); a.LeaseTtlMs <= 0 || a.LeaseTtlMs > 300 || a.SentUnixNanos == 0 {
			t.Errorf("n%d's assignment of the job renews it for %d ms, want the window's 300 at most", i, a.LeaseTtlMs)
		}
	}
	// n0 is the block's relay (the first member by name).
	var relayed *pb.RelayedRenewal
	timeout := time.After(10 * time.Second)
	for relayed == nil {
		select {
		case a := <-chans[0]:
			for _, r := range a.RelayedRenewals {
				if r.Node != "n1" && r.Node != "n3" {
					t.Fatalf("the relay's stream renewed %s, which has no node server or is the relay", r.Node)
				}
				if r.Node == "n1" {
					relayed = r
				}
			}
		case <-timeout:
			t.Fatal("no renewal of n1 through its relay n0")
		}
	}
	g1 := co.srv.grants.live("n1")
	if g1 == nil || relayed.Session != g1.session || relayed.Addr != "127.0.0.1:9001" || relayed.LeaseTtlMs <= 0 || relayed.LeaseTtlMs > 300 {
		t.Fatalf("relayed renewal %v; want n1's stream's session, its node server and at most the window", relayed)
	}
	renews := func(node string) bool {
		g := co.srv.grants.live(node)
		_, ok := co.srv.windowRenewers()[g]
		return g != nil && ok
	}
	for node, want := range map[string]bool{"n0": true, "n1": false, "n2": true, "n3": false} {
		if got := renews(node); got != want {
			t.Errorf("%s's stream sends window renewals: %v, want %v", node, got, want)
		}
	}
	// What the relay's renewal gives is recorded in n1's grant before it
	// is sent: the fence of n1's run waits it out.
	now := time.Now()
	relayedBy := func(relay string) []relayedMember { return co.srv.windowRenewers()[co.srv.grants.live(relay)] }
	rs := co.srv.relayedRenewals(relayedBy("n0"), now)
	if len(rs) != 2 || rs[0].Node != "n1" || rs[1].Node != "n3" {
		t.Fatalf("relayed renewals %v, want n1's and n3's", rs)
	}
	bound, _, ok := co.srv.grants.stop("n1", g1.lease)
	if want := now.Add(time.Duration(rs[0].LeaseTtlMs) * time.Millisecond); !ok || bound.Before(want) {
		t.Errorf("n1's bound %v (%v), want at least the relayed deadline %v", bound, ok, want)
	}
	if rs := co.srv.relayedRenewals(relayedBy("n0"), time.Now()); len(rs) != 1 || rs[0].Node != "n3" {
		t.Errorf("relayed renewals after n1's stream stopped: %v, want n3's alone", rs)
	}
	// The relay's stream gone, its members renew themselves.
	drop[0]()
	for co.srv.grants.live("n0") != nil {
		select {
		case <-timeout:
			t.Fatal("the relay's dropped stream still gives deadlines")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !renews("n3") || !renews("n2") {
		t.Error("members wait for a relay whose stream is gone")
	}
	// A node that runs no job is renewed by its lease alone.
	ch, _ := agent(t, c, node("idle", 4))
	next(t, ch, func(*pb.Assignment) bool { return true })
	if renews("idle") {
		t.Error("a node without a job gets window renewals")
	}
}

// give has g give a deadline of ttl at now, as a renewal with a window of
// ttl does while the lease has longer left, and reports whether it did.
func give(g *grant, now time.Time, ttl time.Duration) bool {
	_, ok := g.renewal(ttl, now)
	return ok
}
