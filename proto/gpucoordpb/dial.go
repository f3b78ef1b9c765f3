package gpucoordpb

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// Dial returns a client connection to a coordinator over creds (nil:
// plaintext, for a coordinator on loopback). It connects lazily; the first
// call reports an unreachable address. A connection attempt that has not
// been answered (TCP, TLS and the HTTP/2 preface) within connectTimeout
// fails (0: DefaultConnectTimeout), and attempts are spaced by an
// exponential backoff with jitter of at most MaxReconnectDelay.
func Dial(addr string, creds credentials.TransportCredentials, connectTimeout time.Duration) (*grpc.ClientConn, error) {
	return dial(addr, creds, connectTimeout, KeepaliveTime)
}

// DialAgent is Dial for a node's agent, whose connection is pinged only
// after AgentKeepaliveTime without a read: its Watch stream brings a
// message every heartbeat (Assignment.heartbeat_ms), and the agent ends a
// stream silent for KeepaliveTimeout more. A coordinator of 16,384 agents
// pinged every 2 s answered 6,500 pings a second.
func DialAgent(addr string, creds credentials.TransportCredentials, connectTimeout time.Duration) (*grpc.ClientConn, error) {
	return dial(addr, creds, connectTimeout, AgentKeepaliveTime)
}

func dial(addr string, creds credentials.TransportCredentials, connectTimeout, keepaliveTime time.Duration) (*grpc.ClientConn, error) {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	if connectTimeout <= 0 {
		connectTimeout = DefaultConnectTimeout
	}
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = 100*time.Millisecond, MaxReconnectDelay
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: connectTimeout}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true}),
		// A large job's assignment (about 36 bytes a member: 72 KB at
		// 2,048 nodes) fits the first window: without this, every agent's
		// first one waits a window update round trip behind gRPC's 64 KB.
		grpc.WithInitialWindowSize(WindowSize), grpc.WithInitialConnWindowSize(WindowSize),
		grpc.WithWriteBufferSize(WriteBufferSize))
}

// DefaultConnectTimeout is how long a coordinator is given to answer a
// connection by default (every command's --connect-timeout).
const DefaultConnectTimeout = 10 * time.Second

// MaxReconnectDelay bounds the pause between two connection attempts to a
// coordinator, so that one that comes back is found within seconds.
const MaxReconnectDelay = 5 * time.Second

// KeepaliveTime and KeepaliveTimeout are a client's gRPC keepalives
// (Dial): a connection idle for KeepaliveTime is pinged, and one whose ping
// is not answered within KeepaliveTimeout is closed, failing its calls, so
// that a peer cut off from the network is noticed in seconds rather than
// when TCP's retransmissions give up.
const (
	KeepaliveTime    = 2 * time.Second
	KeepaliveTimeout = 2 * time.Second
)

// AgentKeepaliveTime is how long an agent's connection, and the
// coordinator's end of every connection, goes without a read before it is
// pinged. Both ends still give up on data unacknowledged for
// KeepaliveTimeout (TCP_USER_TIMEOUT, which gRPC sets with the
// keepalives): a coordinator writes on each Watch stream at least every
// heartbeat, so a node cut off is noticed by its next message, not by a
// ping.
const AgentKeepaliveTime = 30 * time.Second

// WindowSize is the HTTP/2 flow-control window a client opens per stream
// and per connection.
const WindowSize = 1 << 20

// WriteBufferSize is both ends' buffer for the frames of one write. gRPC
// takes it from a pool for each write and gives it back at the flush;
// with its default of 32 KB a coordinator of 16,384 agents, whose writes
// are mostly renewals and pings of tens of bytes, allocated 100 MB a
// second of buffers (the pool is emptied by each collection), and its
// collections stalled it for a second at a time. A larger message goes
// out in several system calls.
const WriteBufferSize = 4 << 10

// ServerOptions are the coordinator's gRPC server options that go with
// Dial's and DialAgent's: it pings a client only after AgentKeepaliveTime
// without a read (Dial's clients ping it first), and lets clients ping as
// often as KeepaliveTime.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: AgentKeepaliveTime, Timeout: KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.WriteBufferSize(WriteBufferSize),
	}
}

// FollowOpen is the header a coordinator sends on a Follow stream once it
// has taken the job: the stream is open, though no event may come for a
// while (a quiet job followed from a revision).
const FollowOpen = "gpucoord-follow-open"
