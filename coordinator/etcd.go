package coordinator

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EtcdConfig says which etcd holds the coordinator's state: an external
// cluster (Endpoints) or, without endpoints, an embedded server keeping its
// data in DataDir.
type EtcdConfig struct {
	// Endpoints are the client URLs of an external etcd v3 cluster.
	Endpoints []string
	// DataDir holds the embedded server's data when Endpoints is empty.
	DataDir string
	// Username and Password authenticate to an external cluster.
	Username, Password string
	// CAFile, CertFile and KeyFile configure TLS to an external cluster:
	// the CA that signed the servers, and a client certificate.
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds the first contact with etcd.
	DialTimeout time.Duration

	// Name is the embedded member's name ("gpucoord" when empty).
	Name string
	// Members, when not empty, make the embedded server a member of this
	// static cluster (Name among them): each member's name and peer URL
	// (https). Empty runs a one-member cluster whose peer port is a unix
	// socket in DataDir.
	Members []EtcdMember
	// PeerListen is where the peer port binds; empty means every address
	// with the port of this member's URL.
	PeerListen string
	// PeerTLS is this member's peer certificate and key (PeerCert's), and
	// the CA every peer's certificate must chain to: peers speak mutual
	// TLS, and only a certificate whose common name is a member's PeerCN
	// is accepted. The coordinator writes them into DataDir when it holds
	// the CA's key.
	PeerTLS pki.Files
	// ClusterToken tells this cluster's peer traffic from another's that
	// reaches the same ports (a job's id).
	ClusterToken string
}

// EtcdMember is a member of a static embedded etcd cluster.
type EtcdMember struct {
	Name, PeerURL string
}

// ParseMembers reads NAME=https://HOST:PORT,... (etcd's --initial-cluster).
func ParseMembers(s string) ([]EtcdMember, error) {
	var ms []EtcdMember
	for _, item := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || strings.ContainsAny(name, "/ ") {
			return nil, errorf(ErrInvalid, "etcd member %q: want NAME=https://HOST:PORT", item)
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Scheme != "https" || pu.Port() == "" || pu.Hostname() == "" || (pu.Path != "" && pu.Path != "/") {
			return nil, errorf(ErrInvalid, "etcd member %s's peer URL %q: want https://HOST:PORT", name, u)
		}
		if slices.ContainsFunc(ms, func(m EtcdMember) bool { return m.Name == name }) {
			return nil, errorf(ErrInvalid, "etcd member %s named twice", name)
		}
		ms = append(ms, EtcdMember{Name: name, PeerURL: "https://" + pu.Host})
	}
	return ms, nil
}

// memberURL returns the peer URL of the member named name, "" when there
// is none.
func (c EtcdConfig) memberURL(name string) string {
	for _, m := range c.Members {
		if m.Name == name {
			return m.PeerURL
		}
	}
	return ""
}

// validateMembers checks a static cluster's settings.
func (c EtcdConfig) validateMembers() error {
	if len(c.Members) == 0 {
		return nil
	}
	if len(c.Endpoints) > 0 {
		return errorf(ErrInvalid, "--etcd and --etcd-initial-cluster exclude each other: the members are embedded servers")
	}
	if c.memberURL(c.Name) == "" {
		names := make([]string, len(c.Members))
		for i, m := range c.Members {
			names[i] = m.Name
		}
		return errorf(ErrInvalid, "this member's name %q is not among the initial cluster's (%s): give --etcd-name", c.Name, strings.Join(names, ", "))
	}
	return nil
}

// Etcd is a connection to the coordinator's etcd, and the embedded server
// when there is one.
type Etcd struct {
	// Client talks to etcd.
	Client *clientv3.Client
	// Endpoints are the client URLs in use (the embedded server's, if any).
	Endpoints []string
	requests  requestCounter
	server    *embed.Etcd
	lock      *os.File // the data directory's, held while the server runs
}

// OpenEtcd starts the embedded server or connects to the external
// cluster, and checks that etcd answers within DialTimeout. Close releases
// it.
func OpenEtcd(ctx context.Context, c EtcdConfig) (*Etcd, error) {
	e := &Etcd{Endpoints: c.Endpoints}
	if len(c.Endpoints) == 0 {
		lock, err := lockDataDir(c.DataDir)
		if err != nil {
			return nil, err
		}
		srv, err := startEmbedded(c)
		if err != nil {
			lock.Close()
			return nil, err
		}
		e.server, e.lock = srv, lock
		for _, l := range srv.Clients {
			e.Endpoints = append(e.Endpoints, "http://"+l.Addr().String())
		}
	}
	for _, ep := range e.Endpoints {
		if u, err := url.Parse(ep); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			e.Close()
			return nil, errorf(ErrInvalid, "etcd endpoint %q: want http://HOST:PORT or https://HOST:PORT", ep)
		}
	}
	cc := clientv3.Config{
		Endpoints:   e.Endpoints,
		DialTimeout: c.DialTimeout,
		Username:    c.Username,
		Password:    c.Password,
		Logger:      zap.NewNop(),
		DialOptions: e.requests.dialOptions(),
		// A generation of thousands of nodes is one transaction of
		// megabytes (its members): the client sends what the server
		// takes (etcdRequestLimit).
		MaxCallSendMsgSize: etcdRequestLimit + 1<<20,
		MaxCallRecvMsgSize: 2*etcdRequestLimit + 1<<20,
	}
	if c.CAFile != "" || c.CertFile != "" || strings.HasPrefix(e.Endpoints[0], "https://") {
		tc, err := tlsConfig(c)
		if err != nil {
			e.Close()
			return nil, err
		}
		cc.TLS = tc
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		e.Close()
		return nil, errorf(ErrUnavailable, "etcd at %s: %v", strings.Join(e.Endpoints, ","), err)
	}
	e.Client = cli
	// The client connects lazily: ask something so that an unreachable or
	// refusing cluster is reported now, in one line.
	pctx, cancel := context.WithTimeout(ctx, c.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, "/gpucoord-ping"); err != nil {
		e.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, errorf(ErrUnavailable, "etcd at %s did not answer within %s", strings.Join(e.Endpoints, ","), c.DialTimeout)
		}
		return nil, errorf(ErrUnavailable, "etcd at %s: %v", strings.Join(e.Endpoints, ","), err)
	}
	return e, nil
}

// Close disconnects and stops the embedded server.
func (e *Etcd) Close() error {
	if e.Client != nil {
		e.Client.Close()
	}
	if e.server != nil {
		// A leader hands its leadership over before it stops, and waits
		// for that up to etcd's request timeout (11 s with the static
		// clusters' timing) when its peers are stopping too (the tasks of a
		// Slurm job that ends or is cancelled): give it 2 s, then stop
		// without it. slurmstepd kills a task that is not done by KillWait.
		done := make(chan struct{})
		go func() { e.server.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			e.server.Server.HardStop()
			<-done
		}
	}
	if e.lock != nil {
		e.lock.Close() // releases the flock
	}
	return nil
}

// lockDataDir takes the embedded etcd's data directory for this process
// (an exclusive flock on gpucoord.lock in it, holding the pid): a second
// coordinator on the same directory fails at once, naming the first,
// rather than wait in etcd's own lock of its database.
func lockDataDir(dir string) (*os.File, error) {
	if dir == "" {
		return nil, errorf(ErrInvalid, "the embedded etcd needs a data directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd data directory: %w", err)
	}
	path := filepath.Join(dir, "gpucoord.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("etcd data directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errorf(ErrUnavailable, "data dir %s is in use by another coordinator (pid %s): give another --data-dir, or stop that one",
				dir, cmp.Or(strings.TrimSpace(string(b)), "unknown"))
		}
		return nil, fmt.Errorf("locking the etcd data directory %s: %w", dir, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// startEmbedded runs the embedded member: its client port on loopback (a
// port the kernel picks; only this coordinator talks to it), its peer port
// a unix socket in DataDir for a one-member cluster, or its URL in
// Members, with mutual TLS, in a static cluster.
// The embedded etcd's limits on one transaction, and the client's on one
// request: enough for a generation of 65,536 nodes (about 160 bytes a
// member), and for a decision that writes a strike for each of thousands
// of nodes lost at once (a 16,384-node run lost hundreds when etcd
// stalled; etcd's default is 128 operations). An external etcd needs
// --max-txn-ops and --max-request-bytes as large (docs/LAUNCH.md).
const (
	etcdTxnOps       = 64 << 10
	etcdRequestLimit = 16 << 20
)

func startEmbedded(c EtcdConfig) (*embed.Etcd, error) {
	dir := c.DataDir
	cfg := embed.NewConfig()
	cfg.Name = cmp.Or(c.Name, "gpucoord")
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// etcd formats a request it found slow (over 100 ms to apply, in its
	// apply loop, or to answer) as text for its log, even for a logger
	// that drops it: 140 ms of a CPU profile of a 16,384-node rendezvous
	// went to printing a generation's transaction that wrote 16,384 keys.
	// Its log is dropped here, so the warnings are never due.
	cfg.WarningApplyDuration, cfg.WarningUnaryRequestDuration = 24*time.Hour, 24*time.Hour
	lc, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*lc}, []url.URL{*lc}
	if len(c.Members) == 0 {
		lp, _ := url.Parse("unix://" + dir + "/peer.sock")
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*lp}, []url.URL{*lp}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		os.Remove(dir + "/peer.sock")
	} else {
		own, err := url.Parse(c.memberURL(cfg.Name))
		if err != nil {
			return nil, errorf(ErrInvalid, "etcd member %s: %v", cfg.Name, err)
		}
		listen := *own
		listen.Host = cmp.Or(c.PeerListen, net.JoinHostPort("0.0.0.0", own.Port()))
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{listen}, []url.URL{*own}
		var initial []string
		for _, m := range c.Members {
			initial = append(initial, m.Name+"="+m.PeerURL)
			cfg.PeerTLSInfo.AllowedCNs = append(cfg.PeerTLSInfo.AllowedCNs, pki.PeerCN(m.Name))
		}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = cmp.Or(c.ClusterToken, "gpucoord")
		if c.PeerTLS.CA == "" || c.PeerTLS.Cert == "" || c.PeerTLS.Key == "" {
			return nil, errorf(ErrInvalid, "etcd member %s: peers speak mutual TLS, and there is no peer certificate (give --tls-ca and --tls-ca-key)", cfg.Name)
		}
		cfg.PeerTLSInfo.CertFile, cfg.PeerTLSInfo.KeyFile, cfg.PeerTLSInfo.TrustedCAFile = c.PeerTLS.Cert, c.PeerTLS.Key, c.PeerTLS.CA
		cfg.PeerTLSInfo.ClientCertAuth = true
		// A member that lost its peers gives up its leadership, so that a
		// coordinator on the minority side stops writing at once.
		cfg.PreVote = true
		// The members run on the nodes that train (Slurm's first three):
		// their cores are busy with data loading and the ranks' own work, so
		// raft's LAN defaults (a heartbeat every 100 ms, an election after
		// 1 s without one) would elect again and again under load (a Slurm
		// box under make test did). A leader that died is replaced within
		// 3 s, before a coordinator's own election TTL (5 s) has passed.
		cfg.TickMs, cfg.ElectionMs = 300, 3000
	}
	// Every step writes progress: keep an hour of history (enough for a
	// launch that lost its coordinator to resume its Follow stream) and
	// compact the rest, so a long job does not grow the database forever.
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = embed.CompactorModePeriodic, "1h"
	// A generation's transaction carries its member list, and a decision
	// a strike for each node lost: etcd's defaults (1.5 MiB, 128
	// operations) stop a job at about 9,000 nodes, or one that loses more
	// than about 120 at once.
	cfg.MaxTxnOps, cfg.MaxRequestBytes = etcdTxnOps, etcdRequestLimit
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	}
	select {
	case <-srv.Server.ReadyNotify():
		return srv, nil
	case err := <-srv.Err():
		srv.Close()
		return nil, fmt.Errorf("embedded etcd in %s: %w", dir, err)
	case <-time.After(max(c.DialTimeout, 30*time.Second)):
		srv.Close()
		if len(c.Members) > 0 {
			return nil, errorf(ErrUnavailable, "embedded etcd member %s did not join its cluster (%s) within %s: a majority of its members must be up and reach each other's peer ports", cfg.Name, cfg.InitialCluster, max(c.DialTimeout, 30*time.Second))
		}
		return nil, errorf(ErrUnavailable, "embedded etcd in %s did not become ready", dir)
	}
}

func tlsConfig(c EtcdConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errorf(ErrInvalid, "etcd CA %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
