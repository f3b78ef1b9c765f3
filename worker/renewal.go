package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// With a coordinator's fence window, a running job's members are renewed
// through their block's relay: the relay's stream carries its block's
// renewals (Assignment.relayed_renewals), and its agent forwards each to
// the member's node server at once. The member takes one only from the
// relay its assignment names, for the stream it has open, and counts it
// from the coordinator's send time on that stream's clock, as a renewal
// on the stream itself, on the clock offset the stream's own renewals
// measured: a renewal that took long through the relay moves the deadline
// no later than it would have, sent on the stream.

// renewalRoute is the node server's route for renewals a relay forwards.
const renewalRoute = "POST /v1/renewal"

// forwardRenewals forwards the renewals the relay's message asg carries,
// each to its member, concurrently: a renewal alone given a third of its
// time (one that does not arrive in time is of no use, and the member's
// next comes), one with the member's new assignment relayTimeout. The
// relay reports which members took their assignments (Delivered) once
// all have answered, or a third of pb.RelayWait after it began when some
// have not (the rest, if they take it, once all have): their own streams
// send them no more. A member that cannot be reached so costs the
// others nothing.
func (a *Agent) forwardRenewals(asg *pb.Assignment) {
	if a.holder == nil {
		return
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		took  []*pb.RelayedRenewal // answered, not yet reported
		carry bool
	)
	for _, r := range asg.RelayedRenewals {
		if r.SentUnixNanos == 0 {
			r.SentUnixNanos = asg.SentUnixNanos
		}
		timeout := max(time.Duration(r.LeaseTtlMs)*time.Millisecond/3, 100*time.Millisecond)
		if len(r.Assignment) > 0 {
			timeout, carry = relayTimeout, true
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if err := a.sendRenewal(ctx, r); err != nil {
				a.log.Debug("forwarding a renewal", "node", r.Node, "assignment", len(r.Assignment) > 0, "err", err)
				return
			}
			if len(r.Assignment) > 0 {
				mu.Lock()
				took = append(took, r)
				mu.Unlock()
			}
		})
	}
	if !carry {
		return
	}
	all := make(chan struct{})
	go func() {
		wg.Wait()
		close(all)
	}()
	report := func() {
		mu.Lock()
		rs := took
		took = nil
		mu.Unlock()
		if len(rs) > 0 {
			a.reportDelivered(asg, rs)
		}
	}
	a.bg.Go(func() {
		t := time.NewTimer(pb.RelayWait / 3)
		defer t.Stop()
		select {
		case <-all:
		case <-t.C:
			report()
			<-all
		}
		report()
	})
}

// reportDelivered tells the coordinator that the members of rs took the
// assignments they carried, of the relay's assignment asg's revision. It
// is of use only while their streams wait for it (pb.RelayWait): it is not
// tried again.
func (a *Agent) reportDelivered(asg *pb.Assignment, rs []*pb.RelayedRenewal) {
	d := &pb.Delivered{Revision: asg.Revision}
	for _, r := range rs {
		d.Nodes, d.Sessions = append(d.Nodes, r.Node), append(d.Sessions, r.Session)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pb.RelayWait)
	defer cancel()
	a.mu.Lock()
	client, lease := a.client, a.lease
	a.mu.Unlock()
	if _, err := client.Report(ctx, &pb.ReportRequest{Job: asg.Job, Generation: asg.Generation.GetNumber(), Node: a.cfg.Name, LeaseId: lease,
		Kind: &pb.ReportRequest_Delivered{Delivered: d}}); err != nil {
		a.log.Debug("reporting assignments delivered", "nodes", len(d.Nodes), "err", err)
	}
}

func (a *Agent) sendRenewal(ctx context.Context, r *pb.RelayedRenewal) error {
	body, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.holder.Scheme()+"://"+r.Addr+"/v1/renewal", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := a.holder.ClientFor(r.Node).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s: %s", r.Node, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// maxRelayedBody bounds a renewal forwarded to the node server: one with
// an assignment carries the job's spec and the node's part of the
// generation.
const maxRelayedBody = 4 << 20

// relayRenewal takes a renewal of this node forwarded by a relay, for the
// stream open now. A renewal alone comes from the relay the node's latest
// assignment names (over mutual TLS). One with the node's new assignment
// (the job's change, through its relay in the new generation, perhaps one
// the latest did not name) comes from any node, with the MAC of the
// stream's relay key: the session goroutine then takes the assignment. It
// answers 204 when taken, 403 from another node or with a MAC that fails,
// 409 for another stream or relay, 503 when the session has too many
// waiting.
func (a *Agent) relayRenewal(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRelayedBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	rr := &pb.RelayedRenewal{}
	if err := proto.Unmarshal(b, rr); err != nil {
		http.Error(w, "renewal: "+err.Error(), http.StatusBadRequest)
		return
	}
	carries := len(rr.Assignment) > 0
	if rr.Node != a.cfg.Name || rr.LeaseTtlMs < 0 || (rr.LeaseTtlMs == 0 && !carries) {
		http.Error(w, fmt.Sprintf("renewal: %s takes its own renewals, not %s's", a.cfg.Name, rr.Node), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	clock, latest, key, session, in := a.clock, a.latest, a.relayKey, a.clockSession, a.relayedIn
	a.mu.Unlock()
	var asg *pb.Assignment
	if carries {
		if clock == nil || rr.Session != session {
			http.Error(w, fmt.Sprintf("renewal: an assignment of stream %d, not of the one open", rr.Session), http.StatusConflict)
			return
		}
		if !pb.RelayMACValid(key, rr) {
			http.Error(w, "renewal: the assignment fails the stream's MAC", http.StatusForbidden)
			return
		}
		asg = &pb.Assignment{}
		if err := proto.Unmarshal(rr.Assignment, asg); err != nil {
			http.Error(w, "renewal: assignment: "+err.Error(), http.StatusBadRequest)
			return
		}
	} else if relay := latest.GetRelay(); r.TLS != nil {
		id, err := pki.PeerIdentity(r.TLS)
		if err != nil || id.Role != pki.RoleNode || id.Name != relay || relay == "" {
			http.Error(w, fmt.Sprintf("renewal: from %s, not from this node's relay %q", id, relay), http.StatusForbidden)
			return
		}
	}
	if clock == nil {
		http.Error(w, "renewal: no stream open", http.StatusConflict)
		return
	}
	if rr.LeaseTtlMs > 0 {
		// Taken only while that stream is still the one open: a stream
		// opened since has said what the deadline was (WatchRequest's
		// deadline_left_ms), and nothing may move it past that.
		d, ok := clock.relayed(rr.LeaseTtlMs, rr.SentUnixNanos)
		if !ok {
			http.Error(w, "renewal: the stream has brought no renewal to count it by", http.StatusConflict)
			return
		}
		if !a.renewIf(d, func() bool { return a.clock == clock && a.clockSession == rr.Session }) {
			http.Error(w, fmt.Sprintf("renewal: of stream %d, not of the one open", rr.Session), http.StatusConflict)
			return
		}
	}
	if asg != nil {
		select {
		case in <- asg:
		default:
			http.Error(w, "renewal: too many assignments waiting", http.StatusServiceUnavailable)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
