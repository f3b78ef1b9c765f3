package coordinator

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// server implements the Coordinator service over etcd. Every coordinator
// serves it, leader or not: each call reads or writes etcd, and Watch and
// Follow translate etcd watches.
type server struct {
	pb.UnimplementedCoordinatorServer
	cli *clientv3.Client
	k   keys
	cfg *Config
	log *slog.Logger
	// stopping is closed when the coordinator shuts down: streams that end
	// then are not the agents' loss.
	stopping <-chan struct{}
	// keepalive observes the latency of a lease renewal, in seconds.
	keepalive func(float64)
	// health says whether etcd is reachable; while it is not, calls fail
	// and streams end (Unavailable).
	health *health
}

// auth refuses calls without the join token when one is set. The token is
// compared in constant time and never logged.
func (s *server) auth(ctx context.Context) error {
	if s.cfg.Token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(pb.TokenHeader) {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok && subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.Token)) == 1 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "join token missing or wrong: give the coordinator's token with --token, GPUCOORD_TOKEN or --token-file")
}

func (s *server) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.auth(ctx); err != nil {
		return nil, err
	}
	if s.health.isDown() {
		return nil, errEtcdDown
	}
	return h(ctx, req)
}

func (s *server) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.auth(ss.Context()); err != nil {
		return err
	}
	return s.health.guardStream(srv, ss, h)
}

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
	switch {
	case n.GetProtocol() != pb.ProtocolVersion:
		return nil, status.Errorf(codes.FailedPrecondition, "agent %q speaks protocol %d (version %s); this coordinator speaks %d: run the same gpucoord version on every node",
			n.GetName(), n.GetProtocol(), n.GetVersion(), pb.ProtocolVersion)
	case n.GetName() == "" || strings.ContainsAny(n.GetName(), "/ \t\n") || strings.HasPrefix(n.GetName(), coordinatorMember):
		return nil, status.Errorf(codes.InvalidArgument, "node name %q: want a non-empty name without '/' or spaces, not starting with %q", n.GetName(), coordinatorMember)
	case n.GetGpus() < 1:
		return nil, status.Errorf(codes.InvalidArgument, "node %q: %d GPUs: want at least 1", n.GetName(), n.GetGpus())
	case n.GetHost() == "":
		return nil, status.Errorf(codes.InvalidArgument, "node %q: no host address", n.GetName())
	}
	if from := peerHost(ctx); IsLoopback(n.GetHost()) && from != "" && !IsLoopback(from) {
		return nil, status.Errorf(codes.InvalidArgument, "node %q advertises %s, a loopback address, but connects from %s: other nodes could not reach it (start the worker without --advertise-addr, or give its --iface)",
			n.GetName(), n.GetHost(), from)
	}
	ttl := int64(s.cfg.LeaseTTL / time.Second)
	lease, err := s.cli.Grant(ctx, ttl)
	if err != nil {
		return nil, etcdErr(err)
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
	return &pb.RegisterResponse{LeaseId: int64(lease.ID), TtlSeconds: ttl, Gossip: s.gossipFor(ctx)}, nil
}

// Watch implements pb.CoordinatorServer. The node's lease is kept alive
// while the stream is open, and every renewal is sent to the agent (the
// assignment again, with the lease's TTL) so that the agent knows how long
// its ranks may run without another. A coordinator that cannot renew the
// lease (etcd unreachable) ends the stream, so that the agent moves to one
// that can.
func (s *server) Watch(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.Assignment]) error {
	ctx := stream.Context()
	lease := clientv3.LeaseID(req.GetLeaseId())
	first, err := s.cli.KeepAliveOnce(ctx, lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return status.Errorf(codes.NotFound, "node %q: lease %x is gone: register again", req.GetNode(), req.GetLeaseId())
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "node %q: renewing lease %x: %v", req.GetNode(), req.GetLeaseId(), err)
	}
	kctx, stopKeep := context.WithCancel(context.WithoutCancel(ctx))
	defer stopKeep()
	renewed := make(chan int64, 1)
	keepErr := make(chan error, 1)
	go func() { keepErr <- s.keepAlive(kctx, lease, renewed) }()
	defer func() {
		// A stream the agent dropped without Leave, while this coordinator
		// is not shutting down and reaches etcd, is the agent's loss:
		// revoke its lease now rather than waiting out the TTL.
		select {
		case <-s.stopping:
		default:
			if ctx.Err() != nil && !s.health.isDown() {
				rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if _, err := s.cli.Revoke(rctx, lease); err == nil {
					s.log.Warn("node disconnected", "node", req.GetNode())
				}
				cancel()
			}
		}
	}()
	w := s.cli.Watch(clientv3.WithRequireLeader(ctx), s.k.jobs(), clientv3.WithPrefix())
	var last *pb.Assignment
	send := func(ttlMs int64) error {
		snap, err := read(ctx, s.cli, s.k, "")
		if err != nil {
			return etcdErr(err)
		}
		a := snap.assignment(req.GetNode())
		if last != nil && proto.Equal(a, last) {
			return nil
		}
		last = a
		return stream.Send(withTTL(a, ttlMs))
	}
	if err := send(first.TTL * 1000); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return status.Error(codes.Unavailable, "coordinator shutting down")
		case err := <-keepErr:
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return status.Errorf(codes.NotFound, "node %q: lease %x expired: register again", req.GetNode(), req.GetLeaseId())
			}
			s.log.Warn("cannot renew a node's lease: ending its stream so that it moves to another coordinator", "node", req.GetNode(), "err", err)
			return status.Errorf(codes.Unavailable, "this coordinator cannot renew lease %x: %v", req.GetLeaseId(), err)
		case ttl := <-renewed:
			if err := stream.Send(withTTL(last, ttl)); err != nil {
				return err
			}
		case wr, ok := <-w:
			if !ok {
				return status.Error(codes.Unavailable, "etcd watch ended")
			}
			if err := wr.Err(); err != nil {
				return etcdErr(err)
			}
			if !assignmentChanged(s.k, wr.Events) {
				continue
			}
			if err := send(0); err != nil {
				return err
			}
		}
	}
}

// withTTL is a with the lease renewal of ttlMs, or a itself for none.
func withTTL(a *pb.Assignment, ttlMs int64) *pb.Assignment {
	if ttlMs == 0 {
		return a
	}
	a = proto.Clone(a).(*pb.Assignment)
	a.LeaseTtlMs = ttlMs
	return a
}

// keepAlive renews a node's lease every third of its TTL, timing each
// renewal (the heartbeat latency metric) and handing the TTL granted to
// renewed (which holds the newest only), until ctx ends or a renewal fails:
// rpctypes.ErrLeaseNotFound when the lease is gone, etcd's error when etcd
// did not answer in time.
func (s *server) keepAlive(ctx context.Context, lease clientv3.LeaseID, renewed chan int64) error {
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, s.cfg.LeaseTTL/3)
		resp, err := s.cli.KeepAliveOnce(rctx, lease)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if s.keepalive != nil {
			s.keepalive(time.Since(start).Seconds())
		}
		select { // the newest renewal replaces one not yet sent
		case <-renewed:
		default:
		}
		renewed <- resp.TTL * 1000
	}
}

// assignmentChanged reports whether any event touches what an assignment
// is made of (not progress or exits, which change every step).
func assignmentChanged(k keys, evs []*clientv3.Event) bool {
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		if strings.HasSuffix(key, "/generation") || strings.HasSuffix(key, "/state") || strings.Contains(key, "/bootstrap/") {
			return true
		}
	}
	return false
}

// Report implements pb.CoordinatorServer.
func (s *server) Report(ctx context.Context, req *pb.ReportRequest) (*pb.ReportResponse, error) {
	id, gen := req.GetJob(), req.GetGeneration()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "report without a job")
	}
	var err error
	switch k := req.Kind.(type) {
	case *pb.ReportRequest_Bootstrap:
		key := s.k.bootstrap(id, gen)
		_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, encode(k.Bootstrap))).Commit()
	case *pb.ReportRequest_Step:
		// Only the current generation's steps count; a replaced
		// generation's ranks are told so, and stop.
		var gr *clientv3.GetResponse
		if gr, err = s.cli.Get(ctx, s.k.generation(id)); err == nil && len(gr.Kvs) == 1 {
			g := &pb.Generation{}
			if decode(gr.Kvs[0].Value, g) == nil && g.Number > gen {
				return nil, status.Errorf(codes.FailedPrecondition, "job %s: generation %d was replaced by generation %d", id, gen, g.Number)
			}
			if g.Number == gen {
				st := proto.Clone(k.Step).(*pb.Step)
				st.Generation, st.Dp = g.Number, g.Dp
				ops := []clientv3.Op{clientv3.OpPut(s.k.progress(id), encode(st))}
				if st.Checkpointed {
					ops = append(ops, clientv3.OpPut(s.k.commit(id), encode(st)))
				}
				_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.generation(id)), "=", gr.Kvs[0].ModRevision)).
					Then(ops...).Commit()
			}
		}
	case *pb.ReportRequest_Times:
		if req.GetNode() == "" {
			return nil, status.Error(codes.InvalidArgument, "times without a node")
		}
		err = s.appendTimes(ctx, s.k.times(id, gen, req.GetNode()), k.Times)
	case *pb.ReportRequest_Exit:
		_, err = s.cli.Put(ctx, s.k.exit(id, gen, k.Exit.GetRank()), encode(k.Exit))
		if k.Exit.GetCode() != 0 {
			s.log.Warn("rank failed", "job", id, "generation", gen, "node", req.GetNode(), "rank", k.Exit.GetRank(), "code", k.Exit.GetCode(), "err", k.Exit.GetError())
		}
	default:
		return nil, status.Error(codes.InvalidArgument, "empty report")
	}
	return &pb.ReportResponse{}, etcdErr(err)
}

// appendTimes adds a window to a node's history, keeping the last
// StragglerWindows, in a transaction on the key's revision (one writer per
// key, so a retry is rare).
func (s *server) appendTimes(ctx context.Context, key string, w *pb.RankTimes) error {
	for {
		h := &pb.TimesHistory{}
		var rev int64
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 1 {
			decode(resp.Kvs[0].Value, h)
			rev = resp.Kvs[0].ModRevision
		}
		h.Windows = append(h.Windows, w)
		if n := s.cfg.StragglerWindows; len(h.Windows) > n {
			h.Windows = h.Windows[len(h.Windows)-n:]
		}
		tx, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpPut(key, encode(h))).Commit()
		if err != nil || tx.Succeeded {
			return err
		}
	}
}

// Leave implements pb.CoordinatorServer.
func (s *server) Leave(ctx context.Context, req *pb.LeaveRequest) (*pb.LeaveResponse, error) {
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
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, encode(spec)),
			clientv3.OpPut(s.k.state(spec.Id), encode(&pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1, Reason: "waiting for rendezvous"}))).
		Commit()
	if err != nil {
		return nil, etcdErr(err)
	}
	if !resp.Succeeded {
		return nil, status.Errorf(codes.AlreadyExists, "job %q already exists: choose another --job-id", spec.Id)
	}
	s.log.Info("job submitted", "job", spec.Id, "nodes", spec.Nodes, "gpus_per_node", spec.GpusPerNode)
	return &pb.SubmitResponse{}, nil
}

// Follow implements pb.CoordinatorServer. Steps come from the etcd watch
// of the job's keys, so none is skipped however fast they come, and a
// client that lost its stream resumes from a revision.
func (s *server) Follow(req *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
	ctx := stream.Context()
	id := req.GetJob()
	snap, err := read(ctx, s.cli, s.k, id)
	if err != nil {
		return etcdErr(err)
	}
	if len(snap.jobs) == 0 {
		return status.Errorf(codes.NotFound, "no job %q", id)
	}
	from := req.GetFromRevision()
	if from == 0 {
		j := snap.jobs[0]
		if err := stream.Send(&pb.JobEvent{State: j.state, Generation: j.gen, Step: j.step, Revision: snap.rev}); err != nil {
			return err
		}
		if j.terminal() {
			return nil
		}
		from = snap.rev + 1
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
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
				var out *pb.JobEvent
				switch key {
				case s.k.progress(id):
					out = &pb.JobEvent{Step: &pb.Step{}, Revision: rev}
					decode(ev.Kv.Value, out.Step)
				case s.k.state(id):
					out = &pb.JobEvent{State: &pb.JobState{}, Revision: rev}
					decode(ev.Kv.Value, out.State)
				case s.k.generation(id):
					out = &pb.JobEvent{Generation: &pb.Generation{}, Revision: rev}
					decode(ev.Kv.Value, out.Generation)
				default:
					continue
				}
				if err := stream.Send(out); err != nil {
					return err
				}
				if out.State != nil && (&job{state: out.State}).terminal() {
					return nil
				}
			}
		}
	}
}

// Cancel implements pb.CoordinatorServer.
func (s *server) Cancel(ctx context.Context, req *pb.CancelRequest) (*pb.CancelResponse, error) {
	snap, err := read(ctx, s.cli, s.k, req.GetJob())
	if err != nil {
		return nil, etcdErr(err)
	}
	if len(snap.jobs) == 0 {
		return nil, status.Errorf(codes.NotFound, "no job %q", req.GetJob())
	}
	j := snap.jobs[0]
	if j.terminal() {
		return &pb.CancelResponse{}, nil
	}
	st := &pb.JobState{Phase: pb.JobState_CANCELLED, Reason: req.GetReason(), ExitCode: 130, FailedRank: -1}
	if st.Reason == "" {
		st.Reason = "cancelled"
	}
	_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.state(j.spec.Id)), "=", j.stateRev)).
		Then(clientv3.OpPut(s.k.state(j.spec.Id), encode(st))).Commit()
	return &pb.CancelResponse{}, etcdErr(err)
}

// Status implements pb.CoordinatorServer.
func (s *server) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	snap, err := read(ctx, s.cli, s.k, "")
	if err != nil {
		return nil, etcdErr(err)
	}
	resp := &pb.StatusResponse{}
	if lr, err := s.cli.Get(ctx, s.k.leader(), clientv3.WithFirstCreate()...); err == nil && len(lr.Kvs) > 0 {
		resp.Leader = string(lr.Kvs[0].Value)
	}
	busy := snap.busy()
	for _, n := range snap.nodes {
		resp.Nodes = append(resp.Nodes, &pb.NodeStatus{Node: n, Job: busy[n.Name]})
	}
	slices.SortFunc(resp.Nodes, func(a, b *pb.NodeStatus) int { return strings.Compare(a.Node.Name, b.Node.Name) })
	for _, j := range snap.jobs {
		js := &pb.JobStatus{Spec: j.spec, State: j.state, Generation: j.gen, LastStep: j.step}
		if j.commit != nil {
			js.CommittedStep = j.commit.Step
		}
		js.Stragglers = j.stragglers.GetRanks()
		for _, m := range j.gen.GetMembers() {
			state := "lost"
			if snap.nodes[m.Node] != nil {
				state = "alive"
			}
			js.Members = append(js.Members, &pb.MemberStatus{Node: m.Node, FirstRank: m.FirstRank, Ranks: m.Ranks, State: state})
		}
		resp.Jobs = append(resp.Jobs, js)
	}
	return resp, nil
}
