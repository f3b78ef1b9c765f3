package worker

import (
	"errors"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// errSilent ends a Watch stream that brought no message for longer than
// its coordinator promised, and a margin.
var errSilent = errors.New("worker: the coordinator's stream went silent")

// silence ends a Watch stream silent for longer than silenceBound: the
// coordinator, or the way to it, is gone, and the agent moves to another
// while its lease holds. An agent's connection carries no keepalive
// pings (pb.DialAgent); the stream's own messages, each third of the
// lease at least (Assignment.heartbeat_ms), say the coordinator is there.
//
// # Concurrency
//
// heard, bound and stop are called by the one goroutine reading the
// stream.
type silence struct {
	beat  time.Duration // the stream's heartbeat; 0 until its first message
	ttl   time.Duration // the lease's TTL
	timer *time.Timer
}

// newSilence starts the count of a stream of a lease of ttl, calling end
// with errSilent once it is silent past its bound.
func newSilence(ttl time.Duration, end func(error)) *silence {
	s := &silence{ttl: ttl}
	s.timer = time.AfterFunc(s.bound(), func() { end(errSilent) })
	return s
}

// heard restarts the count at a message, which names the stream's
// heartbeat in milliseconds on its first (0: unchanged).
func (s *silence) heard(beatMs int64) {
	if beatMs > 0 {
		s.beat = time.Duration(beatMs) * time.Millisecond
	}
	s.timer.Reset(s.bound())
}

// bound is silenceBound of what the stream said.
func (s *silence) bound() time.Duration { return silenceBound(s.beat, s.ttl) }

func (s *silence) stop() { s.timer.Stop() }

// silenceBound is how long a stream may be silent before the agent ends
// it: its heartbeat and pb.KeepaliveTimeout, the time a ping's answer
// was given. Before its first message, the coordinator may wait a
// lease's TTL (its first renewal, then its view catching up) before it
// answers or ends the stream itself; an unknown TTL counts as
// pb.AgentKeepaliveTime, the pings' interval.
func silenceBound(beat, ttl time.Duration) time.Duration {
	switch {
	case beat > 0:
		return beat + pb.KeepaliveTimeout
	case ttl > 0:
		return ttl + pb.KeepaliveTimeout
	}
	return pb.AgentKeepaliveTime
}
