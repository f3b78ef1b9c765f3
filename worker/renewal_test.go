package worker

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

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

// TestRelayedAssignment: a member takes a new assignment forwarded by any
// node (its relay in the new generation may be one its assignment does not
// name) when it carries the MAC of the open stream's relay key, for that
// stream, with the deadline given with it; it refuses one whose MAC fails
// (another key, a changed deadline), of another stream, and one more than
// the session can hold.
func TestRelayedAssignment(t *testing.T) {
	p := newTestPKI(t)
	x, _ := relayAgent(t, p, "x", &pb.Assignment{Job: "j", Generation: &pb.Generation{Number: 1}}, nil)
	m, addr := relayAgent(t, p, "m", &pb.Assignment{Job: "j", Relay: "r", Generation: &pb.Generation{Number: 1}}, nil)
	key := bytes.Repeat([]byte{7}, pb.RelayKeySize)
	t0 := time.Now()
	clock := &leaseClock{}
	m.renew(clock.deadline(&pb.Assignment{LeaseTtlMs: 500, SentUnixNanos: t0.UnixNano()}, t0.Add(40*time.Millisecond)))
	in := make(chan *pb.Assignment, 1)
	m.clock, m.clockSession, m.relayKey, m.relayedIn = clock, 5, key, in
	deadline := func() time.Time {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.deadline
	}
	next, err := proto.Marshal(&pb.Assignment{Job: "j", Relay: "x", Revision: 9, Open: true, Generation: &pb.Generation{Number: 2}})
	if err != nil {
		t.Fatal(err)
	}
	sent := t0.Add(100 * time.Millisecond)
	relayed := func(session uint64, k []byte) *pb.RelayedRenewal {
		r := &pb.RelayedRenewal{Node: "m", Session: session, LeaseTtlMs: 2000, SentUnixNanos: sent.UnixNano(), Addr: addr, Assignment: next}
		r.Mac = pb.RelayMAC(k, r)
		return r
	}
	refused := func(what, code string, r *pb.RelayedRenewal) {
		t.Helper()
		before := deadline()
		if err := x.sendRenewal(t.Context(), r); err == nil || !strings.Contains(err.Error(), code) {
			t.Errorf("an assignment %s: %v, want refused (%s)", what, err, code)
		}
		if !deadline().Equal(before) {
			t.Errorf("an assignment %s moved the deadline", what)
		}
		select {
		case a := <-in:
			t.Errorf("an assignment %s was taken: %v", what, a)
		default:
		}
	}
	refused("with another stream's key", "403", relayed(5, bytes.Repeat([]byte{8}, pb.RelayKeySize)))
	changed := relayed(5, key)
	changed.LeaseTtlMs *= 2
	refused("whose deadline was changed on the way", "403", changed)
	refused("of another stream", "409", relayed(4, key))
	if err := x.sendRenewal(t.Context(), relayed(5, key)); err != nil {
		t.Fatalf("an assignment through a node m's assignment does not name: %v", err)
	}
	select {
	case a := <-in:
		if a.Revision != 9 || a.Generation.GetNumber() != 2 || a.Relay != "x" {
			t.Errorf("took %v, want the relayed assignment", a)
		}
	default:
		t.Fatal("the assignment was answered taken, and is not on its way to the session")
	}
	if want := sent.Add(40*time.Millisecond + 2*time.Second); !deadline().Equal(want) {
		t.Errorf("deadline %v after the relayed assignment, want %v (its send time, on the stream's clock, plus its TTL)", deadline(), want)
	}
	filler := &pb.Assignment{Revision: 1}
	in <- filler // the session's queue is full
	if err := x.sendRenewal(t.Context(), relayed(5, key)); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("an assignment while the session holds as many as it can: %v, want refused (503)", err)
	}
	if a := <-in; a != filler || len(in) != 0 {
		t.Error("an assignment refused for a full queue was queued")
	}
}
