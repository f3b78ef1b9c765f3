package worker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

// fakeCoordinator records the reports it is sent and answers each
// relayed one as taken, with committed step 7, but those of node "bad",
// refused.
type fakeCoordinator struct {
	pb.CoordinatorClient
	mu    sync.Mutex
	calls []*pb.ReportRequest
}

func (f *fakeCoordinator) Report(_ context.Context, r *pb.ReportRequest, _ ...grpc.CallOption) (*pb.ReportResponse, error) {
	f.mu.Lock()
	f.calls = append(f.calls, r)
	f.mu.Unlock()
	resp := &pb.ReportResponse{Committed: 7}
	for _, x := range r.GetRelayed().GetReports() {
		a := &pb.RelayedAnswer{Committed: 7}
		if x.Node == "bad" {
			a.Code, a.Error = int32(codes.PermissionDenied), "not yours"
		}
		resp.Relayed = append(resp.Relayed, a)
	}
	return resp, nil
}

func (f *fakeCoordinator) seen() []*pb.ReportRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.ReportRequest(nil), f.calls...)
}

// relayAgent is an agent of name whose node server (over mutual TLS)
// relays, following asg, and whose coordinator is co.
func relayAgent(t *testing.T, p *testPKI, name string, asg *pb.Assignment, co pb.CoordinatorClient) (*Agent, string) {
	t.Helper()
	server, client, err := pki.PeerTLS(p.creds(pki.RoleNode, name))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	a := &Agent{cfg: &Config{Name: name}, log: log, client: co, latest: asg}
	a.holder = ckpt.New(t.TempDir(), name, server, client, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	out := ranklog.New(t.TempDir(), name, ranklog.DefaultLimits, log)
	go func() {
		done <- ckpt.Serve(ctx, ln, server, nodeMux(a.holder, out, a.relayReport, a.relayRenewal), log)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return a, ln.Addr().String()
}

// TestRelayForwards: three nodes of r's block report through r at once:
// r forwards them and each gets the coordinator's answer; a refusal
// reaches its node alone. A node posing as another is refused by
// r and reports to the coordinator itself, as does one whose relay is
// gone.
func TestRelayForwards(t *testing.T) {
	p := newTestPKI(t)
	co := &fakeCoordinator{}
	own := &pb.Assignment{Job: "j", Generation: &pb.Generation{Number: 1}}
	r, addr := relayAgent(t, p, "r", own, co)
	view := &pb.Assignment{Job: "j", Relay: "r", Generation: &pb.Generation{Number: 1, Members: []*pb.Member{{Node: "r", CheckpointAddr: addr}}}}
	stored := func() *pb.ReportRequest {
		return &pb.ReportRequest{Job: "j", Generation: 1, Kind: &pb.ReportRequest_Stored{Stored: &pb.Stored{Steps: []*pb.StoredStep{{Step: 7}}}}}
	}
	var senders []*Agent
	var directs []*fakeCoordinator
	for _, name := range []string{"a", "b", "bad"} {
		d := &fakeCoordinator{}
		s, _ := relayAgent(t, p, name, nil, d)
		senders, directs = append(senders, s), append(directs, d)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(senders))
	for i, s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := s.reportVia(t.Context(), view, stored())
			if err == nil && resp.Committed != 7 {
				err = fmt.Errorf("committed %d, want 7", resp.Committed)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || status.Code(errs[2]) != codes.PermissionDenied {
		t.Errorf("through the relay: %v", errs)
	}
	// Every report went through r (in as many calls as the 5 ms window
	// and the calls under way made: one, unless the senders' handshakes
	// spread them out).
	calls, relayed := co.seen(), 0
	for _, c := range calls {
		if c.Node != "r" || c.GetRelayed() == nil {
			t.Errorf("a call to the coordinator not relayed by r: %v", c)
		}
		relayed += len(c.GetRelayed().GetReports())
	}
	if relayed != 3 {
		t.Fatalf("the relay forwarded %d reports in %d calls, want 3", relayed, len(calls))
	}
	t.Logf("three reports in %d relayed calls", len(calls))
	for i, d := range directs {
		if n := len(d.seen()); n != 0 {
			t.Errorf("%s reported to the coordinator itself %d times", senders[i].cfg.Name, n)
		}
	}

	// a's certificate, b's name: refused by the relay.
	forged := stored()
	forged.Node = "b"
	body, _ := proto.Marshal(forged)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+addr+"/v1/relay", bytes.NewReader(body))
	resp, err := senders[0].holder.ClientFor("r").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a posing as b: %s, want 403", resp.Status)
	}
	// The relay gone: the node reports to the coordinator itself.
	gone := &pb.Assignment{Job: "j", Relay: "r", Generation: &pb.Generation{Number: 1, Members: []*pb.Member{{Node: "r", CheckpointAddr: freeLoopback(t)}}}}
	if _, err := senders[1].reportVia(t.Context(), gone, stored()); err != nil || len(directs[1].seen()) != 1 {
		t.Errorf("relay gone: %v, %d direct reports, want 1", err, len(directs[1].seen()))
	}
	// ... and is passed over for a while, even at its old address.
	if _, err := senders[1].reportVia(t.Context(), view, stored()); err != nil || len(directs[1].seen()) != 2 || len(co.seen()) != len(calls) {
		t.Errorf("after the relay failed: %v, %d direct reports (want 2), %d relayed calls (want %d)", err, len(directs[1].seen()), len(co.seen()), len(calls))
	}
	// A relay of another generation does not take the report.
	r.mu.Lock()
	r.latest = &pb.Assignment{Job: "j", Generation: &pb.Generation{Number: 2}}
	r.mu.Unlock()
	if _, err := senders[0].throughRelay(t.Context(), view, stored()); err == nil || status.Code(err) != codes.Unknown {
		t.Errorf("relay at generation 2 taking a report of 1: %v", err)
	}
	// A Stopped report of a generation the relay has not got yet (3) is
	// forwarded, in a call of its own generation: the coordinator judges
	// it (a relay may get a new generation after its block's nodes).
	before := len(co.seen())
	view3 := &pb.Assignment{Job: "j", Relay: "r", Generation: &pb.Generation{Number: 3, Members: []*pb.Member{{Node: "r", CheckpointAddr: addr}}}}
	stop := &pb.ReportRequest{Job: "j", Generation: 3, Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: 3}}}
	if _, err := senders[0].throughRelay(t.Context(), view3, stop); err != nil {
		t.Fatalf("a Stopped report of generation 3 through a relay at 2: %v", err)
	}
	if got := co.seen()[before:]; len(got) != 1 || got[0].Generation != 3 || got[0].GetRelayed().GetReports()[0].GetStopped().GetBelow() != 3 {
		t.Errorf("relayed calls %v: want one of generation 3 with a's Stopped", got)
	}
}

// TestRelayCallOfOneGeneration: reports waiting at a relay go in calls of
// one job and generation each (the coordinator refuses a report of
// another generation than its call's).
func TestRelayCallOfOneGeneration(t *testing.T) {
	co := &fakeCoordinator{}
	a := &Agent{cfg: &Config{Name: "r"}, log: slog.New(slog.NewTextHandler(t.Output(), nil)), client: co}
	var waits []*relayedReport
	for _, g := range []int64{1, 2, 1, 2, 2} {
		x := &relayedReport{r: &pb.ReportRequest{Job: "j", Generation: g, Node: fmt.Sprint("n", len(waits))}, done: make(chan struct{})}
		waits = append(waits, x)
	}
	a.relays.pending, a.relays.busy = slices.Clone(waits), true
	a.forward()
	calls := co.seen()
	if len(calls) != 2 || calls[0].Generation != 1 || len(calls[0].GetRelayed().GetReports()) != 2 || calls[1].Generation != 2 || len(calls[1].GetRelayed().GetReports()) != 3 {
		t.Fatalf("calls %v: want generation 1's two reports, then generation 2's three", calls)
	}
	for _, c := range calls {
		for _, r := range c.GetRelayed().GetReports() {
			if r.Generation != c.Generation {
				t.Errorf("a report of generation %d in a call of %d", r.Generation, c.Generation)
			}
		}
	}
	for i, x := range waits {
		select {
		case <-x.done:
		default:
			t.Errorf("report %d not answered", i)
		}
	}
	if a.relays.busy || len(a.relays.pending) != 0 {
		t.Errorf("after forward: busy %v, %d pending", a.relays.busy, len(a.relays.pending))
	}
}

// freeLoopback is a loopback address nobody listens on.
func freeLoopback(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
