package worker

import (
	"strings"
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestRelayRenewal: a member takes a renewal forwarded by the relay its
// assignment names, for the stream it has open, and counts it from the
// coordinator's send time on that stream's clock; it refuses one from
// another node, of another stream, or while no stream is open.
func TestRelayRenewal(t *testing.T) {
	p := newTestPKI(t)
	r, _ := relayAgent(t, p, "r", &pb.Assignment{Job: "j", Generation: &pb.Generation{Number: 1}}, nil)
	x, _ := relayAgent(t, p, "x", &pb.Assignment{Job: "j", Relay: "r", Generation: &pb.Generation{Number: 1}}, nil)
	m, addr := relayAgent(t, p, "m", &pb.Assignment{Job: "j", Relay: "r", Generation: &pb.Generation{Number: 1}}, nil)
	// m's stream (session 5) has brought a renewal read 40 ms after it
	// was sent on the coordinator's clock: that clock is 40 ms behind.
	t0 := time.Now()
	clock := &leaseClock{}
	m.renew(clock.deadline(&pb.Assignment{LeaseTtlMs: 500, SentUnixNanos: t0.UnixNano()}, t0.Add(40*time.Millisecond)))
	m.clock, m.clockSession = clock, 5
	deadline := func() time.Time {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.deadline
	}
	renewal := func(session uint64, sent time.Time) *pb.RelayedRenewal {
		return &pb.RelayedRenewal{Node: "m", Session: session, LeaseTtlMs: 2000, SentUnixNanos: sent.UnixNano(), Addr: addr}
	}
	sent := t0.Add(100 * time.Millisecond)
	if err := r.sendRenewal(t.Context(), renewal(5, sent)); err != nil {
		t.Fatalf("the relay's renewal: %v", err)
	}
	if want := sent.Add(40*time.Millisecond + 2*time.Second); !deadline().Equal(want) {
		t.Fatalf("deadline %v after the relayed renewal, want %v (its send time, on the stream's clock, plus its TTL)", deadline(), want)
	}
	later := t0.Add(time.Second)
	for _, c := range []struct {
		what, code string
		from       *Agent
		session    uint64
		before     func()
	}{
		{"from a node not m's relay", "403", x, 5, nil},
		{"of a stream not open", "409", r, 4, nil},
		{"while a new stream opens", "409", r, 5, func() { m.mu.Lock(); m.clock = nil; m.mu.Unlock() }},
	} {
		before := deadline()
		if c.before != nil {
			c.before()
		}
		err := c.from.sendRenewal(t.Context(), renewal(c.session, later))
		if err == nil || !strings.Contains(err.Error(), c.code) {
			t.Errorf("a renewal %s: %v, want refused (%s)", c.what, err, c.code)
		}
		if !deadline().Equal(before) {
			t.Errorf("a renewal %s moved the deadline", c.what)
		}
	}
}
