package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/join"
	"github.com/gpucoord/gpucoord/internal/pki"
	"github.com/gpucoord/gpucoord/internal/rankexe"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker"
	"github.com/gpucoord/gpucoord/worker/engine"
)

func init() {
	subcommands = append(subcommands, newCoordinatorCmd, newWorkerCmd, newRankCmd, newFenceCmd, newVersionCmd)
}

// version is the build version: set with -ldflags "-X main.version=...",
// else the module's version from the build info.
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	v := "devel"
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += "+dirty"
		}
	}
	return v
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print gpucoord's version and wire-protocol version",
		Long: `version prints this binary's version (its module version, or the VCS
revision it was built from) and the protocol version agents and
coordinators speak: every node and coordinator of a cluster must speak the
same protocol (an agent of another is refused when it registers, naming
both).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			fmt.Fprintf(c.OutOrStdout(), "gpucoord %s (protocol %d)\n", buildVersion(), pb.ProtocolVersion)
			return nil
		},
	}
}

// logFlags are the logging flags of the long-running commands.
type logFlags struct{ format, level string }

func (f *logFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.format, "log-format", "text", "log format: text or json")
	c.Flags().StringVar(&f.level, "log-level", "info", "log level: debug, info, warn or error")
}

func (f *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(f.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch f.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", f.format)
}

// authFlags say how a command proves itself to coordinators: a join token
// (--token-file or GPUCOORD_TOKEN: never an argument, which ps shows), with
// which it obtains a
// certificate once and keeps it in --credentials-dir, or an organisation's
// certificate (--tls-ca, --tls-cert, --tls-key). With none of them it
// speaks plaintext, which only a coordinator on loopback accepts.
type authFlags struct {
	file, dir string
	tls       pki.Files
	// connectTimeout is how long a coordinator is given to answer a
	// connection: every command that reaches coordinators takes it.
	connectTimeout time.Duration
}

func (f *authFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.file, "token-file", "", "file holding a join token (as gpucoord token create prints it, or the coordinator's --token-file); or set GPUCOORD_TOKEN")
	fl.StringVar(&f.tls.CA, "tls-ca", "", "CA certificate of an organisation's PKI, instead of a token")
	fl.StringVar(&f.tls.Cert, "tls-cert", "", "this identity's certificate under --tls-ca (subject: CN=name, OU=role)")
	fl.StringVar(&f.tls.Key, "tls-key", "", "the key of --tls-cert")
	fl.StringVar(&f.dir, "credentials-dir", join.DefaultDir(), "where the certificate a token buys is kept (0600 files)")
	fl.DurationVar(&f.connectTimeout, "connect-timeout", pb.DefaultConnectTimeout, "how long each coordinator has to answer a connection before the next is tried")
}

// config resolves the flags into a join configuration for id.
func (f *authFlags) config(addrs []string, id pki.Identity) (join.Config, error) {
	tok := ""
	switch {
	case f.file != "":
		b, err := os.ReadFile(f.file)
		if err != nil {
			return join.Config{}, fmt.Errorf("--token-file: %w", err)
		}
		if tok = strings.TrimSpace(string(b)); tok == "" {
			return join.Config{}, fmt.Errorf("--token-file %s is empty", f.file)
		}
	default:
		tok = os.Getenv("GPUCOORD_TOKEN")
	}
	if tok != "" && !f.tls.Empty() {
		return join.Config{}, errors.New("a join token and --tls-cert exclude each other: give one")
	}
	if tok != "" {
		if _, err := pki.ParseToken(tok); err != nil {
			return join.Config{}, err
		}
	}
	if f.connectTimeout <= 0 {
		return join.Config{}, fmt.Errorf("--connect-timeout %s: want a positive duration", f.connectTimeout)
	}
	return join.Config{Coordinators: addrs, Token: tok, Files: f.tls, Dir: f.dir, Identity: id, Timeout: f.connectTimeout}, nil
}

// clientCredentials are a client command's credentials as the user on this
// machine, in role (client, or admin for the token commands).
func (f *authFlags) clientCredentials(ctx context.Context, addrs []string, role string) (credentials.TransportCredentials, error) {
	cfg, err := f.config(addrs, pki.Identity{Role: role, Name: join.UserAtHost()})
	if err != nil {
		return nil, usageError(err)
	}
	return join.Credentials(ctx, cfg)
}

// agentTLS is what a client command reads the agents' node servers (rank
// output) with: mutual TLS as the user on this machine, or nil
// (plaintext, which only agents on loopback serve) without a token or
// files. The credentials are those clientCredentials obtained and kept.
func (f *authFlags) agentTLS(ctx context.Context, addrs []string) (*tls.Config, error) {
	cfg, err := f.config(addrs, pki.Identity{Role: pki.RoleClient, Name: join.UserAtHost()})
	if err != nil {
		return nil, usageError(err)
	}
	c, ok, err := join.Load(ctx, cfg)
	if err != nil || !ok {
		return nil, err
	}
	return pki.AgentTLS(c)
}

// resolveLogs reads the logging flags of the long-running commands
// (coordinator, worker); a bad one is a usage error.
func resolveLogs(c *cobra.Command, logs *logFlags) (*slog.Logger, error) {
	log, err := logs.logger(c.ErrOrStderr())
	if err != nil {
		return nil, usageError(err)
	}
	return log, nil
}

// defaultDataDir is where the embedded etcd keeps its data by default.
func defaultDataDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "gpucoord", "etcd")
}

// coordinatorGCPercent is a coordinator's GOGC unless the environment
// sets one. Its collections mark every agent's stream (a live heap of
// about 500 MB at 16,384 nodes, with 16,384 goroutines' stacks): with
// Go's 100 they took about a sixth of its time there, and 200 measured
// 0.85 to 0.95 cores against 0.99 to 1.05, for 2.2 to 2.3 GB resident
// against 1.6 (docs/BENCHMARKS.md).
const coordinatorGCPercent = 200

func newCoordinatorCmd() *cobra.Command {
	cfg := coordinator.DefaultConfig()
	cfg.Planner = webPlan
	var etcd, profile, members, healthAddr string
	var logs logFlags
	cmd := &cobra.Command{
		Use:   "coordinator [flags]",
		Short: "Run a coordinator: job state in etcd, rendezvous, failure handling, the gRPC service",
		Long: `coordinator serves the Coordinator gRPC service that worker agents, launch
and status talk to. Its only state is in etcd: an embedded server keeping
its data in --data-dir (the default, for one machine or a trial), or an
external etcd v3 cluster with --etcd. Several coordinators may share one
etcd: one leads (etcd election) and the others stand by and take over.

Off loopback every call is mutual TLS. With --token-file the coordinators
keep a cluster CA in etcd (the first one makes it) and the file holds a join
token, written there (0600) when the file does not exist: give the same file
to the agents (worker --token-file) and to launch, which obtain their own
certificates with it once. gpucoord token create, list and revoke manage
more tokens. An organisation's own PKI takes the CA's place with --tls-ca,
--tls-cert and --tls-key (and --tls-ca-key to let tokens buy certificates).
On loopback without either, the service is plaintext.

--http serves a dashboard from files inside the binary: the pool by
failure domain, each job's rank grid (as plan --svg draws it) coloured
live by each rank's state, its loss and step-time curves, generations,
commits and replicas, a hung rank's stacks, a rank's output, and a plan
form. Every coordinator may serve one; a standby's follows the leader's
state. On loopback it is plaintext and open to this machine; on any other
address it is HTTPS and asks for a client certificate of the cluster's CA
(a client's reads, an admin's may cancel; docs/SECURITY.md). gpucoord
status --web prints its address.

A coordinator collects its garbage when its heap has grown to three times
what is live (GOGC=200, where Go's default is twice): at 16,384 nodes that
saved 0.1 to 0.15 cores for 0.6 GB more. GOGC in the environment wins.`,
		Example: `  gpucoord coordinator
  gpucoord coordinator --http 127.0.0.1:8080
  gpucoord coordinator --listen 0.0.0.0:7070 --token-file /etc/gpucoord/token
  gpucoord coordinator --listen 0.0.0.0:7070 --etcd http://etcd-0:2379,http://etcd-1:2379 --token-file /shared/gpucoord/token`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if os.Getenv("GOGC") == "" {
				debug.SetGCPercent(coordinatorGCPercent)
			}
			var err error
			if cfg.Logger, err = resolveLogs(c, &logs); err != nil {
				return err
			}
			if etcd != "" {
				cfg.Etcd.Endpoints = strings.Split(etcd, ",")
			}
			if members != "" {
				if cfg.Etcd.Members, err = coordinator.ParseMembers(members); err != nil {
					return usageError(err)
				}
			}
			if err := applyGossipProfile(c, profile, &cfg.GossipTuning); err != nil {
				return usageError(err)
			}
			// The endpoint's path is always /metrics: HOST:PORT/metrics
			// means HOST:PORT.
			if m := strings.TrimSuffix(cfg.Metrics, "/metrics"); m != "" {
				if _, port, err := net.SplitHostPort(m); err != nil || port == "" || strings.Contains(m, "/") {
					return usageError(fmt.Errorf("--metrics %q: want HOST:PORT, such as 127.0.0.1:9400 (metrics are then on http://127.0.0.1:9400/metrics)", cfg.Metrics))
				}
				cfg.Metrics = m
			}
			var health net.Listener
			if healthAddr != "" {
				if health, err = net.Listen("tcp", healthAddr); err != nil {
					return usageError(fmt.Errorf("--health-listen: %w", err))
				}
				defer health.Close()
			}
			co, err := coordinator.New(c.Context(), cfg)
			if err != nil {
				if errors.Is(err, coordinator.ErrInvalid) {
					return usageError(err)
				}
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "coordinator listening on %s (etcd %s)\n", co.Addr(), strings.Join(co.EtcdEndpoints(), ","))
			if m := co.MetricsAddr(); m != "" {
				fmt.Fprintf(c.OutOrStdout(), "metrics on http://%s/metrics\n", m)
			}
			if u := co.WebURL(); u != "" {
				fmt.Fprintf(c.OutOrStdout(), "dashboard on %s\n", u)
			}
			if health == nil {
				return co.Run(c.Context())
			}
			served := make(chan error, 1)
			go func() { served <- co.ServeHealth(health) }()
			err = co.Run(c.Context())
			return errors.Join(err, <-served)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address")
	fl.StringVar(&cfg.Name, "name", "", "name in the leader election (default the listen address)")
	fl.StringVar(&etcd, "etcd", "", "external etcd client URLs, comma-separated (default: embedded etcd in --data-dir)")
	fl.StringVar(&cfg.Etcd.DataDir, "data-dir", defaultDataDir(), "embedded etcd's data directory")
	fl.StringVar(&cfg.Etcd.Name, "etcd-name", "", "the embedded etcd member's name in --etcd-initial-cluster (default --name)")
	fl.StringVar(&members, "etcd-initial-cluster", "", "make the embedded etcd a member of this static cluster, NAME=https://HOST:PORT,... (etcd's --initial-cluster); the members speak mutual TLS under --tls-ca, each making its peer certificate with --tls-ca-key")
	fl.StringVar(&cfg.Etcd.PeerListen, "etcd-peer-listen", "", "where the embedded member's peer port binds (default every address, the port of its URL in --etcd-initial-cluster)")
	fl.StringVar(&cfg.Etcd.ClusterToken, "etcd-cluster-token", "", "tells this etcd cluster's peer traffic from another's on the same ports (default gpucoord)")
	fl.StringVar(&cfg.Etcd.Username, "etcd-user", "", "etcd user name")
	fl.StringVar(&cfg.Etcd.Password, "etcd-password", "", "etcd password (or ETCD_PASSWORD)")
	fl.StringVar(&cfg.Etcd.CAFile, "etcd-ca", "", "CA certificate of the etcd servers (TLS)")
	fl.StringVar(&cfg.Etcd.CertFile, "etcd-cert", "", "client certificate for etcd (TLS)")
	fl.StringVar(&cfg.Etcd.KeyFile, "etcd-key", "", "client key for etcd (TLS)")
	fl.StringVar(&cfg.Prefix, "prefix", cfg.Prefix, "root of every etcd key")
	fl.StringVar(&healthAddr, "health-listen", "", "serve gRPC health (grpc.health.v1) alone, in plaintext, on HOST:PORT, for probes that speak no TLS: service \"\" while it runs, \"gpucoord.v1.Coordinator\" while it reaches etcd")
	fl.StringVar(&cfg.Metrics, "metrics", "", "serve Prometheus metrics on HOST:PORT, at http://HOST:PORT/metrics (e.g. 127.0.0.1:9400)")
	fl.StringVar(&cfg.HTTP, "http", "", "serve the dashboard on HOST:PORT: plaintext and open on loopback (127.0.0.1:8080), TLS with a client certificate of the cluster's CA elsewhere (needs --token-file or --tls-*); gpucoord status --web prints its address")
	fl.IntVar(&cfg.KeepJobs, "keep-jobs", cfg.KeepJobs, "ended jobs kept in etcd for status; older ones are deleted")
	fl.DurationVar(&cfg.StableFor, "stable-for", cfg.StableFor, "how long a node must stay registered before a running job takes it in (doubled per strike)")
	fl.DurationVar(&cfg.FenceMargin, "fence-margin", cfg.FenceMargin, "how long after a lost node's lease has ended its ranks count as stopped, before the job's next generation starts (covers its agent's clock and the kill)")
	fl.DurationVar(&cfg.FenceWindow, "fence-window", 0, "how long a node may run its ranks past its last renewal, below --lease-ttl (e.g. 1s): each node is renewed every third of it (a running job's members through their block's relay, one message a block), and a node its gossip pool reports dead costs its job the rest of that window plus --fence-margin instead of the rest of its lease; a coordinator stalled longer than two thirds of it stops its nodes' ranks. 0: the lease")
	fl.DurationVar(&cfg.Etcd.DialTimeout, "etcd-dial-timeout", cfg.Etcd.DialTimeout, "how long to wait for etcd to answer at start")
	fl.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "a node's lease: how long a silent node stays in the pool")
	fl.DurationVar(&cfg.ElectionTTL, "election-ttl", cfg.ElectionTTL, "the leader's session: how soon a standby takes over")
	fl.String("gossip", "", "ignored: a coordinator is a member of no gossip pool")
	fl.MarkDeprecated("gossip", "coordinators are no longer members of a gossip pool: each failure domain's agents gossip among themselves and report deaths to the coordinators; the flag is ignored")
	fl.StringVar(&profile, "gossip-profile", "lan", "failure-detection tuning: lan (a dead node found in about a second) or wan (memberlist's WAN settings, for round trips of hundreds of ms); --probe-interval, --probe-timeout and --suspicion-mult override it")
	fl.DurationVar(&cfg.GossipTuning.ProbeInterval, "probe-interval", cfg.GossipTuning.ProbeInterval, "gossip: how often each member probes another")
	fl.DurationVar(&cfg.GossipTuning.ProbeTimeout, "probe-timeout", cfg.GossipTuning.ProbeTimeout, "gossip: how long a probe waits for its answer")
	fl.IntVar(&cfg.GossipTuning.SuspicionMult, "suspicion-mult", cfg.GossipTuning.SuspicionMult, "gossip: probe intervals a suspect has to refute before it is declared dead")
	fl.StringVar(&cfg.TokenFile, "token-file", "", "serve mutual TLS from the cluster CA in etcd; this file holds a join token for agents and launch (written, 0600, when absent)")
	fl.StringVar(&cfg.TLS.CA, "tls-ca", "", "an organisation's CA certificate: serve mutual TLS under it instead of the cluster CA")
	fl.StringVar(&cfg.TLS.Cert, "tls-cert", "", "this coordinator's certificate under --tls-ca (default: issued at start with --tls-ca-key)")
	fl.StringVar(&cfg.TLS.Key, "tls-key", "", "the key of --tls-cert")
	fl.StringVar(&cfg.TLSCAKey, "tls-ca-key", "", "the key of --tls-ca, so that join tokens can buy certificates under it")
	fl.StringSliceVar(&cfg.TLSHosts, "tls-san", nil, "more names or addresses for the coordinator's certificate (a load balancer's), comma-separated")
	logs.register(cmd)
	if p := os.Getenv("ETCD_PASSWORD"); p != "" {
		cfg.Etcd.Password = p
	}
	return cmd
}

func newWorkerCmd() *cobra.Command {
	cfg := worker.DefaultConfig()
	var coords string
	var auth authFlags
	var logs logFlags
	var stepMiB int64
	var signalExit int
	cmd := &cobra.Command{
		Use:   "worker --coordinator ADDR[,ADDR...] [flags]",
		Short: "Run a node's worker agent: register, watch for work, run and supervise the ranks",
		Long: `worker registers this node with the coordinators (the first that answers;
the others when it fails), keeps its lease alive, and starts one process
per local rank when a job's generation includes the node: the native engine,
or the job's command with torchrun's environment. Rank output is printed
here, each line tagged [node rRANK tpT ppP dpD], and kept for launch (which
reads it from the agent's node server, with the checkpoints it holds) and
for gpucoord logs (the latest 2 MiB of each rank, under --state-dir/gpucoord/logs).
The agent writes only in a directory "gpucoord" of --state-dir and
--checkpoint-local, and removes nothing outside it: a directory that holds
other files can be given.
Ranks are stopped with
SIGTERM, then SIGKILL after --grace, when the job ends, when the agent is
told to stop (SIGINT/SIGTERM) or when no coordinator has renewed the node's
lease for its TTL; they die with the agent even when it is killed.

Off loopback the agent speaks mutual TLS as its node: with a join token
(--token-file) it obtains the node's certificate once and keeps it in
--credentials-dir; an organisation's certificate for the node (OU=node,
CN=the node's name) can be given with --tls-ca, --tls-cert and --tls-key.

No address flag is needed: the node advertises the address of the
interface that routes to the coordinator (--iface or --advertise-addr to
choose another, --bind where NAT or a container runtime makes the local
address differ), and its ranks get GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME for that interface unless already set.

A native-engine rank runs this binary, or the one GPUCOORD_RANK_EXECUTABLE
names (a build without the race detector under a race-enabled agent).`,
		Example: `  gpucoord worker --coordinator coord-0:7070 --gpus-per-node 8 --token-file /etc/gpucoord/token
  gpucoord worker --coordinator coord-0:7070,coord-1:7070 --gpus-per-node 8 --iface ib0 --token-file /etc/gpucoord/token`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var err error
			if cfg.Logger, err = resolveLogs(c, &logs); err != nil {
				return err
			}
			if coords != "" {
				cfg.Coordinators = strings.Split(coords, ",")
			}
			flagFromEnv(c, &cfg.Name, envNodeName, "name")
			flagFromEnv(c, &cfg.Host, envAdvertiseAddr, "advertise-addr", "host")
			flagFromEnv(c, &cfg.FailureDomain, envFailureDomain, "failure-domain")
			jc, err := auth.config(cfg.Coordinators, pki.Identity{Role: pki.RoleNode, Name: cfg.Name})
			if err != nil {
				return usageError(err)
			}
			cfg.Token, cfg.TLS, cfg.CredentialsDir, cfg.ConnectTimeout = jc.Token, jc.Files, jc.Dir, auth.connectTimeout
			cfg.Checkpoints.MaxStepBytes = stepMiB << 20
			exe, err := rankexe.Path()
			if err != nil {
				return err
			}
			cfg.NativeCommand, cfg.FenceCommand = []string{exe, rankCmd}, []string{exe, fenceCmd}
			cfg.Output, cfg.Version = c.OutOrStdout(), buildVersion()
			a, err := worker.New(cfg)
			if err != nil {
				return usageError(err)
			}
			err = a.Run(c.Context())
			if err == nil && c.Context().Err() != nil && signalExit != 0 {
				// Stopped by SIGTERM or SIGINT, cleanly: say so in the exit
				// status (a Kubernetes Job then replaces the pod).
				return &exitError{code: signalExit}
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&coords, "coordinator", "", "coordinator addresses, comma-separated")
	fl.StringVar(&cfg.Name, "name", cfg.Name, "this node's unique name (default $GPUCOORD_NODE_NAME, else the host name)")
	fl.StringVar(&cfg.Host, "advertise-addr", "", "address other nodes reach this one at (default: $GPUCOORD_ADVERTISE_ADDR, else --iface's address, else the address of the interface that routes to the coordinator)")
	fl.StringVar(&cfg.Host, "host", "", "same as --advertise-addr")
	fl.MarkDeprecated("host", "use --advertise-addr")
	fl.StringVar(&cfg.Bind, "bind", "", "local address ranks, the rendezvous store and gossip listen on, where it differs from the advertised one (NAT, containers); default --advertise-addr")
	fl.StringVar(&cfg.Iface, "iface", "", "network interface to advertise and to give gloo and NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, unless already set)")
	fl.IntVar(&cfg.GPUs, "gpus-per-node", cfg.GPUs, "this node's rank slots: GPUs, or processes on a CPU machine (launch --gpus-per-node asks for as many)")
	fl.IntVar(&cfg.GPUs, "gpus", cfg.GPUs, "same as --gpus-per-node")
	fl.MarkDeprecated("gpus", "use --gpus-per-node, as launch does")
	fl.StringVar(&cfg.NVLinkDomain, "nvlink-domain", "", "name of the node's NVLink domain (default: the node alone)")
	fl.StringVar(&cfg.FailureDomain, "failure-domain", "", "what fails with this node (a rack, a power feed, a zone): replicas of its checkpoints go to nodes of other domains first, and it gossips in its domain's failure-detection pool (default: $GPUCOORD_FAILURE_DOMAIN, else its --nvlink-domain; nodes naming neither share one pool)")
	fl.StringVar(&cfg.Gossip, "gossip", "", "address of this node's member of its failure domain's failure-detection pool, TCP and UDP, reached by the other nodes of its domain (default: --bind, a free port)")
	fl.BoolVar(&cfg.Devices, "cuda", false, "set CUDA_VISIBLE_DEVICES to each rank's local index")
	fl.IntVar(&signalExit, "signal-exit-code", 0, "exit with this status after SIGTERM or SIGINT stopped the agent cleanly (default 0; 143 in a Kubernetes Job, so that a drained or preempted agent's pod is replaced rather than counted done)")
	fl.StringVar(&cfg.WorkDir, "state-dir", cfg.WorkDir, "where the agent keeps its files, in DIR/gpucoord: plan files, the ranks' logs, checkpoints when /dev/shm has no room (launch --workdir is where ranks start)")
	fl.StringVar(&cfg.WorkDir, "work-dir", cfg.WorkDir, "same as --state-dir")
	fl.MarkDeprecated("work-dir", "use --state-dir (launch --workdir is where the ranks start)")
	fl.StringVar(&cfg.CheckpointRoot, "checkpoint-local", "", "where this node keeps the checkpoints it holds for jobs without a shared --checkpoint-dir (its ranks' and replicas of its peers'), in DIR/gpucoord/checkpoints/NAME; default /dev/shm when it has 2 GiB free, else --state-dir")
	fl.Int64Var(&stepMiB, "checkpoint-max-step-mib", cfg.Checkpoints.MaxStepBytes>>20, "the largest step of a peer's checkpoint files this node takes as a replica or fetches, in MiB (raised to twice this node's own largest step); set it above the largest step any node writes")
	fl.DurationVar(&cfg.Checkpoints.ReplicaTimeout, "replica-timeout", cfg.Checkpoints.ReplicaTimeout, "how long one replica of a step may take, sent or fetched, plus a second per 64 MiB of it: a peer that takes longer fails the step (its ranks are told failed N), not the job")
	fl.DurationVar(&cfg.Grace, "grace", cfg.Grace, "time between SIGTERM and SIGKILL when ranks stop")
	fl.StringVar(&cfg.RankUser, "rank-user", "", "run the ranks as this user (a name or uid; the agent must run as root), so that they can read neither the node's key, the agent's environment, nor other jobs' held checkpoints (docs/SECURITY.md)")
	fl.StringArrayVar(&cfg.RankEnv, "rank-env", nil, "a variable of this agent's environment its ranks inherit beyond the usual ones (PATH, HOME, LANG, LC_*, TMPDIR, LD_LIBRARY_PATH, PYTHON*, CUDA_*, NCCL_*, GLOO_*, TORCH*, OMP_*...), or PREFIX* for all that start so (repeatable); gpucoord's own, its join token among them, never pass")
	auth.register(cmd)
	logs.register(cmd)
	return cmd
}

// applyGossipProfile sets t to the named profile, keeping the tuning
// flags given on the command line.
func applyGossipProfile(c *cobra.Command, name string, t *gossip.Tuning) error {
	p, err := gossip.Profile(name)
	if err != nil {
		return fmt.Errorf("--gossip-profile: %w", err)
	}
	fl := c.Flags()
	if !fl.Changed("probe-interval") {
		t.ProbeInterval = p.ProbeInterval
	}
	if !fl.Changed("probe-timeout") {
		t.ProbeTimeout = p.ProbeTimeout
	}
	if !fl.Changed("suspicion-mult") {
		t.SuspicionMult = p.SuspicionMult
	}
	return nil
}

// rankCmd is the hidden command an agent starts for each native-engine rank.
const rankCmd = "rank"

func newRankCmd() *cobra.Command {
	return &cobra.Command{
		Use:    rankCmd,
		Short:  "One rank of a native-engine job under a worker agent (not for direct use)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			// Slurm's --signal=USR1@T reaches every process of the step:
			// it is for launch, which stops the job at a backup step.
			signal.Ignore(syscall.SIGUSR1)
			err := worker.RunNativeRank(c.Context(), c.OutOrStdout(), c.ErrOrStderr())
			switch {
			case errors.Is(err, engine.ErrPreempted):
				return &exitError{code: worker.ExitPreempted, err: err}
			case errors.Is(err, engine.ErrUnrestorable):
				return &exitError{code: worker.ExitUnrestorable, err: err}
			}
			return err
		},
	}
}

// fenceCmd is the hidden command an agent starts as its fence watchdog.
const fenceCmd = "fence"

func newFenceCmd() *cobra.Command {
	return &cobra.Command{
		Use:    fenceCmd,
		Short:  "The fence watchdog beside a worker agent: kills its ranks when the lease deadline passes (not for direct use)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			// Only the agent ends it: by closing its stdin, or by dying
			// (Slurm's SIGUSR1 is for launch).
			signal.Ignore(syscall.SIGUSR1)
			return worker.RunFenceWatchdog(context.Background(), c.InOrStdin(), c.ErrOrStderr())
		},
	}
}

// since formats a duration for progress lines.
func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }
