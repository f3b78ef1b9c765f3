package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// Who may call what. A call names its method; the caller's certificate
// names its identity (pki.IdentityOf). Join needs no certificate (it takes
// a join token); every other call needs one of the roles listed, and a
// node's calls are further held to its own node by the handlers (asNode).
var methodRoles = map[string][]string{
	pb.Coordinator_Join_FullMethodName:        nil,
	pb.Coordinator_CreateToken_FullMethodName: {pki.RoleAdmin},
	pb.Coordinator_ListTokens_FullMethodName:  {pki.RoleAdmin},
	pb.Coordinator_RevokeToken_FullMethodName: {pki.RoleAdmin},
	pb.Coordinator_GossipKeys_FullMethodName:  {pki.RoleAdmin},
	pb.Coordinator_Register_FullMethodName:    {pki.RoleNode},
	pb.Coordinator_Watch_FullMethodName:       {pki.RoleNode},
	pb.Coordinator_Report_FullMethodName:      {pki.RoleNode},
	pb.Coordinator_Leave_FullMethodName:       {pki.RoleNode},
	pb.Coordinator_Members_FullMethodName:     {pki.RoleNode},
	pb.Coordinator_PoolReport_FullMethodName:  {pki.RoleNode},
	pb.Coordinator_Submit_FullMethodName:      {pki.RoleClient, pki.RoleAdmin},
	pb.Coordinator_Follow_FullMethodName:      {pki.RoleClient, pki.RoleAdmin},
	pb.Coordinator_Cancel_FullMethodName:      {pki.RoleClient, pki.RoleAdmin},
	pb.Coordinator_Status_FullMethodName:      {pki.RoleClient, pki.RoleAdmin},
}

type identityKey struct{}

// authorize says whether the caller of method may call it: on a
// plaintext coordinator (loopback) everyone may; with TLS, the role of the
// verified certificate must be one the method allows. The identity goes
// into the returned context for the handlers.
func (s *server) authorize(ctx context.Context, method string) (context.Context, error) {
	if !s.secure {
		return ctx, nil
	}
	roles, known := methodRoles[method]
	if !known {
		return nil, status.Errorf(codes.PermissionDenied, "%s: no identity may call it", method)
	}
	if roles == nil {
		return ctx, nil
	}
	id, err := callerIdentity(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "%v: join the cluster first (a join token with --token-file, or --tls-cert and --tls-key)", err)
	}
	if !slices.Contains(roles, id.Role) {
		return nil, status.Errorf(codes.PermissionDenied, "%s may not call %s (it needs the %v role)", id, method, roles)
	}
	return context.WithValue(ctx, identityKey{}, id), nil
}

// callerIdentity is the identity of the verified client certificate of
// the call in ctx.
func callerIdentity(ctx context.Context) (pki.Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.Identity{}, errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return pki.Identity{}, errors.New("no client certificate")
	}
	return pki.IdentityOf(info.State.VerifiedChains[0][0])
}

// asNode refuses a call about node unless the caller is that node (or the
// coordinator is plaintext, where no one has an identity).
func (s *server) asNode(ctx context.Context, node string) error {
	if !s.secure {
		return nil
	}
	id, _ := ctx.Value(identityKey{}).(pki.Identity)
	if id.Role != pki.RoleNode || id.Name != node {
		return status.Errorf(codes.PermissionDenied, "%s may not act as node %q", id, node)
	}
	return nil
}

// clusterPKI is what a coordinator serves TLS with: its server
// configuration and the CA that signs what Join issues (nil when an
// organisation's CA is used without its key).
type clusterPKI struct {
	tls *tls.Config
	ca  *pki.CA
}

// pkiRecord is the cluster CA as kept in etcd.
type pkiRecord struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// setupPKI builds the coordinator's TLS: from an organisation's files
// when cfg names them, else from the cluster CA in etcd (created by the
// first coordinator that needs it). A coordinator on loopback with neither
// files nor a token file serves plaintext (nil).
func setupPKI(ctx context.Context, cli *clientv3.Client, k keys, cfg *Config, now time.Time) (*clusterPKI, error) {
	if !cfg.secure() {
		return nil, nil
	}
	if !cfg.TLS.Empty() {
		var c pki.Credentials
		var ca *pki.CA
		var err error
		if cfg.TLSCAKey != "" {
			if ca, err = orgCA(cfg); err != nil {
				return nil, err
			}
		}
		if cfg.TLS.Cert != "" {
			c, err = cfg.TLS.Load()
		} else {
			// No certificate named: issue our own under the CA.
			c.CA = ca.PEM()
			c.Cert, c.Key, err = ca.ServerCert(cfg.Name, serverHosts(cfg.Listen, cfg.TLSHosts), now)
		}
		if err != nil {
			return nil, errorf(ErrInvalid, "tls: %v", err)
		}
		t, err := pki.ServerTLS(c)
		if err != nil {
			return nil, errorf(ErrInvalid, "tls: %v", err)
		}
		return &clusterPKI{tls: t, ca: ca}, nil
	}
	ca, err := clusterCA(ctx, cli, k, now)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := ca.ServerCert(cfg.Name, serverHosts(cfg.Listen, cfg.TLSHosts), now)
	if err != nil {
		return nil, err
	}
	t, err := pki.ServerTLS(pki.Credentials{CA: ca.PEM(), Cert: certPEM, Key: keyPEM})
	if err != nil {
		return nil, err
	}
	return &clusterPKI{tls: t, ca: ca}, nil
}

// orgCA reads the organisation's CA that cfg names with its key.
func orgCA(cfg *Config) (*pki.CA, error) {
	cert, err := os.ReadFile(cfg.TLS.CA)
	if err != nil {
		return nil, errorf(ErrInvalid, "tls: CA: %v", err)
	}
	key, err := os.ReadFile(cfg.TLSCAKey)
	if err != nil {
		return nil, errorf(ErrInvalid, "tls: CA key: %v", err)
	}
	ca, err := pki.ParseCA(cert, key)
	if err != nil {
		return nil, errorf(ErrInvalid, "tls: %v", err)
	}
	return ca, nil
}

// writePeerTLS makes this etcd member's peer certificate under the
// organisation's CA and names it, with the CA, in cfg.Etcd.PeerTLS: files
// (0600) in the data directory's peer-tls.
func writePeerTLS(cfg *Config, now time.Time) error {
	ca, err := orgCA(cfg)
	if err != nil {
		return err
	}
	own, _ := url.Parse(cfg.Etcd.memberURL(cfg.Etcd.Name))
	certPEM, keyPEM, err := ca.PeerCert(cfg.Etcd.Name, serverHosts(net.JoinHostPort(own.Hostname(), own.Port()), cfg.TLSHosts), now)
	if err != nil {
		return err
	}
	dir := filepath.Join(cfg.Etcd.DataDir, "peer-tls")
	if err := (pki.Credentials{CA: ca.PEM(), Cert: certPEM, Key: keyPEM}).Save(dir); err != nil {
		return fmt.Errorf("etcd peer certificate: %w", err)
	}
	cfg.Etcd.PeerTLS = pki.DirFiles(dir)
	return nil
}

// clusterCA reads the cluster CA from etcd, or makes it there if no
// coordinator did yet (the first to write wins; the others read its).
func clusterCA(ctx context.Context, cli *clientv3.Client, k keys, now time.Time) (*pki.CA, error) {
	certPEM, keyPEM, err := pki.NewCA(string(k), now)
	if err != nil {
		return nil, err
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k.ca()), "=", 0)).
		Then(clientv3.OpPut(k.ca(), encodeJSON(pkiRecord{Cert: string(certPEM), Key: string(keyPEM)}))).
		Else(clientv3.OpGet(k.ca())).Commit()
	if err != nil {
		return nil, errorf(ErrUnavailable, "cluster CA in etcd: %v", err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) != 1 {
			return nil, errorf(ErrUnavailable, "cluster CA in etcd: %s vanished", k.ca())
		}
		var r pkiRecord
		if err := decodeJSON(kvs[0].Value, &r); err != nil {
			return nil, errorf(ErrInvalid, "cluster CA in etcd at %s: %v", k.ca(), err)
		}
		certPEM, keyPEM = []byte(r.Cert), []byte(r.Key)
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, errorf(ErrInvalid, "cluster CA in etcd at %s: %v", k.ca(), err)
	}
	return ca, nil
}

// serverHosts are the names and addresses a coordinator's certificate is
// valid for: the listen host, every address of the machine, its host
// name, loopback, and extra.
func serverHosts(listen string, extra []string) []string {
	host, _, _ := net.SplitHostPort(listen)
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		hosts = append(hosts, host)
	}
	if name, err := os.Hostname(); err == nil {
		hosts = append(hosts, name)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
				hosts = append(hosts, ipn.IP.String())
			}
		}
	}
	hosts = append(hosts, extra...)
	slices.Sort(hosts)
	return slices.Compact(hosts)
}

// bootstrapToken makes sure the token file names a live token of this
// cluster: an absent file gets a new token (every role, no expiry), written
// 0600; an existing one must hold a token of this CA that has not been
// revoked. Several coordinators may share the file: the first writes it.
func bootstrapToken(ctx context.Context, cli *clientv3.Client, k keys, path string, ca *pki.CA, now time.Time) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		tok, err := pki.NewToken(pki.Hash(ca.Cert))
		if err != nil {
			return err
		}
		if err := putToken(ctx, cli, k, tok, tok.Record(pki.Roles, now, 0, "bootstrap token (--token-file)"), 0); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return errorf(ErrInvalid, "token file %s: %v", path, err)
		}
		switch err := pki.CreateSecret(path, []byte(tok.String()+"\n")); {
		case err == nil:
			return nil
		case !errors.Is(err, os.ErrExist):
			return errorf(ErrInvalid, "token file %s: %v", path, err)
		}
		// Another coordinator wrote it first: use its token.
		if _, err := cli.Delete(ctx, k.token(tok.ID)); err != nil {
			return errorf(ErrUnavailable, "etcd: %v", err)
		}
		if b, err = os.ReadFile(path); err != nil {
			return errorf(ErrInvalid, "token file %s: %v", path, err)
		}
	} else if err != nil {
		return errorf(ErrInvalid, "token file %s: %v", path, err)
	}
	tok, err := pki.ParseToken(string(b))
	if err != nil {
		return errorf(ErrInvalid, "token file %s: %v", path, err)
	}
	if tok.CAHash != pki.Hash(ca.Cert) {
		return errorf(ErrInvalid, "token file %s holds a token of another cluster (another CA): remove it and a new one is written", path)
	}
	resp, err := cli.Get(ctx, k.token(tok.ID))
	if err != nil {
		return errorf(ErrUnavailable, "etcd: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return errorf(ErrInvalid, "token file %s: token %s was revoked or expired: remove the file and a new one is written", path, tok.ID)
	}
	return nil
}

// putToken keeps r under tok's id, with a lease of ttl when it expires so
// that etcd drops it.
func putToken(ctx context.Context, cli *clientv3.Client, k keys, tok pki.Token, r pki.TokenRecord, ttl time.Duration) error {
	var opts []clientv3.OpOption
	if ttl > 0 {
		lease, err := cli.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
		if err != nil {
			return etcdErr(err)
		}
		opts = append(opts, clientv3.WithLease(lease.ID))
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k.token(tok.ID)), "=", 0)).
		Then(clientv3.OpPut(k.token(tok.ID), encodeJSON(r), opts...)).Commit()
	if err != nil {
		return etcdErr(err)
	}
	if !resp.Succeeded {
		return status.Errorf(codes.AlreadyExists, "token %s exists", tok.ID)
	}
	return nil
}

// Join implements pb.CoordinatorServer.
func (s *server) Join(ctx context.Context, req *pb.JoinRequest) (*pb.JoinResponse, error) {
	if s.ca == nil {
		return nil, status.Error(codes.FailedPrecondition, "this coordinator cannot issue certificates: it serves an organisation's certificate without the CA's key (--tls-ca-key): use certificates of that PKI")
	}
	tok, err := pki.ParseToken(req.GetToken())
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "%v", err)
	}
	id := pki.Identity{Role: req.GetRole(), Name: req.GetName()}
	if err := id.Validate(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if id.Role == pki.RoleNode {
		if err := validNodeName(id.Name); err != nil {
			return nil, err
		}
		// A node that is alive has its certificate: a second one for its
		// name would let the holder of a token act as it.
		resp, err := s.cli.Get(ctx, s.k.node(id.Name), clientv3.WithCountOnly())
		if err != nil {
			return nil, etcdErr(err)
		}
		if resp.Count > 0 {
			return nil, status.Errorf(codes.AlreadyExists, "node %q is registered and alive: a certificate for its name is issued only once its lease ends", id.Name)
		}
	}
	resp, err := s.cli.Get(ctx, s.k.token(tok.ID))
	if err != nil {
		return nil, etcdErr(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, status.Errorf(codes.Unauthenticated, "join token %s is not known here: revoked, expired or of another cluster", tok.ID)
	}
	var r pki.TokenRecord
	if err := decodeJSON(resp.Kvs[0].Value, &r); err != nil {
		return nil, status.Errorf(codes.Internal, "token %s in etcd: %v", tok.ID, err)
	}
	now := time.Now()
	if err := r.Allows(tok, id.Role, now); err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "%v", err)
	}
	cert, err := s.ca.SignRequest(req.GetCsr(), id, now)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	s.log.Info("certificate issued", "identity", id.String(), "token", tok.ID, "from", peerHost(ctx))
	return &pb.JoinResponse{Certificate: cert, Ca: s.ca.PEM()}, nil
}

// CreateToken implements pb.CoordinatorServer.
func (s *server) CreateToken(ctx context.Context, req *pb.CreateTokenRequest) (*pb.CreateTokenResponse, error) {
	if s.ca == nil {
		return nil, status.Error(codes.FailedPrecondition, "this coordinator cannot issue certificates (an organisation's CA without its key): join tokens would buy nothing")
	}
	if req.GetTtlSeconds() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "token ttl %ds: want 0 (no expiry) or more", req.GetTtlSeconds())
	}
	roles := req.GetRoles()
	if err := pki.CheckRoles(roles); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	tok, err := pki.NewToken(pki.Hash(s.ca.Cert))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	ttl := time.Duration(req.GetTtlSeconds()) * time.Second
	r := tok.Record(roles, time.Now(), ttl, req.GetDescription())
	if err := putToken(ctx, s.cli, s.k, tok, r, ttl); err != nil {
		return nil, err
	}
	id, _ := ctx.Value(identityKey{}).(pki.Identity)
	s.log.Info("join token created", "token", tok.ID, "roles", roles, "ttl", ttl, "by", id.String())
	return &pb.CreateTokenResponse{Token: tok.String(), Info: tokenInfo(tok.ID, r)}, nil
}

func tokenInfo(id string, r pki.TokenRecord) *pb.TokenInfo {
	return &pb.TokenInfo{Id: id, Roles: r.Roles, CreatedUnixMs: r.CreatedUnixMs, ExpiresUnixMs: r.ExpiresUnixMs, Description: r.Description}
}

// ListTokens implements pb.CoordinatorServer.
func (s *server) ListTokens(ctx context.Context, _ *pb.ListTokensRequest) (*pb.ListTokensResponse, error) {
	resp, err := s.cli.Get(ctx, s.k.tokens(), clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr(err)
	}
	out := &pb.ListTokensResponse{}
	for _, kv := range resp.Kvs {
		var r pki.TokenRecord
		if decodeJSON(kv.Value, &r) != nil {
			continue
		}
		out.Tokens = append(out.Tokens, tokenInfo(string(kv.Key[len(s.k.tokens()):]), r))
	}
	return out, nil
}

// RevokeToken implements pb.CoordinatorServer.
func (s *server) RevokeToken(ctx context.Context, req *pb.RevokeTokenRequest) (*pb.RevokeTokenResponse, error) {
	resp, err := s.cli.Delete(ctx, s.k.token(req.GetId()))
	if err != nil {
		return nil, etcdErr(err)
	}
	if resp.Deleted == 0 {
		return nil, status.Errorf(codes.NotFound, "no join token %q", req.GetId())
	}
	id, _ := ctx.Value(identityKey{}).(pki.Identity)
	s.log.Info("join token revoked", "token", req.GetId(), "by", id.String())
	return &pb.RevokeTokenResponse{}, nil
}
