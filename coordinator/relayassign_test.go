package coordinator

import (
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
	// n1's stream never sends the opening its relay delivered: its next
	// assignment is the job's end.
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

// TestRelayWaitLeft: a member's stream waits for a delivery until
// relayWait has passed since its relay's stream sent the assignment, not
// since the member's stream saw it; with none sent, not at all.
func TestRelayWaitLeft(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		offered int64 // the revision sent through the relay at t0 (0: none)
		rev     int64
		now     time.Duration // after t0
		want    time.Duration
	}{
		{0, 5, 0, 0},
		{4, 5, 0, 0},
		{5, 5, 300 * time.Millisecond, 700 * time.Millisecond},
		{6, 5, 300 * time.Millisecond, 700 * time.Millisecond},
		{5, 5, 1200 * time.Millisecond, -200 * time.Millisecond},
	} {
		g := &grant{}
		if c.offered > 0 {
			g.offered(c.offered, t0)
		}
		if got := g.relayWaitLeft(c.rev, time.Second, t0.Add(c.now)); got != c.want {
			t.Errorf("revision %d sent through the relay at t0, %d waited for at t0+%s: %s left, want %s", c.offered, c.rev, c.now, got, c.want)
		}
	}
}

// TestOnChange: what a member's stream does with a changed assignment.
func TestOnChange(t *testing.T) {
	g1, g2 := &pb.Generation{Number: 1}, &pb.Generation{Number: 2}
	none := &pb.Assignment{Revision: 3}
	closed := &pb.Assignment{Job: "j", Generation: g2, Revision: 5}
	opened := &pb.Assignment{Job: "j", Generation: g2, Open: true, Revision: 6}
	noneAgain := &pb.Assignment{Revision: 7}
	running := &pb.Assignment{Job: "j", Generation: g1, Open: true, Revision: 4}
	for _, c := range []struct {
		what             string
		a, last, pending *pb.Assignment
		delivered        int64
		relayed          bool
		want             change
	}{
		{"the same as sent", running, running, nil, 0, true, changeNone},
		{"the same as left to the relay", opened, running, opened, 0, true, changeNone},
		{"new, through the relay", closed, running, nil, 0, true, changeToRelay},
		{"new, a newer one than left to the relay", opened, running, closed, 0, true, changeToRelay},
		{"new, delivered already", closed, running, nil, 5, true, changeDelivered},
		{"new, an older one delivered", opened, running, closed, 5, true, changeToRelay},
		{"new, no relay", closed, running, nil, 0, false, changeSend},
		{"back to the one sent while another is left to the relay", noneAgain, none, closed, 0, true, changeToRelay},
		{"back to the one sent, no relay now", noneAgain, none, closed, 0, false, changeSend},
	} {
		if got := onChange(c.a, c.last, c.pending, c.delivered, c.relayed); got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
}
