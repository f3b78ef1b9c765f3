package coordinator

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/gossip"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// poolNode is a registered node of the tests below: name@domain, its
// run's instance "i-name", a gossip address.
func poolNode(name, domain string) *pb.Node {
	return &pb.Node{Name: name, Host: "10.0.0.1", Gpus: 1, FailureDomain: domain, Instance: "i-" + name, GossipAddr: "10.0.0.1:7946", Protocol: pb.ProtocolVersion}
}

// poolServer is a server whose cache holds nodes as registered (each with
// lease 100+i), and the channel its deaths to act on go to.
func poolServer(t *testing.T, nodes ...*pb.Node) (*server, <-chan deathKey) {
	t.Helper()
	k := keys("/t/")
	c := newCache(nil, k, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var kvs []*mvccpb.KeyValue
	for i, n := range nodes {
		kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(k.node(n.Name)), Value: []byte(encode(n)), CreateRevision: int64(i + 1), ModRevision: int64(i + 1), Lease: int64(100 + i)})
	}
	c.reset(int64(len(kvs)), kvs)
	dead := make(chan deathKey, 16)
	return &server{cache: c, deaths: newDeathReports(), dead: dead, log: slog.New(slog.NewTextHandler(t.Output(), nil))}, dead
}

// TestPoolDeathRules: what a coordinator makes of the deaths the members
// of a domain's pool report. A death counts only for a node registered,
// as the run named, in the reporter's failure domain by the coordinator's
// records; it is acted on once, when two members have reported it (one in
// a pool of two), however many report it.
func TestPoolDeathRules(t *testing.T) {
	type report struct{ by, member string }
	rack := func(names ...string) []*pb.Node {
		var out []*pb.Node
		for _, n := range names {
			out = append(out, poolNode(n, "rack1"))
		}
		return out
	}
	tests := []struct {
		name    string
		nodes   []*pb.Node
		reports []report
		want    []deathVerdict // each report's
		acted   []string       // the members handed to revokeDead, in order
	}{
		{name: "same domain, pool of two: one report is enough", nodes: rack("a", "b"),
			reports: []report{{"a", "b#i-b"}}, want: []deathVerdict{deathCounted}, acted: []string{"b#i-b"}},
		{name: "other domain refused", nodes: append(rack("a", "b", "c"), poolNode("x", "rack2")),
			reports: []report{{"x", "b#i-b"}, {"a", "x#i-x"}, {"b", "x#i-x"}}, want: []deathVerdict{deathForeign, deathForeign, deathForeign}},
		{name: "unknown node", nodes: rack("a", "b"),
			reports: []report{{"a", "gone#i-gone"}}, want: []deathVerdict{deathUnknown}},
		{name: "earlier instance left alone", nodes: rack("a", "b"),
			reports: []report{{"a", "b#earlier"}}, want: []deathVerdict{deathEarlier}},
		{name: "the reporter itself", nodes: rack("a", "b"),
			reports: []report{{"a", "a#i-a"}}, want: []deathVerdict{deathSelf}},
		{name: "pool of three: one member cut off cannot take the others out", nodes: rack("a", "b", "c"),
			reports: []report{{"a", "b#i-b"}, {"a", "c#i-c"}, {"a", "b#i-b"}}, want: []deathVerdict{deathCounted, deathCounted, deathCounted}},
		{name: "pool of three: the second reporter acts, once", nodes: rack("a", "b", "c", "d"),
			reports: []report{{"a", "d#i-d"}, {"b", "d#i-d"}, {"c", "d#i-d"}, {"b", "d#i-d"}},
			want:    []deathVerdict{deathCounted, deathCounted, deathCounted, deathCounted}, acted: []string{"d#i-d"}},
		{name: "nodes naming no domain share one pool", nodes: []*pb.Node{poolNode("a", ""), poolNode("b", "")},
			reports: []report{{"a", "b#i-b"}}, want: []deathVerdict{deathCounted}, acted: []string{"b#i-b"}},
		{name: "the NVLink domain where no failure domain is named", nodes: []*pb.Node{{Name: "a", NvlinkDomain: "nvl0", Instance: "i-a", GossipAddr: "h:1"},
			{Name: "b", NvlinkDomain: "nvl0", Instance: "i-b", GossipAddr: "h:2"}, {Name: "c", Instance: "i-c", GossipAddr: "h:3"}},
			reports: []report{{"c", "b#i-b"}, {"a", "b#i-b"}}, want: []deathVerdict{deathForeign, deathCounted}, acted: []string{"b#i-b"}},
		{name: "a node in no pool does not count toward the quorum", nodes: append(rack("a", "b"), &pb.Node{Name: "c", FailureDomain: "rack1", Instance: "i-c"}),
			reports: []report{{"a", "b#i-b"}}, want: []deathVerdict{deathCounted}, acted: []string{"b#i-b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, dead := poolServer(t, tc.nodes...)
			now := time.UnixMilli(1_700_000_000_000)
			for i, r := range tc.reports {
				e, ok := s.cache.registered(r.by)
				if !ok {
					t.Fatalf("reporter %s not registered", r.by)
				}
				got := s.poolDeaths(e.node, []string{r.member}, now.Add(time.Duration(i)*time.Millisecond))
				if got[0] != tc.want[i] {
					t.Errorf("report %d (%s: %s dead) = %v, want %v", i, r.by, r.member, got[0], tc.want[i])
				}
			}
			var acted []string
			for len(dead) > 0 {
				acted = append(acted, (<-dead).member)
			}
			if !slices.Equal(acted, tc.acted) {
				t.Errorf("acted on %v, want %v", acted, tc.acted)
			}
		})
	}
}

// TestDeathReportsWindow: reports of one death gathered more than
// deathWindow apart do not add up; a death acted on whose revocation
// failed is acted on again at its next report; a run registered again (a
// new lease) is another death.
func TestDeathReportsWindow(t *testing.T) {
	d := newDeathReports()
	now := time.UnixMilli(1_700_000_000_000)
	k := deathKey{member: "b#1", lease: 7}
	if d.add(k, "a", 2, now) {
		t.Fatal("acted on one report of two")
	}
	if d.add(k, "c", 2, now.Add(deathWindow+time.Second)) {
		t.Fatal("acted on two reports a window apart")
	}
	if !d.add(k, "a", 2, now.Add(deathWindow+2*time.Second)) {
		t.Fatal("two reports within the window: not acted on")
	}
	if d.add(k, "e", 2, now.Add(deathWindow+3*time.Second)) {
		t.Fatal("acted twice")
	}
	d.retry(k)
	if !d.add(k, "e", 2, now.Add(deathWindow+4*time.Second)) {
		t.Fatal("not acted on again after a failed revocation")
	}
	if d.add(deathKey{member: "b#1", lease: 8}, "a", 2, now.Add(deathWindow+5*time.Second)) {
		t.Fatal("a new registration's death acted on with the reports of the one before")
	}
}

// TestPoolReport: through the service, with etcd. Registration hands a
// node members of its own domain's pool as seeds, under its domain's
// label; a death reported from another domain, or of an earlier run, is
// left alone; a death reported by two of its pool's members removes the
// node; a stranger to the pool (no lease of its own) reports nothing.
func TestPoolReport(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	lease := map[string]int64{}
	register := func(name, domain string, port int) *pb.Gossip {
		t.Helper()
		n := node(name, 1)
		n.FailureDomain, n.Instance, n.GossipAddr = domain, "run1", fmt.Sprintf("127.0.0.1:%d", port)
		resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
		if err != nil {
			t.Fatal(err)
		}
		lease[name] = resp.LeaseId
		assignments, _ := watch(t, c, name, resp.LeaseId, 0) // keeps the lease alive
		go func() {
			for range assignments {
			}
		}()
		// The next registration's seeds come from the cache.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, ok := co.cache.registered(name); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not in the cache after 10s", name)
			}
		}
		return resp.Gossip
	}
	ga := register("a", "rack1", 7001)
	gb := register("b", "rack1", 7002)
	gc := register("c", "rack1", 7003)
	gx := register("x", "rack2", 7004)
	if len(ga.Seeds) != 0 {
		t.Errorf("the domain's first node was given seeds %v", ga.Seeds)
	}
	if !slices.Equal(gb.Seeds, []string{"127.0.0.1:7001"}) {
		t.Errorf("b's seeds %v, want a's address", gb.Seeds)
	}
	if slices.Sort(gc.Seeds); !slices.Equal(gc.Seeds, []string{"127.0.0.1:7001", "127.0.0.1:7002"}) {
		t.Errorf("c's seeds %v, want a's and b's", gc.Seeds)
	}
	if len(gx.Seeds) != 0 || gx.Label == ga.Label || ga.Label != gossip.DomainLabel(co.srv.gossip.Label, "rack1") {
		t.Errorf("rack2's first node: seeds %v, label %q (rack1's %q)", gx.Seeds, gx.Label, ga.Label)
	}
	registered := func(name string) bool {
		_, ok := co.cache.registered(name)
		resp, err := co.etcd.Client.Get(t.Context(), keys(co.cfg.Prefix).node(name))
		if err != nil {
			t.Fatal(err)
		}
		return ok || len(resp.Kvs) == 1
	}
	report := func(by string, dead ...string) *pb.PoolReportResponse {
		t.Helper()
		resp, err := c.PoolReport(t.Context(), &pb.PoolReportRequest{Node: by, LeaseId: lease[by], Dead: dead})
		if err != nil {
			t.Fatalf("%s's report: %v", by, err)
		}
		return resp
	}
	if _, err := c.PoolReport(t.Context(), &pb.PoolReportRequest{Node: "a", LeaseId: lease["b"], Dead: []string{"c#run1"}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a report with another node's lease: %v, want PermissionDenied", err)
	}
	report("x", "c#run1")
	report("a", "c#run0")
	report("b", "c#run0")
	if resp := report("a", "c#run1"); len(resp.Seeds) != 2 {
		t.Errorf("a's report answered with seeds %v, want b's and c's", resp.Seeds)
	}
	time.Sleep(500 * time.Millisecond)
	if !registered("c") {
		t.Fatal("c removed by one report of three members, one from another domain, or of an earlier run")
	}
	report("b", "c#run1")
	for deadline := time.Now().Add(10 * time.Second); registered("c"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("c still registered 10s after two members of its pool reported it dead")
		}
	}
	for _, n := range []string{"a", "b", "x"} {
		if !registered(n) {
			t.Errorf("%s lost", n)
		}
	}
}
