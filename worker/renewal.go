package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
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

// forwardRenewals forwards the renewals the relay's renewal asg carries,
// each to its member, concurrently, each given a third of its time: one
// that does not arrive in time is of no use, and the member's next comes.
func (a *Agent) forwardRenewals(asg *pb.Assignment) {
	if a.holder == nil {
		return
	}
	for _, r := range asg.RelayedRenewals {
		r.SentUnixNanos = asg.SentUnixNanos
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), max(time.Duration(r.LeaseTtlMs)*time.Millisecond/3, 100*time.Millisecond))
			defer cancel()
			if err := a.sendRenewal(ctx, r); err != nil {
				a.log.Debug("forwarding a renewal", "node", r.Node, "err", err)
			}
		}()
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

// relayRenewal takes a renewal of this node forwarded by its relay: from
// the relay its latest assignment names (over mutual TLS), for the stream
// open now. It answers 204 when taken, 403 from another node, 409 for
// another stream or relay.
func (a *Agent) relayRenewal(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	rr := &pb.RelayedRenewal{}
	if err := proto.Unmarshal(b, rr); err != nil {
		http.Error(w, "renewal: "+err.Error(), http.StatusBadRequest)
		return
	}
	if rr.Node != a.cfg.Name || rr.LeaseTtlMs <= 0 {
		http.Error(w, fmt.Sprintf("renewal: %s takes its own renewals, not %s's", a.cfg.Name, rr.Node), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	clock, asg := a.clock, a.latest
	a.mu.Unlock()
	relay := asg.GetRelay()
	if r.TLS != nil {
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
	// Taken only while that stream is still the one open: a stream opened
	// since has said what the deadline was (WatchRequest's
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
	w.WriteHeader(http.StatusNoContent)
}
