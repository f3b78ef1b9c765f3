package coordinator

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// testEtcd starts an embedded etcd for one test and returns its endpoints.
func testEtcd(t testing.TB) []string {
	t.Helper()
	e, err := OpenEtcd(t.Context(), EtcdConfig{DataDir: t.TempDir(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e.Endpoints
}

// testCoordinator runs a coordinator against endpoints with short timeouts
// until the test ends (or stop is called). edit adjusts the config.
func testCoordinator(t testing.TB, endpoints []string, edit func(*Config)) (c *Coordinator, stop func()) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.Etcd.Endpoints = "127.0.0.1:0", endpoints
	cfg.LeaseTTL, cfg.ElectionTTL, cfg.FailureSettle, cfg.Tick, cfg.TimesFlush = 2*time.Second, 2*time.Second, 200*time.Millisecond, 20*time.Millisecond, 50*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	if edit != nil {
		edit(cfg)
	}
	c, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("coordinator Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return c, stop
}

// client is a plaintext client of the coordinator at addr.
func client(t *testing.T, addr string) pb.CoordinatorClient { return tlsClient(t, addr, nil) }

// tlsClient is a client of the coordinator at addr over creds.
func tlsClient(t *testing.T, addr string, creds credentials.TransportCredentials) pb.CoordinatorClient {
	t.Helper()
	cc, err := pb.Dial(addr, creds, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewCoordinatorClient(cc)
}

func node(name string, gpus int32) *pb.Node {
	return &pb.Node{Name: name, Host: "127.0.0.1", Gpus: gpus, Protocol: pb.ProtocolVersion}
}

// agent registers a node and opens its Watch stream; the returned channel
// carries its assignments, and cancel drops the stream as a dying agent
// would.
// agent registers n and watches its assignments; kill makes the node
// lost, as a dead agent found by gossip is: its stream ends and its lease
// is revoked.
func agent(t *testing.T, c pb.CoordinatorClient, n *pb.Node) (<-chan *pb.Assignment, func()) {
	t.Helper()
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
	if err != nil {
		t.Fatalf("register %s: %v", n.Name, err)
	}
	ch, disconnect := watch(t, c, n.Name, resp.LeaseId, 0)
	return ch, func() {
		disconnect()
		if _, err := c.Leave(t.Context(), &pb.LeaveRequest{Node: n.Name, LeaseId: resp.LeaseId}); err != nil {
			t.Errorf("leave %s: %v", n.Name, err)
		}
	}
}

// testSessions numbers the tests' Watch streams, as an agent numbers its
// own: each higher than any before.
var testSessions atomic.Uint64

// watch opens a node's Watch stream on its lease; cancel drops the stream
// (the node is disconnected, not lost).
func watch(t *testing.T, c pb.CoordinatorClient, name string, lease, from int64) (<-chan *pb.Assignment, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := c.Watch(ctx, &pb.WatchRequest{Node: name, LeaseId: lease, FromRevision: from, Session: testSessions.Add(1)})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *pb.Assignment, 16)
	go func() {
		defer close(ch)
		// As an agent does, the node says when it runs nothing of a
		// generation below its assignment's (Stopped): this one runs no
		// ranks at all.
		var job, booted string
		var gen, bootedGen int64
		stopped := func(job string, below int64) {
			c.Report(ctx, &pb.ReportRequest{Job: job, Node: name, LeaseId: lease, Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: below}}})
		}
		for {
			a, err := stream.Recv()
			if err != nil {
				return
			}
			if !a.Renewal {
				if job != "" && a.Job != job {
					stopped(job, gen+1)
				}
				job, gen = a.Job, a.Generation.GetNumber()
				if job != "" && a.Master == "" && runsRank0(a, name) && (booted != job || bootedGen != gen) {
					// Rank 0's node reports its address once a
					// generation, opened or not, before it says it
					// stopped, as its agent does.
					booted, bootedGen = job, gen
					c.Report(ctx, &pb.ReportRequest{Job: job, Generation: gen, Node: name, LeaseId: lease,
						Kind: &pb.ReportRequest_Bootstrap{Bootstrap: &pb.Bootstrap{Master: testMaster}}})
				}
				if job != "" {
					stopped(job, gen)
				}
			}
			select {
			case ch <- a:
			case <-ctx.Done(): // the test is over, or dropped the stream
				return
			}
		}
	}()
	return ch, cancel
}

// testMaster is the address the test agents' rank 0 reports.
const testMaster = "127.0.0.1:29500"

// runsRank0 says node's member of a's generation runs rank 0.
func runsRank0(a *pb.Assignment, node string) bool {
	for _, m := range a.Generation.GetMembers() {
		if m.Node == node {
			return m.FirstRank == 0
		}
	}
	return false
}

// next waits for an assignment that satisfies ok.
func next(t *testing.T, ch <-chan *pb.Assignment, ok func(*pb.Assignment) bool) *pb.Assignment {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case a, open := <-ch:
			if !open {
				t.Fatal("watch stream ended")
			}
			if !a.Renewal && ok(a) {
				return a
			}
		case <-timeout:
			t.Fatal("no matching assignment within 10s")
		}
	}
}

// whole is the generation a's view is of, whole, as the coordinator holds
// it, after checking the view: the node itself at its place, a subset of
// the members, and their count.
func whole(t *testing.T, co *Coordinator, a *pb.Assignment) *pb.Generation {
	t.Helper()
	g, _ := co.cache.generation(a.Job)
	if g.GetNumber() != a.Generation.GetNumber() {
		t.Fatalf("job %s: the coordinator holds generation %d, the assignment %d", a.Job, g.GetNumber(), a.Generation.GetNumber())
	}
	if int(a.GroupWorld) != len(g.Members) || a.GroupRank < 0 || int(a.GroupRank) >= len(g.Members) {
		t.Fatalf("assignment of generation %d: place %d of %d, the generation has %d members", g.Number, a.GroupRank, a.GroupWorld, len(g.Members))
	}
	for _, m := range a.Generation.Members {
		if !slices.ContainsFunc(g.Members, func(w *pb.Member) bool { return proto.Equal(w, m) }) {
			t.Fatalf("the view of generation %d names %v, not a member", g.Number, m)
		}
	}
	if !slices.ContainsFunc(a.Generation.Members, func(m *pb.Member) bool { return proto.Equal(m, g.Members[a.GroupRank]) }) {
		t.Fatalf("the view of generation %d lacks its own node %s", g.Number, g.Members[a.GroupRank].Node)
	}
	return g
}

// final follows a job until it ends and returns its last state.
func final(t *testing.T, c pb.CoordinatorClient, id string) *pb.JobState {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	stream, err := c.Follow(ctx, &pb.FollowRequest{Job: id})
	if err != nil {
		t.Fatal(err)
	}
	var last *pb.JobState
	for {
		ev, err := stream.Recv()
		if err != nil {
			if last == nil {
				t.Fatalf("follow %s: %v", id, err)
			}
			return last
		}
		if ev.State != nil {
			last = ev.State
		}
	}
}

// spec is a program's job; its checkpoint directory (never read here) lets
// it restart.
func spec(id string, nodes, gpus int32) *pb.JobSpec {
	return &pb.JobSpec{Id: id, Nodes: nodes, GpusPerNode: gpus, Tp: 2, Pp: 2, Command: []string{"true"}, CheckpointDir: "/shared/ckpt"}
}

// TestAssignmentView: each node of a job whose agents hold its
// checkpoints receives its part of the generation: its place and the
// count, the node it replicates to (in the other rack), and as members
// only itself, that node, the one replicating to it and its relay (n0).
func TestAssignmentView(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	var chans []<-chan *pb.Assignment
	for i, rack := range []string{"r1", "r1", "r2", "r2"} {
		n := node(fmt.Sprintf("n%d", i), 2)
		n.FailureDomain = rack
		ch, _ := agent(t, c, n)
		chans = append(chans, ch)
	}
	s := spec("j", 4, 2)
	s.CheckpointDir, s.CheckpointReplicas = "", 2
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	// n0 and n1 (r1) replicate to n2 and n3 (r2), and back.
	want := map[int]struct{ replica, members string }{
		0: {"n2", "n0 n2"}, 1: {"n3", "n0 n1 n3"}, 2: {"n0", "n0 n2"}, 3: {"n1", "n0 n1 n3"},
	}
	for i, ch := range chans {
		a := next(t, ch, func(a *pb.Assignment) bool { return a.Job == "j" })
		g := whole(t, co, a)
		var names []string
		for _, m := range a.Generation.Members {
			names = append(names, m.Node)
		}
		if a.GroupRank != int32(i) || a.GroupWorld != 4 || fmt.Sprint(a.Replicas) != "["+want[i].replica+"]" || strings.Join(names, " ") != want[i].members {
			t.Errorf("n%d: place %d of %d, replicas %v, members %v; want %d of 4, [%s], %s", i, a.GroupRank, a.GroupWorld, a.Replicas, names, i, want[i].replica, want[i].members)
		}
		if a.Generation.World != g.World || a.Generation.Dp != g.Dp || a.Generation.Number != g.Number || a.Generation.Stopping != nil {
			t.Errorf("n%d: view %v of generation %v", i, a.Generation, g)
		}
	}
}

// TestJobLifecycle: two nodes register, a job of 2x4 ranks freezes into
// generation 1 with ranks laid out node by node, rank 0's node bootstraps,
// both get the master address, and the job succeeds when all 8 ranks
// report exit 0.
func TestJobLifecycle(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 4))
	a1, _ := agent(t, c, node("n1", 4))
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j1", 2, 4)}); err != nil {
		t.Fatal(err)
	}
	g0 := next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j1" })
	g := whole(t, co, g0)
	if g.Number != 1 || g.World != 8 || g.Dp != 2 || len(g.Members) != 2 ||
		g.Members[0].Node != "n0" || g.Members[0].FirstRank != 0 || g.Members[1].Node != "n1" || g.Members[1].FirstRank != 4 {
		t.Fatalf("generation = %v", g)
	}
	if g0.Master != "" {
		t.Fatalf("master %q before bootstrap", g0.Master)
	}
	// n0's agent reports its address (watch): both get it.
	for _, ch := range []<-chan *pb.Assignment{a0, a1} {
		next(t, ch, func(a *pb.Assignment) bool { return a.Master == testMaster })
	}
	st, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil || len(st.Nodes) != 2 || st.Nodes[0].Job != "j1" || st.Jobs[0].State.Phase != pb.JobState_RUNNING {
		t.Fatalf("status = %v, %v", st, err)
	}
	for r := range int32(8) {
		c.Report(t.Context(), &pb.ReportRequest{Job: "j1", Generation: 1, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: r}}})
	}
	if s := final(t, c, "j1"); s.Phase != pb.JobState_SUCCEEDED {
		t.Fatalf("state = %v", s)
	}
	// The nodes are free again: their assignment is empty.
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "" })
}

// TestRankFailureNamesRank: a rank's non-zero exit fails the job with that
// code, rank and node.
func TestRankFailureNamesRank(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 2))
	agent(t, c, node("n1", 2))
	s := spec("j", 2, 2)
	s.Tp = 1
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
	c.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: 1, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: 3, Code: 7, Error: "exit status 7"}}})
	st := final(t, c, "j")
	if st.Phase != pb.JobState_FAILED || st.ExitCode != 7 || st.FailedRank != 3 || st.FailedNode != "n1" || !strings.Contains(st.Reason, "rank 3 on n1 exited with code 7") {
		t.Fatalf("state = %v", st)
	}
}

// TestNodeLossNamesNodeAndRanks: a node found dead (its stream ends and
// its lease is revoked, as gossip does) is out of the pool at once, and its
// running job fails naming the node and its ranks, even when its peers'
// rank failures come first.
func TestNodeLossNamesNodeAndRanks(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 4))
	_, kill1 := agent(t, c, node("n1", 4))
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 2, 4)})
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
	// A peer on n0 fails first because n1 vanished.
	c.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: 1, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: 1, Code: 1}}})
	kill1()
	st := final(t, c, "j")
	if st.Phase != pb.JobState_FAILED || len(st.LostNodes) != 1 || st.LostNodes[0] != "n1" ||
		len(st.LostRanks) != 4 || st.LostRanks[0] != 4 || !strings.Contains(st.Reason, "node lost: n1 (ranks 4-7)") {
		t.Fatalf("state = %v", st)
	}
}

// disconnectable starts a coordinator whose leases live 30 s (longer than
// any wait of these tests), an agent n0, and registers n1 without watching:
// the caller opens and drops n1's streams on its lease.
func disconnectable(t *testing.T) (c pb.CoordinatorClient, a0 <-chan *pb.Assignment, lease int64) {
	t.Helper()
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.LeaseTTL = 30 * time.Second })
	c = client(t, co.Addr())
	a0, _ = agent(t, c, node("n0", 4))
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("n1", 4)})
	if err != nil {
		t.Fatal(err)
	}
	return c, a0, resp.LeaseId
}

// TestDisconnectedAtFailureIsLost: an agent killed with its ranks drops its
// stream, and its peers' ranks fail; the node, disconnected when the
// failure is seen, is lost at once: the job does not wait for its lease
// (30 s here, longer than final waits).
func TestDisconnectedAtFailureIsLost(t *testing.T) {
	c, a0, lease := disconnectable(t)
	_, drop := watch(t, c, "n1", lease, 0)
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 2, 4)})
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
	drop()
	waitJob(t, c, "j", func(j *pb.JobStatus) bool { return len(j.Members) == 2 && j.Members[1].State == "disconnected" })
	report(t, c, "j", 1, &pb.RankExit{Rank: 1, Code: 1})
	st := final(t, c, "j")
	if st.Phase != pb.JobState_FAILED || len(st.LostNodes) != 1 || st.LostNodes[0] != "n1" || st.FailedRank != 1 ||
		!strings.Contains(st.Reason, "node lost: n1 (ranks 4-7)") {
		t.Fatalf("state = %v", st)
	}
}

// TestReconnectKeepsPlace: a dropped stream (a proxy reset, a blip) makes
// the node disconnected, not lost: an agent that watches again on its
// lease gets its generation back and the job ends in it.
func TestReconnectKeepsPlace(t *testing.T) {
	c, a0, lease := disconnectable(t)
	a1, drop := watch(t, c, "n1", lease, 0)
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 2, 4)})
	first := next(t, a1, func(a *pb.Assignment) bool { return a.Job == "j" })
	drop()
	waitJob(t, c, "j", func(j *pb.JobStatus) bool { return len(j.Members) == 2 && j.Members[1].State == "disconnected" })
	a1, _ = watch(t, c, "n1", lease, first.Revision)
	again := next(t, a1, func(*pb.Assignment) bool { return true })
	if again.Job != "j" || again.Generation.GetNumber() != 1 || again.Revision < first.Revision {
		t.Fatalf("after reconnecting: %v, want job j generation 1 at revision >= %d", again, first.Revision)
	}
	waitJob(t, c, "j", func(j *pb.JobStatus) bool { return j.Members[1].State == "alive" })
	for r := range int32(8) {
		report(t, c, "j", 1, &pb.RankExit{Rank: r})
	}
	if st := final(t, c, "j"); st.Phase != pb.JobState_SUCCEEDED {
		t.Fatalf("state = %v", st)
	}
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "" })
}

// TestRendezvousWaitsThenTimesOut: too few nodes keep a job pending with a
// reason naming the count, until the rendezvous timeout fails it.
func TestRendezvousWaitsThenTimesOut(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 4))
	// Its stream's first message follows its conns key: the node is free
	// before the job's 500 ms start.
	next(t, a0, func(*pb.Assignment) bool { return true })
	s := spec("j", 2, 4)
	s.RendezvousTimeoutMs = 500
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	st := final(t, c, "j")
	if st.Phase != pb.JobState_FAILED || !strings.Contains(st.Reason, "rendezvous timed out after 500ms: waiting for nodes: 1 of 2 free with 4 GPUs each (1 registered)") {
		t.Fatalf("state = %v", st)
	}
}

// TestLastCallTakesMoreNodes: with max nodes above nodes, rendezvous waits
// the last call and takes the nodes that came, up to max.
func TestLastCallTakesMoreNodes(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 2))
	s := spec("j", 1, 2)
	s.Tp, s.Pp, s.MaxNodes, s.LastCallMs = 1, 1, 3, 1000
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	agent(t, c, node("n1", 2))
	g := whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" }))
	if len(g.Members) != 2 || g.World != 4 || g.Dp != 4 {
		t.Fatalf("generation = %v, want both nodes", g)
	}
}

// TestRefusals: the errors a misconfigured agent or client gets.
func TestRefusals(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	old := node("n0", 1)
	old.Protocol = pb.ProtocolVersion + 1
	if _, err := c.Register(t.Context(), &pb.RegisterRequest{Node: old}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("other protocol: err = %v", err)
	}
	for _, name := range []string{"..", ".logs", "a/b", "checkpoints", "coordinator:A"} {
		_, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node(name, 1)})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), pb.NodeNameRule) {
			t.Errorf("node name %q: err = %v, want InvalidArgument saying %q", name, err, pb.NodeNameRule)
		}
	}
	agent(t, c, node("n0", 1))
	if _, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("n0", 1)}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("name in use: err = %v", err)
	}
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 1, 1)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("tp 2 on 1 GPU: err = %v", err)
	}
	ok := spec("j", 1, 4)
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: ok}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: ok}); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), `job "j" already exists`) {
		t.Errorf("second job j: err = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Listen = "0.0.0.0:7070" }, "give --token-file"},
		{func(c *Config) { c.TLS.Cert = "c.pem" }, "go together"},
		{func(c *Config) { c.TLSCAKey = "k.pem" }, "--tls-ca-key goes with"},
		{func(c *Config) { c.LeaseTTL = 1500 * time.Millisecond }, "lease TTL"},
		{func(c *Config) { c.Prefix = "gpucoord" }, "etcd prefix"},
		{func(c *Config) { c.Listen = "nowhere" }, "listen address"},
	}
	for _, tc := range tests {
		c := DefaultConfig()
		tc.edit(c)
		if err := c.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want %q", err, tc.want)
		}
	}
	c := DefaultConfig()
	c.Listen, c.TokenFile = "0.0.0.0:7070", "token"
	if err := c.Validate(); err != nil {
		t.Errorf("with a token file: %v", err)
	}
}

// TestBadEnvironment: a port in use and an unreachable etcd are one-line
// errors from New, with nothing left running.
func TestBadEnvironment(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := DefaultConfig()
	cfg.Listen, cfg.Etcd.DataDir = ln.Addr().String(), t.TempDir()
	if _, err := New(t.Context(), cfg); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("port in use: err = %v", err)
	}
	cfg = DefaultConfig()
	cfg.Listen, cfg.Etcd.Endpoints, cfg.Etcd.DialTimeout = "127.0.0.1:0", []string{"http://127.0.0.1:1"}, 500*time.Millisecond
	start := time.Now()
	if _, err := New(t.Context(), cfg); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "etcd at http://127.0.0.1:1 did not answer within 500ms") {
		t.Errorf("unreachable etcd: err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("unreachable etcd took %s to report", d)
	}
}

// TestStandbyTakesOver: two coordinators share one etcd; when the leader
// stops, the standby is elected and finishes the job the first froze.
func TestStandbyTakesOver(t *testing.T) {
	eps := testEtcd(t)
	coA, stopA := testCoordinator(t, eps, func(c *Config) { c.Name = "A" })
	ca := client(t, coA.Addr())
	waitLeader(t, ca, "A")
	coB, _ := testCoordinator(t, eps, func(c *Config) { c.Name = "B" })
	cb := client(t, coB.Addr())
	a0, _ := agent(t, cb, node("n0", 2))
	c := spec("j", 1, 2)
	c.Tp = 1
	if _, err := cb.Submit(t.Context(), &pb.SubmitRequest{Spec: c}); err != nil {
		t.Fatal(err)
	}
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
	stopA()
	waitLeader(t, cb, "B")
	for r := range int32(2) {
		cb.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: 1, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: r}}})
	}
	if s := final(t, cb, "j"); s.Phase != pb.JobState_SUCCEEDED {
		t.Fatalf("state = %v", s)
	}
}

func waitLeader(t *testing.T, c pb.CoordinatorClient, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := c.Status(t.Context(), &pb.StatusRequest{}); err == nil && st.Leader == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not become leader within 10s", want)
}

// TestMetricsAndSecrets: /metrics reports the pool, the leader, a job's
// generation and the lease renewals; the join token shows in no metric,
// status or log line.
func TestMetricsAndSecrets(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	tokenFile := filepath.Join(t.TempDir(), "token")
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) {
		c.TokenFile, c.Metrics = tokenFile, "127.0.0.1:0"
		c.Logger = slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(b)
		}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	tok := readToken(t, tokenFile)
	c := tlsClient(t, co.Addr(), joined(t, co.Addr(), tok, pki.RoleClient, "me"))
	a0, _ := agent(t, tlsClient(t, co.Addr(), joined(t, co.Addr(), tok, pki.RoleNode, "n0")), node("n0", 2))
	s := spec("j", 1, 2)
	s.Tp = 1
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
	want := []string{"gpucoord_nodes 1", "gpucoord_nodes_busy 1", "gpucoord_leader 1", `gpucoord_job_generation{job_id="j"} 1`,
		`gpucoord_jobs{phase="running"} 1`, "gpucoord_lease_renewal_interval_seconds_count", `gpucoord_etcd_requests_total{method="Txn"}`,
		"gpucoord_relayed_assignments_total 0", "gpucoord_relay_fallbacks_total 0",
		"# TYPE gpucoord_job_restarts_total counter", `gpucoord_job_restarts_total{job_id="j"} 0`, "go_goroutines", "process_resident_memory_bytes"}
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + co.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
			}
		}
		// Renewals happen every third of the 2s TTL.
		if missing == "" && !strings.Contains(body, "gpucoord_lease_renewal_interval_seconds_count 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %q:\n%s", missing, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A job's own series end with it; the phase count keeps it.
	if _, err := c.Cancel(t.Context(), &pb.CancelRequest{Job: "j", Reason: "done"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + co.MetricsAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `job_id="j"`) && strings.Contains(string(b), `gpucoord_jobs{phase="cancelled"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the job ended, its series stay or it is not counted cancelled:\n%s", b)
		}
	}
	st, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(co.srv.gossip.Keys) != 1 || len(co.srv.gossip.Keys[0]) != 32 {
		t.Fatalf("gossip keys %d, want one of 32 bytes", len(co.srv.gossip.Keys))
	}
	key := hex.EncodeToString(co.srv.gossip.Keys[0])
	for what, text := range map[string]string{"metrics": body, "status": st.String(), "logs": logs.String()} {
		if strings.Contains(text, tok.Secret) {
			t.Errorf("the token's secret shows in the %s", what)
		}
		if strings.Contains(text, key) || strings.Contains(text, string(co.srv.gossip.Keys[0])) {
			t.Errorf("the gossip key shows in the %s", what)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// report sends one report of generation gen.
func report(t *testing.T, c pb.CoordinatorClient, job string, gen int64, kind any) {
	t.Helper()
	r := &pb.ReportRequest{Job: job, Generation: gen}
	switch k := kind.(type) {
	case *pb.Step:
		r.Kind = &pb.ReportRequest_Step{Step: k}
	case *pb.RankExit:
		r.Kind = &pb.ReportRequest_Exit{Exit: k}
	}
	if _, err := c.Report(t.Context(), r); err != nil {
		t.Fatal(err)
	}
}

// stored reports that each node stored step of generation gen (a shared
// directory: no holders), and checks that the last report commits it.
func stored(t *testing.T, c pb.CoordinatorClient, job string, gen, step int64, nodes ...string) {
	t.Helper()
	for i, n := range nodes {
		resp, err := c.Report(t.Context(), &pb.ReportRequest{Job: job, Generation: gen, Node: n,
			Kind: &pb.ReportRequest_Stored{Stored: &pb.Stored{Steps: []*pb.StoredStep{{Step: step}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if i == len(nodes)-1 && len(nodes) > 1 && resp.Committed != step {
			t.Errorf("step %d stored by %v: committed %d", step, nodes, resp.Committed)
		}
	}
}

// TestRelayedReports: n0, the relay of a three-node job's block, forwards
// n1's and n2's Stored reports and n2's times in one call; with n0's own
// report the step is committed. A report of another generation, of
// another kind than Stored, Times and Stopped, or a Stopped of another
// generation than the relay's, is refused alone, and n1 relays nothing.
func TestRelayedReports(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	var chans []<-chan *pb.Assignment
	for i := range 3 {
		ch, _ := agent(t, c, node(fmt.Sprintf("n%d", i), 2))
		chans = append(chans, ch)
	}
	s := spec("j", 3, 2)
	s.Tp, s.Pp = 1, 1
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		a := next(t, ch, func(a *pb.Assignment) bool { return a.Job == "j" })
		if want := map[bool]string{true: "", false: "n0"}[i == 0]; a.Relay != want {
			t.Errorf("n%d's relay %q, want %q", i, a.Relay, want)
		}
	}
	storedBy := func(node string, gen int64) *pb.ReportRequest {
		return &pb.ReportRequest{Job: "j", Generation: gen, Node: node, Kind: &pb.ReportRequest_Stored{Stored: &pb.Stored{Steps: []*pb.StoredStep{{Step: 5}}}}}
	}
	relayed := func(relay string, reports ...*pb.ReportRequest) *pb.ReportResponse {
		t.Helper()
		resp, err := c.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: 1, Node: relay, Kind: &pb.ReportRequest_Relayed{Relayed: &pb.Relayed{Reports: reports}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Relayed) != len(reports) {
			t.Fatalf("%d answers to %d reports", len(resp.Relayed), len(reports))
		}
		return resp
	}
	times := &pb.ReportRequest{Job: "j", Generation: 1, Node: "n2", Kind: &pb.ReportRequest_Times{Times: pb.NewRankTimes(&pb.RankTime{Rank: 4, ComputeSeconds: 0.5, Steps: 1})}}
	exit := &pb.ReportRequest{Job: "j", Generation: 1, Node: "n1", Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: 2, Code: 1}}}
	stoppedBy := func(node string, below int64) *pb.ReportRequest {
		return &pb.ReportRequest{Job: "j", Generation: 1, Node: node, Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: below}}}
	}
	resp := relayed("n0", storedBy("n1", 1), times, storedBy("n2", 1), storedBy("n2", 2), exit, stoppedBy("n2", 1), stoppedBy("n1", 2))
	want := []codes.Code{codes.OK, codes.OK, codes.OK, codes.InvalidArgument, codes.InvalidArgument, codes.OK, codes.InvalidArgument}
	for i, a := range resp.Relayed {
		if codes.Code(a.Code) != want[i] {
			t.Errorf("relayed report %d: %s %q, want %s", i, codes.Code(a.Code), a.Error, want[i])
		}
	}
	if resp := relayed("n1", storedBy("n2", 1), stoppedBy("n2", 1)); codes.Code(resp.Relayed[0].Code) != codes.PermissionDenied || codes.Code(resp.Relayed[1].Code) != codes.PermissionDenied {
		t.Errorf("n1 relaying n2's reports: %v, want PermissionDenied", resp.Relayed)
	}
	if co.cache.committed("j") != 0 {
		t.Fatal("committed before n0 stored")
	}
	// The answer to n0's report says the commit it made (the cache, read
	// at once, may not have the write yet).
	resp, err := c.Report(t.Context(), storedBy("n0", 1))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Committed != 5 {
		t.Errorf("committed %d after every node stored step 5, want 5", resp.Committed)
	}
}

// TestRecoveryGenerations walks the elastic state machine: a node lost
// with restarts left makes generation 2 on the live node, resuming after
// the last committed step (not the last reported one); a rank failure
// makes generation 3 on the same node; a node that registers joins at a
// step boundary once it has been registered for StableFor (generation 4,
// dp back to 2); with no restarts left, the next loss fails the job.
func TestRecoveryGenerations(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.StableFor = 300 * time.Millisecond })
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 4))
	_, kill1 := agent(t, c, node("n1", 4))
	s := spec("j", 2, 4)
	s.MinNodes, s.MaxRestarts = 1, 3
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 1 })
	report(t, c, "j", 1, &pb.Step{Step: 1})
	stored(t, c, "j", 1, 1, "n0", "n1")
	report(t, c, "j", 1, &pb.Step{Step: 2})
	stored(t, c, "j", 1, 2, "n1", "n0")
	report(t, c, "j", 1, &pb.Step{Step: 3})
	stored(t, c, "j", 1, 3, "n0") // not committed: n1 has not stored it
	kill1()
	g := whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 }))
	if len(g.Members) != 1 || g.Members[0].Node != "n0" || g.World != 4 || g.Dp != 1 || g.ResumeStep != 2 || g.Reason != "node lost: n1 (ranks 4-7)" {
		t.Fatalf("generation 2 = %v", g)
	}
	// A rank of generation 1 reporting late changes nothing; one of
	// generation 2 failing makes generation 3.
	report(t, c, "j", 1, &pb.RankExit{Rank: 0, Code: 1})
	report(t, c, "j", 2, &pb.Step{Step: 3})
	stored(t, c, "j", 2, 3, "n0")
	report(t, c, "j", 2, &pb.RankExit{Rank: 2, Code: 9})
	g = whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 3 }))
	if len(g.Members) != 1 || g.ResumeStep != 3 || !strings.Contains(g.Reason, "rank 2 on n0 exited with code 9") {
		t.Fatalf("generation 3 = %v", g)
	}
	registered := time.Now()
	agent(t, c, node("n2", 4))
	report(t, c, "j", 3, &pb.Step{Step: 4})
	stored(t, c, "j", 3, 4, "n0")
	g = whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 4 }))
	if d := time.Since(registered); d < 300*time.Millisecond {
		t.Errorf("n2 admitted %s after it registered, before StableFor", d)
	}
	if len(g.Members) != 2 || g.Members[1].Node != "n2" || g.Dp != 2 || g.ResumeStep != 4 || g.Reason != "nodes joined: n2" {
		t.Fatalf("generation 4 = %v", g)
	}
	// Three restarts used: the next failure ends the job.
	report(t, c, "j", 4, &pb.RankExit{Rank: 5, Code: 3})
	st := final(t, c, "j")
	if st.Phase != pb.JobState_FAILED || st.ExitCode != 3 || st.FailedNode != "n2" {
		t.Fatalf("state = %v", st)
	}
}

// TestPauseBelowMinNodes: a loss that leaves fewer nodes than min_nodes
// pauses the job (its nodes are told to run nothing) with the reason; a
// new node brings it back as the next generation; without one, the pause
// ends in failure after the rendezvous timeout.
func TestPauseBelowMinNodes(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.StableFor = 100 * time.Millisecond })
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 4))
	_, kill1 := agent(t, c, node("n1", 4))
	s := spec("j", 2, 4)
	s.MaxRestarts = 3 // min_nodes 0 means nodes: 2
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
	kill1()
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "" })
	st, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil || st.Jobs[0].State.Phase != pb.JobState_PENDING ||
		st.Jobs[0].State.Reason != "paused after generation 1: node lost: n1 (ranks 4-7); waiting for nodes: 1 live of at least 2" {
		t.Fatalf("status = %v, %v", st, err)
	}
	if m := st.Jobs[0].Members; len(m) != 2 || m[0].Node != "n0" || m[0].State != "alive" || m[1].Node != "n1" || m[1].State != "lost" || m[1].FirstRank != 4 {
		t.Errorf("members = %v, want n0 alive and n1 lost", m)
	}
	agent(t, c, node("n2", 4))
	g := whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 }))
	if len(g.Members) != 2 || g.Members[0].Node != "n0" || g.Members[1].Node != "n2" || g.Reason != "resumed on 2 nodes after a pause" {
		t.Fatalf("generation 2 = %v", g)
	}

	s2 := spec("k", 2, 4)
	s2.MaxRestarts, s2.RendezvousTimeoutMs = 3, 500
	_, kill3 := agent(t, c, node("n3", 4))
	agent(t, c, node("n4", 4))
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s2})
	waitJob(t, c, "k", func(j *pb.JobStatus) bool { return j.State.GetPhase() == pb.JobState_RUNNING })
	kill3()
	if st := final(t, c, "k"); st.Phase != pb.JobState_FAILED || !strings.Contains(st.Reason, "paused for 500ms without enough nodes") {
		t.Fatalf("state of k = %v", st)
	}
}

// TestShrinkKeepsGlobalBatch: after a loss the leader takes the most live
// nodes whose DP degree divides the global batch into whole micro-batches:
// 3 live nodes of 2 ranks give dp 3, which does not divide 16/2 = 8, so the
// new generation runs on 2 nodes (dp 2).
func TestShrinkKeepsGlobalBatch(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 2))
	agent(t, c, node("n1", 2))
	agent(t, c, node("n2", 2))
	_, kill3 := agent(t, c, node("n3", 2))
	s := spec("j", 4, 2)
	s.Tp, s.Pp, s.MinNodes, s.MaxRestarts, s.GlobalBatch, s.MicroBatch = 2, 1, 1, 1, 16, 2
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 1 })
	kill3()
	g := whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 }))
	if len(g.Members) != 2 || g.Dp != 2 {
		t.Fatalf("generation 2 = %v, want 2 nodes at dp 2", g)
	}
}

// TestStragglers: a rank whose compute time stayed above twice the median
// in each of its last three windows is a straggler, named with its node and
// GPU in status; with evict_stragglers its node is dropped and the job
// goes on without it. Two slow windows out of three are not enough.
func TestStragglers(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.Metrics = "127.0.0.1:0" })
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 2))
	agent(t, c, node("n1", 2))
	s := spec("j", 2, 2)
	s.Tp, s.Pp, s.MinNodes, s.MaxRestarts = 1, 1, 1, 2
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
	next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 1 })
	window := func(job string, slow float64) {
		for _, n := range []struct {
			node  string
			ranks []*pb.RankTime
		}{
			{"n0", []*pb.RankTime{{Rank: 0, ComputeSeconds: 0.010, Steps: 20}, {Rank: 1, ComputeSeconds: 0.011, Steps: 20}}},
			{"n1", []*pb.RankTime{{Rank: 2, ComputeSeconds: 0.010, Steps: 20}, {Rank: 3, ComputeSeconds: slow, Steps: 20}}},
		} {
			if _, err := c.Report(t.Context(), &pb.ReportRequest{Job: job, Generation: 1, Node: n.node,
				Kind: &pb.ReportRequest_Times{Times: pb.NewRankTimes(n.ranks...)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, slow := range []float64{0.05, 0.05, 0.011, 0.05, 0.05} {
		window("j", slow)
	}
	// The leader acts on etcd's changes in order: once it has answered a
	// job submitted after these reports, it has weighed them.
	probe := spec("probe", 9, 1)
	probe.Tp, probe.Pp = 1, 1
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: probe}); err != nil {
		t.Fatal(err)
	}
	waitJob(t, c, "probe", func(j *pb.JobStatus) bool { return strings.Contains(j.State.GetReason(), "waiting for nodes") })
	st, _ := c.Status(t.Context(), &pb.StatusRequest{})
	if len(st.Jobs[0].Stragglers) != 0 {
		t.Fatalf("stragglers %v with a normal window among the last three", st.Jobs[0].Stragglers)
	}
	window("j", 0.05) // now slow in each of the last three
	sts := waitJob(t, c, "j", func(j *pb.JobStatus) bool { return len(j.Stragglers) > 0 }).Stragglers
	if len(sts) != 1 || sts[0].Rank != 3 || sts[0].Node != "n1" || sts[0].LocalRank != 1 || sts[0].Ratio != 4.76 {
		t.Fatalf("stragglers = %v, want rank 3 on n1 (GPU 1) at 4.76x the median", sts)
	}
	resp, err := http.Get("http://" + co.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `gpucoord_job_straggler_ratio{gpu="1",job_id="j",node="n1",rank="3"} 4.76`; !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %q", want)
	}

	// With eviction the straggler's node leaves the job.
	e := spec("e", 2, 2)
	e.Tp, e.Pp, e.MinNodes, e.MaxRestarts, e.EvictStragglers = 1, 1, 1, 2, true
	b0, _ := agent(t, c, node("n2", 2))
	agent(t, c, node("n3", 2))
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: e})
	next(t, b0, func(a *pb.Assignment) bool { return a.Job == "e" && a.Generation.GetNumber() == 1 })
	for range 3 {
		for _, n := range []struct {
			node  string
			ranks []*pb.RankTime
		}{
			{"n2", []*pb.RankTime{{Rank: 0, ComputeSeconds: 0.010}, {Rank: 1, ComputeSeconds: 0.011}}},
			{"n3", []*pb.RankTime{{Rank: 2, ComputeSeconds: 0.010}, {Rank: 3, ComputeSeconds: 0.05}}},
		} {
			c.Report(t.Context(), &pb.ReportRequest{Job: "e", Generation: 1, Node: n.node, Kind: &pb.ReportRequest_Times{Times: pb.NewRankTimes(n.ranks...)}})
		}
	}
	g := whole(t, co, next(t, b0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 }))
	if len(g.Members) != 1 || g.Members[0].Node != "n2" || g.Reason != "stragglers evicted: n3" {
		t.Fatalf("generation 2 of e = %v", g)
	}
}

// waitJob polls status until job id satisfies ok, and returns it.
func waitJob(t *testing.T, c pb.CoordinatorClient, id string, ok func(*pb.JobStatus) bool) *pb.JobStatus {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := c.Status(t.Context(), &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range st.Jobs {
			if j.Spec.Id == id && ok(j) {
				return j
			}
		}
	}
	t.Fatalf("job %s did not get there within 10s", id)
	return nil
}

// TestFollowCompacted: a Follow resumed from a revision etcd has compacted
// away is OutOfRange (launch then follows from now), not a hang.
func TestFollowCompacted(t *testing.T) {
	eps := testEtcd(t)
	co, _ := testCoordinator(t, eps, nil)
	c := client(t, co.Addr())
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 9, 4)}); err != nil {
		t.Fatal(err)
	}
	e, err := OpenEtcd(t.Context(), EtcdConfig{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	resp, err := e.Client.Put(t.Context(), "/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(t.Context(), resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	stream, err := c.Follow(t.Context(), &pb.FollowRequest{Job: "j", FromRevision: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.OutOfRange {
		t.Errorf("follow from a compacted revision: err = %v, want OutOfRange", err)
	}
}

// TestEndedJobsForgotten: beyond KeepJobs ended jobs, the oldest leave
// etcd; running ones stay.
func TestEndedJobsForgotten(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.KeepJobs = 1 })
	c := client(t, co.Addr())
	for _, id := range []string{"a", "b"} {
		s := spec(id, 9, 4)
		s.RendezvousTimeoutMs = 1
		c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
		final(t, c, id)
	}
	c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("c", 9, 4)}) // pending: kept
	waitJob(t, c, "c", func(j *pb.JobStatus) bool { return strings.Contains(j.State.GetReason(), "waiting for nodes") })
	st, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range st.Jobs {
		ids = append(ids, j.Spec.Id)
	}
	if strings.Join(ids, ",") != "b,c" {
		t.Errorf("jobs %v, want b (the newest ended) and c (pending)", ids)
	}
}

// TestResumeBackup: a job submitted with an earlier run's backup step (a
// requeued Slurm job) starts from it: generation 1 resumes after that
// step, from the backup tier; a generation after a failure before any new
// commit resumes from it again. A spec naming a backup step without a
// backup tier is refused.
func TestResumeBackup(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	a0, _ := agent(t, c, node("n0", 2))
	bad := spec("bad", 1, 2)
	bad.ResumeBackup = &pb.Step{Step: 40, Generation: 3, Dp: 2}
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: bad}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a backup step without a backup tier: %v", err)
	}
	s := spec("j", 1, 2)
	s.Tp, s.Pp, s.CheckpointDir, s.CheckpointReplicas = 1, 1, "", 1
	s.CheckpointBackup, s.BackupEvery, s.MaxRestarts = "/shared/backup", 10, 2
	s.ResumeBackup = &pb.Step{Step: 40, Generation: 3, Dp: 2}
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	g := whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 1 }))
	if g.ResumeStep != 40 || !g.FromBackup || g.Reason != "an earlier run's step 40, from the backup tier" {
		t.Fatalf("generation 1 = %v", g)
	}
	report(t, c, "j", 1, &pb.RankExit{Rank: 1, Code: 3})
	g = whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 }))
	if g.ResumeStep != 40 || !g.FromBackup {
		t.Fatalf("generation 2 = %v", g)
	}
}
