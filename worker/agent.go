package worker

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	gpclient "github.com/gpucoord/gpucoord/client"
	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/tcp"
	"github.com/gpucoord/gpucoord/internal/backoff"
	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/join"
	"github.com/gpucoord/gpucoord/internal/localproc"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

// Config configures an Agent. Start from DefaultConfig and override fields.
type Config struct {
	// Coordinators are the addresses of the cluster's coordinators; the
	// agent uses the first that answers and moves on when it fails.
	Coordinators []string
	// Token is a join token: with it the agent obtains its node's
	// certificate once (kept under CredentialsDir) and speaks mutual TLS.
	// Empty, with no TLS files, only for a coordinator on loopback.
	Token string
	// TLS names the node's credentials from an organisation's PKI (a
	// certificate for role node and this node's name), instead of a token.
	TLS pki.Files
	// CredentialsDir keeps what a token bought; empty means
	// join.DefaultDir().
	CredentialsDir string
	// Name is the node's unique name in the pool.
	Name string
	// Host is the address other nodes reach this one at; empty means the
	// address of Iface, else of the interface that routes to the first
	// coordinator. A loopback address is refused by a coordinator the node
	// reaches from elsewhere.
	Host string
	// Bind is the local address the node's ranks, rendezvous store and
	// gossip member listen on; empty means Host. Set it where Host is an
	// address only a NAT or a container runtime knows.
	Bind string
	// Iface names the network interface whose address is advertised and
	// which gloo and NCCL use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, unless
	// the agent's environment or the job sets them); empty means the one
	// holding Bind.
	Iface string
	// GPUs is the number of rank slots: GPUs, or processes on a CPU machine.
	GPUs int
	// NVLinkDomain names the node's NVLink domain; empty is the node alone.
	NVLinkDomain string
	// FailureDomain names what fails with the node (a rack): the replicas
	// of its checkpoints go to other domains first, and the node gossips
	// in its domain's failure-detection pool. Empty: the NVLink domain
	// (nodes naming neither share one pool).
	FailureDomain string
	// Gossip is the address of the node's member of its domain's
	// failure-detection pool (TCP and UDP); empty means Bind with a free
	// port.
	Gossip string
	// Devices sets CUDA_VISIBLE_DEVICES to each rank's local index.
	Devices bool
	// DeviceList, when set, is the node's GPUs as the scheduler gave them
	// (Slurm's CUDA_VISIBLE_DEVICES): local rank i sees the i-th alone.
	DeviceList []string
	// FenceCommand is the argv of the node's fence watchdog
	// (RunFenceWatchdog on its stdin): a process beside the agent that
	// kills the ranks once the lease deadline passes, should the agent be
	// frozen. Empty: the agent alone fences its ranks.
	FenceCommand []string
	// NativeCommand is the argv that runs one rank of a native-engine job
	// from its environment (RunNativeRank): this binary's hidden command.
	NativeCommand []string
	// WorkDir (--state-dir) holds the agent's files, in WorkDir/gpucoord
	// (OwnDir): each generation's plan file, the ranks' logs, and held
	// checkpoints when /dev/shm has no room.
	WorkDir string
	// CheckpointRoot (--checkpoint-local) is the directory under which the
	// agent keeps the checkpoints it holds (its ranks' and its peers'
	// replicas) for jobs without a shared checkpoint directory, in
	// CheckpointRoot/gpucoord/checkpoints/Name; empty means /dev/shm when
	// it has room, else WorkDir (the function CheckpointRoot).
	CheckpointRoot string
	// Checkpoints bounds what the node server takes from peers and how
	// long a replica may take (zero fields: ckpt.DefaultLimits').
	Checkpoints ckpt.Limits
	// Output receives every rank's output, each line behind its rank's tag.
	Output io.Writer
	// RankUser, when set, is the user (a name or a uid) the ranks run as:
	// another than the agent's, which must then run as root. The ranks can
	// then reach neither the node's key, the agent's environment, its
	// ranks' logs, nor other jobs' held checkpoints (docs/SECURITY.md).
	RankUser string
	// RankEnv names variables of the agent's environment its ranks inherit
	// beyond InheritedEnv (NAME, or PREFIX* for every name starting with
	// PREFIX); none of gpucoord's own (GPUCOORD_*) is ever passed.
	RankEnv []string
	// Grace is how long ranks have between SIGTERM and SIGKILL.
	Grace time.Duration
	// Retry is the first pause before the coordinators are tried again
	// after none answered; it doubles at each pass, up to MaxRetry, with
	// jitter. A report a coordinator failed is tried again after Retry.
	Retry time.Duration
	// ConnectTimeout is how long a coordinator is given to answer a
	// connection before the next one is tried.
	ConnectTimeout time.Duration
	// TimesEvery is the window over which the ranks' compute times are
	// averaged and reported for straggler detection.
	TimesEvery time.Duration
	// Version is the build version, for display.
	Version string
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns settings for a real node.
func DefaultConfig() *Config {
	host, _ := os.Hostname()
	return &Config{Name: host, GPUs: 1, Grace: localproc.DefaultGrace, Retry: 500 * time.Millisecond, TimesEvery: time.Second,
		ConnectTimeout: pb.DefaultConnectTimeout, Checkpoints: ckpt.DefaultLimits, WorkDir: filepath.Join(os.TempDir(), "gpucoord-worker"), Output: os.Stdout}
}

// MaxRetry bounds the pause between two passes over coordinators that
// did not answer.
const MaxRetry = 30 * time.Second

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case len(c.Coordinators) == 0:
		return errors.New("no coordinator address")
	case pb.CheckNodeName(c.Name) != nil:
		return fmt.Errorf("--name %q: %s", c.Name, pb.NodeNameRule)
	case c.GPUs < 1:
		return fmt.Errorf("gpus %d: want at least 1", c.GPUs)
	case len(c.DeviceList) > 0 && c.GPUs > len(c.DeviceList):
		return fmt.Errorf("%d ranks per node but %d GPUs given to the node (%s): one rank per GPU", c.GPUs, len(c.DeviceList), strings.Join(c.DeviceList, ","))
	case len(c.NativeCommand) == 0:
		return errors.New("no native rank command")
	case c.Grace <= 0:
		return fmt.Errorf("--grace %s: want a positive duration", c.Grace)
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("--connect-timeout %s: want a positive duration", c.ConnectTimeout)
	case c.Retry <= 0 || c.TimesEvery <= 0:
		return fmt.Errorf("retry %s and times window %s must be positive", c.Retry, c.TimesEvery)
	}
	for _, p := range c.RankEnv {
		if err := CheckRankEnv(p); err != nil {
			return err
		}
	}
	return c.Checkpoints.Validate()
}

// ErrRefused marks a coordinator's refusal that retrying cannot fix: a
// wrong token, another protocol version, a name in use by a live node.
var ErrRefused = errors.New("worker: refused by the coordinator")

// errNameTaken is a registration refused because the name is registered:
// retried for nameTakenWait, as it is usually this node's earlier run.
var errNameTaken = errors.New("worker: name in use")

// nameTakenWait is how long an agent waits for its name to be free: far
// more than a lease's life.
const nameTakenWait = time.Minute

// Agent is the worker agent of one node: it registers with a coordinator,
// keeps its lease alive through its Watch stream, and runs the ranks its
// assignment names.
type Agent struct {
	cfg      *Config
	net      Network
	log      *slog.Logger
	instance string     // this run's, random: its gossip member is name#instance
	streams  uint64     // the Watch streams opened, by the one loop that opens them
	out      sync.Mutex // serialises rank output lines

	mu     sync.Mutex
	client pb.CoordinatorClient // current coordinator
	lease  int64
	// leaseTTL is the lease's, as its registration gave it: how long a
	// stream may take to bring its first message.
	leaseTTL time.Duration
	// revision is the newest view of etcd an assignment came from: a stream
	// opened on another coordinator starts no earlier.
	revision int64
	deadline time.Time // when the lease runs out unless renewed: the ranks' right to run
	dog      *fenceDog // the fence watchdog; nil without FenceCommand
	// clock is the open stream's (session's) coordinator clock, for the
	// renewals that come through the node's relay.
	clock        *leaseClock
	clockSession uint64
	// relayKey is the open stream's relay key (Assignment.relay_key), and
	// relayedIn takes the assignments its relay forwards, checked by it,
	// to the session goroutine.
	relayKey  []byte
	relayedIn chan *pb.Assignment
	// reported is the job and generation of the assignment whose Stopped
	// report was sent last (the session goroutine's alone).
	reported struct {
		job string
		gen int64
	}
	// stopSeq counts the Stopped reports begun: one not delivered because
	// this node was not registered is sent again after it registers,
	// while no later assignment has made it stale.
	stopSeq atomic.Int64
	renewed chan struct{}  // poked at every renewal, for the fence
	bg      sync.WaitGroup // reports sent in the background
	// pool is the node's member of its domain's pool (a.mu; nil until the
	// first registration, and if it could not start), poolTuning its
	// tuning; poolKeys are the keys it uses (the session goroutine's).
	// gossipBind and gossipAddr are where it listens and what the
	// registration says (empty: the node is in no pool).
	pool       *gossip.Pool
	poolTuning gossip.Tuning
	poolKeys   [][]byte
	gossipBind string
	gossipAddr string
	// poolDead takes the members the pool declares dead, to report.
	poolDead chan string
	// conns are the connections to every coordinator (Run's): deaths are
	// reported to all of them.
	conns []*grpc.ClientConn

	latest *pb.Assignment // the last assignment received (a.mu)
	relays relay          // the reports this node relays for its block

	holder   *ckpt.Holder // the checkpoints this node holds; set by Run
	ckptAddr string       // where peers and clients reach the node server
	// output keeps what the ranks print, for launch and gpucoord logs.
	output *ranklog.Store
	// rankUser is the user ranks run as; nil: the agent's.
	rankUser *rankUser
	// ready is closed once a coordinator has registered the node and its
	// stream has delivered the first assignment: the node can take a job.
	ready     chan struct{}
	readyOnce sync.Once
}

// Ready is closed once the node is registered and watching: a job
// submitted from then on can have it at once.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// New returns an agent; Run starts it.
func New(cfg *Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("worker: instance id: %w", err)
	}
	// The first coordinator whose route can be found says which address
	// this node advertises.
	var nw Network
	var err error
	for _, c := range cfg.Coordinators {
		if nw, err = ResolveNetwork(context.Background(), cfg.Host, cfg.Bind, cfg.Iface, c); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	log = log.With("component", "agent", "node", cfg.Name)
	ru, err := lookupRankUser(cfg.RankUser)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if ru != nil {
		// The ranks' logs are the agent's to serve, not other ranks' to read.
		logs := filepath.Dir(logsDir(cfg.Name, cfg.WorkDir))
		if err := errors.Join(os.MkdirAll(logs, 0o755), os.Chmod(logs, 0o700)); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	output := ranklog.New(logsDir(cfg.Name, cfg.WorkDir), cfg.Name, ranklog.DefaultLimits, log)
	clearJobDirs(cfg.WorkDir, cfg.Name, log)
	return &Agent{cfg: cfg, net: nw, instance: hex.EncodeToString(id[:]), renewed: make(chan struct{}, 1), ready: make(chan struct{}),
		log: log, output: output, rankUser: ru, poolDead: make(chan string, 1024)}, nil
}

// Run registers and serves assignments until ctx ends, then stops its
// ranks (SIGTERM, Grace, SIGKILL) and leaves the pool. Ranks keep running
// while the agent moves between coordinators, as long as the node's lease
// holds: when no coordinator has renewed it for its TTL (the node is cut
// off, or every coordinator lost etcd), the ranks are stopped, since the
// coordinator may have given them to another node. It returns an
// ErrRefused error when the coordinator will not take this node.
func (a *Agent) Run(ctx context.Context) error {
	creds, peer, err := a.credentials(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	served, err := a.serveNode(serveCtx, peer)
	if err != nil {
		stopServing()
		return err
	}
	defer func() { stopServing(); <-served }()
	conns := make([]*grpc.ClientConn, len(a.cfg.Coordinators))
	for i, addr := range a.cfg.Coordinators {
		cc, err := pb.DialAgent(addr, creds, a.cfg.ConnectTimeout)
		if err != nil {
			return fmt.Errorf("worker: coordinator %s: %w", addr, err)
		}
		defer cc.Close()
		conns[i] = cc
	}
	a.conns = conns
	a.reserveGossip()
	dog, err := startFenceDog(a.cfg.FenceCommand, os.Stderr)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	a.dog = dog
	defer func() {
		if err := dog.stop(); err != nil {
			a.log.Warn("fence watchdog", "err", err)
		}
	}()
	run := &runner{agent: a}
	defer run.stop()
	// The sessions outlive ctx by the preemption: the Watch stream keeps
	// the node's lease (and so its place in the job) while its ranks
	// checkpoint.
	sctx, stopSessions := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSessions()
	ended := make(chan error, 1)
	go func() { ended <- a.sessions(sctx, conns, run) }()
	fenced, kept := make(chan struct{}), make(chan struct{})
	go func() { defer close(fenced); a.fence(sctx, run) }()
	go func() { defer close(kept); a.keepPool(sctx) }()
	defer func() { stopSessions(); <-fenced; <-kept; a.bg.Wait() }()
	select {
	case <-ctx.Done():
		run.preempt(a.cfg.Grace)
		stopSessions()
		<-ended
	case err = <-ended:
	}
	run.stop()
	a.leave()
	if pool := a.member(); pool != nil {
		pool.Leave(time.Second)
		pool.Shutdown()
	}
	return err
}

// credentials obtains what the agent shows coordinators (join.Load as
// this node), trying again (backing off from Retry) while no coordinator
// answers; a
// refusal ends it with ErrRefused. peer is the node's credentials, for
// its peers; nil with the coordinators' plaintext.
func (a *Agent) credentials(ctx context.Context) (creds credentials.TransportCredentials, peer *pki.Credentials, err error) {
	cfg := join.Config{Coordinators: a.cfg.Coordinators, Token: a.cfg.Token, Files: a.cfg.TLS, Dir: a.cfg.CredentialsDir,
		Identity: pki.Identity{Role: pki.RoleNode, Name: a.cfg.Name}}
	for attempt := 0; ; attempt++ {
		c, ok, err := join.Load(ctx, cfg)
		switch {
		case err == nil && !ok:
			return nil, nil, nil
		case err == nil:
			t, err := pki.ClientTLS(c)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: tls: %v", ErrRefused, err)
			}
			a.log.Info("mutual TLS as this node", "identity", cfg.Identity.String())
			return credentials.NewTLS(t), &c, nil
		case ctx.Err() != nil:
			return nil, nil, nil
		case errors.Is(err, join.ErrRefused):
			return nil, nil, fmt.Errorf("%w: %v", ErrRefused, err)
		}
		wait := backoff.Next(attempt, a.cfg.Retry, MaxRetry)
		a.log.Warn("joining the cluster", "err", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil, nil, nil
		case <-time.After(wait):
		}
	}
}

// serveNode starts the node server: the checkpoints this node holds, to
// its peers, and what its ranks print, to users' clients (launch, gpucoord
// logs). It serves on the bind address, with mutual TLS (pki.PeerTLS) or,
// without credentials, in plaintext on loopback only (elsewhere the node
// holds its own files but serves nothing). The returned channel closes
// when the server has stopped after ctx ends.
func (a *Agent) serveNode(ctx context.Context, peer *pki.Credentials) (<-chan struct{}, error) {
	done := make(chan struct{})
	root := CheckpointRoot(a.cfg.Name, a.cfg.CheckpointRoot, a.cfg.WorkDir)
	var server, client *tls.Config
	if peer != nil {
		var err error
		if server, client, err = pki.PeerTLS(*peer); err != nil {
			return nil, fmt.Errorf("worker: peer tls: %w", err)
		}
	}
	a.holder = ckpt.New(root, a.cfg.Name, server, client, a.log)
	a.holder.SetLimits(a.cfg.Checkpoints)
	a.holder.SetLookup(a.members)
	if peer == nil && !net.ParseIP(a.net.Bind).IsLoopback() {
		a.log.Warn("no credentials: neither checkpoints nor rank output are served off loopback (jobs need a shared --checkpoint-dir)")
		close(done)
		return done, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(a.net.Bind, "0"))
	if err != nil {
		return nil, fmt.Errorf("worker: node server: %w", err)
	}
	a.ckptAddr = net.JoinHostPort(a.net.Host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	mux := nodeMux(a.holder, a.output, a.relayReport, a.relayRenewal)
	go func() {
		defer close(done)
		if err := ckpt.Serve(ctx, ln, server, mux, a.log); err != nil {
			a.log.Error("node server", "err", err)
		}
	}()
	a.log.Info("node server", "checkpoints", root, "addr", a.ckptAddr)
	return done, nil
}

// sessions moves between the coordinators until ctx ends or one refuses
// the node: after a failure it tries the next at once, and after a whole
// pass in which none answered it pauses, backing off from Retry.
func (a *Agent) sessions(ctx context.Context, conns []*grpc.ClientConn, run *runner) error {
	var taken time.Time // when registration first found the name in use
	failed := 0         // passes in a row in which no coordinator answered
	answered := false   // a coordinator answered in this pass
	faults := make([]string, len(conns))
	down := map[string]bool{} // coordinators that took no connection in a pause since one last answered
	for i := 0; ctx.Err() == nil; i = (i + 1) % len(conns) {
		client := pb.NewCoordinatorClient(conns[i])
		ok, err := a.session(ctx, client, run)
		answered = answered || ok
		faults[i] = ""
		if ctx.Err() != nil {
			break
		}
		switch {
		case errors.Is(err, ErrRefused):
			return err
		case errors.Is(err, errNameTaken) && taken.IsZero():
			// Most likely this node's earlier run, killed or cut off, whose
			// lease has not ended yet: take its place when it does.
			taken = time.Now()
			a.log.Warn("an earlier run of this node is still registered: waiting for its lease to end", "wait", nameTakenWait)
		case errors.Is(err, errNameTaken) && time.Since(taken) > nameTakenWait:
			return fmt.Errorf("%w: %v (still, after %s)", ErrRefused, err, nameTakenWait)
		case errors.Is(err, errNameTaken):
		case ok:
			taken = time.Time{}
			a.log.Warn("coordinator connection", "addr", a.cfg.Coordinators[i], "err", err)
		default:
			taken = time.Time{}
			faults[i] = gpclient.Describe(err, a.cfg.ConnectTimeout)
		}
		if (i+1)%len(conns) != 0 {
			continue
		}
		if answered {
			failed = 0
		}
		wait := backoff.Next(failed, a.cfg.Retry, MaxRetry)
		if !answered {
			failed++
			ue := &gpclient.UnreachableError{Addrs: a.cfg.Coordinators, Faults: faults}
			a.log.Warn(ue.Error(), "retry_in", wait.Round(time.Millisecond))
		}
		if answered {
			clear(down)
		}
		answered = false
		a.pause(ctx, wait, conns, down)
	}
	return nil
}

// pause waits d between two passes over the coordinators, or less: it
// ends as soon as a coordinator that did not take a connection during the
// pause takes one (a network cut that healed, a coordinator restarted), so
// that a pause grown long during an outage does not outlast it. gRPC's
// own reconnection backoff is then reset too: the next attempt connects at
// once.
//
// down holds the coordinators seen refusing connections during this pause
// or one before it since a coordinator last answered.
func (a *Agent) pause(ctx context.Context, d time.Duration, conns []*grpc.ClientConn, down map[string]bool) {
	end := time.NewTimer(d)
	defer end.Stop()
	tick := time.NewTicker(a.cfg.Retry)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-end.C:
			return
		case <-tick.C:
		}
		for _, addr := range a.cfg.Coordinators {
			dctx, cancel := context.WithTimeout(ctx, a.cfg.Retry)
			c, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
			cancel()
			if err != nil {
				down[addr] = true
				continue
			}
			c.Close()
			if down[addr] {
				a.log.Info("a coordinator takes connections again: trying now", "addr", addr)
				for _, cc := range conns {
					cc.ResetConnectBackoff()
				}
				return
			}
		}
	}
}

// renew moves the lease deadline to d, when it is later, and tells the
// fence watchdog.
func (a *Agent) renew(d time.Time) {
	a.renewIf(d, func() bool { return true })
}

// renewIf is renew when ok, called with a.mu held, says so; it reports
// whether ok did.
func (a *Agent) renewIf(d time.Time, ok func() bool) bool {
	a.mu.Lock()
	if !ok() {
		a.mu.Unlock()
		return false
	}
	later := d.After(a.deadline)
	if later {
		a.deadline = d
	}
	a.mu.Unlock()
	if later {
		a.dog.deadline(d)
	}
	select {
	case a.renewed <- struct{}{}:
	default:
	}
	return true
}

// fence stops the ranks whenever the lease deadline passes with ranks
// running, until ctx ends: from then on the coordinator may have given
// their ranks to another node, and two copies of a rank must not run.
func (a *Agent) fence(ctx context.Context, run *runner) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		a.mu.Lock()
		deadline := a.deadline
		a.mu.Unlock()
		var expired <-chan time.Time // nil once passed: only a renewal is waited for
		if left := time.Until(deadline); !deadline.IsZero() && left > 0 {
			t.Reset(left)
			expired = t.C
		} else if !deadline.IsZero() && run.active() {
			a.log.Error("lease deadline passed with no coordinator renewing it: stopping ranks", "deadline", deadline.Format(time.RFC3339Nano))
			run.fence()
		}
		select {
		case <-ctx.Done():
			return
		case <-a.renewed:
		case <-expired:
		}
	}
}

// session registers if needed and follows one Watch stream until it ends;
// answered says whether the coordinator answered (registered the node or
// opened the stream), the error why the session ended.
func (a *Agent) session(ctx context.Context, client pb.CoordinatorClient, run *runner) (answered bool, err error) {
	clock := &leaseClock{} // this stream's coordinator's clock, mapped onto ours
	a.mu.Lock()
	lease, ttl := a.lease, a.leaseTTL
	a.mu.Unlock()
	if lease == 0 {
		// A coordinator that took the connection and never answers is
		// passed over as one that did not take it.
		rctx, cancel := context.WithTimeout(ctx, a.cfg.ConnectTimeout+reportTimeout)
		resp, err := client.Register(rctx, &pb.RegisterRequest{Node: &pb.Node{Name: a.cfg.Name, Host: a.net.Host, Gpus: int32(a.cfg.GPUs),
			NvlinkDomain: a.cfg.NVLinkDomain, FailureDomain: a.cfg.FailureDomain, Protocol: pb.ProtocolVersion, Version: a.cfg.Version, Instance: a.instance,
			CheckpointAddr: a.ckptAddr, GossipAddr: a.gossipAddr}})
		cancel()
		if err != nil {
			switch status.Code(err) {
			case codes.AlreadyExists:
				return true, fmt.Errorf("%w: %s", errNameTaken, status.Convert(err).Message())
			case codes.Unauthenticated, codes.FailedPrecondition, codes.InvalidArgument, codes.PermissionDenied:
				return true, fmt.Errorf("%w: %s", ErrRefused, status.Convert(err).Message())
			}
			return false, err
		}
		answered = true
		lease, ttl = resp.LeaseId, time.Duration(resp.TtlSeconds)*time.Second
		a.mu.Lock()
		// A new registration watches afresh: the revision seen belongs to
		// the lease that ended (perhaps of an etcd cluster since replaced).
		a.lease, a.leaseTTL, a.revision = lease, ttl, 0
		a.mu.Unlock()
		a.log.Info("registered", "gpus", a.cfg.GPUs, "host", a.net.Host, "bind", a.net.Bind, "iface", a.net.Iface)
		a.joinPool(resp.Gossip)
	}
	// Each stream has a higher session than the one before it (its conns
	// key then wins over any the agent left behind), and says how long
	// the deadlines the streams before it gave still run: a fence of the
	// run waits that out at least. A registration gives no deadline: the
	// first comes with the first assignment.
	// Renewals through the relay of the stream before count no more.
	a.streams++
	a.mu.Lock()
	a.clock = nil
	seen, left := a.revision, max(time.Until(a.deadline), 0)
	a.mu.Unlock()
	// The connection is not pinged (DialAgent): the stream's messages say
	// the coordinator is there, and a stream silent for longer than it
	// promised is ended here (silence).
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	silent := newSilence(ttl, cancel)
	defer silent.stop()
	stream, err := client.Watch(wctx, &pb.WatchRequest{Node: a.cfg.Name, LeaseId: lease, FromRevision: seen, Session: a.streams, DeadlineLeftMs: left.Milliseconds() + 1})
	if err != nil {
		return answered, err
	}
	relayedIn := make(chan *pb.Assignment, relayedQueue)
	a.mu.Lock()
	a.client = client
	a.clock, a.clockSession = clock, a.streams
	a.relayKey, a.relayedIn = nil, relayedIn
	a.mu.Unlock()
	// The stream's messages and the assignments the node's relay forwards
	// for it are taken in one place, in the order they come, each revision
	// once: a relayed one newer than any taken (applied), a stream's
	// unless a relay brought it or a newer one (relayedRev). The loop
	// returns only once it has taken the stream's error: the reader
	// always hands it over, and ends with it.
	msgs := make(chan received)
	go func() {
		for {
			asg, err := stream.Recv()
			msgs <- received{asg, err}
			if err != nil {
				return
			}
		}
	}()
	var applied, relayedRev int64
	for {
		var asg *pb.Assignment
		select {
		case m := <-msgs:
			asg, err = m.asg, m.err
		case r := <-relayedIn:
			if r.Revision <= applied {
				continue // its own stream was quicker
			}
			relayedRev, applied = r.Revision, r.Revision
			a.mu.Lock()
			a.revision = max(a.revision, r.Revision)
			a.mu.Unlock()
			a.assigned(ctx, run, r)
			continue
		}
		if err == nil {
			silent.heard(asg.HeartbeatMs)
		} else if cause := context.Cause(wctx); ctx.Err() == nil && errors.Is(cause, errSilent) {
			err = fmt.Errorf("%w: no message for %s", cause, silent.bound())
		}
		if err != nil {
			switch status.Code(err) {
			case codes.NotFound:
				// The lease expired while we were away: register anew.
				a.mu.Lock()
				a.lease = 0
				a.mu.Unlock()
			case codes.OutOfRange:
				// The revision seen is ahead of etcd's: another etcd
				// cluster (restored, or replaced). Watch afresh.
				a.mu.Lock()
				a.revision = 0
				a.mu.Unlock()
			}
			return answered || status.Code(err) == codes.NotFound, err
		}
		answered = true
		a.readyOnce.Do(func() { close(a.ready) })
		if asg.LeaseTtlMs > 0 {
			a.renew(clock.deadline(asg, time.Now()))
		}
		a.mu.Lock()
		a.revision = max(a.revision, asg.Revision)
		if len(asg.RelayKey) > 0 {
			a.relayKey = asg.RelayKey
		}
		a.mu.Unlock()
		if len(asg.RelayedRenewals) > 0 {
			a.forwardRenewals(asg)
		}
		if !asg.Renewal && (relayedRev == 0 || asg.Revision > relayedRev) {
			applied = max(applied, asg.Revision)
			a.assigned(ctx, run, asg)
		}
	}
}

// relayedQueue bounds the assignments through the relay a session has
// yet to take: a change comes a few times a generation, and one that does
// not fit is refused to the relay, which then does not report it
// delivered (the member's stream sends it).
const relayedQueue = 8

// received is a message of a Watch stream, or why it ended.
type received struct {
	asg *pb.Assignment
	err error
}

// assigned acts on asg, a new assignment (from the stream or through the
// node's relay): it is the latest, its generation is the node server's,
// its ranks run and earlier ones stop, and the held checkpoints and rank
// output of ended jobs go.
func (a *Agent) assigned(ctx context.Context, run *runner, asg *pb.Assignment) {
	a.mu.Lock()
	a.latest = asg
	a.mu.Unlock()
	a.sawAssignment(asg)
	a.setPoolKeys(asg.GossipKeys)
	booted := run.apply(ctx, asg)
	a.stopped(ctx, asg, booted)
	a.dropHeld(asg.LiveJobs)
	a.output.Keep(asg.LiveJobs)
}

// jobDir is where this agent keeps a job's plan files and error files,
// in the work directory's own (OwnDir): under the node's name, so agents
// sharing a work directory never share it.
func (a *Agent) jobDir(job string) string {
	return filepath.Join(jobsDir(a.cfg.WorkDir), job, a.cfg.Name)
}

// removeJobDir removes this agent's directory of job, and the job's
// directory when no other agent's is left in it; never anything of a name
// no job may have.
func (a *Agent) removeJobDir(job string) {
	if err := pb.CheckJobID(job); err != nil {
		a.log.Error("not removing the job's files", "err", err)
		return
	}
	if err := os.RemoveAll(a.jobDir(job)); err != nil {
		a.log.Warn("removing the job's files", "job", job, "err", err)
		return
	}
	os.Remove(filepath.Join(jobsDir(a.cfg.WorkDir), job)) // fails, as it should, while not empty
	a.log.Info("job files removed", "job", job, "dir", a.jobDir(job))
}

// clearJobDirs removes what an earlier run of the agent named node left
// of its jobs (a plan file of a generation it was killed in): no rank runs
// yet, and a generation is never started twice on a node.
func clearJobDirs(workDir, node string, log *slog.Logger) {
	entries, _ := os.ReadDir(jobsDir(workDir))
	for _, e := range entries {
		job := e.Name()
		if pb.CheckJobID(job) != nil {
			continue
		}
		dir := filepath.Join(jobsDir(workDir), job, node)
		if _, err := os.Lstat(dir); err != nil {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("removing an earlier run's job files", "job", job, "err", err)
			continue
		}
		os.Remove(filepath.Join(jobsDir(workDir), job)) // fails, as it should, while not empty
		log.Info("an earlier run's job files removed", "job", job, "dir", dir)
	}
}

// dropHeld removes the checkpoints this node holds of jobs that ended:
// those of the jobs in live (not ended) stay, though this node may run
// none of them now (a paused job resumes from them; a job that went on
// without this node may gather from it).
func (a *Agent) dropHeld(live []string) {
	if a.holder == nil {
		return
	}
	for _, job := range a.holder.Jobs() {
		if slices.Contains(live, job) {
			continue
		}
		if err := a.holder.Remove(job); err != nil {
			a.log.Warn("removing the checkpoints of an ended job", "job", job, "err", err)
			continue
		}
		a.log.Info("checkpoints of an ended job removed", "job", job)
	}
}

// stopped tells the coordinators, once apply has stopped what ran before
// (it waits for the ranks to exit), that this node runs no rank of the
// assigned job below the assigned generation, and none of the job it was
// assigned before up to the generation it was assigned last (Stopped; not
// "none ever": the node may join a later generation of that job, whose
// ranks the report must not cover): a generation opens once every node
// that may still run earlier ranks has said so. A generation already open
// waits for nobody. The reports are sent in the background, tried again
// while no coordinator answers, or while this node is not registered (a
// cut lost its lease) and no later assignment has made them stale. The
// report for asg's job waits for booted, rank 0's address reported
// (runner.bootEarly), when it is not nil: the generation then opens
// with the address.
func (a *Agent) stopped(ctx context.Context, asg *pb.Assignment, booted <-chan struct{}) {
	job, gen := asg.Job, asg.Generation.GetNumber()
	last := a.reported
	if last.job == job && last.gen == gen {
		return
	}
	a.reported.job, a.reported.gen = job, gen
	seq := a.stopSeq.Add(1)
	send := func(job string, below int64, after <-chan struct{}, via *pb.Assignment) {
		a.bg.Add(1)
		go func() {
			defer a.bg.Done()
			if after != nil {
				select {
				case <-after:
				case <-ctx.Done():
					return
				}
			}
			for {
				r := &pb.ReportRequest{Job: job, Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: below}}}
				var err error
				if via != nil {
					// The first try goes through the node's relay in the
					// new generation, with the block's others; any other
					// to the coordinator itself.
					r.Generation = below
					_, err = a.reportVia(ctx, via, r)
					via = nil
				} else {
					_, err = a.reportResp(ctx, r)
				}
				if err == nil || ctx.Err() != nil {
					return
				}
				if c := status.Code(err); c != codes.NotFound && c != codes.PermissionDenied || a.stopSeq.Load() != seq {
					a.log.Warn("reporting the ranks stopped", "job", job, "below", below, "err", err)
					return
				}
				// Not registered now (its lease lost to a cut), or sent
				// with the lease it had before registering again: the
				// generation waiting for this report opens only with it,
				// so it is said again with the lease it holds next.
				select {
				case <-ctx.Done():
					return
				case <-time.After(a.cfg.Retry):
				}
			}
		}()
	}
	if last.job != "" && last.job != job {
		send(last.job, last.gen+1, nil, nil)
	}
	if job != "" && !asg.Open {
		send(job, gen, booted, asg)
	}
}

// node is what a rank's environment says of this node.
func (a *Agent) node() NodeEnv {
	return NodeEnv{Name: a.cfg.Name, Network: a.net, Devices: a.cfg.Devices, DeviceList: a.cfg.DeviceList}
}

// reserveGossip picks the address of the node's pool member, before its
// first registration says it: Gossip, else Bind with a port free for TCP
// and UDP now. Without one the node registers in no pool.
func (a *Agent) reserveGossip() {
	bind := a.cfg.Gossip
	if bind == "" {
		bind = net.JoinHostPort(a.net.Bind, "0")
	}
	host, port, err := net.SplitHostPort(bind)
	if err == nil && port == "0" {
		var p int
		p, err = gossip.FreePort(host)
		port = strconv.Itoa(p)
	}
	if err != nil {
		a.log.Warn("gossip address: the node joins no pool", "err", err)
		return
	}
	a.gossipBind, a.gossipAddr = net.JoinHostPort(host, port), net.JoinHostPort(a.net.Host, port)
}

// member is the node's pool member; nil before the first registration.
func (a *Agent) member() *gossip.Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pool
}

// joinPool starts this node's member of its domain's pool (once: the
// first registration's label and tuning; the first node of a domain, given
// no seeds, starts the pool alone) and joins the seeds. A node outside the
// pool still works; only its failures are noticed later (by its stream or
// its lease).
func (a *Agent) joinPool(g *pb.Gossip) {
	if g == nil || a.gossipAddr == "" {
		return
	}
	pool := a.member()
	if pool == nil {
		t := gossip.Tuning{ProbeInterval: time.Duration(g.ProbeIntervalMs) * time.Millisecond,
			ProbeTimeout: time.Duration(g.ProbeTimeoutMs) * time.Millisecond, SuspicionMult: int(g.SuspicionMult)}
		var err error
		pool, err = gossip.New(gossip.MemberName(a.cfg.Name, a.instance), a.gossipBind, a.net.Host, t, gossip.Secure{Keys: g.Keys, Label: g.Label}, poolEvents(a.poolDead), nil)
		if err != nil {
			// Registered with an address no member listens on: the next
			// registration says none.
			a.log.Warn("gossip pool: the node joins no pool", "err", err)
			a.gossipAddr = ""
			return
		}
		a.mu.Lock()
		a.pool, a.poolTuning = pool, t
		a.mu.Unlock()
		a.poolKeys = g.Keys
		a.log.Info("gossip member", "addr", pool.LocalNode().Address(), "domain", cmp.Or(a.cfg.FailureDomain, a.cfg.NVLinkDomain), "seeds", len(g.Seeds))
	}
	a.joinSeeds(pool, g.Seeds)
}

// joinSeeds joins those of seeds that are not alive members of pool
// already.
func (a *Agent) joinSeeds(pool *gossip.Pool, seeds []string) {
	alive := map[string]bool{}
	for _, m := range pool.Members() {
		alive[m.Address()] = true
	}
	var join []string
	for _, s := range seeds {
		if !alive[s] {
			join = append(join, s)
		}
	}
	if len(join) == 0 {
		return
	}
	if _, err := pool.Join(join); err != nil {
		a.log.Warn("gossip join", "seeds", join, "err", err)
	}
}

// poolEvents hands the members a pool declares dead (or that left) to the
// agent's keepPool, never blocking memberlist.
type poolEvents chan string

func (e poolEvents) Dead(name string) {
	select {
	case e <- name:
	default:
	}
}

// poolAskMax bounds the pause between two requests for members of a pool
// that still lacks some.
const poolAskMax = time.Minute

// keepPool looks after the node's pool member until ctx ends. It reports
// every death the pool finds to every coordinator (PoolReport): a member
// of a domain's pool is how the coordinators, members of no pool, learn
// that a node of the domain is gone (a frozen agent keeps its stream and
// its lease alive for seconds more). And while its pool has fewer alive
// members than the coordinators count registered in the domain (it
// started alone beside another that did too, it lost every member it knew
// when the rest of its rack restarted, a partition healed), it asks for
// seeds and joins them, backing off from ten probe intervals to
// poolAskMax while the count stays short.
func (a *Agent) keepPool(ctx context.Context) {
	want := 0 // the pool's registered members, as last answered; 0: not asked yet
	wait := time.Second
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		var dead []string
		select {
		case <-ctx.Done():
			return
		case m := <-a.poolDead:
			dead = append(dead, m)
			for more := true; more; { // the deaths found meanwhile go in the same report
				select {
				case m := <-a.poolDead:
					dead = append(dead, m)
				default:
					more = false
				}
			}
		case <-t.C:
		}
		a.mu.Lock()
		pool, lease, base := a.pool, a.lease, 10*a.poolTuning.ProbeInterval
		a.mu.Unlock()
		if pool == nil || lease == 0 {
			if len(dead) > 0 {
				a.log.Warn("gossip: deaths not reported: this node is not registered", "dead", dead)
			}
			t.Reset(time.Second)
			continue
		}
		// Complete: looked at again, locally, in a while. A node told it is
		// alone in its domain asks again, less and less often: another
		// may have registered as it asked.
		if len(dead) == 0 && want > 1 && pool.NumMembers() >= want {
			wait = base
			t.Reset(wait)
			continue
		}
		if len(dead) > 0 {
			a.log.Warn("gossip: members of this node's pool declared dead: reporting them", "dead", dead)
		}
		seeds, members := a.poolReport(ctx, lease, dead)
		if members > 0 {
			want = members
		}
		a.joinSeeds(pool, seeds)
		if len(dead) == 0 {
			wait = min(max(2*wait, base), poolAskMax) // still short: ask less often
		}
		t.Reset(wait) // no stale tick after a Reset (Go 1.23's timers)
	}
}

// poolReportTimeout bounds one PoolReport call.
const poolReportTimeout = 3 * time.Second

// poolReport sends the deaths in dead (none: a request for seeds) to every
// coordinator at once, and returns the seeds and the largest count of
// members they answered with.
func (a *Agent) poolReport(ctx context.Context, lease int64, dead []string) (seeds []string, members int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, cc := range a.conns {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, poolReportTimeout)
			defer cancel()
			resp, err := pb.NewCoordinatorClient(cc).PoolReport(cctx, &pb.PoolReportRequest{Node: a.cfg.Name, LeaseId: lease, Dead: dead})
			if err != nil {
				if ctx.Err() == nil {
					a.log.Warn("gossip: pool report", "coordinator", a.cfg.Coordinators[i], "err", err)
				}
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range resp.GetSeeds() {
				if !slices.Contains(seeds, s) {
					seeds = append(seeds, s)
				}
			}
			members = max(members, int(resp.GetMembers()))
		})
	}
	wg.Wait()
	return seeds, members
}

// setPoolKeys makes keys the pool member's keys when they changed (a
// rotation step the coordinators announce with every assignment).
func (a *Agent) setPoolKeys(keys [][]byte) {
	pool := a.member()
	if pool == nil || len(keys) == 0 || slices.EqualFunc(keys, a.poolKeys, bytes.Equal) {
		return
	}
	if err := pool.SetKeys(keys); err != nil {
		a.log.Error("gossip keys", "err", err)
		return
	}
	a.poolKeys = keys
	fps := make([]string, len(keys))
	for i, k := range keys {
		fps[i] = gossip.Fingerprint(k)
	}
	a.log.Info("gossip keys changed", "keys", strings.Join(fps, ","))
}

// leave revokes the lease, so that the coordinators forget this node at
// once.
func (a *Agent) leave() {
	a.mu.Lock()
	client, lease := a.client, a.lease
	a.mu.Unlock()
	if client == nil || lease == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	client.Leave(ctx, &pb.LeaveRequest{Node: a.cfg.Name, LeaseId: lease})
}

// reportTimeout bounds one Report call.
const reportTimeout = 5 * time.Second

// report sends r to the current coordinator, retrying across coordinator
// changes until it is taken, refused for good (a wrong token, a bad
// report) or ctx ends.
func (a *Agent) report(ctx context.Context, r *pb.ReportRequest) error {
	_, err := a.reportResp(ctx, r)
	return err
}

// reportResp is report, with the coordinator's answer.
func (a *Agent) reportResp(ctx context.Context, r *pb.ReportRequest) (*pb.ReportResponse, error) {
	r.Node = a.cfg.Name
	for {
		a.mu.Lock()
		client := a.client
		r.LeaseId = a.lease // the lease now: a report is fenced by it
		a.mu.Unlock()
		// A call is bounded: one sent to a coordinator that was then cut
		// off, or lost etcd, is tried again through the current one.
		cctx, cancel := context.WithTimeout(ctx, reportTimeout)
		resp, err := client.Report(cctx, r)
		cancel()
		if err == nil || ctx.Err() != nil {
			return resp, err
		}
		a.log.Warn("report", "job", r.Job, "err", err)
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.ResourceExhausted:
		default: // another coordinator would refuse it too
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(a.cfg.Retry):
		}
	}
}

// runner runs the ranks of at most one assignment at a time.
type runner struct {
	agent *Agent
	mu    sync.Mutex          // guards procs
	procs map[int]*os.Process // the current run's ranks, once started
	// life guards the fields below: apply and stop come from the session
	// goroutine, preempt and the last stop from Run's.
	life   sync.Mutex
	cur    *pb.Assignment // what runs now; nil for nothing
	cancel context.CancelFunc
	done   chan struct{}
	// started is the job and generation this agent started last: a
	// generation is run once; if its ranks were stopped while it went on
	// (fenced), its assignment coming back is answered with their failure.
	started struct {
		job string
		gen int64
	}
	// fenced is the job and generation whose ranks the lease fence stopped.
	fenced  *pb.Assignment
	masters chan *pb.Bootstrap // hands the master address and probe to a run waiting for them
	// early is rank 0's bootstrap of the assigned generation, made on this
	// node before the generation opened; nil for none.
	early *earlyBoot
}

func (r *runner) active() bool {
	r.life.Lock()
	defer r.life.Unlock()
	return r.cur != nil
}

// apply makes the ranks match asg: stops a run of another job or
// generation, starts a new one, or passes on the master address. On rank
// 0's node, a generation not open yet gets its bootstrap made and
// reported meanwhile (bootEarly): booted is closed once that report is
// answered; nil for none.
func (r *runner) apply(ctx context.Context, asg *pb.Assignment) (booted <-chan struct{}) {
	r.life.Lock()
	defer r.life.Unlock()
	if e := r.early; e != nil && (asg.Job != e.job || asg.Generation.GetNumber() != e.gen) {
		r.dropEarlyLocked()
	}
	if r.cur != nil && (asg.Job != r.cur.Job || asg.Generation.GetNumber() != r.cur.Generation.GetNumber()) {
		old := r.cur.Job
		r.stopLocked()
		if asg.Job != old {
			// The node is done with the job (it ended, or went on
			// without this node): its plan and scratch files go.
			r.agent.removeJobDir(old)
		}
	}
	if asg.Job == "" {
		return nil
	}
	if err := pb.CheckJobID(asg.Job); err != nil {
		// Every path of a job is named by its id: a coordinator that
		// sends one no job may have gets nothing run, or removed.
		r.agent.log.Error("assignment refused", "err", err)
		return nil
	}
	if r.cur == nil && asg.Job == r.started.job && asg.Generation.GetNumber() <= r.started.gen {
		r.refuseRestart(ctx, asg)
		return nil
	}
	if r.cur != nil {
		if asg.Master != "" && r.cur.Master == "" {
			r.cur.Master = asg.Master
			r.masters <- &pb.Bootstrap{Master: asg.Master, Probe: asg.Probe, StoreSecret: asg.StoreSecret}
		}
		return nil
	}
	if !asg.Open {
		// Earlier ranks of the job may still run elsewhere: no rank yet.
		return r.bootEarly(ctx, asg)
	}
	early := r.early
	r.early = nil
	r.cur = proto.Clone(asg).(*pb.Assignment)
	r.started.job, r.started.gen = asg.Job, asg.Generation.GetNumber()
	// The ranks outlive the agent's context: when the agent is told to
	// stop, Run first lets them checkpoint (preempt), then stops them.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel, r.done, r.masters = cancel, make(chan struct{}), make(chan *pb.Bootstrap, 1)
	if asg.Master != "" {
		r.masters <- &pb.Bootstrap{Master: asg.Master, Probe: asg.Probe, StoreSecret: asg.StoreSecret}
	}
	r.mu.Lock()
	r.procs = map[int]*os.Process{}
	r.mu.Unlock()
	hooks := runHooks{
		started: func(rank int, p *os.Process) {
			r.mu.Lock()
			r.procs[rank] = p
			r.mu.Unlock()
			r.agent.dog.started(p.Pid) // its own process group
		},
	}
	go func(a *pb.Assignment, masters <-chan *pb.Bootstrap, done chan struct{}) {
		defer close(done)
		defer r.agent.dog.clear() // every rank has exited
		r.agent.run(rctx, a, masters, early, hooks)
	}(r.cur, r.masters, r.done)
	return nil
}

// bootEarly makes rank 0's bootstrap of asg's generation, which has not
// opened, when this node runs rank 0 (earlyBoot), and reports it in the
// background: the store serves no rank of an earlier generation (its
// address and secret are the new generation's), and the probe is a file
// of its own. It returns a channel closed once the report is answered;
// nil when this node makes none. A bootstrap that fails here is left to
// the run, which reports the failure.
func (r *runner) bootEarly(ctx context.Context, asg *pb.Assignment) <-chan struct{} {
	if r.early != nil {
		return r.early.reported
	}
	a, gen := r.agent, asg.Generation.GetNumber()
	if me := member(asg, a.cfg.Name); me == nil || me.FirstRank != 0 || asg.Master != "" {
		return nil
	}
	// The store outlives the session that made it, as a run's does: it
	// ends with stop (dropEarlyLocked, or the run that takes it over).
	boot, stop, err := a.bootstrapRank0(context.WithoutCancel(ctx), asg)
	if err != nil {
		a.log.Warn("rank 0's bootstrap before the generation opens (its run tries again)", "job", asg.Job, "generation", gen, "err", err)
		return nil
	}
	e := &earlyBoot{job: asg.Job, gen: gen, boot: boot, stop: stop, reported: make(chan struct{})}
	r.early = e
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		defer close(e.reported)
		if err := a.report(ctx, &pb.ReportRequest{Job: e.job, Generation: e.gen, Kind: &pb.ReportRequest_Bootstrap{Bootstrap: boot}}); err != nil && ctx.Err() == nil {
			a.log.Warn("reporting rank 0's bootstrap before the generation opens (its run reports it again)", "job", e.job, "generation", e.gen, "err", err)
		}
	}()
	return e.reported
}

// dropEarlyLocked stops the store of a bootstrap made for a generation
// that did not open here (another came, or the agent stops).
func (r *runner) dropEarlyLocked() {
	if r.early != nil {
		r.early.stop()
		r.early = nil
	}
}

// preempt asks the current run's native ranks to checkpoint the step in
// progress and stop (PreemptSignal), and waits up to grace for them (the
// run stores and reports that step before it ends, while this node is
// still a member); a command's ranks are left to stop.
func (r *runner) preempt(grace time.Duration) {
	r.life.Lock()
	cur, done := r.cur, r.done
	r.life.Unlock()
	if cur == nil || len(cur.Spec.GetCommand()) > 0 {
		return
	}
	r.mu.Lock()
	procs := slices.Collect(maps.Values(r.procs))
	r.mu.Unlock()
	if len(procs) == 0 {
		return
	}
	r.agent.log.Info("preempted: ranks checkpoint, then stop", "ranks", len(procs), "grace", grace)
	for _, p := range procs {
		p.Signal(PreemptSignal)
	}
	select {
	case <-done:
	case <-time.After(grace):
		r.agent.log.Warn("ranks did not stop within the grace period after preemption")
	}
}

// runHooks are what a run tells its runner: each rank's process once it
// starts.
type runHooks struct {
	started func(rank int, p *os.Process)
}

// fence stops the current run because the node's lease ran out: its
// generation is not run again on this node.
func (r *runner) fence() {
	r.life.Lock()
	defer r.life.Unlock()
	if r.cur != nil {
		r.fenced = r.cur
	}
	// At once, with no grace: the lease is over, and what the ranks would
	// still write may already be another generation's.
	r.mu.Lock()
	for _, p := range r.procs {
		syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
	r.mu.Unlock()
	r.stopLocked()
	r.dropEarlyLocked()
}

// refuseRestart answers an assignment of a generation this node already
// ran: if the fence stopped its ranks while the coordinator kept the
// generation going (the lease outlived the agent's deadline), report them
// failed, once, so that the coordinator makes a new generation; never
// start them again (their rendezvous is gone, and the generation's other
// ranks have moved on).
func (r *runner) refuseRestart(ctx context.Context, asg *pb.Assignment) {
	f := r.fenced
	if f == nil || f.Job != asg.Job || f.Generation.GetNumber() != asg.Generation.GetNumber() {
		return
	}
	r.fenced = nil
	me := member(asg, r.agent.cfg.Name)
	if me == nil {
		return
	}
	go r.agent.reportExit(ctx, asg, &pb.RankExit{Rank: me.FirstRank, Code: 1,
		Error: fmt.Sprintf("node %s stopped its ranks when its lease deadline passed (no coordinator renewed it in time)", r.agent.cfg.Name)})
}

// stop ends the current run and waits for its ranks to exit.
func (r *runner) stop() {
	r.life.Lock()
	defer r.life.Unlock()
	r.stopLocked()
	r.dropEarlyLocked()
}

func (r *runner) stopLocked() {
	if r.cur == nil {
		return
	}
	r.cancel()
	<-r.done
	r.cur = nil
}

// errorFilePath is rank's TORCHELASTIC_ERROR_FILE in a generation's
// directory.
func errorFilePath(dir string, rank int) string {
	return filepath.Join(dir, "error-"+strconv.Itoa(rank)+".json")
}

// reportTimes sends the local ranks' mean compute times every window,
// through the node's relay.
func (a *Agent) reportTimes(ctx context.Context, asg *pb.Assignment, times *stepTimes) {
	// Every node reports at the same instants of its clock (whole
	// windows), so that a relay forwards its block's times in one call.
	now := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(now.Truncate(a.cfg.TimesEvery).Add(a.cfg.TimesEvery).Sub(now)):
	}
	t := time.NewTicker(a.cfg.TimesEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ranks := times.take(); ranks.Len() > 0 {
			a.reportVia(ctx, asg, &pb.ReportRequest{Job: asg.Job, Generation: asg.Generation.GetNumber(),
				Kind: &pb.ReportRequest_Times{Times: ranks}})
		}
	}
}

// stepTimes sums the local ranks' compute times between reports.
type stepTimes struct {
	mu  sync.Mutex
	sum map[int]float64
	n   map[int]int
}

func newStepTimes() *stepTimes { return &stepTimes{sum: map[int]float64{}, n: map[int]int{}} }

func (t *stepTimes) add(rank int, secs float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sum[rank] += secs
	t.n[rank]++
}

// take returns each rank's mean since the last take, by rank, and starts
// a new window.
func (t *stepTimes) take() *pb.RankTimes {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := &pb.RankTimes{}
	for _, r := range slices.Sorted(maps.Keys(t.n)) {
		out.Add(int32(r), t.sum[r]/float64(t.n[r]), int32(t.n[r]))
	}
	clear(t.sum)
	clear(t.n)
	return out
}

// reportExit reports how a rank ended; a failure without a time is
// stamped now.
func (a *Agent) reportExit(ctx context.Context, asg *pb.Assignment, e *pb.RankExit) {
	if e.Code != 0 && e.FailedAtUnixMs == 0 {
		e.FailedAtUnixMs = time.Now().UnixMilli()
	}
	a.report(ctx, &pb.ReportRequest{Job: asg.Job, Generation: asg.Generation.GetNumber(), Kind: &pb.ReportRequest_Exit{Exit: e}})
}

// bootstrap prepares rank 0's rendezvous address on this node: for a
// native job a store served here until the run ends, with a secret of this
// generation's that every request must be signed with; for a user's
// program a free port for its own store (torch's TCPStore on rank 0).
func (a *Agent) bootstrap(ctx context.Context, native bool) (*pb.Bootstrap, func(), error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(a.net.Bind, "0"))
	if err != nil {
		return nil, nil, err
	}
	boot := &pb.Bootstrap{Master: net.JoinHostPort(a.net.Host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))}
	if !native {
		ln.Close()
		return boot, func() {}, nil
	}
	if boot.StoreSecret, err = tcp.NewSecret(); err != nil {
		ln.Close()
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tcp.ServeStore(sctx, ln, collectives.NewMemStore(), boot.StoreSecret)
	}()
	return boot, func() { cancel(); <-done }, nil
}

// writePlan stores the assignment as the GPUCOORD_PLAN file.
func writePlan(path string, asg *pb.Assignment) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// The store's secret goes to native ranks in their environment only;
	// the pool's keys go to no rank.
	asg = proto.Clone(asg).(*pb.Assignment)
	asg.StoreSecret, asg.GossipKeys = nil, nil
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(asg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
