package coordinator

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestRelayedAssignments: a job's change reaches the members of a block
// through its relay's stream: the relay's message carries each member's
// new assignment (those with a node server and a stream here), with a
// window deadline and the MAC of the member's stream's relay key; a
// member whose delivery the relay reports gets nothing on its own stream,
// one whose delivery is not reported gets it there after relayWait, and a
// node without a node server gets it on its own stream at once. Only the
// relay may report a delivery.
func TestRelayedAssignments(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) {
		c.FenceWindow, c.relayWait = 600*time.Millisecond, 500*time.Millisecond
	})
	var lookMu sync.Mutex
	looks := map[string]int{} // each stream's looks at a change, or late
	co.hooks.looked = func(node string) {
		lookMu.Lock()
		looks[node]++
		lookMu.Unlock()
	}
	looked := func(node string) int {
		lookMu.Lock()
		defer lookMu.Unlock()
		return looks[node]
	}
	c := client(t, co.Addr())
	chans := map[string]<-chan *pb.Assignment{}
	leases := map[string]int64{}
	keys := map[string][]byte{}
	for _, n := range blockOfFour(t, c) {
		first := next(t, n.ch, func(*pb.Assignment) bool { return true })
		if len(first.RelayKey) != pb.RelayKeySize {
			t.Fatalf("%s's first message has a relay key of %d bytes, want %d", n.name, len(first.RelayKey), pb.RelayKeySize)
		}
		chans[n.name], leases[n.name], keys[n.name] = n.ch, n.lease, first.RelayKey
	}
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 4, 4)}); err != nil {
		t.Fatal(err)
	}
	opened := func(a *pb.Assignment) bool { return a.Job == "j" && a.Open && a.Master != "" }
	// n0 runs rank 0 and is the block's relay: the opening (with rank 0's
	// address) carries n1's and n3's.
	a0 := next(t, chans["n0"], opened)
	n1Looks := looked("n1")
	relayed := map[string]*pb.RelayedRenewal{}
	for _, r := range a0.RelayedRenewals {
		if len(r.Assignment) > 0 {
			relayed[r.Node] = r
		}
	}
	if len(relayed) != 2 || relayed["n1"] == nil || relayed["n3"] == nil {
		t.Fatalf("the relay's opening carries assignments of %v, want n1's and n3's", relayed)
	}
	for node, r := range relayed {
		a := &pb.Assignment{}
		if err := proto.Unmarshal(r.Assignment, a); err != nil {
			t.Fatal(err)
		}
		if !opened(a) || a.Generation.GetNumber() != 1 || a.Revision != a0.Revision || a.Relay != "n0" {
			t.Errorf("%s's relayed assignment: job %q generation %d open %v master %q revision %d relay %q; want the opening of j's generation 1 at %d through n0",
				node, a.Job, a.Generation.GetNumber(), a.Open, a.Master, a.Revision, a.Relay, a0.Revision)
		}
		if r.LeaseTtlMs <= 0 || r.LeaseTtlMs > 600 || r.SentUnixNanos == 0 {
			t.Errorf("%s's relayed assignment gives %d ms from %d, want the window's 600 at most", node, r.LeaseTtlMs, r.SentUnixNanos)
		}
		if !pb.RelayMACValid(keys[node], r) {
			t.Errorf("%s's relayed assignment fails its stream's MAC", node)
		}
		if g := co.srv.grants.live(node); g == nil || g.session != r.Session {
			t.Errorf("%s's relayed assignment is for session %d, not its stream's", node, r.Session)
		}
	}
	if pb.RelayMACValid(keys["n3"], relayed["n1"]) {
		t.Error("n1's relayed assignment passes n3's key")
	}
	tampered := proto.Clone(relayed["n1"]).(*pb.RelayedRenewal)
	tampered.LeaseTtlMs++
	if pb.RelayMACValid(keys["n1"], tampered) {
		t.Error("a relayed assignment with another deadline passes the MAC")
	}
	delivered := func(from string, nodes ...string) error {
		var sessions []uint64
		for _, n := range nodes {
			sessions = append(sessions, relayed[n].GetSession())
		}
		_, err := c.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: 1, Node: from, LeaseId: leases[from],
			Kind: &pb.ReportRequest_Delivered{Delivered: &pb.Delivered{Revision: a0.Revision, Nodes: nodes, Sessions: sessions}}})
		return err
	}
	if err := delivered("n2", "n3"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("n2 reporting n3's delivery: %v, want PermissionDenied (n0 relays n3)", err)
	}
	if err := delivered("n0", "n1"); err != nil {
		t.Fatal(err)
	}
	// n2 has no node server: its own stream sends the opening at once. n3's
	// delivery was not reported: its own stream sends it after relayWait.
	next(t, chans["n2"], opened)
	next(t, chans["n3"], opened)
	if n := co.srv.relayFallbacks.Load(); n != 1 {
		t.Errorf("%d assignments sent by members' streams after relayWait, want 1 (n3's)", n)
	}
	// n1's stream sleeps while its relay carries its job's changes: it
	// has not looked at the opening, or since (it was delivered in time).
	if n := looked("n1") - n1Looks; n != 0 {
		t.Errorf("n1's stream looked at its assignment %d times after the relay's opening, want 0: it sleeps", n)
	}
	if g := co.srv.grants.live("n1"); g == nil || !g.asleep.Load() {
		t.Error("n1's stream does not sleep while its relay carries its changes")
	}
	// n1's stream never sends the opening its relay delivered: its next
	// assignment is the job's end, which wakes it (its route changed).
	if _, err := c.Cancel(t.Context(), &pb.CancelRequest{Job: "j"}); err != nil {
		t.Fatal(err)
	}
	if a := next(t, chans["n1"], func(*pb.Assignment) bool { return true }); a.Job != "" {
		t.Errorf("n1's stream sent job %q (open %v) after its relay delivered it", a.Job, a.Open)
	}
}

// TestDeliveredCapped: a relay's report of a delivery counts up to the
// newest revision a relay was given for the stream, never past it: a
// relay cannot silence a member's later assignments.
func TestDeliveredCapped(t *testing.T) {
	for _, c := range []struct {
		offered, reported []int64
		want              int64
	}{
		{nil, []int64{9}, 0},
		{[]int64{5}, []int64{100}, 5},
		{[]int64{5, 7}, []int64{6}, 6},
		{[]int64{7, 5}, []int64{8, 6}, 7},
	} {
		g := &grant{}
		for _, r := range c.offered {
			g.offered(r, time.Now())
		}
		for _, r := range c.reported {
			g.markDelivered(r)
		}
		if got := g.delivered.Load(); got != c.want {
			t.Errorf("offered %v, reported %v: delivered %d, want %d", c.offered, c.reported, got, c.want)
		}
	}
}

// TestOnChange: what a member's stream does with a changed assignment.
func TestOnChange(t *testing.T) {
	g1, g2 := &pb.Generation{Number: 1}, &pb.Generation{Number: 2}
	closed := &pb.Assignment{Job: "j", Generation: g2, Revision: 5}
	running := &pb.Assignment{Job: "j", Generation: g1, Open: true, Revision: 4}
	for _, c := range []struct {
		what      string
		a, known  *pb.Assignment
		delivered int64
		relayed   bool
		want      change
	}{
		{"the same as the node holds", running, running, 0, true, changeNone},
		{"the same, no relay", running, running, 0, false, changeNone},
		{"new, through the relay", closed, running, 0, true, changeToRelay},
		{"new, delivered already", closed, running, 5, true, changeDelivered},
		{"new, an older one delivered", closed, running, 4, true, changeToRelay},
		{"new, no relay", closed, running, 0, false, changeSend},
		{"after a sleep, through the relay", running, nil, 0, true, changeToRelay},
		{"after a sleep, delivered", closed, nil, 5, true, changeDelivered},
		{"after a sleep, no relay (or late): sent, whatever the node holds", running, nil, 0, false, changeSend},
	} {
		if got := onChange(c.a, c.known, c.delivered, c.relayed); got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
}

// TestRelayLate: a sleeping member's stream is late once relayWait has
// passed since its relay's stream sent the newest assignment, or since the
// change when it has not sent it; never once it is delivered.
func TestRelayLate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const wait = time.Second
	for _, c := range []struct {
		what                    string
		rev, delivered, relayed int64
		relayedAt, now          time.Duration // after t0, the change
		late                    bool
		next                    time.Duration // when it will be late (-1: never)
	}{
		{"delivered", 5, 5, 5, 100 * time.Millisecond, 3 * time.Second, false, -1},
		{"a newer one delivered", 5, 6, 6, 100 * time.Millisecond, 3 * time.Second, false, -1},
		{"sent, waiting", 5, 0, 5, 300 * time.Millisecond, time.Second, false, 1300 * time.Millisecond},
		{"sent, the wait over", 5, 4, 5, 300 * time.Millisecond, 1300 * time.Millisecond, true, -1},
		{"not sent, waiting", 5, 4, 4, 100 * time.Millisecond, 500 * time.Millisecond, false, time.Second},
		{"not sent, the wait over", 5, 4, 4, 100 * time.Millisecond, time.Second, true, -1},
	} {
		late, next := relayLate(c.rev, c.delivered, c.relayed, at(c.relayedAt), t0, wait, at(c.now))
		want := time.Time{}
		if c.next >= 0 {
			want = at(c.next)
		}
		if late != c.late || !next.Equal(want) {
			t.Errorf("%s: late %v next %v, want %v %v", c.what, late, next, c.late, want)
		}
	}
}
