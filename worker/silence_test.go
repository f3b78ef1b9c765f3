package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

func TestSilenceBound(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		beat, ttl, want time.Duration
	}{
		{0, 0, pb.AgentKeepaliveTime},                                                 // nothing known: the pings' interval
		{0, 15 * s, 15*s + pb.KeepaliveTimeout},                                       // before the first message: a lease's TTL
		{2266 * time.Millisecond, 5 * s, 2266*time.Millisecond + pb.KeepaliveTimeout}, // the heartbeat
	} {
		if got := silenceBound(tc.beat, tc.ttl); got != tc.want {
			t.Errorf("silenceBound(%s, %s) = %s, want %s", tc.beat, tc.ttl, got, tc.want)
		}
	}
}

// silentCoordinator's Watch stream sends msgs, then ends with end or,
// when end is nil, says nothing more until its context ends.
type silentCoordinator struct {
	pb.CoordinatorClient
	msgs []*pb.Assignment
	end  error
}

func (c *silentCoordinator) Watch(ctx context.Context, _ *pb.WatchRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[pb.Assignment], error) {
	return &fakeWatch{ctx: ctx, msgs: c.msgs, end: c.end}, nil
}

type fakeWatch struct {
	grpc.ClientStream
	ctx  context.Context
	msgs []*pb.Assignment
	end  error
}

func (w *fakeWatch) Recv() (*pb.Assignment, error) {
	if len(w.msgs) > 0 {
		m := w.msgs[0]
		w.msgs = w.msgs[1:]
		return m, nil
	}
	if w.end != nil {
		return nil, w.end
	}
	<-w.ctx.Done()
	return nil, w.ctx.Err()
}

func (w *fakeWatch) Header() (metadata.MD, error) { return nil, nil }

// TestSessionSilence: a stream that goes silent past its heartbeat and
// the margin is ended by the agent, which moves on (errSilent); one that
// ends on its own ends as it did, however many messages it brought.
func TestSessionSilence(t *testing.T) {
	beat := &pb.Assignment{Renewal: true, HeartbeatMs: 10}
	more := func(n int) []*pb.Assignment {
		out := []*pb.Assignment{beat}
		for range n {
			out = append(out, &pb.Assignment{Renewal: true})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		co   *silentCoordinator
		want error
	}{
		{"silent after its first", &silentCoordinator{msgs: more(0)}, errSilent},
		{"silent after many", &silentCoordinator{msgs: more(100)}, errSilent},
		{"ended by the coordinator", &silentCoordinator{msgs: more(100), end: io.EOF}, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{cfg: &Config{Name: "n0"}, log: slog.New(slog.NewTextHandler(t.Output(), nil)), ready: make(chan struct{}), lease: 7, leaseTTL: time.Second}
			// Without the count, a silent stream would wait here for
			// the test's own bound.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			answered, err := a.session(ctx, tc.co, &runner{agent: a})
			if !answered || !errors.Is(err, tc.want) {
				t.Errorf("session: answered %v, %v; want answered, %v", answered, err, tc.want)
			}
		})
	}
}
