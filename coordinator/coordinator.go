package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Config configures a Coordinator. Start from DefaultConfig and override
// fields.
type Config struct {
	// Name identifies this coordinator in the election and in status;
	// empty means the listen address.
	Name string
	// Listen is the gRPC address. Any address but loopback needs TokenFile
	// or TLS.
	Listen string
	// Etcd says where the state lives: an external cluster or the
	// embedded server.
	Etcd EtcdConfig
	// Prefix is the root of every etcd key; it ends in "/".
	Prefix string
	// Metrics is the address of the Prometheus /metrics endpoint; empty
	// serves none.
	Metrics string
	// HTTP is the address of the dashboard (web.go); empty serves none.
	// On loopback it is plaintext and open to this machine; off loopback
	// it is TLS and asks for a client certificate of the cluster's CA, so
	// the coordinator must serve mutual TLS (TokenFile or TLS).
	HTTP string
	// Planner answers the dashboard's plan form; nil leaves it out.
	Planner PlanFunc
	// GossipTuning sets how fast the agents' pools declare a silent member
	// dead: agents are told it at Register. The coordinator is a member of
	// no pool; the agents report the deaths their pools find (PoolReport).
	GossipTuning gossip.Tuning
	// TokenFile is the bootstrap join token's file: written (0600) with a
	// new token, good for every role, when absent; checked against the
	// cluster when present. With it the coordinator serves mutual TLS from
	// the cluster CA in etcd. A coordinator off loopback needs it or TLS.
	TokenFile string
	// TLS names an organisation's CA, and this coordinator's certificate
	// and key under it, to serve mutual TLS with instead of the cluster CA
	// in etcd; TLSCAKey, when set, is that CA's key, so that join tokens
	// can buy certificates too.
	TLS      pki.Files
	TLSCAKey string
	// TLSHosts are names and addresses the coordinator's certificate is
	// valid for besides the machine's own (a load balancer's name).
	TLSHosts []string
	// LeaseTTL is the life of a node's lease after its last keep-alive:
	// the backstop that finds a node that vanished without a word.
	LeaseTTL time.Duration
	// ElectionTTL is the life of the leader's session: a standby takes
	// over at most this long after the leader dies.
	ElectionTTL time.Duration
	// FailureSettle is how long the leader waits after a rank's failure
	// before it decides the cause, so that a node lost at the same moment
	// (whose peers failed because it vanished) is named as the cause.
	FailureSettle time.Duration
	// FenceMargin is how long after a node's lease has surely run out (its
	// key gone, or the lease's remaining time when it was revoked) its
	// ranks of an earlier generation count as stopped: the agent's own
	// deadline may run this late (its clock is mapped onto the
	// coordinator's by the renewals, and the ranks are killed once it
	// passes), and coordinators' clocks may differ by this much. No
	// generation of the job opens before (docs/ARCHITECTURE.md, "Fencing").
	FenceMargin time.Duration
	// FenceWindow, when set, bounds how long a node runs its ranks past
	// its last renewal, below the lease: each Watch stream renews the node
	// every third of it, for at most it. A node its pool reports dead then
	// costs its job the rest of the window its serving coordinator granted
	// (plus FenceMargin), not the rest of its lease; a coordinator stalled
	// for longer than two thirds of it stops its nodes' ranks. 0: the
	// lease's TTL, as without it.
	FenceWindow time.Duration
	// StableFor is how long a node must have been registered, without
	// losing its lease, before a running job takes it in (a rejoining or
	// replacement node); a flapping node does not thrash the job.
	StableFor time.Duration
	// StragglerFactor flags a rank whose mean compute time per step is more
	// than this many times the median of its generation's ranks...
	StragglerFactor float64
	// StragglerWindows ... in this many consecutive reported windows.
	StragglerWindows int
	// KeepJobs is how many ended jobs etcd keeps (for status); the leader
	// deletes the oldest beyond it, so state does not grow forever.
	KeepJobs int
	// Tick is how often the leader looks at a running job's compute times
	// for stragglers; every other decision is taken at the event it
	// depends on, or at its own deadline.
	Tick time.Duration
	// TimesFlush is how often a coordinator writes the compute times its
	// agents reported since (one key per running job generation).
	TimesFlush time.Duration
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// relayWait, when not 0, replaces relayWait (tests).
	relayWait time.Duration
}

// DefaultConfig returns settings for a real cluster: the embedded etcd,
// loopback, 5 s leases.
func DefaultConfig() *Config {
	return &Config{
		Listen:           "127.0.0.1:7070",
		Prefix:           "/gpucoord/",
		LeaseTTL:         5 * time.Second,
		ElectionTTL:      5 * time.Second,
		FailureSettle:    time.Second,
		FenceMargin:      time.Second,
		StableFor:        2 * time.Second,
		StragglerFactor:  2,
		StragglerWindows: 3,
		KeepJobs:         100,
		Tick:             200 * time.Millisecond,
		TimesFlush:       time.Second,
		Etcd:             EtcdConfig{DialTimeout: 5 * time.Second},
		GossipTuning:     gossip.DefaultTuning(),
	}
}

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.LeaseTTL < 2*time.Second || c.LeaseTTL%time.Second != 0:
		return errorf(ErrInvalid, "lease TTL %s: want whole seconds, at least 2s (etcd's lease granularity)", c.LeaseTTL)
	case c.ElectionTTL < 2*time.Second || c.ElectionTTL%time.Second != 0:
		return errorf(ErrInvalid, "election TTL %s: want whole seconds, at least 2s", c.ElectionTTL)
	case c.FenceMargin < 0:
		return errorf(ErrInvalid, "fence margin %s: must not be negative", c.FenceMargin)
	case c.FenceWindow != 0 && (c.FenceWindow < 300*time.Millisecond || c.FenceWindow >= c.LeaseTTL):
		return errorf(ErrInvalid, "fence window %s: want 0 (the lease's TTL), or at least 300ms and shorter than the lease TTL %s", c.FenceWindow, c.LeaseTTL)
	case c.StableFor < 0:
		return errorf(ErrInvalid, "stable-for %s: want 0 or more", c.StableFor)
	case c.KeepJobs < 0:
		return errorf(ErrInvalid, "keep jobs %d: want 0 or more", c.KeepJobs)
	case c.StragglerFactor <= 1 || c.StragglerWindows < 1:
		return errorf(ErrInvalid, "straggler factor %g and windows %d: want a factor above 1 and at least 1 window", c.StragglerFactor, c.StragglerWindows)
	case c.FailureSettle < 0 || c.Tick < time.Millisecond || c.TimesFlush < time.Millisecond:
		return errorf(ErrInvalid, "failure settle %s, tick %s and times flush %s: want settle >= 0, tick and flush >= 1ms", c.FailureSettle, c.Tick, c.TimesFlush)
	case !strings.HasSuffix(c.Prefix, "/") || !strings.HasPrefix(c.Prefix, "/"):
		return errorf(ErrInvalid, "etcd prefix %q: want a path that starts and ends with '/'", c.Prefix)
	case c.Etcd.DialTimeout <= 0:
		return errorf(ErrInvalid, "etcd dial timeout %s: want a positive duration", c.Etcd.DialTimeout)
	}
	if err := c.GossipTuning.Validate(); err != nil {
		return errorf(ErrInvalid, "%v", err)
	}
	if err := c.validateHTTP(); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return errorf(ErrInvalid, "listen address %q: %v", c.Listen, err)
	}
	if !c.TLS.Empty() && (c.TLS.CA == "" || (c.TLS.Cert == "") != (c.TLS.Key == "") || (c.TLS.Cert == "" && c.TLSCAKey == "")) {
		return errorf(ErrInvalid, "--tls-ca, --tls-cert and --tls-key go together: name all three (or --tls-ca and --tls-ca-key, and the coordinator issues its own certificate)")
	}
	if c.TLSCAKey != "" && c.TLS.CA == "" {
		return errorf(ErrInvalid, "--tls-ca-key goes with --tls-ca")
	}
	if err := c.Etcd.validateMembers(); err != nil {
		return err
	}
	if len(c.Etcd.Members) > 0 && c.Etcd.PeerTLS.Empty() && c.TLSCAKey == "" {
		return errorf(ErrInvalid, "the embedded etcd's members speak mutual TLS: give --tls-ca and --tls-ca-key, from which each member makes its peer certificate")
	}
	if !c.secure() && !IsLoopback(host) {
		return errorf(ErrInvalid, "listen address %s is not loopback: give --token-file (a join token is written there, and the coordinator serves mutual TLS) or an organisation's --tls-ca, --tls-cert and --tls-key", c.Listen)
	}
	return nil
}

// secure reports whether the coordinator serves mutual TLS: with a token
// file or an organisation's certificate. Without either it serves
// plaintext, on loopback only.
func (c *Config) secure() bool { return c.TokenFile != "" || !c.TLS.Empty() }

// IsLoopback reports whether host names only this machine.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Coordinator serves the Coordinator gRPC service over state in etcd and,
// while it is the elected leader, runs rendezvous and acts on failures.
type Coordinator struct {
	cfg      *Config
	log      *slog.Logger
	ln       net.Listener
	etcd     *Etcd
	srv      *server
	cache    *cache
	grpc     *grpc.Server
	stopping chan struct{}
	metrics  net.Listener // nil without Config.Metrics
	registry *prometheus.Registry
	leading  atomic.Bool
	dead     chan deathKey // deaths the agents' pools reported, for revokeDead
	hooks    *hooks
	web      *web // nil without Config.HTTP
}

// hooks are fault points for tests, at the lines where a crash or a race
// matters; every field is nil outside tests. Set them before Run.
type hooks struct {
	// beforeApply and afterApply run around the leader's transaction of a
	// decision.
	beforeApply, afterApply func(job string, d *decision)
	// watchRead runs after a Watch stream read its first assignment and
	// before it waits for changes.
	watchRead func(node string)
	// cancelRead runs after Cancel read the job's state and before it
	// writes.
	cancelRead func(job string)
	// dropRenewal, when it says so, has a Watch stream send no message
	// for a renewal of node's lease (as when etcd's renewal is late).
	dropRenewal func(node string) bool
	// looked runs when a Watch stream looks at node's assignment after a
	// change, or late.
	looked func(node string)
}

// New binds the listen address and opens etcd, so that a port in use or an
// unreachable etcd is reported before anything runs. Run must follow; it
// releases both.
func New(ctx context.Context, cfg *Config) (*Coordinator, error) {
	if cfg.Etcd.Name == "" {
		cfg.Etcd.Name = cfg.Name
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, errorf(ErrUnavailable, "listen on %s: %v", cfg.Listen, errors.Unwrap(err))
	}
	var mln net.Listener
	if cfg.Metrics != "" {
		if mln, err = net.Listen("tcp", cfg.Metrics); err != nil {
			ln.Close()
			return nil, errorf(ErrUnavailable, "metrics: listen on %s: %v", cfg.Metrics, errors.Unwrap(err))
		}
	}
	if len(cfg.Etcd.Members) > 0 && cfg.Etcd.PeerTLS.Empty() {
		err = writePeerTLS(cfg, time.Now())
	}
	var e *Etcd
	if err == nil {
		e, err = OpenEtcd(ctx, cfg.Etcd)
	}
	if err != nil {
		ln.Close()
		if mln != nil {
			mln.Close()
		}
		return nil, err
	}
	c := &Coordinator{cfg: cfg, log: log.With("component", "coordinator"), ln: ln, etcd: e, stopping: make(chan struct{}), metrics: mln}
	if c.cfg.Name == "" {
		c.cfg.Name = ln.Addr().String()
	}
	c.dead = make(chan deathKey, 1024)
	sec, cp, err := c.secrets(ctx)
	if err != nil {
		ln.Close()
		if mln != nil {
			mln.Close()
		}
		e.Close()
		return nil, err
	}
	c.cache = newCache(e.Client, keys(cfg.Prefix), c.log.With("component", "cache"))
	c.hooks = &hooks{}
	c.srv = &server{cli: e.Client, k: keys(cfg.Prefix), cfg: cfg, log: c.log, stopping: c.stopping, health: newHealth(), cache: c.cache, hooks: c.hooks,
		times: newTimesBuffer(cfg.StragglerWindows, cfg.StragglerFactor), gossip: sec, secure: cp != nil, deaths: newDeathReports(), dead: c.dead,
		renewals: newRenewals(), grants: newGrants(), relayWait: cmp.Or(cfg.relayWait, relayWait)}
	c.srv.stored, c.srv.stopped, c.srv.conns = newStoredWriter(c.srv), newStoppedWriter(c.srv), newConnWriter(c.srv)
	opts := append(pb.ServerOptions(), grpc.UnaryInterceptor(c.srv.unary), grpc.ChainUnaryInterceptor(c.withDashboard), grpc.StreamInterceptor(c.srv.stream), grpc.ForceServerCodecV2(newPassCodec()))
	if cp != nil {
		c.srv.ca = cp.ca
		opts = append(opts, grpc.Creds(credentials.NewTLS(cp.tls)))
	}
	m := newMetrics(c.srv, c.leading.Load, &e.requests)
	c.srv.keepalive = m.keepalive.Observe
	c.registry = prometheus.NewRegistry()
	c.registry.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.grpc = grpc.NewServer(opts...)
	pb.RegisterCoordinatorServer(c.grpc, c.srv)
	c.registerHealth()
	if err := c.openWeb(cp); err != nil {
		ln.Close()
		if mln != nil {
			mln.Close()
		}
		e.Close()
		return nil, err
	}
	return c, nil
}

// secrets reads (or makes, for the first coordinator of a cluster) the
// gossip pools' key and the cluster's PKI, and writes the bootstrap token
// file when one is asked for.
func (c *Coordinator) secrets(ctx context.Context) (gossip.Secure, *clusterPKI, error) {
	k, now := keys(c.cfg.Prefix), time.Now()
	sec, err := clusterGossip(ctx, c.etcd.Client, k)
	if err != nil {
		return sec, nil, errorf(ErrUnavailable, "%v", err)
	}
	cp, err := setupPKI(ctx, c.etcd.Client, k, c.cfg, now)
	if err != nil || c.cfg.TokenFile == "" {
		return sec, cp, err
	}
	if cp.ca == nil {
		return sec, nil, errorf(ErrInvalid, "--token-file needs a CA that can issue certificates: the cluster CA, or --tls-ca-key with an organisation's")
	}
	return sec, cp, bootstrapToken(ctx, c.etcd.Client, k, c.cfg.TokenFile, cp.ca, now)
}

// Addr returns the address the gRPC service listens on.
func (c *Coordinator) Addr() string { return c.ln.Addr().String() }

// MetricsAddr returns the address of the /metrics endpoint, or "".
func (c *Coordinator) MetricsAddr() string {
	if c.metrics == nil {
		return ""
	}
	return c.metrics.Addr().String()
}

// EtcdEndpoints returns the client URLs of the etcd in use.
func (c *Coordinator) EtcdEndpoints() []string { return c.etcd.Endpoints }

// Run serves until ctx ends, campaigning for leadership and leading while
// elected. It returns after every goroutine it started has ended, with the
// listener and etcd closed.
func (c *Coordinator) Run(ctx context.Context) error {
	defer c.etcd.Close()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := c.grpc.Serve(c.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("coordinator: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		close(c.stopping)
		done := make(chan struct{})
		go func() { c.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			c.grpc.Stop()
			<-done
		}
		return nil
	})
	g.Go(func() error {
		return c.srv.health.monitor(gctx, etcdProbe(c.etcd.Client, c.cfg.Prefix), time.Second, 2*time.Second, c.log.With("component", "health"))
	})
	g.Go(func() error { return c.cache.run(gctx) })
	g.Go(func() error {
		return c.srv.times.run(gctx, c.etcd.Client, keys(c.cfg.Prefix), c.cache, c.cfg.Name, c.cfg.TimesFlush, c.log.With("component", "times"))
	})
	g.Go(func() error { return c.campaign(gctx) })
	g.Go(func() error { return c.revokeDead(gctx) })
	g.Go(func() error { return c.srv.windowLoop(gctx) })
	g.Go(func() error { return c.srv.relaySweep(gctx) })
	if c.metrics != nil {
		g.Go(func() error { return serveMetrics(gctx, c.metrics, c.registry) })
	}
	if c.web != nil {
		g.Go(func() error { return c.web.run(gctx) })
	}
	c.log.Info("coordinator serving", "addr", c.Addr(), "etcd", strings.Join(c.etcd.Endpoints, ","))
	err := g.Wait()
	c.srv.background.Wait() // before the etcd client closes
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
