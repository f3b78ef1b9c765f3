package client

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Config configures a Client. Start from DefaultConfig, set Coordinators
// and override fields.
type Config struct {
	// Coordinators are the addresses (host:port) of the cluster's
	// coordinators. A call starts at the one that answered last and moves
	// to the next when one fails.
	Coordinators []string
	// Credentials are what the client shows coordinators: mutual TLS with
	// a client identity (see the join token commands), or nil for a
	// coordinator on loopback that serves plaintext.
	Credentials credentials.TransportCredentials
	// ConnectTimeout is how long a coordinator is given to answer a
	// connection (TCP, TLS and gRPC's preface); one that has not is passed
	// over for the next.
	ConnectTimeout time.Duration
	// RetryInterval is the first pause before a call tries the coordinators
	// again after a whole pass failed; it doubles at each pass (at most
	// MaxRetryInterval), with jitter.
	RetryInterval time.Duration
	// CallTimeout bounds one attempt of a unary call (Submit, Cancel,
	// Status) at one coordinator.
	CallTimeout time.Duration
	// Rounds is how many passes over Coordinators a unary call makes
	// before it gives up with ErrUnreachable.
	Rounds int
	// FollowTimeout is how long Follow goes on trying coordinators after
	// the last event it received; a stream that breaks later than that
	// ends Follow with ErrUnreachable.
	FollowTimeout time.Duration
	// OnFailover, if set, is called each time a call leaves a coordinator
	// for the next one; see Failover. It runs on the goroutine making the
	// call, before the retry, and should return quickly.
	OnFailover func(Failover)
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns settings for a real cluster; Coordinators is left
// for the caller to set.
func DefaultConfig() *Config {
	return &Config{ConnectTimeout: pb.DefaultConnectTimeout, RetryInterval: 200 * time.Millisecond, CallTimeout: 10 * time.Second, Rounds: 3,
		FollowTimeout: time.Minute}
}

// MaxRetryInterval bounds the pause between two passes over the
// coordinators.
const MaxRetryInterval = 5 * time.Second

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	if len(c.Coordinators) == 0 {
		return errors.New("no coordinator address")
	}
	for i, a := range c.Coordinators {
		if strings.TrimSpace(a) == "" {
			return fmt.Errorf("coordinator address %d of %d is empty", i+1, len(c.Coordinators))
		}
	}
	switch {
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("connect timeout %s: want a positive timeout", c.ConnectTimeout)
	case c.RetryInterval <= 0:
		return fmt.Errorf("retry interval %s: want a positive pause", c.RetryInterval)
	case c.CallTimeout <= 0:
		return fmt.Errorf("call timeout %s: want a positive timeout", c.CallTimeout)
	case c.Rounds < 1:
		return fmt.Errorf("rounds %d: want at least one pass over the coordinators", c.Rounds)
	case c.FollowTimeout <= 0:
		return fmt.Errorf("follow timeout %s: want a positive timeout", c.FollowTimeout)
	}
	return nil
}

// Failover is a call leaving a coordinator for the next, as reported to
// Config.OnFailover.
type Failover struct {
	// Method is the call: "Submit", "Follow", "Cancel" or "Status".
	Method string
	// Addr is the coordinator the call leaves.
	Addr string
	// Err is why, an *Error: a fault of this coordinator, or for Follow a
	// stream that broke or ended before the job did. errors.Is(Err,
	// ErrCompacted) means the coordinator could not resume from the last
	// revision seen: the next stream starts from the job as it is now, and
	// the events in between are not delivered.
	Err error
}
