package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/backoff"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Client is the Go API of a cluster's coordinators. It is safe for
// concurrent use by several goroutines.
type Client struct {
	cfg   Config
	log   *slog.Logger
	conns []*grpc.ClientConn
	rpcs  []pb.CoordinatorClient
	// last is the index of the coordinator that answered last: where the
	// next call starts.
	last   atomic.Int64
	closed atomic.Bool
}

// New validates cfg and returns a Client of its coordinators. It connects
// lazily: an unreachable coordinator is found by the first call. Close it
// when done.
func New(cfg *Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Client{cfg: *cfg, log: cfg.Logger}
	c.cfg.Coordinators = slices.Clone(cfg.Coordinators)
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("component", "client")
	for _, addr := range c.cfg.Coordinators {
		cc, err := pb.Dial(addr, cfg.Credentials, cfg.ConnectTimeout)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("coordinator %q: %w", addr, err)
		}
		c.conns = append(c.conns, cc)
		c.rpcs = append(c.rpcs, pb.NewCoordinatorClient(cc))
	}
	return c, nil
}

// Close closes the connections. Calls in flight fail; later calls return
// ErrClosed. Closing twice is harmless.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// Submit submits a job. A coordinator's refusal comes back at once: an
// *Error wrapping ErrInvalid for a spec it cannot run, ErrExists for an id
// already taken, ErrUnauthenticated for a wrong token. It returns
// ErrUnreachable when no coordinator answered, and ctx.Err() when ctx
// ends first.
//
// A Submit that timed out at one coordinator may still have been applied
// there: its retry at the next then reports ErrExists.
func (c *Client) Submit(ctx context.Context, spec *pb.JobSpec) error {
	_, err := c.SubmitJob(ctx, spec)
	return err
}

// SubmitJob is Submit returning the coordinator's answer: the URL of its
// dashboard, when it serves one (SubmitResponse.dashboard).
func (c *Client) SubmitJob(ctx context.Context, spec *pb.JobSpec) (*pb.SubmitResponse, error) {
	if spec.GetSubmission() == "" {
		// A retry after a lost answer finds this submission's own job.
		var id [8]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, fmt.Errorf("submission id: %w", err)
		}
		spec = proto.Clone(spec).(*pb.JobSpec)
		spec.Submission = hex.EncodeToString(id[:])
	}
	var resp *pb.SubmitResponse
	err := c.call(ctx, "Submit", func(ctx context.Context, rpc pb.CoordinatorClient) error {
		var err error
		resp, err = rpc.Submit(ctx, &pb.SubmitRequest{Spec: spec})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Cancel stops a job, giving reason, and returns the job's state after the
// call: CANCELLED, or the end the job had already reached. A coordinator
// that reports no state yields a nil state and no error. An unknown job is
// an *Error wrapping ErrNotFound; the other errors are Submit's.
func (c *Client) Cancel(ctx context.Context, job, reason string) (*pb.JobState, error) {
	var st *pb.JobState
	err := c.call(ctx, "Cancel", func(ctx context.Context, rpc pb.CoordinatorClient) error {
		resp, err := rpc.Cancel(ctx, &pb.CancelRequest{Job: job, Reason: reason})
		st = resp.GetState()
		return err
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// Status returns the pool, the jobs and the leader. Its errors are
// Submit's.
func (c *Client) Status(ctx context.Context) (*pb.StatusResponse, error) {
	var resp *pb.StatusResponse
	err := c.call(ctx, "Status", func(ctx context.Context, rpc pb.CoordinatorClient) error {
		var err error
		resp, err = rpc.Status(ctx, &pb.StatusRequest{})
		return err
	})
	return resp, err
}

// Follow calls fn with each event of job, in order, until the job ends,
// and returns its final state. The first event has the job as it is now;
// later ones only what changed (pb.JobEvent).
//
// When a stream breaks, Follow moves to the next coordinator and resumes
// after the last revision it delivered (FollowRequest.from_revision), so
// no event is repeated or lost: the coordinator sends everything one etcd
// revision changed (a generation and its state) as one event.
// When the history from that revision is compacted, it follows again from the job as it is
// now (reported to Config.OnFailover with ErrCompacted): the events in
// between are not delivered. It gives up with ErrUnreachable when streams
// have kept failing for Config.FollowTimeout (counted from the first
// failure in a row; a stream that opens starts the count again: a quiet
// job's follower rides out a failover however long the job has been
// quiet), and stops at once
// on a refusal every coordinator would give (an *Error wrapping
// ErrNotFound or ErrUnauthenticated).
//
// fn runs on the calling goroutine, one event at a time; it may be nil. If
// it returns an error, Follow stops and returns that error. When ctx ends,
// Follow returns ctx.Err().
func (c *Client) Follow(ctx context.Context, job string, fn func(*pb.JobEvent) error) (*pb.JobState, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	f := &follow{job: job, fn: fn}
	for i := c.first(); ; i = (i + 1) % len(c.rpcs) {
		attempt := time.Now()
		f.opened = false
		end, broke, err := c.followAt(ctx, i, f)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, err
		case end != nil:
			return end, nil
		case c.closed.Load():
			return nil, ErrClosed
		case errors.Is(broke, ErrCompacted):
			f.rev = 0
			c.failover("Follow", broke)
			continue
		case refusal(broke.Status.Code()):
			return nil, broke
		}
		if f.failing.IsZero() {
			// The first failure in a row: of this attempt, or of a stream
			// that was open until now.
			f.failing = attempt
			if f.opened {
				f.failing = time.Now()
			}
		}
		if time.Since(f.failing) > c.cfg.FollowTimeout {
			return nil, fmt.Errorf("%w for %s at %s: %w", ErrUnreachable, c.cfg.FollowTimeout, strings.Join(c.cfg.Coordinators, ","), broke)
		}
		c.failover("Follow", broke)
		if err := c.pause(ctx, 0); err != nil {
			return nil, err
		}
	}
}

// follow is where a Follow call stands.
type follow struct {
	job     string
	fn      func(*pb.JobEvent) error
	rev     int64        // where the next stream starts; 0 is now
	state   *pb.JobState // the job's state as last reported
	failing time.Time    // when the streams began to fail, in a row; zero while one is open
	opened  bool         // the current stream opened
}

// followAt reads one Follow stream from coordinator i. It returns the
// final state once the job has ended, the fault or refusal that ended the
// stream, or fn's error.
func (c *Client) followAt(ctx context.Context, i int, f *follow) (*pb.JobState, *Error, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpcs[i].Follow(ctx, &pb.FollowRequest{Job: f.job, FromRevision: f.rev})
	if err != nil {
		return nil, c.errorAt(i, err), nil
	}
	// The coordinator answers with the stream's headers once it has taken
	// the job (a job that does not exist ends the stream without them).
	md, err := stream.Header()
	if err != nil {
		return nil, c.errorAt(i, err), nil
	}
	if len(md.Get(pb.FollowOpen)) > 0 {
		f.failing, f.opened = time.Time{}, true
	}
	for {
		ev, err := stream.Recv()
		if err == io.EOF {
			// The coordinator closed the stream before the job ended.
			return nil, &Error{Addr: c.cfg.Coordinators[i], Status: status.New(codes.Unavailable, err.Error())}, nil
		}
		if err != nil {
			return nil, c.errorAt(i, err), nil
		}
		c.last.Store(int64(i))
		f.failing, f.rev = time.Time{}, ev.Revision+1
		if ev.State != nil {
			f.state = ev.State
		}
		if f.fn != nil {
			if err := f.fn(ev); err != nil {
				return nil, nil, err
			}
		}
		if pb.Terminal(f.state) {
			return f.state, nil, nil
		}
	}
}

// call runs a unary RPC, starting at the coordinator that answered last
// and moving to the next after a fault, for Config.Rounds passes with a
// growing pause between passes. When none answered, the error is an
// *UnreachableError saying what each one's last attempt met.
func (c *Client) call(ctx context.Context, method string, rpc func(context.Context, pb.CoordinatorClient) error) error {
	if c.closed.Load() {
		return ErrClosed
	}
	n, first := len(c.rpcs), c.first()
	var last *Error
	faults := make([]string, n)
	for a := range c.cfg.Rounds * n {
		if a > 0 {
			c.failover(method, last)
		}
		if a > 0 && a%n == 0 {
			if err := c.pause(ctx, a/n-1); err != nil {
				return err
			}
		}
		i := (first + a) % n
		actx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		err := rpc(actx, c.rpcs[i])
		cancel()
		if err == nil {
			c.last.Store(int64(i))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if c.closed.Load() {
			return ErrClosed
		}
		if last = c.errorAt(i, err); !unaryFault(last.Status.Code()) {
			c.last.Store(int64(i)) // it answered
			return last
		}
		faults[i] = describe(last.Status, c.cfg.ConnectTimeout, c.cfg.CallTimeout)
	}
	return &UnreachableError{Addrs: c.cfg.Coordinators, Faults: faults, Last: last}
}

// first is the index of the coordinator a call starts at.
func (c *Client) first() int { return int(c.last.Load()) }

// errorAt wraps the error of a call to coordinator i.
func (c *Client) errorAt(i int, err error) *Error {
	return &Error{Addr: c.cfg.Coordinators[i], Status: status.Convert(err)}
}

// failover reports a call leaving the coordinator of err.
func (c *Client) failover(method string, err *Error) {
	c.log.Info("coordinator failed; trying the next", "method", method, "coordinator", err.Addr, "err", err.Status.Message())
	if c.cfg.OnFailover != nil {
		c.cfg.OnFailover(Failover{Method: method, Addr: err.Addr, Err: err})
	}
}

// pause waits before retry number attempt (backoff from
// Config.RetryInterval), or until ctx ends.
func (c *Client) pause(ctx context.Context, attempt int) error {
	t := time.NewTimer(backoff.Next(attempt, c.cfg.RetryInterval, MaxRetryInterval))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
