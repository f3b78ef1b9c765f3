package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/client"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// followScript serves one Follow stream of a fake.
type followScript func(*pb.FollowRequest, grpc.ServerStreamingServer[pb.JobEvent]) error

// fake is a coordinator whose answers a test sets. It records what it was
// asked.
type fake struct {
	pb.UnimplementedCoordinatorServer
	// submitErr, cancelErr and statusErr answer those calls; block makes
	// Submit wait until its caller gives up.
	submitErr, cancelErr, statusErr error
	block                           bool
	cancelResp                      *pb.CancelResponse
	// follows serve the Follow streams in order; past the last, a stream
	// fails with Unavailable.
	follows []followScript

	mu      sync.Mutex
	calls   map[string]int
	submits []*pb.JobSpec
	cancels []*pb.CancelRequest
	froms   []int64 // each Follow's from_revision
}

func (f *fake) record(ctx context.Context, method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[method]++
}

func (f *fake) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *fake) Submit(ctx context.Context, req *pb.SubmitRequest) (*pb.SubmitResponse, error) {
	f.record(ctx, "Submit")
	f.mu.Lock()
	f.submits = append(f.submits, req.GetSpec())
	f.mu.Unlock()
	if f.block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &pb.SubmitResponse{}, f.submitErr
}

func (f *fake) Cancel(ctx context.Context, req *pb.CancelRequest) (*pb.CancelResponse, error) {
	f.record(ctx, "Cancel")
	f.mu.Lock()
	f.cancels = append(f.cancels, req)
	f.mu.Unlock()
	if f.cancelErr != nil {
		return nil, f.cancelErr
	}
	return f.cancelResp, nil
}

func (f *fake) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	f.record(ctx, "Status")
	if f.statusErr != nil {
		return nil, f.statusErr
	}
	return &pb.StatusResponse{Leader: "fake"}, nil
}

func (f *fake) Follow(req *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
	f.record(stream.Context(), "Follow")
	f.mu.Lock()
	n := len(f.froms)
	f.froms = append(f.froms, req.GetFromRevision())
	f.mu.Unlock()
	if n >= len(f.follows) {
		return status.Error(codes.Unavailable, "no more streams")
	}
	return f.follows[n](req, stream)
}

func (f *fake) fromRevisions() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.froms)
}

// seen returns the specs and cancel requests f received.
func (f *fake) seen() ([]*pb.JobSpec, []*pb.CancelRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.submits), slices.Clone(f.cancels)
}

// serve runs f as a gRPC server on 127.0.0.1 until the test ends. It
// returns the address and a function that stops the server at once.
func serve(t *testing.T, f *fake) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(pb.ServerOptions()...)
	pb.RegisterCoordinatorServer(s, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis.Addr().String(), s.Stop
}

// deadAddr is an address nobody listens on: calls to it fail with
// Unavailable.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// newClient returns a Client of addrs with test settings, closed when the
// test ends, and the failovers it reports.
func newClient(t *testing.T, addrs []string, modify func(*client.Config)) (*client.Client, *[]client.Failover) {
	t.Helper()
	var failovers []client.Failover
	cfg := client.DefaultConfig()
	cfg.Coordinators = addrs
	cfg.RetryInterval = time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	cfg.OnFailover = func(f client.Failover) { failovers = append(failovers, f) }
	if modify != nil {
		modify(cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, &failovers
}

var spec = &pb.JobSpec{Id: "j", Nodes: 1, GpusPerNode: 1, Tp: 1, Pp: 1}

// TestSubmitFailover: a Submit that meets a coordinator at fault goes to
// the next, and later calls start at the one that answered.
func TestSubmitFailover(t *testing.T) {
	tests := []struct {
		name  string
		first func(t *testing.T) (string, *fake)
	}{
		{"answers Unavailable", func(t *testing.T) (string, *fake) {
			f := &fake{submitErr: status.Error(codes.Unavailable, "this coordinator cannot reach etcd: try another"),
				statusErr: status.Error(codes.Unavailable, "down")}
			addr, _ := serve(t, f)
			return addr, f
		}},
		{"takes longer than CallTimeout", func(t *testing.T) (string, *fake) {
			f := &fake{block: true, statusErr: status.Error(codes.Unavailable, "down")}
			addr, _ := serve(t, f)
			return addr, f
		}},
		{"nobody listening", func(t *testing.T) (string, *fake) { return deadAddr(t), &fake{} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addrA, a := tc.first(t)
			b := &fake{}
			addrB, _ := serve(t, b)
			c, failovers := newClient(t, []string{addrA, addrB}, func(cfg *client.Config) { cfg.CallTimeout = 200 * time.Millisecond })
			if err := c.Submit(t.Context(), spec); err != nil {
				t.Fatalf("Submit: %v", err)
			}
			// The spec, with a submission id of its own, the same at every
			// coordinator it was tried at.
			submits, _ := b.seen()
			if len(submits) != 1 {
				t.Fatalf("second coordinator got %d submissions, want 1", len(submits))
			}
			got := proto.Clone(submits[0]).(*pb.JobSpec)
			got.Submission = ""
			if !proto.Equal(got, spec) || submits[0].Submission == "" {
				t.Errorf("second coordinator got %v, want the spec with a submission id", submits)
			}
			if firsts, _ := a.seen(); len(firsts) == 1 && firsts[0].Submission != submits[0].Submission {
				t.Errorf("submission ids %q then %q: a retry must carry the same", firsts[0].Submission, submits[0].Submission)
			}
			if len(*failovers) != 1 || (*failovers)[0].Method != "Submit" || (*failovers)[0].Addr != addrA || !errors.Is((*failovers)[0].Err, client.ErrUnreachable) {
				t.Errorf("failovers = %+v, want one Submit leaving %s with ErrUnreachable", *failovers, addrA)
			}
			if _, err := c.Status(t.Context()); err != nil {
				t.Fatalf("Status: %v", err)
			}
			if n := a.count("Status"); n != 0 || b.count("Status") != 1 {
				t.Errorf("Status went to the coordinator at fault (%d calls) rather than the one that answered", n)
			}
		})
	}
}

// TestRefused: an answer every coordinator would give comes back at once,
// without trying the next.
func TestRefused(t *testing.T) {
	tests := []struct {
		code codes.Code
		want error // nil: no sentinel
	}{
		{codes.InvalidArgument, client.ErrInvalid},
		{codes.AlreadyExists, client.ErrExists},
		{codes.Unauthenticated, client.ErrUnauthenticated},
		{codes.Internal, nil},
	}
	for _, tc := range tests {
		t.Run(tc.code.String(), func(t *testing.T) {
			a := &fake{submitErr: status.Error(tc.code, "refused here")}
			b := &fake{}
			addrA, _ := serve(t, a)
			addrB, _ := serve(t, b)
			c, failovers := newClient(t, []string{addrA, addrB}, nil)
			err := c.Submit(t.Context(), spec)
			if err == nil {
				t.Fatal("Submit succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if errors.Is(err, client.ErrUnreachable) {
				t.Errorf("err = %v is ErrUnreachable", err)
			}
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Addr != addrA || ce.Status.Message() != "refused here" || status.Code(err) != tc.code {
				t.Errorf("err = %#v, want an *Error of %s with the coordinator's message and code %s", err, addrA, tc.code)
			}
			if a.count("Submit") != 1 || b.count("Submit") != 0 || len(*failovers) != 0 {
				t.Errorf("Submit tried %d and %d times, %d failovers; want once at the first", a.count("Submit"), b.count("Submit"), len(*failovers))
			}
		})
	}
}

// TestSubmitUnreachable: Rounds passes over the list, then ErrUnreachable
// with the last coordinator's answer.
func TestSubmitUnreachable(t *testing.T) {
	a := &fake{submitErr: status.Error(codes.Unavailable, "a is down")}
	b := &fake{submitErr: status.Error(codes.Unavailable, "b is down")}
	addrA, _ := serve(t, a)
	addrB, _ := serve(t, b)
	c, failovers := newClient(t, []string{addrA, addrB}, func(cfg *client.Config) { cfg.Rounds = 2 })
	err := c.Submit(t.Context(), spec)
	var ce *client.Error
	if !errors.Is(err, client.ErrUnreachable) || !errors.As(err, &ce) || ce.Addr != addrB || ce.Status.Message() != "b is down" {
		t.Fatalf("err = %v, want ErrUnreachable ending at %s", err, addrB)
	}
	if a.count("Submit") != 2 || b.count("Submit") != 2 || len(*failovers) != 3 {
		t.Errorf("tries %d and %d, %d failovers; want 2, 2 and 3", a.count("Submit"), b.count("Submit"), len(*failovers))
	}
}

// TestUnreachableSays: when no coordinator answers, the error names each
// one with what it met, in a few words: a port that takes connections and
// never answers (within ConnectTimeout), a refused connection; a silent
// coordinator is passed over for one that answers.
func TestUnreachableSays(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var conns []net.Conn // held open, unread, until the listener closes
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	dead := deadAddr(t)
	c, _ := newClient(t, []string{silent.Addr().String(), dead}, func(cfg *client.Config) {
		cfg.ConnectTimeout, cfg.Rounds = 300*time.Millisecond, 2
	})
	_, err = c.Status(t.Context())
	var ue *client.UnreachableError
	want := fmt.Sprintf("no coordinator answered at %s (no answer within 300ms), %s (connection refused)", silent.Addr(), dead)
	if !errors.As(err, &ue) || !errors.Is(err, client.ErrUnreachable) || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
	good := &fake{}
	addr, _ := serve(t, good)
	c, failovers := newClient(t, []string{silent.Addr().String(), addr}, func(cfg *client.Config) { cfg.ConnectTimeout = 300 * time.Millisecond })
	if _, err := c.Status(t.Context()); err != nil || len(*failovers) != 1 || (*failovers)[0].Addr != silent.Addr().String() {
		t.Errorf("Status past a silent coordinator: %v, failovers %v", err, *failovers)
	}
}

// send streams evs in order; it returns the first send error.
func send(stream grpc.ServerStreamingServer[pb.JobEvent], evs ...*pb.JobEvent) error {
	for _, ev := range evs {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

var (
	running   = &pb.JobState{Phase: pb.JobState_RUNNING}
	succeeded = &pb.JobState{Phase: pb.JobState_SUCCEEDED}
)

// follow runs Follow and returns the final state, the error and the
// revisions of the events fn saw. onEvent, if set, runs in fn.
func follow(t *testing.T, ctx context.Context, c *client.Client, onEvent func(*pb.JobEvent) error) (*pb.JobState, []int64, error) {
	t.Helper()
	var revs []int64
	st, err := c.Follow(ctx, "j", func(ev *pb.JobEvent) error {
		revs = append(revs, ev.Revision)
		if onEvent != nil {
			return onEvent(ev)
		}
		return nil
	})
	return st, revs, err
}

// TestFollowResume: a stream that breaks is followed at the next
// coordinator from the revision after the last event delivered.
func TestFollowResume(t *testing.T) {
	tests := []struct {
		name string
		end  error // how the first coordinator's stream ends
		stop bool  // the first coordinator's server stops after event 11
	}{
		{name: "coordinator answers Unavailable", end: status.Error(codes.Unavailable, "etcd watch ended")},
		{name: "stream ends before the job", end: nil},
		{name: "coordinator stops", stop: true},
		{name: "stream breaks with Internal", end: status.Error(codes.Internal, "stream reset")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &fake{follows: []followScript{func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
				if err := send(stream, &pb.JobEvent{State: running, Generation: &pb.Generation{Number: 1}, Revision: 10},
					&pb.JobEvent{Step: &pb.Step{Step: 1}, Revision: 11}); err != nil {
					return err
				}
				if tc.stop {
					<-stream.Context().Done()
					return nil
				}
				return tc.end
			}}}
			b := &fake{follows: []followScript{func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
				return send(stream, &pb.JobEvent{Step: &pb.Step{Step: 2}, Revision: 12}, &pb.JobEvent{State: succeeded, Revision: 13})
			}}}
			addrA, stopA := serve(t, a)
			addrB, _ := serve(t, b)
			c, failovers := newClient(t, []string{addrA, addrB}, nil)
			st, revs, err := follow(t, t.Context(), c, func(ev *pb.JobEvent) error {
				if tc.stop && ev.Revision == 11 {
					stopA()
				}
				return nil
			})
			if err != nil || st.GetPhase() != pb.JobState_SUCCEEDED {
				t.Fatalf("Follow = %v, %v; want SUCCEEDED", st, err)
			}
			if !slices.Equal(revs, []int64{10, 11, 12, 13}) {
				t.Errorf("events of revisions %v, want 10 to 13 once each", revs)
			}
			if got := a.fromRevisions(); !slices.Equal(got, []int64{0}) {
				t.Errorf("first coordinator got from_revision %v, want [0]", got)
			}
			if got := b.fromRevisions(); !slices.Equal(got, []int64{12}) {
				t.Errorf("second coordinator got from_revision %v, want [12]", got)
			}
			if len(*failovers) != 1 || (*failovers)[0].Method != "Follow" || (*failovers)[0].Addr != addrA || errors.Is((*failovers)[0].Err, client.ErrCompacted) {
				t.Errorf("failovers = %+v, want one Follow leaving %s", *failovers, addrA)
			}
		})
	}
}

// TestFollowCompacted: a coordinator that no longer holds the history
// from the revision asked for (OutOfRange) makes Follow start again from
// the job as it is now.
func TestFollowCompacted(t *testing.T) {
	f := &fake{follows: []followScript{
		func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
			if err := send(stream, &pb.JobEvent{State: running, Revision: 5}); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "coordinator shutting down")
		},
		func(*pb.FollowRequest, grpc.ServerStreamingServer[pb.JobEvent]) error {
			return status.Error(codes.OutOfRange, "job j: etcd history before revision 9 is compacted: follow again from now")
		},
		func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
			return send(stream, &pb.JobEvent{State: succeeded, Revision: 20})
		},
	}}
	addr, _ := serve(t, f)
	c, failovers := newClient(t, []string{addr}, nil)
	st, revs, err := follow(t, t.Context(), c, nil)
	if err != nil || st.GetPhase() != pb.JobState_SUCCEEDED {
		t.Fatalf("Follow = %v, %v; want SUCCEEDED", st, err)
	}
	if got := f.fromRevisions(); !slices.Equal(got, []int64{0, 6, 0}) {
		t.Errorf("from_revision %v, want [0 6 0]: resume after 5, then from now", got)
	}
	if !slices.Equal(revs, []int64{5, 20}) {
		t.Errorf("events of revisions %v, want [5 20]", revs)
	}
	if len(*failovers) != 2 || errors.Is((*failovers)[0].Err, client.ErrCompacted) || !errors.Is((*failovers)[1].Err, client.ErrCompacted) {
		t.Errorf("failovers = %+v, want a fault, then ErrCompacted", *failovers)
	}
}

// TestFollowEnds covers the ways Follow ends other than the job's end.
func TestFollowEnds(t *testing.T) {
	errStop := errors.New("enough")
	blockAfterOne := func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
		if err := send(stream, &pb.JobEvent{State: running, Revision: 1}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	tests := []struct {
		name    string
		script  followScript
		timeout time.Duration // FollowTimeout; 0 keeps the default
		cancel  bool          // fn cancels the context
		stop    bool          // fn returns errStop
		want    error
	}{
		{name: "unknown job", want: client.ErrNotFound, script: func(*pb.FollowRequest, grpc.ServerStreamingServer[pb.JobEvent]) error {
			return status.Error(codes.NotFound, `no job "j"`)
		}},
		{name: "no event for FollowTimeout", want: client.ErrUnreachable, timeout: time.Nanosecond, script: func(*pb.FollowRequest, grpc.ServerStreamingServer[pb.JobEvent]) error {
			return status.Error(codes.Unavailable, "down")
		}},
		{name: "context cancelled", want: context.Canceled, cancel: true, script: blockAfterOne},
		{name: "fn fails", want: errStop, stop: true, script: blockAfterOne},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &fake{follows: []followScript{tc.script}}
			b := &fake{}
			addrA, _ := serve(t, a)
			addrB, _ := serve(t, b)
			c, _ := newClient(t, []string{addrA, addrB}, func(cfg *client.Config) {
				if tc.timeout != 0 {
					cfg.FollowTimeout = tc.timeout
				}
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			st, _, err := follow(t, ctx, c, func(*pb.JobEvent) error {
				if tc.cancel {
					cancel()
				}
				if tc.stop {
					return errStop
				}
				return nil
			})
			if st != nil || !errors.Is(err, tc.want) {
				t.Errorf("Follow = %v, %v; want %v", st, err, tc.want)
			}
			if n := b.count("Follow"); n != 0 {
				t.Errorf("Follow went on to the next coordinator (%d streams)", n)
			}
		})
	}
}

// TestFollowQuietFailover: a stream that opened and stayed quiet for
// longer than FollowTimeout, then broke (its coordinator failed over), is
// followed at the next coordinator: the give-up clock runs from the first
// failure in a row, not from the last event.
func TestFollowQuietFailover(t *testing.T) {
	const timeout = 50 * time.Millisecond
	quiet := func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
		if err := stream.SendHeader(metadata.Pairs(pb.FollowOpen, "1")); err != nil {
			return err
		}
		// The job is quiet for longer than the follower's timeout: the
		// time passing is what the test is about.
		time.Sleep(3 * timeout)
		return status.Error(codes.Unavailable, "coordinator stopped")
	}
	ends := func(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
		if err := stream.SendHeader(metadata.Pairs(pb.FollowOpen, "1")); err != nil {
			return err
		}
		return send(stream, &pb.JobEvent{State: succeeded, Revision: 9})
	}
	a, b := &fake{follows: []followScript{quiet}}, &fake{follows: []followScript{ends}}
	addrA, _ := serve(t, a)
	addrB, _ := serve(t, b)
	c, _ := newClient(t, []string{addrA, addrB}, func(cfg *client.Config) { cfg.FollowTimeout = timeout })
	st, _, err := follow(t, t.Context(), c, nil)
	if err != nil || st.GetPhase() != pb.JobState_SUCCEEDED {
		t.Fatalf("Follow = %v, %v: want the job's end from the second coordinator", st, err)
	}
}

// TestCancel: Cancel returns the state the coordinator's answer carries.
func TestCancel(t *testing.T) {
	cancelled := &pb.JobState{Phase: pb.JobState_CANCELLED, Reason: "launch interrupted", ExitCode: 130, FailedRank: -1}
	tests := []struct {
		name    string
		first   *fake
		second  *fake
		want    *pb.JobState
		wantErr error
	}{
		{name: "cancelled", first: &fake{cancelResp: &pb.CancelResponse{State: cancelled}}, want: cancelled},
		{name: "ended first", first: &fake{cancelResp: &pb.CancelResponse{State: succeeded}}, want: succeeded},
		{name: "no state in the answer", first: &fake{cancelResp: &pb.CancelResponse{}}},
		{name: "after a failover", first: &fake{cancelErr: status.Error(codes.Unavailable, "down")},
			second: &fake{cancelResp: &pb.CancelResponse{State: cancelled}}, want: cancelled},
		{name: "unknown job", first: &fake{cancelErr: status.Error(codes.NotFound, `no job "j"`)}, wantErr: client.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.second == nil {
				tc.second = &fake{}
			}
			addrA, _ := serve(t, tc.first)
			addrB, _ := serve(t, tc.second)
			c, _ := newClient(t, []string{addrA, addrB}, nil)
			st, err := c.Cancel(t.Context(), "j", "launch interrupted")
			if !errors.Is(err, tc.wantErr) || !proto.Equal(st, tc.want) {
				t.Fatalf("Cancel = %v, %v; want %v, %v", st, err, tc.want, tc.wantErr)
			}
			if tc.want == nil && st != nil {
				t.Errorf("Cancel = %v, want a nil state", st)
			}
			_, got := tc.first.seen()
			if tc.second.count("Cancel") > 0 {
				_, got = tc.second.seen()
			}
			if len(got) != 1 || got[0].Job != "j" || got[0].Reason != "launch interrupted" {
				t.Errorf("coordinator got %v, want job j with the reason", got)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*client.Config)
		ok     bool
	}{
		{"default with an address", func(*client.Config) {}, true},
		{"no address", func(c *client.Config) { c.Coordinators = nil }, false},
		{"empty address", func(c *client.Config) { c.Coordinators = []string{"127.0.0.1:1", " "} }, false},
		{"no retry interval", func(c *client.Config) { c.RetryInterval = 0 }, false},
		{"no call timeout", func(c *client.Config) { c.CallTimeout = 0 }, false},
		{"no rounds", func(c *client.Config) { c.Rounds = 0 }, false},
		{"no follow timeout", func(c *client.Config) { c.FollowTimeout = 0 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := client.DefaultConfig()
			cfg.Coordinators = []string{"127.0.0.1:1"}
			tc.modify(cfg)
			if err := cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate = %v, want ok %v", err, tc.ok)
			}
			c, err := client.New(cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}

func TestClosed(t *testing.T) {
	c, _ := newClient(t, []string{deadAddr(t)}, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.Submit(t.Context(), spec); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Submit after Close: %v, want ErrClosed", err)
	}
	if _, err := c.Follow(t.Context(), "j", nil); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Follow after Close: %v, want ErrClosed", err)
	}
}
