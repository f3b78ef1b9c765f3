package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// A relay (Assignment.relay, the first node of each block of 32 members)
// forwards its block's Stored, Times and Stopped reports to the
// coordinator in one call, Relayed, gathering those that arrive while its
// last call is under way: a coordinator so answers a call per block, not
// per node (at a new generation of 16,384 nodes, 512 calls for the
// survivors' Stopped reports, not 16,383), and the block's stored records
// go to etcd in one write. A node whose relay does not answer reports to
// the coordinator itself.
const (
	// relayRoute is the node server's route for reports to relay.
	relayRoute = "POST /v1/relay"
	// relayTimeout bounds a report through a relay, the relay's own call
	// to the coordinator included.
	relayTimeout = 3 * time.Second
	// maxRelayed bounds the reports one Relayed call carries.
	maxRelayed = 4 * pb.RelayBlock
	// relayGather is how long a relay waits, from the first report of a
	// call, for the block's others: the nodes send their times at the
	// same instants (reportTimes) and store a step together. It is short:
	// the native engine waits for a step's report before it trains past
	// the next (50 ms made make test's jobs 20% slower), and the reports
	// that come while a call is under way go in the next anyway.
	relayGather = 5 * time.Millisecond
)

// relay is the agent's side of relaying: the reports waiting for its next
// call.
type relay struct {
	mu      sync.Mutex
	pending []*relayedReport
	busy    bool
	// down is the node's relay that last failed it, passed over until
	// downUntil.
	down      string
	downUntil time.Time
}

type relayedReport struct {
	r      *pb.ReportRequest
	done   chan struct{}
	answer *pb.RelayedAnswer
	err    error // the relay's call failed: the node reports itself
}

// handle takes a report to relay: one of a node of the block (the caller,
// over mutual TLS), of the job and generation this node runs. It answers
// the coordinator's answer (a RelayedAnswer), or 502 when the relay could
// not forward it, 409 when it runs another generation.
func (a *Agent) relayReport(w http.ResponseWriter, r *http.Request) {
	rl := &a.relays
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	rep := &pb.ReportRequest{}
	if err := proto.Unmarshal(b, rep); err != nil {
		http.Error(w, "relay: "+err.Error(), http.StatusBadRequest)
		return
	}
	if r.TLS != nil {
		id, err := pki.PeerIdentity(r.TLS)
		if err != nil || id.Role != pki.RoleNode || id.Name != rep.GetNode() {
			http.Error(w, fmt.Sprintf("relay: a node relays its own reports alone, not %s's for %s", rep.GetNode(), id), http.StatusForbidden)
			return
		}
	}
	switch rep.Kind.(type) {
	case *pb.ReportRequest_Stored, *pb.ReportRequest_Times:
		asg := a.current()
		if asg == nil || asg.Job != rep.GetJob() || asg.Generation.GetNumber() != rep.GetGeneration() || asg.Relay != "" {
			http.Error(w, fmt.Sprintf("relay: %s does not relay job %s generation %d", a.cfg.Name, rep.GetJob(), rep.GetGeneration()), http.StatusConflict)
			return
		}
	case *pb.ReportRequest_Stopped:
		// Of a new generation, which may reach the block's nodes before
		// this one: the coordinator checks that this node relays the
		// sender's reports in it.
	default:
		http.Error(w, "relay: Stored, Times and Stopped reports alone", http.StatusBadRequest)
		return
	}
	x := &relayedReport{r: rep, done: make(chan struct{})}
	rl.mu.Lock()
	rl.pending = append(rl.pending, x)
	lead := !rl.busy
	rl.busy = true
	rl.mu.Unlock()
	if lead {
		go a.forward()
	}
	select {
	case <-x.done:
	case <-r.Context().Done():
		return
	}
	if x.err != nil {
		http.Error(w, "relay: "+x.err.Error(), http.StatusBadGateway)
		return
	}
	out, _ := proto.Marshal(x.answer)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// forward sends the pending reports, maxRelayed a call, until none is
// left: each call carries those that came while the last was under way,
// of the job and generation of the first of them (a call is of one).
func (a *Agent) forward() {
	rl := &a.relays
	time.Sleep(relayGather) // not a synchronisation: a batching window, whose length costs only latency
	for {
		rl.mu.Lock()
		if len(rl.pending) == 0 {
			rl.busy = false
			rl.mu.Unlock()
			return
		}
		job, gen := rl.pending[0].r.GetJob(), rl.pending[0].r.GetGeneration()
		var batch, rest []*relayedReport
		for _, x := range rl.pending {
			if len(batch) < maxRelayed && x.r.GetJob() == job && x.r.GetGeneration() == gen {
				batch = append(batch, x)
			} else {
				rest = append(rest, x)
			}
		}
		rl.pending = rest
		rl.mu.Unlock()
		reports := make([]*pb.ReportRequest, len(batch))
		for i, x := range batch {
			reports[i] = x.r
		}
		ctx, cancel := context.WithTimeout(context.Background(), relayTimeout)
		resp, err := a.reportResp(ctx, &pb.ReportRequest{Job: job, Generation: gen, Kind: &pb.ReportRequest_Relayed{Relayed: &pb.Relayed{Reports: reports}}})
		cancel()
		if err == nil && len(resp.GetRelayed()) != len(batch) {
			err = fmt.Errorf("the coordinator answered %d of %d relayed reports", len(resp.GetRelayed()), len(batch))
		}
		for i, x := range batch {
			if x.err = err; err == nil {
				x.answer = resp.Relayed[i]
			}
			close(x.done)
		}
	}
}

// reportVia sends r, a Stored, Times or Stopped report of asg's generation,
// through the node's relay, or to the coordinator itself when it has none
// or the relay does not take it.
//
// A relay that failed is passed over for relayRest: a relay cut off
// would otherwise cost every report its timeout.
func (a *Agent) reportVia(ctx context.Context, asg *pb.Assignment, r *pb.ReportRequest) (*pb.ReportResponse, error) {
	if asg.GetRelay() == "" || a.holder == nil || a.relays.passOver(asg.Relay) {
		return a.reportResp(ctx, r)
	}
	resp, err := a.throughRelay(ctx, asg, r)
	switch status.Code(err) {
	case codes.Unknown, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.ResourceExhausted:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	default:
		return resp, err // taken, or refused for good by the coordinator
	}
	a.relays.failed(asg.Relay)
	a.log.Info("the relay did not take a report: reporting to the coordinator", "relay", asg.Relay, "for", relayRest, "err", err)
	return a.reportResp(ctx, r)
}

// relayRest is how long a relay that failed is passed over.
const relayRest = 10 * time.Second

func (rl *relay) failed(relay string) {
	rl.mu.Lock()
	rl.down, rl.downUntil = relay, time.Now().Add(relayRest)
	rl.mu.Unlock()
}

func (rl *relay) passOver(relay string) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return rl.down == relay && time.Now().Before(rl.downUntil)
}

// throughRelay posts r to asg's relay. A refusal by the coordinator comes
// back as its status; anything else (the relay unreachable, refusing, or
// unable to forward) as an error of code Unknown.
func (a *Agent) throughRelay(ctx context.Context, asg *pb.Assignment, r *pb.ReportRequest) (*pb.ReportResponse, error) {
	var addr string
	for _, m := range asg.Generation.GetMembers() {
		if m.Node == asg.Relay {
			addr = m.CheckpointAddr
		}
	}
	if addr == "" {
		return nil, errors.New("the relay has no node server")
	}
	r.Node = a.cfg.Name
	a.mu.Lock()
	r.LeaseId = a.lease
	a.mu.Unlock()
	body, err := proto.Marshal(r)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, relayTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, a.holder.Scheme()+"://"+addr+"/v1/relay", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := a.holder.ClientFor(asg.Relay).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("relay %s: %s: %s", asg.Relay, resp.Status, bytes.TrimSpace(b))
	}
	ans := &pb.RelayedAnswer{}
	if err := proto.Unmarshal(b, ans); err != nil {
		return nil, fmt.Errorf("relay %s: %w", asg.Relay, err)
	}
	if ans.Code != 0 {
		return nil, status.Error(codes.Code(ans.Code), ans.Error)
	}
	return &pb.ReportResponse{Committed: ans.Committed}, nil
}

// current is the latest assignment the node received; nil before one.
func (a *Agent) current() *pb.Assignment {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.latest
}
