package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// server implements the Coordinator service over etcd. Every coordinator
// serves it, leader or not: each call reads or writes etcd, and Watch and
// Follow translate etcd watches.
type server struct {
	pb.UnimplementedCoordinatorServer
	// longerLeases says once that etcd grants longer leases than asked.
	longerLeases sync.Once
	cli          *clientv3.Client
	k            keys
	cfg          *Config
	log          *slog.Logger
	// stopping is closed when the coordinator shuts down: streams that end
	// then are not the agents' loss.
	stopping <-chan struct{}
	// keepalive observes the latency of a lease renewal, in seconds.
	keepalive func(float64)
	// health says whether etcd is reachable; while it is not, calls fail
	// and streams end (Unavailable).
	health *health
	// cache is this coordinator's view of etcd: Watch, Status and Follow
	// read it.
	cache *cache
	// streams numbers Watch streams, to name each one's connection key.
	streams atomic.Int64
	hooks   *hooks
	// times buffers the compute times reported here until they are
	// written.
	times *timesBuffer
	// background holds the writes streams leave behind when they end, and
	// the groups of stored records being written.
	background sync.WaitGroup
	// stored writes the Stored reports in groups.
	stored  *storedWriter
	stopped *stoppedWriter
	conns   *connWriter
	// gossip is the pools' keys and the cluster's label, handed to agents
	// at Register (each domain's pool has its own label, gossip.DomainLabel).
	gossip gossip.Secure
	// deaths gathers the deaths the agents' pools report (PoolReport), and
	// dead takes those to act on, to revokeDead.
	deaths *deathReports
	dead   chan<- deathKey
	// renewals are the lease renewals sent on this coordinator's streams
	// (the dashboard's).
	renewals *renewals
	// grants are the deadlines this coordinator's streams gave, for a
	// fence by the window (Config.FenceWindow).
	grants *grants
	// secure says the coordinator serves mutual TLS: every call but Join
	// has a verified identity, and a node's calls are held to its own node.
	secure bool
	// ca signs what Join issues; nil when this coordinator cannot.
	ca *pki.CA
	// relayWait is how long a member's stream leaves an assignment to its
	// relay (relayWait); relayFallbacks counts those it then sent itself.
	relayWait      time.Duration
	relayFallbacks atomic.Int64
	// relayedSent counts the assignments relays' messages carried.
	relayedSent atomic.Int64
}

func (s *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := s.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	if s.health.isDown() {
		return nil, errEtcdDown
	}
	return h(ctx, req)
}

func (s *server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return s.health.guardStream(srv, identityStream{ss, ctx}, h)
}

// identityStream is a stream whose context carries the caller's identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s identityStream) Context() context.Context { return s.ctx }

// etcdErr turns an etcd failure into a gRPC status.
func etcdErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Unavailable, "etcd: %v", err)
}

// peerHost is the host a call came from, or "" when unknown.
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(p.Addr.String())
	if err != nil {
		return ""
	}
	return host
}

// Register implements pb.CoordinatorServer.
func (s *server) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	n := req.GetNode()
	if n.GetProtocol() != pb.ProtocolVersion {
		return nil, status.Errorf(codes.FailedPrecondition, "agent %q speaks protocol %d (version %s); this coordinator speaks %d: run the same gpucoord version on every node",
			n.GetName(), n.GetProtocol(), n.GetVersion(), pb.ProtocolVersion)
	}
	if err := validNodeName(n.GetName()); err != nil {
		return nil, err
	}
	if err := s.asNode(ctx, n.GetName()); err != nil {
		return nil, err
	}
	switch {
	case n.GetGpus() < 1:
		return nil, status.Errorf(codes.InvalidArgument, "node %q: %d GPUs: want at least 1", n.GetName(), n.GetGpus())
	case len(n.GetNvlinkDomain()) > 253 || len(n.GetFailureDomain()) > 253:
		return nil, status.Errorf(codes.InvalidArgument, "node %q: an NVLink or failure domain name longer than 253 bytes", n.GetName())
	case n.GetHost() == "":
		return nil, status.Errorf(codes.InvalidArgument, "node %q: no host address", n.GetName())
	}
	if err := checkGossipAddr(n); err != nil {
		return nil, err
	}
	if from := peerHost(ctx); IsLoopback(n.GetHost()) && from != "" && !IsLoopback(from) {
		return nil, status.Errorf(codes.InvalidArgument, "node %q advertises %s, a loopback address, but connects from %s: other nodes could not reach it (start the worker without --advertise-addr, or give its --iface)",
			n.GetName(), n.GetHost(), from)
	}
	n = proto.Clone(n).(*pb.Node)
	n.RegisteredUnixMs = time.Now().UnixMilli()
	ttl := int64(s.cfg.LeaseTTL / time.Second)
	lease, err := s.cli.Grant(ctx, ttl)
	if err != nil {
		return nil, etcdErr(err)
	}
	if lease.TTL > ttl {
		s.longerLeases.Do(func() {
			s.log.Warn("etcd grants leases longer than --lease-ttl: its shortest lease is 1.5 elections (--election-timeout), in whole seconds", "asked", s.cfg.LeaseTTL, "granted", time.Duration(lease.TTL)*time.Second)
		})
	}
	key := s.k.node(n.Name)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encode(n), clientv3.WithLease(lease.ID))).
		Commit()
	if err != nil {
		s.cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		return nil, etcdErr(err)
	}
	if !resp.Succeeded {
		s.cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		return nil, status.Errorf(codes.AlreadyExists, "a node named %q is already registered and alive: give this agent another --name", n.Name)
	}
	s.log.Info("node registered", "node", n.Name, "host", n.Host, "gpus", n.Gpus)
	return &pb.RegisterResponse{LeaseId: int64(lease.ID), TtlSeconds: ttl, Gossip: s.gossipFor(n)}, nil
}

// checkGossipAddr refuses a gossip address that is not a port on the
// node's own host: the coordinators hand it to the node's domain as a seed
// to connect to.
func checkGossipAddr(n *pb.Node) error {
	a := n.GetGossipAddr()
	if a == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(a)
	if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 1 || p > 65535 || host != n.GetHost() {
		return status.Errorf(codes.InvalidArgument, "node %q: gossip address %q: want host:port on its host %s", n.GetName(), a, n.GetHost())
	}
	return nil
}

// catchUp waits, a third of a lease at most, for the view to reach the
// revision an agent's last assignment came from, so that a stream never
// goes back in time. A view that does not get there in time ends the
// stream (Unavailable: the agent tries another coordinator while its
// lease holds); a revision ahead of etcd's own is another etcd cluster's
// (OutOfRange: the agent watches afresh).
func (s *server) catchUp(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.LeaseTTL/3)
	err := s.cache.waitRev(wctx, rev)
	cancel()
	if err == nil || ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	resp, gerr := s.cli.Get(ctx, string(s.k), clientv3.WithCountOnly())
	if gerr != nil {
		return etcdErr(gerr)
	}
	if resp.Header.Revision < rev {
		return status.Errorf(codes.OutOfRange, "revision %d is ahead of etcd's %d: another etcd cluster; watch afresh", rev, resp.Header.Revision)
	}
	return status.Errorf(codes.Unavailable, "this coordinator's view of etcd is behind revision %d: try another", rev)
}

// validNodeName refuses a name no node may have: pb.CheckNodeName's rule.
func validNodeName(name string) error {
	if err := pb.CheckNodeName(name); err != nil {
		return status.Errorf(codes.InvalidArgument, "node name %q: %s", name, pb.NodeNameRule)
	}
	return nil
}

// leaseHolder is the instance of node's agent when lease is the node's
// lease now: from the cache when it agrees, else from etcd (the cache may
// not have the registration yet). A lease that is not the node's is
// refused (NotFound when the node is not registered).
func (s *server) leaseHolder(ctx context.Context, node string, lease clientv3.LeaseID) (string, error) {
	if have, instance, ok := s.cache.nodeLease(node); ok && have == int64(lease) {
		return instance, nil
	}
	resp, err := s.cli.Get(ctx, s.k.node(node))
	if err != nil {
		return "", etcdErr(err)
	}
	if len(resp.Kvs) == 0 {
		return "", status.Errorf(codes.NotFound, "node %q is not registered: register again", node)
	}
	if clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return "", status.Errorf(codes.PermissionDenied, "lease %x is not node %q's", int64(lease), node)
	}
	n := &pb.Node{}
	if err := decode(resp.Kvs[0].Value, n); err != nil {
		return "", status.Errorf(codes.Internal, "node %s: %v", node, err)
	}
	return n.Instance, nil
}

// ownLease refuses a lease that is not node's: its key's lease in etcd.
func (s *server) ownLease(ctx context.Context, node string, lease clientv3.LeaseID) error {
	if !s.secure {
		return nil
	}
	resp, err := s.cli.Get(ctx, s.k.node(node))
	if err != nil {
		return etcdErr(err)
	}
	if len(resp.Kvs) == 0 {
		return status.Errorf(codes.NotFound, "node %q is not registered: register again", node)
	}
	if clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return status.Errorf(codes.PermissionDenied, "lease %x is not node %q's", int64(lease), node)
	}
	return nil
}

// Watch implements pb.CoordinatorServer. The node's lease is kept alive
// while the stream is open, and every renewal is sent to the agent (a
// renewal message with the lease's TTL, or the fence window when shorter,
// which then also comes every third of the window) so that the agent knows
// how long its ranks may run without another. Assignments come from this
// coordinator's cache: a stream wakes when the cache changes, never reads
// etcd itself. While the stream is open the node's connection key says so;
// a stream that drops leaves the node in the pool, disconnected, until its
// lease ends (an agent that comes back in time keeps its place).
func (s *server) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.Assignment]) error {
	ctx := stream.Context()
	node, lease := req.GetNode(), clientv3.LeaseID(req.GetLeaseId())
	if err := s.asNode(ctx, node); err != nil {
		return err
	}
	if err := s.ownLease(ctx, node, lease); err != nil {
		return err
	}
	// The agent's earlier streams of this run ended before start, and the
	// lease's first renewal is no older than it.
	start := time.Now()
	renewed := start
	// The lease is kept alive from here on, before any wait: a view that
	// is slow to catch up costs the stream, never the node's lease. Its
	// first renewal (on the etcd client's one keep-alive stream, within
	// half a second: no stream of its own per Watch) says it lives.
	kctx, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	renewals, err := s.cli.KeepAlive(kctx, lease)
	if err != nil {
		return etcdErr(err)
	}
	var first *clientv3.LeaseKeepAliveResponse
	wait := time.NewTimer(2 * s.cfg.LeaseTTL / 3)
	select {
	case r, ok := <-renewals:
		if !ok {
			// The etcd client closes the channel when etcd answers that
			// the lease is gone.
			wait.Stop()
			return status.Errorf(codes.NotFound, "node %q: lease %x is gone: register again", node, req.GetLeaseId())
		}
		first = r
	case <-wait.C:
	case <-ctx.Done():
		wait.Stop()
		return status.FromContextError(ctx.Err()).Err()
	}
	wait.Stop()
	if first == nil {
		return status.Errorf(codes.Unavailable, "node %q: no renewal of lease %x within %s", node, req.GetLeaseId(), 2*s.cfg.LeaseTTL/3)
	}
	if err := s.catchUp(ctx, req.GetFromRevision()); err != nil {
		return err
	}
	id := fmt.Sprintf("%s/%d", s.cfg.Name, s.streams.Add(1))
	conn := connValue(req.GetSession(), id)
	if werr, err := s.conns.add(ctx, struct{}{}, node, connItem{id: id, session: req.GetSession(), lease: lease}); err != nil {
		return err
	} else if werr != nil {
		return werr
	}
	defer func() {
		if ctx.Err() == nil {
			return // this coordinator ended the stream: the agent's next one takes the key over
		}
		// The agent went away: the node is disconnected. Only this
		// stream's key is marked closed (the agent may be on another
		// stream already; a later one's session still wins over it), and
		// not on this stream's time: the handler returns at once.
		s.background.Add(1)
		go func() {
			defer s.background.Done()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			resp, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.Value(s.k.conn(node)), "=", conn)).Then(clientv3.OpPut(s.k.conn(node), conn+connClosed, clientv3.WithLease(lease))).Commit()
			if err == nil && resp.Succeeded {
				s.log.Info("node disconnected: it keeps its place until its lease ends", "node", node)
			}
		}()
	}()
	// What the stream gives the run from here on (grants) is what a fence
	// by the stream waits out: each deadline is recorded before it is
	// sent, and none is given once the grant is stopped. The run's earlier
	// streams gave what the agent says is left (no grant is longer than
	// the lease: an agent's word is not taken for more, nor the fence
	// held back by it).
	leaseTTL := time.Duration(first.TTL) * time.Second
	before := min(max(time.Duration(req.GetDeadlineLeftMs())*time.Millisecond, 0), leaseTTL)
	// A relay's stream that ends wakes its block's sleeping streams, once
	// its grant is closed (this defer runs after close's).
	defer s.wakeBlock(node)
	g := s.grants.open(node, conn, req.GetSession(), lease, start.Add(before), renewed, leaseTTL)
	defer s.grants.close(node, g, 2*leaseTTL)
	give := func(now time.Time) (ttlMs int64, ok bool) {
		ttl, ok := g.renewal(s.cfg.FenceWindow, now)
		return ttl.Milliseconds(), ok
	}
	a, _, changed := s.cache.assignment(node)
	if s.hooks.watchRead != nil {
		s.hooks.watchRead(node)
	}
	// The first message says how often the stream brings one (the agent
	// takes a stream silent for longer, and a margin, for this
	// coordinator gone); a quiet timer keeps that promise while etcd's
	// renewals are late.
	beat := heartbeat(leaseTTL)
	now := time.Now()
	ttlMs, ok := give(now)
	if !ok {
		ttlMs = 0
	}
	if err := stream.Send(firstMessage(a, ttlMs, now, beat, g.key)); err != nil {
		return err
	}
	s.renewals.sent(node, renewed, first.TTL*1000)
	last := a
	quiet := time.NewTimer(beat)
	defer quiet.Stop()
	// send sends m on the stream and counts the heartbeat from it.
	send := func(m any) error {
		quiet.Reset(beat)
		return stream.SendMsg(m)
	}
	// With a fence window, the stream renews the node at its turns
	// (windowLoop: every third of the window, while the node runs a job
	// and no relay renews it) between the lease's renewals, and a relay's
	// stream its block's members too.
	renew := func(now time.Time, relayed []*pb.RelayedRenewal) error {
		ttlMs, ok := give(now)
		if !ok && len(relayed) == 0 {
			return nil
		}
		return send(&pb.Assignment{Renewal: true, LeaseTtlMs: ttlMs, SentUnixNanos: now.UnixNano(), Revision: last.Revision, RelayedRenewals: relayed})
	}
	// The client renews every third of the TTL etcd granted (an etcd
	// cluster's shortest lease may be longer than --lease-ttl): two thirds
	// without a renewal means this coordinator cannot reach etcd for it,
	// and the agent should move to one that can before the lease runs
	// out (stallAfter).
	stall := func(ttl int64) time.Duration {
		return max(stallAfter(time.Duration(ttl)*time.Second), stallAfter(s.cfg.LeaseTTL))
	}
	stalled := time.NewTimer(stall(first.TTL))
	defer stalled.Stop()
	// sendAssignment sends a, changed, whose wire form is wire, on the
	// stream: a relay's with its block's members' (relayedAssignments).
	sendAssignment := func(a *pb.Assignment, wire encoded) error {
		last = a
		now := time.Now()
		if s.cfg.FenceWindow > 0 && a.Job != "" {
			// A node given a job gets its first window deadline with
			// it: without one, it gets none until its relay's next.
			if ttlMs, ok := give(now); ok {
				wire = wire.withRenewal(ttlMs, now)
			}
		}
		if rs := s.relayedAssignments(node, now); len(rs) > 0 {
			wire = wire.withRelayed(rs)
		}
		return send(wire)
	}
	// asleep, while the node's relay carries its job's changes, is what
	// the stream waits on instead of every change: its route's change
	// (relayassign.go). known says the stream knows what the node holds
	// (last): after a sleep it does not.
	var asleep <-chan struct{}
	known := true
	// look looks at the node's assignment after a change, or late: its
	// relay did not deliver it in time, or its relay's stream here ended.
	look := func(late bool) error {
		if s.hooks.looked != nil {
			s.hooks.looked(node)
		}
		relay, waits, moved, next := s.cache.memberRoute(node)
		changed = next
		// It sleeps only while it leaves its changes to a relay (and
		// relaySweep wakes only streams that sleep).
		relayed := relay != "" && s.grants.live(relay) != nil
		var sleep <-chan struct{}
		if relayed {
			sleep = moved
		}
		defer func() {
			asleep = sleep
			g.asleep.Store(sleep != nil)
			known = known && sleep == nil
		}()
		if waits {
			return nil
		}
		a, wire, next := s.cache.assignment(node)
		changed = next
		var holds *pb.Assignment
		if known {
			holds = last
		}
		switch onChange(a, holds, g.delivered.Load(), relayed && !late) {
		case changeNone, changeToRelay:
		case changeDelivered:
			last, known = a, true
		case changeSend:
			if late && relay != "" {
				s.relayFallbacks.Add(1)
				s.log.Info("assignment sent on the node's own stream: its relay reported no delivery in time", "node", node, "relay", relay, "job", a.Job, "revision", a.Revision)
			}
			known = true
			return sendAssignment(a, wire)
		}
		return nil
	}
	for {
		wake := changed
		if asleep != nil {
			wake = asleep
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return status.Error(codes.Unavailable, "coordinator shutting down")
		case <-stalled.C:
			s.log.Warn("cannot renew a node's lease: ending its stream so that it moves to another coordinator", "node", node, "since", renewed.Format(time.RFC3339Nano))
			return status.Errorf(codes.Unavailable, "this coordinator cannot renew lease %x: no renewal since %s", req.GetLeaseId(), renewed.Format(time.RFC3339Nano))
		case r, ok := <-renewals:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return status.Errorf(codes.NotFound, "node %q: lease %x expired: register again", node, req.GetLeaseId())
			}
			now := time.Now()
			stalled.Reset(stall(r.TTL))
			if s.keepalive != nil {
				s.keepalive(now.Sub(renewed).Seconds())
			}
			renewed = now
			g.leaseRenewed(now, time.Duration(r.TTL)*time.Second)
			if s.hooks.dropRenewal != nil && s.hooks.dropRenewal(node) {
				continue
			}
			if err := renew(now, nil); err != nil {
				return err
			}
			s.renewals.sent(node, now, r.TTL*1000)
		case <-quiet.C:
			// etcd's renewal is late: the agent hears the coordinator
			// serves it still (the stall above ends the stream if etcd
			// stays away).
			if err := send(&pb.Assignment{Renewal: true, Revision: last.Revision}); err != nil {
				return err
			}
		case t := <-g.tick:
			if err := renew(t.now, s.relayedRenewals(t.relayed, t.now)); err != nil {
				return err
			}
		case <-wake:
			if err := look(false); err != nil {
				return err
			}
		case <-g.late:
			if err := look(true); err != nil {
				return err
			}
		}
	}
}

// heartbeat is the longest a Watch stream of a lease of ttl goes without
// a message while its coordinator serves it (Assignment.heartbeat_ms):
// etcd's client renews a lease a third of its TTL after the last renewal,
// looking every half second, and the stream sends each renewal on.
func heartbeat(ttl time.Duration) time.Duration { return ttl/3 + heartbeatSlack }

// heartbeatSlack is the half second etcd's client may take past a third
// of the TTL, and a tenth of one for its answer.
const heartbeatSlack = 600 * time.Millisecond

// stallAfter is how long a Watch stream of a lease of ttl goes without a
// renewal from etcd before it ends, so that its agent moves to a
// coordinator that can renew: two thirds of the TTL, and never less than
// a heartbeat and half a second. Renewals come up to a heartbeat apart
// (etcd's client looks every half second): with 2 s leases, two thirds
// (1.33 s) ended streams of a renewal 0.17 s late under load, and with
// one coordinator the new stream's first renewal came after the lease.
func stallAfter(ttl time.Duration) time.Duration {
	return max(2*ttl/3, heartbeat(ttl)+500*time.Millisecond)
}

// firstMessage is a stream's first message: assignment a (the cache's,
// not changed) with the lease renewal of ttlMs made at sent when given,
// and how often the stream brings a message.
func firstMessage(a *pb.Assignment, ttlMs int64, sent time.Time, beat time.Duration, relayKey []byte) *pb.Assignment {
	a = proto.Clone(a).(*pb.Assignment)
	if ttlMs > 0 {
		a.LeaseTtlMs, a.SentUnixNanos = ttlMs, sent.UnixNano()
	}
	a.HeartbeatMs, a.RelayKey = beat.Milliseconds(), relayKey
	return a
}

// sameAssignment reports whether a and b run the same thing (revisions
// aside). Spec and generation are the cache's: shared while unchanged.
func sameAssignment(a, b *pb.Assignment) bool {
	return a.Job == b.Job && a.Open == b.Open && a.Master == b.Master && a.Probe == b.Probe && (a.Generation == b.Generation || proto.Equal(a.Generation, b.Generation)) &&
		slices.EqualFunc(a.GossipKeys, b.GossipKeys, bytes.Equal) && slices.Equal(a.LiveJobs, b.LiveJobs)
}

// Report implements pb.CoordinatorServer.
func (s *server) Report(ctx context.Context, req *pb.ReportRequest) (*pb.ReportResponse, error) {
	if req.GetJob() == "" {
		return nil, status.Error(codes.InvalidArgument, "report without a job")
	}
	if err := s.asNode(ctx, req.GetNode()); err != nil {
		return nil, err
	}
	if k, ok := req.Kind.(*pb.ReportRequest_Stopped); ok {
		return s.reportStopped(ctx, req, k.Stopped)
	}
	if err := s.ownRanks(ctx, req); err != nil {
		return nil, err
	}
	switch k := req.Kind.(type) {
	case *pb.ReportRequest_Relayed:
		return s.reportRelayed(ctx, req, k.Relayed)
	case *pb.ReportRequest_Delivered:
		return s.reportDelivered(req, k.Delivered)
	}
	return s.report(ctx, req)
}

// report takes a node's report of job's generation (its identity and
// ranks checked).
func (s *server) report(ctx context.Context, req *pb.ReportRequest) (*pb.ReportResponse, error) {
	id, gen := req.GetJob(), req.GetGeneration()
	var err error
	switch k := req.Kind.(type) {
	case *pb.ReportRequest_Bootstrap:
		key := s.k.bootstrap(id, gen)
		_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, encode(k.Bootstrap))).Commit()
	case *pb.ReportRequest_Step:
		err = s.reportStep(ctx, id, gen, k.Step)
	case *pb.ReportRequest_Stored:
		if err := checkStored(gen, req.GetNode(), k.Stored); err != nil {
			return nil, err
		}
		committed, err := s.reportStored(ctx, id, gen, map[string]*pb.Stored{req.GetNode(): k.Stored})
		return &pb.ReportResponse{Committed: committed}, err
	case *pb.ReportRequest_Times:
		if req.GetNode() == "" {
			return nil, status.Error(codes.InvalidArgument, "times without a node")
		}
		if err := k.Times.Check(); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		s.times.add(id, gen, req.GetNode(), k.Times, time.Now())
	case *pb.ReportRequest_Exit:
		_, err = s.cli.Put(ctx, s.k.exit(id, gen, k.Exit.GetRank()), encode(k.Exit))
		if k.Exit.GetCode() != 0 {
			s.log.Warn("rank failed", "job", id, "generation", gen, "node", req.GetNode(), "rank", k.Exit.GetRank(), "code", k.Exit.GetCode(), "err", k.Exit.GetError())
		}
	default:
		return nil, status.Error(codes.InvalidArgument, "empty report")
	}
	if err != nil {
		return nil, etcdErr(err)
	}
	return &pb.ReportResponse{Committed: s.cache.committed(id)}, nil
}

// reportStopped records that a node runs no rank of the job below a
// generation (Stopped): the leader opens a generation once every node that
// may still run earlier ranks has said so, or is surely fenced. The node
// speaks only for itself, with its lease now; a report of any job that
// exists is taken (a node that ran an earlier generation need not be in
// the current one).
func (s *server) reportStopped(ctx context.Context, req *pb.ReportRequest, st *pb.Stopped) (*pb.ReportResponse, error) {
	if err := s.checkStopped(ctx, req, st); err != nil {
		return nil, err
	}
	werr, err := s.stopped.add(ctx, req.GetJob(), req.GetNode(), st.Below)
	if err == nil {
		err = werr
	}
	if err != nil {
		return nil, err
	}
	return &pb.ReportResponse{Committed: s.cache.committed(req.GetJob())}, nil
}

// checkStopped checks a node's Stopped report (reportStopped): the node
// with its lease, a generation that exists.
func (s *server) checkStopped(ctx context.Context, req *pb.ReportRequest, st *pb.Stopped) error {
	node, id := req.GetNode(), req.GetJob()
	if node == "" || st.GetBelow() < 1 {
		return status.Error(codes.InvalidArgument, "stopped: want a node and a generation of at least 1")
	}
	if s.secure || req.GetLeaseId() != 0 {
		if _, err := s.leaseHolder(ctx, node, clientv3.LeaseID(req.GetLeaseId())); err != nil {
			return err
		}
	}
	// A report speaks of generations that exist: at most the current
	// one's successor. One beyond that would cover ranks of a generation
	// the node may yet join, and could let its successor open while they
	// run. A generation's number only grows, and the cache's is never
	// ahead of etcd's: a report within the cache's is within etcd's, and
	// only one beyond it reads the generation from etcd (every member of a
	// 16,384-node job reports at each new generation; reading its 1.2 MB
	// generation each was 20 GB).
	if g, _ := s.cache.generation(id); st.Below > g.GetNumber()+1 {
		resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.k.spec(id), clientv3.WithCountOnly()), clientv3.OpGet(s.k.generation(id))).Commit()
		if err != nil {
			return etcdErr(err)
		}
		if resp.Responses[0].GetResponseRange().GetCount() == 0 {
			return status.Errorf(codes.NotFound, "no job %q", id)
		}
		current := int64(0)
		if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) == 1 {
			g, err := decodeGeneration(kvs[0].Value)
			if err != nil {
				return status.Errorf(codes.Internal, "job %s: generation: %v", id, err)
			}
			current = g.Number
		}
		if st.Below > current+1 {
			return status.Errorf(codes.InvalidArgument, "stopped: job %s is at generation %d: a node can say it runs nothing below %d at most, not %d", id, current, current+1, st.Below)
		}
	}
	return nil
}

// The conns keys of the streams that open are written in groups
// (groupCommit): agents come back by the thousand after a coordinator
// restarts or stalls, and one transaction of 64 nodes' keys costs etcd
// about what one key does.
type connWriter = groupCommit[struct{}, connItem, error]

// connItem is a stream's conns key: its session and id (connValue), under
// the node's lease.
type connItem struct {
	id      string
	session uint64
	lease   clientv3.LeaseID
}

func newConnWriter(s *server) *connWriter {
	return newGroupCommit(&s.background, func(ctx context.Context, _ struct{}, items map[string]connItem) map[string]error {
		return s.writeConns(ctx, items)
	})
}

// writeConns puts each node's conns key (putConn: node -> its stream's
// session and id, under its lease), storedTxnOps/2 a transaction. A lease
// that is gone fails the whole transaction: its nodes are then put one by
// one, each with its own outcome. A key a later session holds, or a
// fenced run's, is left alone, and its stream refused (Aborted).
func (s *server) writeConns(ctx context.Context, items map[string]connItem) map[string]error {
	out := make(map[string]error, len(items))
	put := func(node string) clientv3.Op {
		it := items[node]
		return putConn(s.k.conn(node), it.session, it.id, it.lease)
	}
	outcome := func(nodes []string, resp *clientv3.TxnResponse, err error) {
		for i, node := range nodes {
			switch {
			case err != nil:
				out[node] = err
			case !connPut(resp, i):
				out[node] = status.Errorf(codes.Aborted, "node %q: a later stream of the agent serves it, or it was fenced: this stream (session %d) ends", node, items[node].session)
			default:
				out[node] = nil
			}
		}
	}
	for chunk := range slices.Chunk(slices.Sorted(maps.Keys(items)), storedTxnOps/2) {
		ops := make([]clientv3.Op, len(chunk))
		for i, node := range chunk {
			ops[i] = put(node)
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		outcome(chunk, resp, err)
		if err == nil || len(chunk) == 1 || !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			continue
		}
		for _, node := range chunk {
			resp, err := s.cli.Txn(ctx).Then(put(node)).Commit()
			outcome([]string{node}, resp, err)
		}
	}
	for node, err := range out {
		if err != nil {
			out[node] = etcdErr(err)
		}
	}
	return out
}

// Stopped reports are written in groups by job (groupCommit): every member
// of a generation reports at once when the next one begins.
type stoppedWriter = groupCommit[string, int64, error]

func newStoppedWriter(s *server) *stoppedWriter {
	return newGroupCommit(&s.background, s.writeStopped)
}

// writeStopped writes the Stopped records of job id (node -> below) in
// their buckets' keys (stoppedBucketOf: a generation of 16,384 nodes
// brings 16,384 reports, written as 256 keys, where a key a node took 8 s
// here before the generation could open), up to storedTxnOps/2 keys a
// transaction, stoppedWrites transactions at once: only a job that exists
// gets them, and only a larger value (a report that arrives late never
// undoes a newer one), each key written only if no other write changed it
// since it was read (else read again).
func (s *server) writeStopped(ctx context.Context, id string, below map[string]int64) map[string]error {
	buckets := map[uint32]map[string]int64{}
	for node, b := range below {
		k := stoppedBucketOf(node)
		if buckets[k] == nil {
			buckets[k] = map[string]int64{}
		}
		buckets[k][node] = b
	}
	var mu sync.Mutex
	out := make(map[string]error, len(below))
	var g errgroup.Group
	g.SetLimit(stoppedWrites)
	for chunk := range slices.Chunk(slices.Sorted(maps.Keys(buckets)), storedTxnOps/2) {
		g.Go(func() error {
			err := s.writeStoppedChunk(ctx, id, buckets, chunk)
			mu.Lock()
			for _, b := range chunk {
				for node := range buckets[b] {
					out[node] = err
				}
			}
			mu.Unlock()
			return nil
		})
	}
	g.Wait()
	return out
}

// stoppedWrites is how many of a group's transactions writeStopped has
// under way at once (8 at 16,384 nodes, when it wrote a key a node, made
// etcd answer its health probe too late).
const stoppedWrites = 2

// writeStoppedChunk writes the records of chunk's buckets in one
// transaction, for writeStopped.
func (s *server) writeStoppedChunk(ctx context.Context, id string, buckets map[uint32]map[string]int64, chunk []uint32) error {
	err := status.Errorf(codes.Aborted, "job %s: stopped reports kept conflicting", id)
	for range 8 {
		reads := []clientv3.Op{clientv3.OpGet(s.k.spec(id), clientv3.WithCountOnly())}
		for _, b := range chunk {
			reads = append(reads, clientv3.OpGet(s.k.stoppedBucket(id, b)))
		}
		resp, rerr := s.cli.Txn(ctx).Then(reads...).Commit()
		if rerr != nil {
			return etcdErr(rerr)
		}
		if resp.Responses[0].GetResponseRange().GetCount() == 0 {
			return status.Errorf(codes.NotFound, "no job %q", id)
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.k.spec(id)), ">", 0)}
		var puts []clientv3.Op
		for i, b := range chunk {
			key, rev, cur := s.k.stoppedBucket(id, b), int64(0), &pb.StoppedBucket{}
			if kvs := resp.Responses[1+i].GetResponseRange().GetKvs(); len(kvs) == 1 {
				if decode(kvs[0].Value, cur) != nil {
					cur = &pb.StoppedBucket{} // unreadable: written anew
				}
				rev = kvs[0].ModRevision
			}
			if cur.Below == nil {
				cur.Below = map[string]int64{}
			}
			grew := false
			for node, below := range buckets[b] {
				if below > cur.Below[node] {
					cur.Below[node], grew = below, true
				}
			}
			if !grew {
				continue
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", rev))
			puts = append(puts, clientv3.OpPut(key, encode(cur)))
		}
		if len(puts) == 0 {
			return nil
		}
		w, werr := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if werr != nil {
			return etcdErr(werr)
		}
		if w.Succeeded {
			return nil
		}
	}
	return err
}

// ownRanks refuses a report about ranks the reporting node does not run:
// the node must be a member of the job's generation gen, and run the rank
// an exit names; a bootstrap comes from rank 0's node alone. (Steps and
// stored checkpoints come from any member.)
//
// A report carries the node's lease (required with TLS): it must be the
// node's lease now, and the run of the agent that holds it the member's
// (Member.instance). A node whose lease ended, or that registered again,
// is not the member any more, whatever its certificate: what its ranks
// still do reaches nothing.
func (s *server) ownRanks(ctx context.Context, req *pb.ReportRequest) error {
	if !s.secure && req.GetLeaseId() == 0 {
		return nil
	}
	if req.GetLeaseId() == 0 {
		return status.Errorf(codes.InvalidArgument, "report from node %q without its lease", req.GetNode())
	}
	g, _ := s.cache.generation(req.GetJob())
	if g == nil || g.Number != req.GetGeneration() {
		var err error
		if g, err = s.readGeneration(ctx, req.GetJob()); err != nil {
			return err
		}
	}
	if g == nil || g.Number != req.GetGeneration() {
		return status.Errorf(codes.FailedPrecondition, "job %s: generation %d is not the current one", req.GetJob(), req.GetGeneration())
	}
	m := s.cache.member(req.GetJob(), g, req.GetNode())
	if m == nil {
		return status.Errorf(codes.PermissionDenied, "node %q is not a member of job %s generation %d", req.GetNode(), req.GetJob(), g.Number)
	}
	instance, err := s.leaseHolder(ctx, req.GetNode(), clientv3.LeaseID(req.GetLeaseId()))
	if err != nil {
		return err
	}
	if m.Instance != "" && instance != m.Instance {
		return status.Errorf(codes.PermissionDenied, "node %q registered again since job %s generation %d was made: it is not that member any more", req.GetNode(), req.GetJob(), g.Number)
	}
	switch k := req.Kind.(type) {
	case *pb.ReportRequest_Bootstrap:
		if m.FirstRank != 0 {
			return status.Errorf(codes.PermissionDenied, "node %q does not run rank 0 of job %s: only rank 0's node reports the bootstrap", req.GetNode(), req.GetJob())
		}
	case *pb.ReportRequest_Exit:
		if r := k.Exit.GetRank(); r < m.FirstRank || r >= m.FirstRank+m.Ranks {
			return status.Errorf(codes.PermissionDenied, "node %q runs ranks %d-%d of job %s, not rank %d", req.GetNode(), m.FirstRank, m.FirstRank+m.Ranks-1, req.GetJob(), r)
		}
	case *pb.ReportRequest_Times:
		// A node's times are its own ranks': another's slow times would
		// make a straggler of a rank that is not.
		for _, r := range k.Times.GetRank() {
			if r < m.FirstRank || r >= m.FirstRank+m.Ranks {
				return status.Errorf(codes.PermissionDenied, "node %q runs ranks %d-%d of job %s, not rank %d", req.GetNode(), m.FirstRank, m.FirstRank+m.Ranks-1, req.GetJob(), r)
			}
		}
	}
	return nil
}

// readGeneration reads a job's current generation from etcd (nil for none).
func (s *server) readGeneration(ctx context.Context, job string) (*pb.Generation, error) {
	resp, err := s.cli.Get(ctx, s.k.generation(job))
	if err != nil {
		return nil, etcdErr(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	g, err := decodeGeneration(resp.Kvs[0].Value)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "job %s: generation: %v", job, err)
	}
	return g, nil
}

// reportStep records a step of generation gen: rank 0's progress (commits
// come from every member's Stored, reportStored). Only the current generation's steps count; a
// replaced generation's ranks are told so, and stop. The write is one
// transaction on the generation's revision as the cache holds it; when
// the cache is behind, the answer carries the generation etcd holds.
func (s *server) reportStep(ctx context.Context, id string, gen int64, step *pb.Step) error {
	g, rev := s.cache.generation(id)
	for {
		if g != nil && g.Number > gen {
			return status.Errorf(codes.FailedPrecondition, "job %s: generation %d was replaced by generation %d", id, gen, g.Number)
		}
		if g == nil || g.Number < gen {
			if rev != 0 || g != nil {
				return nil // a generation etcd does not hold (yet): nothing to record
			}
		}
		if g == nil {
			return nil
		}
		st := proto.Clone(step).(*pb.Step)
		st.Generation, st.Dp, st.Tp, st.Pp, st.Vpp = g.Number, g.Dp, g.Tp, g.Pp, g.Vpp
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.generation(id)), "=", rev)).
			Then(clientv3.OpPut(s.k.progress(id), encode(st))).Else(clientv3.OpGet(s.k.generation(id))).Commit()
		if err != nil || resp.Succeeded {
			return etcdErr(err)
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return nil // the job is gone
		}
		if g, err = decodeGeneration(kvs[0].Value); err != nil {
			return status.Errorf(codes.Internal, "job %s: generation: %v", id, err)
		}
		rev = kvs[0].ModRevision
	}
}

// Leave implements pb.CoordinatorServer.
func (s *server) Leave(ctx context.Context, req *pb.LeaveRequest) (*pb.LeaveResponse, error) {
	if err := s.asNode(ctx, req.GetNode()); err != nil {
		return nil, err
	}
	if err := s.ownLease(ctx, req.GetNode(), clientv3.LeaseID(req.GetLeaseId())); err != nil {
		if status.Code(err) == codes.NotFound {
			return &pb.LeaveResponse{}, nil // gone already
		}
		return nil, err
	}
	_, err := s.cli.Revoke(ctx, clientv3.LeaseID(req.GetLeaseId()))
	if err == nil {
		s.log.Info("node left", "node", req.GetNode())
	}
	return &pb.LeaveResponse{}, nil
}

// Submit implements pb.CoordinatorServer.
func (s *server) Submit(ctx context.Context, req *pb.SubmitRequest) (*pb.SubmitResponse, error) {
	spec := req.GetSpec()
	if err := ValidateSpec(spec); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	key := s.k.spec(spec.Id)
	ops := []clientv3.Op{clientv3.OpPut(key, encode(spec)),
		clientv3.OpPut(s.k.state(spec.Id), encode(&pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1, Reason: "waiting for rendezvous"}))}
	if b := spec.GetResumeBackup(); b != nil {
		// An earlier run's step in the backup tier: the job starts from it
		// as from a backup_only commit (restorePoint).
		c := &pb.Step{Step: b.Step, Generation: b.Generation, Dp: b.Dp, Tp: b.Tp, Pp: b.Pp, Vpp: b.Vpp, Checkpointed: true, Backup: true}
		ops = append(ops, clientv3.OpPut(s.k.backup(spec.Id), encode(c)))
		c = proto.Clone(c).(*pb.Step)
		c.BackupOnly = true
		ops = append(ops, clientv3.OpPut(s.k.commit(spec.Id), encode(c)))
	}
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(ops...).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, etcdErr(err)
	}
	if !resp.Succeeded {
		// The same submission tried again (its first answer was lost): done.
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 && spec.Submission != "" {
			if old := (&pb.JobSpec{}); decode(kvs[0].Value, old) == nil && old.Submission == spec.Submission {
				return &pb.SubmitResponse{}, nil
			}
		}
		return nil, status.Errorf(codes.AlreadyExists, "job %q already exists: choose another --job-id", spec.Id)
	}
	s.log.Info("job submitted", "job", spec.Id, "nodes", spec.Nodes, "gpus_per_node", spec.GpusPerNode)
	return &pb.SubmitResponse{}, nil
}

// Members implements pb.CoordinatorServer, from the cache: the job's
// current generation's nodes, by name.
func (s *server) Members(ctx context.Context, req *pb.MembersRequest) (*pb.MembersResponse, error) {
	if err := s.cache.sync(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(err).Err()
		}
		return nil, etcdErr(err)
	}
	g, _ := s.cache.generation(req.GetJob())
	if g == nil {
		return nil, status.Errorf(codes.NotFound, "job %q has no generation", req.GetJob())
	}
	resp := &pb.MembersResponse{Generation: g.Number}
	for _, m := range g.Members {
		if req.GetNode() == "" || m.Node == req.GetNode() {
			resp.Nodes = append(resp.Nodes, m.Node)
		}
	}
	return resp, nil
}

// Follow implements pb.CoordinatorServer. Steps come from the etcd watch
// of the job's keys, so none is skipped however fast they come, and a
// client that lost its stream resumes from a revision.
func (s *server) Follow(req *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
	ctx := stream.Context()
	id := req.GetJob()
	if err := s.cache.waitRev(ctx, 1); err != nil {
		return status.FromContextError(err).Err()
	}
	j, rev, ok := s.cache.jobOf(id)
	if !ok {
		// Submitted through another coordinator a moment ago, perhaps:
		// catch up with etcd before saying no.
		resp, err := s.cli.Get(ctx, s.k.spec(id), clientv3.WithKeysOnly())
		if err != nil {
			return etcdErr(err)
		}
		if len(resp.Kvs) == 0 {
			s.log.Info("follow: no such job", "job", id, "view", rev, "etcd", resp.Header.GetRevision())
		}
		if len(resp.Kvs) > 0 {
			// The spec's own revision: the watch brings it (a write outside
			// the prefix would not move the view).
			if err := s.cache.waitRev(ctx, resp.Kvs[0].ModRevision); err != nil {
				return status.FromContextError(err).Err()
			}
			j, rev, ok = s.cache.jobOf(id)
		}
	}
	if !ok {
		return status.Errorf(codes.NotFound, "no job %q", id)
	}
	if err := stream.SendHeader(metadata.Pairs(pb.FollowOpen, "1")); err != nil {
		return err
	}
	from := req.GetFromRevision()
	if from == 0 {
		if err := stream.Send(&pb.JobEvent{State: j.state, Generation: j.gen, Step: j.step, Commit: j.commit, Revision: rev}); err != nil {
			return err
		}
		if j.terminal() {
			return nil
		}
		from = rev + 1
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.cli.Watch(clientv3.WithRequireLeader(wctx), s.k.job(id), clientv3.WithPrefix(), clientv3.WithRev(from))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return status.Error(codes.Unavailable, "coordinator shutting down")
		case wr, ok := <-w:
			if !ok {
				return status.Error(codes.Unavailable, "etcd watch ended")
			}
			if wr.CompactRevision != 0 {
				return status.Errorf(codes.OutOfRange, "job %s: etcd history before revision %d is compacted: follow again from now", id, wr.CompactRevision)
			}
			if err := wr.Err(); err != nil {
				return etcdErr(err)
			}
			// One event per revision: the leader writes a generation and
			// its state in one transaction, and a client resuming after a
			// revision must not lose half of it.
			var out *pb.JobEvent
			flush := func() (bool, error) {
				if out == nil {
					return false, nil
				}
				ev := out
				out = nil
				if err := stream.Send(ev); err != nil {
					return true, err
				}
				return pb.Terminal(ev.State), nil
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
				if key != s.k.progress(id) && key != s.k.state(id) && key != s.k.generation(id) && key != s.k.commit(id) {
					continue
				}
				if out != nil && out.Revision != rev {
					if stop, err := flush(); stop || err != nil {
						return err
					}
				}
				if out == nil {
					out = &pb.JobEvent{Revision: rev}
				}
				switch key {
				case s.k.progress(id):
					out.Step = &pb.Step{}
					decode(ev.Kv.Value, out.Step)
				case s.k.state(id):
					out.State = &pb.JobState{}
					decode(ev.Kv.Value, out.State)
				case s.k.generation(id):
					out.Generation = &pb.Generation{}
					decode(ev.Kv.Value, out.Generation)
				case s.k.commit(id):
					out.Commit = &pb.Step{}
					decode(ev.Kv.Value, out.Commit)
				}
			}
			if stop, err := flush(); stop || err != nil {
				return err
			}
		}
	}
}

// Cancel implements pb.CoordinatorServer. It writes CANCELLED over the
// state it read, and reads again when someone (the leader) wrote the state
// in between, until the job is cancelled or has ended otherwise; the
// response carries the state the job is in.
func (s *server) Cancel(ctx context.Context, req *pb.CancelRequest) (*pb.CancelResponse, error) {
	id := req.GetJob()
	st := &pb.JobState{Phase: pb.JobState_CANCELLED, Reason: req.GetReason(), ExitCode: 130, FailedRank: -1}
	if st.Reason == "" {
		st.Reason = "cancelled"
	}
	for {
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.k.spec(id)), ">", 0)).
			Then(clientv3.OpGet(s.k.state(id))).Commit()
		if err != nil {
			return nil, etcdErr(err)
		}
		if !resp.Succeeded {
			return nil, status.Errorf(codes.NotFound, "no job %q", id)
		}
		cur, rev := &pb.JobState{Phase: pb.JobState_PENDING}, int64(0)
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			if err := decode(kvs[0].Value, cur); err != nil {
				return nil, status.Errorf(codes.Internal, "job %s: state: %v", id, err)
			}
			rev = kvs[0].ModRevision
		}
		if pb.Terminal(cur) {
			return &pb.CancelResponse{State: cur}, nil
		}
		// The job's nodes are released with its end: a terminal job's
		// generation holds none (cache.rebuildHolds), so the state is the
		// one key written.
		if s.hooks.cancelRead != nil {
			s.hooks.cancelRead(id)
		}
		w, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.state(id)), "=", rev)).
			Then(clientv3.OpPut(s.k.state(id), encode(st))).Commit()
		if err != nil {
			return nil, etcdErr(err)
		}
		if w.Succeeded {
			s.log.Info("job cancelled", "job", id, "reason", st.Reason)
			return &pb.CancelResponse{State: st}, nil
		}
	}
}

// Status implements pb.CoordinatorServer, from the cache.
func (s *server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	// Status shows every key written before the call (a node that has just
	// registered, a job just submitted): the cache first catches up with
	// etcd.
	if err := s.cache.sync(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(err).Err()
		}
		return nil, etcdErr(err)
	}
	nodes, connected, leader, _ := s.cache.pool()
	revoked := s.cache.revoked()
	jobs := s.cache.jobsNow()
	resp := &pb.StatusResponse{Leader: leader}
	busy := map[string]string{}
	for _, j := range jobs {
		if !j.terminal() && j.gen != nil {
			for _, m := range j.gen.Members {
				busy[m.Node] = j.spec.Id
			}
		}
	}
	for _, n := range nodes {
		resp.Nodes = append(resp.Nodes, &pb.NodeStatus{Node: n, Job: busy[n.Name]})
	}
	slices.SortFunc(resp.Nodes, func(a, b *pb.NodeStatus) int { return strings.Compare(a.Node.Name, b.Node.Name) })
	for _, j := range jobs {
		js := &pb.JobStatus{Spec: j.spec, State: j.state, Generation: j.gen, LastStep: j.step}
		if j.commit != nil {
			js.CommittedStep = j.commit.Step
		}
		js.Stragglers = j.stragglers.GetRanks()
		for _, m := range j.gen.GetMembers() {
			state := memberState(m, nodes[m.Node], connected[m.Node], revoked[m.Node])
			js.Members = append(js.Members, &pb.MemberStatus{Node: m.Node, FirstRank: m.FirstRank, Ranks: m.Ranks, State: state})
		}
		resp.Jobs = append(resp.Jobs, js)
	}
	return resp, nil
}

// memberState is the state of a generation's member m, as status and the
// dashboard show it: lost (its node not registered, registered again as
// another run of its agent, or its run revoked: revoked is the run the
// node's fence names, "" for none), alive (its agent's Watch stream is
// open) or disconnected (registered, no stream: it keeps its place until
// its lease ends). n is the node's registration, nil for none.
func memberState(m *pb.Member, n *pb.Node, connected bool, revoked string) string {
	switch {
	case n == nil || m.Instance != "" && n.GetInstance() != m.Instance:
		return "lost"
	case revoked != "" && revoked == n.GetInstance():
		return "lost"
	case connected:
		return "alive"
	}
	return "disconnected"
}

// reportRelayed takes the reports a relay forwards for the members of its
// block (Relayed), each checked on its own: one of a node the relay does
// not speak for, of another generation, or of another kind than Stored,
// Times and Stopped is refused alone. The call's Stored reports go in one
// group (storedWriter) and its Stopped reports in one (stoppedWriter),
// each waited for once: a block's reports are one write and one wait, not
// a goroutine and a wait a report.
func (s *server) reportRelayed(ctx context.Context, relay *pb.ReportRequest, rel *pb.Relayed) (*pb.ReportResponse, error) {
	if len(rel.GetReports()) > 4*pb.RelayBlock {
		return nil, status.Errorf(codes.InvalidArgument, "relayed: %d reports, want at most %d", len(rel.GetReports()), 4*pb.RelayBlock)
	}
	id, gen := relay.GetJob(), relay.GetGeneration()
	answers := make([]*pb.RelayedAnswer, len(rel.GetReports()))
	answer := func(i int, committed int64, err error) {
		if err != nil {
			st := status.Convert(err)
			answers[i].Code, answers[i].Error = int32(st.Code()), st.Message()
			return
		}
		answers[i].Committed = committed
	}
	// The Stored and Stopped reports by node, with their answers' places
	// (a node's second report of a kind in one call replaces its first,
	// as in one group).
	stored, stopped := map[string]*pb.Stored{}, map[string]int64{}
	storedAt, stoppedAt := map[string][]int{}, map[string][]int{}
	for i, r := range rel.GetReports() {
		answers[i] = &pb.RelayedAnswer{}
		if err := s.relayedCheck(ctx, relay, r); err != nil {
			answer(i, 0, err)
			continue
		}
		node := r.GetNode()
		switch k := r.Kind.(type) {
		case *pb.ReportRequest_Stored:
			if err := checkStored(gen, node, k.Stored); err != nil {
				answer(i, 0, err)
				continue
			}
			stored[node], storedAt[node] = k.Stored, append(storedAt[node], i)
		case *pb.ReportRequest_Stopped:
			stopped[node], stoppedAt[node] = k.Stopped.GetBelow(), append(stoppedAt[node], i)
		default:
			resp, err := s.report(ctx, r)
			answer(i, resp.GetCommitted(), err)
		}
	}
	var wg sync.WaitGroup
	if len(stored) > 0 {
		wg.Go(func() {
			committed, err := s.reportStored(ctx, id, gen, stored)
			for _, is := range storedAt {
				for _, i := range is {
					answer(i, committed, err)
				}
			}
		})
	}
	if len(stopped) > 0 {
		wg.Go(func() {
			out, err := s.stopped.addAll(ctx, id, stopped)
			committed := s.cache.committed(id)
			for node, is := range stoppedAt {
				werr := err
				if werr == nil {
					werr = out[node]
				}
				for _, i := range is {
					answer(i, committed, werr)
				}
			}
		})
	}
	wg.Wait()
	return &pb.ReportResponse{Committed: s.cache.committed(id), Relayed: answers}, nil
}

// relayedCheck checks one report a relay forwarded: a Stored, Times or
// Stopped report of the relay's generation, by a node whose reports the
// relay forwards in it (its block's), checked as the node's own call
// would be but for its identity, which the relay checked (mutual TLS).
// A Stopped report through a relay speaks of the generation the relay
// forwards for (below it, the node runs no rank).
func (s *server) relayedCheck(ctx context.Context, relay, r *pb.ReportRequest) error {
	stopped := r.GetStopped()
	switch r.Kind.(type) {
	case *pb.ReportRequest_Stored, *pb.ReportRequest_Times:
	case *pb.ReportRequest_Stopped:
		if stopped.GetBelow() != r.GetGeneration() {
			return status.Errorf(codes.InvalidArgument, "relayed stopped of node %s: below %d, want its generation, %d", r.GetNode(), stopped.GetBelow(), r.GetGeneration())
		}
	default:
		return status.Error(codes.InvalidArgument, "a relay forwards Stored, Times and Stopped reports alone")
	}
	if r.GetJob() != relay.GetJob() || r.GetGeneration() != relay.GetGeneration() {
		return status.Errorf(codes.InvalidArgument, "relay %s forwards job %s generation %d's reports, not job %s generation %d's",
			relay.GetNode(), relay.GetJob(), relay.GetGeneration(), r.GetJob(), r.GetGeneration())
	}
	if !s.cache.relays(r.GetJob(), r.GetGeneration(), relay.GetNode(), r.GetNode()) {
		return status.Errorf(codes.PermissionDenied, "node %s does not relay node %s's reports in job %s generation %d", relay.GetNode(), r.GetNode(), r.GetJob(), r.GetGeneration())
	}
	if stopped != nil {
		return s.checkStopped(ctx, r, stopped)
	}
	return s.ownRanks(ctx, r)
}

// maxStored bounds the steps one Stored report may name.
const maxStored = 64

// checkStored checks a node's Stored report of generation gen, and marks
// its steps as of gen. The request's own message, decoded for this call
// alone (as is a relayed one, inside its relay's), is filled in place: a
// clone of each was 3% of a 16,384-node coordinator's time.
func checkStored(gen int64, node string, st *pb.Stored) error {
	if node == "" || len(st.GetSteps()) == 0 || len(st.GetSteps()) > maxStored {
		return status.Errorf(codes.InvalidArgument, "stored: want a node and 1 to %d steps", maxStored)
	}
	for _, x := range st.Steps {
		if x.Step < 1 || len(x.Holders) > 64 {
			return status.Errorf(codes.InvalidArgument, "stored step %d with %d holders", x.Step, len(x.Holders))
		}
		x.Generation = gen
	}
	return nil
}

// reportStored records nodes' checkpoints of generation gen (recs: node ->
// record, each checked: checkStored) that no commit covers yet, and
// commits the newest step every member of the generation has stored
// (commitOf). The records go to etcd in this coordinator's next group of
// the generation's records (storedWriter), all in the same one, written
// on the generation's revision; then this coordinator's view, once at
// that write's revision, holds every record written before it (so that
// of two coordinators storing the last copies at once the later sees
// both) and counts, per step, the nodes that stored it: only a group that
// completes a step looks at each member's record. The commit is a second
// transaction on the generation and the commit's revisions. It returns
// the job's last committed step.
func (s *server) reportStored(ctx context.Context, id string, gen int64, recs map[string]*pb.Stored) (int64, error) {
	g, rev := s.cache.generation(id)
	items := make(map[string]storedItem, len(recs))
	for range 16 {
		if g == nil || g.Number != gen {
			resp, err := s.cli.Get(ctx, s.k.generation(id))
			if err != nil {
				return 0, etcdErr(err)
			}
			g = nil
			if len(resp.Kvs) > 0 {
				if g, err = decodeGeneration(resp.Kvs[0].Value); err != nil {
					return 0, status.Errorf(codes.Internal, "job %s: generation: %v", id, err)
				}
				rev = resp.Kvs[0].ModRevision
			}
			if g == nil || g.Number != gen {
				return 0, status.Errorf(codes.FailedPrecondition, "job %s: generation %d is not the current one", id, gen)
			}
		}
		var one string
		for node, rec := range recs {
			items[node], one = storedItem{g, rec}, node
		}
		out, err := s.stored.addAll(ctx, storedKey{id, rev}, items)
		if err != nil {
			return 0, err
		}
		// A group's outcome is the same for each of its records.
		if o := out[one]; !o.stale {
			return o.committed, o.err
		}
		g = nil // re-read
	}
	return 0, status.Errorf(codes.Aborted, "job %s: stored reports kept conflicting", id)
}

// commitOf is the commit the stored records make in generation g: the
// newest step every member has stored in g, with each member's holders
// (none with a shared directory) and whether all copied it to the backup
// tier; nil when no step after prev's is stored everywhere.
func commitOf(g *pb.Generation, records map[string]*pb.Stored, prev *pb.Step) *pb.Step {
	if g == nil || len(g.Members) == 0 {
		return nil
	}
	var common map[int64]bool
	for i, m := range g.Members {
		have := map[int64]bool{}
		for _, x := range records[m.Node].GetSteps() {
			if x.Generation == g.Number {
				have[x.Step] = true
			}
		}
		if i == 0 {
			common = have
			continue
		}
		for s := range common {
			if !have[s] {
				delete(common, s)
			}
		}
	}
	var best int64
	for s := range common {
		best = max(best, s)
	}
	if best == 0 || prev != nil && best <= prev.Step && prev.Generation >= g.Number {
		return nil
	}
	c := &pb.Step{Step: best, Generation: g.Number, Dp: g.Dp, Tp: g.Tp, Pp: g.Pp, Vpp: g.Vpp, Checkpointed: true, Backup: true}
	for _, m := range g.Members {
		for _, x := range records[m.Node].GetSteps() {
			if x.Generation != g.Number || x.Step != best {
				continue
			}
			if len(x.Holders) > 0 {
				c.Copies = append(c.Copies, &pb.Copies{Node: m.Node, Holders: x.Holders})
			}
			c.Backup = c.Backup && x.Backup
			break
		}
	}
	return c
}
