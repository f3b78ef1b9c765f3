package coordinator

import (
	"context"
	"crypto/rand"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Assignments through relays. When a running job's assignment changes (a
// new generation, its opening, rank 0's address), every member's stream
// would send it: 16,384 messages at once, three times for a generation
// after a loss, each a write on its own connection. Instead a block's
// relay (Assignment.relay, the first of each pb.RelayBlock members) gets
// its members' new assignments in its own message (relayed_renewals with
// an assignment, each with the deadline the member's own stream would have
// given with it, recorded in the member's grant first), and its agent
// forwards each to the member's node server; the member checks it by the
// MAC of its stream's relay key (pb.RelayMAC), since its relay in the new
// generation may be one its assignment did not name. The relay then says
// which members took it (Delivered), and their own streams send it no
// more. A member whose relay reports no delivery within relayWait of the
// relay's send gets it on its own stream (relaySweep): a relay that died
// or cannot reach a member costs its members that much later, never the
// assignment; a member whose relay's stream is not here gets it on its
// own at once. A block so costs one message for a change (a larger one)
// and a report back, not 32 messages.
//
// Which members go through their relay is throughRelay's rule, asked by
// both streams (routeOf, relayBlock); where they disagree (a stream
// opened or closed between) the member gets it twice or after relayWait,
// and its agent takes each revision once.

// relayWait is how long a member's stream waits for its relay to deliver
// an assignment before it sends it itself.
const relayWait = pb.RelayWait

// A member's stream whose relay carries its job's changes sleeps: it waits
// for its route to change (a new relay, its job's end: cache.memberRoute)
// or to be woken late (grant.wake), not for every change, so that a
// change of a 16,384-node job wakes the 512 relays' streams, not 16,384.
// One goroutine (relaySweep) wakes, relayWait after a change, the
// sleeping streams whose relay has not delivered the newest assignment,
// and a relay's stream that ends wakes its block's. What the node holds
// while its stream sleeps is what its relay delivered, which the stream
// does not follow: after a sleep it compares a change with nothing
// (onChange's known is nil).

// change is what a member's stream does with a changed assignment.
type change int

const (
	changeNone      change = iota // nothing new for the node
	changeDelivered               // its relay delivered it already
	changeToRelay                 // left to its relay (relaySweep wakes the stream if it is late)
	changeSend                    // sent on the stream now
)

// onChange is what a stream does with assignment a, changed, when the node
// holds known (nil when the stream does not know: it slept), its relay
// reported the newest revision delivered, and relayed says whether the
// relay carries it (its route, its relay's stream here, and not late).
func onChange(a, known *pb.Assignment, delivered int64, relayed bool) change {
	switch {
	case known != nil && sameAssignment(a, known):
		return changeNone
	case delivered >= a.Revision:
		return changeDelivered
	case relayed:
		return changeToRelay
	}
	return changeSend
}

// relayLate says whether a sleeping member's stream, whose job's
// assignment is of revision rev, is to send it itself at now: no delivery
// of it was reported, and wait has passed since its relay's stream sent
// it (relayed, at relayedAt), or, when that stream has not, since the
// change (changedAt). When it is not late yet, at is when it will be
// (zero: delivered).
func relayLate(rev, delivered, relayed int64, relayedAt, changedAt time.Time, wait time.Duration, now time.Time) (late bool, at time.Time) {
	if delivered >= rev {
		return false, time.Time{}
	}
	at = changedAt.Add(wait)
	if relayed >= rev {
		at = relayedAt.Add(wait)
	}
	if !at.After(now) {
		return true, time.Time{}
	}
	return false, at
}

// relaySweep wakes the sleeping members' streams whose relay is late
// (relayLate), looking relayWait after each change of the assignments and
// then when the next is due, until ctx ends: one clock for the
// coordinator, not a timer a stream.
func (s *server) relaySweep(ctx context.Context) error {
	changed := s.cache.assignmentsChanged()
	var changedAt time.Time
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			changed, changedAt = s.cache.assignmentsChanged(), time.Now()
			if !armed {
				t.Reset(s.relayWait)
				armed = true
			}
		case now := <-t.C:
			armed = false
			var next time.Time
			s.cache.relayedMembers(func(node string, rev int64) {
				g := s.grants.live(node)
				if g == nil || !g.asleep.Load() {
					return
				}
				relayed := g.relayed.Load() // before its time (offered)
				late, at := relayLate(rev, g.delivered.Load(), relayed, time.Unix(0, g.relayedAt.Load()), changedAt, s.relayWait, now)
				if late {
					g.wake()
				} else if !at.IsZero() && (next.IsZero() || at.Before(next)) {
					next = at
				}
			})
			// A stream that did not sleep at this look (it was looking
			// at a change) is looked at once that change's wait is over.
			if due := changedAt.Add(s.relayWait); due.After(now) && (next.IsZero() || due.Before(next)) {
				next = due
			}
			if !next.IsZero() {
				t.Reset(max(next.Sub(now), relaySweepMin))
				armed = true
			}
		}
	}
}

// relaySweepMin is the least time between two looks of relaySweep.
const relaySweepMin = 20 * time.Millisecond

// wakeBlock wakes the streams of the members relay's block carries (its
// stream here has ended): they look again, and send what their relay no
// longer will. Those that do not sleep too: one may be about to, having
// seen the relay's stream before it ended.
func (s *server) wakeBlock(relay string) {
	for _, m := range s.cache.relayedBy(relay) {
		if g := s.grants.live(m); g != nil {
			g.wake()
		}
	}
}

// newRelayKey is a stream's relay key (Assignment.relay_key).
func newRelayKey() []byte {
	k := make([]byte, pb.RelayKeySize)
	rand.Read(k) // never fails (crypto/rand)
	return k
}

// relayedAssignments are the new assignments of relay's block's members
// whose streams are here, to carry in the relay's message of the job's
// assignment changed, sent at now: each with the deadline the member's
// own stream would give with it (a fence window's, recorded first), and
// its MAC. None when relay relays no one (throughRelay).
func (s *server) relayedAssignments(relay string, now time.Time) []*pb.RelayedRenewal {
	var out []*pb.RelayedRenewal
	for _, m := range s.cache.relayBlock(relay) {
		g := s.grants.live(m.node)
		if g == nil {
			continue
		}
		r := &pb.RelayedRenewal{Node: m.node, Session: g.session, Addr: m.addr, Assignment: m.wire, SentUnixNanos: now.UnixNano()}
		if s.cfg.FenceWindow > 0 {
			if ttl, ok := g.renewal(s.cfg.FenceWindow, now); ok {
				r.LeaseTtlMs = ttl.Milliseconds()
			}
		}
		r.Mac = pb.RelayMAC(g.key, r)
		g.offered(m.rev, now)
		out = append(out, r)
	}
	s.relayedSent.Add(int64(len(out)))
	return out
}

// withRelayed is assignment e with rs appended (Assignment.relayed_renewals),
// in a copy.
func (e encoded) withRelayed(rs []*pb.RelayedRenewal) encoded {
	b := append([]byte(nil), e...)
	for _, r := range rs {
		m, err := proto.Marshal(r)
		if err != nil {
			panic(err) // a message of known fields always encodes
		}
		b = protowire.AppendTag(b, 18, protowire.BytesType) // Assignment.relayed_renewals
		b = protowire.AppendBytes(b, m)
	}
	return b
}

// reportDelivered takes a relay's report that members took an assignment
// through it (Delivered): each must be a member the reporting node relays
// in the report's generation; a member's stream of that session stops
// waiting for it, up to the newest revision a relay was given for it (a
// relay cannot silence assignments it was never given).
func (s *server) reportDelivered(req *pb.ReportRequest, d *pb.Delivered) (*pb.ReportResponse, error) {
	if len(d.Nodes) != len(d.Sessions) || len(d.Nodes) > pb.RelayBlock {
		return nil, status.Errorf(codes.InvalidArgument, "delivered: %d nodes and %d sessions, at most %d", len(d.Nodes), len(d.Sessions), pb.RelayBlock)
	}
	for _, n := range d.Nodes {
		if !s.cache.relays(req.Job, req.Generation, req.Node, n) || n == req.Node {
			return nil, status.Errorf(codes.PermissionDenied, "delivered: %s is not the relay of %s in job %s generation %d", req.Node, n, req.Job, req.Generation)
		}
	}
	for i, n := range d.Nodes {
		if g := s.grants.live(n); g != nil && g.session == d.Sessions[i] {
			g.markDelivered(d.Revision)
		}
	}
	return &pb.ReportResponse{Committed: s.cache.committed(req.Job)}, nil
}
