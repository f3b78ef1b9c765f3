package coordinator

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/join"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// readToken reads the join token a coordinator wrote.
func readToken(t *testing.T, path string) pki.Token {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := pki.ParseToken(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// joined obtains credentials for role and name with tok, as an agent or
// launch does, and returns them as gRPC credentials.
func joined(t *testing.T, addr string, tok pki.Token, role, name string) credentials.TransportCredentials {
	t.Helper()
	c, err := join.Join(t.Context(), []string{addr}, tok, pki.Identity{Role: role, Name: name}, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.ClientTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(cfg)
}

// tlsCoordinator runs a coordinator serving mutual TLS from the cluster
// CA, with its bootstrap token file, and returns it with the token.
func tlsCoordinator(t *testing.T, edit func(*Config)) (*Coordinator, pki.Token) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "token")
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) {
		c.TokenFile = file
		if edit != nil {
			edit(c)
		}
	})
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	return co, readToken(t, file)
}

// TestAuthority: with TLS on, a call without a certificate can only join;
// a wrong or revoked token joins no one; a node's identity acts for its
// own node and ranks only and cannot submit; a client's cannot register
// a node; only an admin manages tokens.
func TestAuthority(t *testing.T) {
	co, tok := tlsCoordinator(t, nil)
	addr := co.Addr()
	code := func(what string, err error, want codes.Code) {
		t.Helper()
		if status.Code(err) != want {
			t.Errorf("%s: err = %v, want %v", what, err, want)
		}
	}

	// No certificate: only Join answers.
	anon := tlsClient(t, addr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
	_, err := anon.Status(t.Context(), &pb.StatusRequest{})
	code("status without a certificate", err, codes.Unauthenticated)
	_, err = anon.Register(t.Context(), &pb.RegisterRequest{Node: node("n0", 1)})
	code("register without a certificate", err, codes.Unauthenticated)
	_, err = client(t, addr).Status(t.Context(), &pb.StatusRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext to a TLS coordinator: err = %v, want Unavailable (no handshake)", err)
	}

	// A wrong secret, and a token for a role it does not allow.
	wrong := tok
	wrong.Secret = strings.Repeat("0", 32)
	if _, err := join.Join(t.Context(), []string{addr}, wrong, pki.Identity{Role: pki.RoleNode, Name: "n9"}, 0); err == nil || !strings.Contains(err.Error(), "wrong secret") {
		t.Errorf("join with a wrong secret: %v", err)
	}
	other := tok
	other.CAHash = strings.Repeat("ab", 32)
	if _, err := join.Join(t.Context(), []string{addr}, other, pki.Identity{Role: pki.RoleNode, Name: "n9"}, 0); err == nil || !strings.Contains(err.Error(), "not the one the join token names") {
		t.Errorf("join with another cluster's CA hash: %v", err)
	}

	n0 := tlsClient(t, addr, joined(t, addr, tok, pki.RoleNode, "n0"))
	n1 := tlsClient(t, addr, joined(t, addr, tok, pki.RoleNode, "n1"))
	user := tlsClient(t, addr, joined(t, addr, tok, pki.RoleClient, "me@here"))
	admin := tlsClient(t, addr, joined(t, addr, tok, pki.RoleAdmin, "ops@here"))

	_, err = n0.Register(t.Context(), &pb.RegisterRequest{Node: node("n1", 1)})
	code("n0 registers as n1", err, codes.PermissionDenied)
	_, err = user.Register(t.Context(), &pb.RegisterRequest{Node: node("n0", 1)})
	code("a client registers a node", err, codes.PermissionDenied)
	register := func(c pb.CoordinatorClient, n *pb.Node) (<-chan *pb.Assignment, int64) {
		t.Helper()
		resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
		if err != nil {
			t.Fatalf("register %s: %v", n.Name, err)
		}
		ch, _ := watch(t, c, n.Name, resp.LeaseId, 0)
		return ch, resp.LeaseId
	}
	a0, lease0 := register(n0, node("n0", 2))
	_, lease1 := register(n1, node("n1", 2))
	if _, err := join.Join(t.Context(), []string{addr}, tok, pki.Identity{Role: pki.RoleNode, Name: "n0"}, 0); err == nil || !strings.Contains(err.Error(), "registered and alive") {
		t.Errorf("a second certificate for live node n0: %v", err)
	}
	if st, err := n0.Watch(t.Context(), &pb.WatchRequest{Node: "n0", LeaseId: lease1}); err == nil {
		_, err = st.Recv()
		code("n0 watches with n1's lease", err, codes.PermissionDenied)
	}
	_, err = n0.Leave(t.Context(), &pb.LeaveRequest{Node: "n1", LeaseId: lease1})
	code("n0 leaves as n1", err, codes.PermissionDenied)
	_, err = n0.Leave(t.Context(), &pb.LeaveRequest{Node: "n0", LeaseId: lease1})
	code("n0 leaves with n1's lease", err, codes.PermissionDenied)
	_, err = n0.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 2, 2)})
	code("a node submits", err, codes.PermissionDenied)
	_, err = user.CreateToken(t.Context(), &pb.CreateTokenRequest{Roles: []string{pki.RoleNode}})
	code("a client creates a token", err, codes.PermissionDenied)

	s := spec("j", 2, 2)
	s.Tp = 1
	if _, err := user.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	g := whole(t, co, next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" }))
	var n1First int32 = -1
	for _, m := range g.Members {
		if m.Node == "n1" {
			n1First = m.FirstRank
		}
	}
	exit := func(from string, lease int64, rank int32) *pb.ReportRequest {
		return &pb.ReportRequest{Job: "j", Generation: g.Number, Node: from, LeaseId: lease, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: rank, Code: 1}}}
	}
	_, err = n0.Report(t.Context(), exit("n1", lease1, n1First))
	code("n0 reports as n1", err, codes.PermissionDenied)
	_, err = n0.Report(t.Context(), exit("n0", lease0, n1First))
	code("n0 reports n1's rank", err, codes.PermissionDenied)
	timesOf := func(rank int32) *pb.ReportRequest {
		return &pb.ReportRequest{Job: "j", Generation: g.Number, Node: "n0", LeaseId: lease0, Kind: &pb.ReportRequest_Times{Times: pb.NewRankTimes(&pb.RankTime{Rank: rank, ComputeSeconds: 9, Steps: 1})}}
	}
	_, err = n0.Report(t.Context(), timesOf(n1First))
	code("n0 reports n1's rank's times", err, codes.PermissionDenied)
	uneven := timesOf(0)
	uneven.GetTimes().Steps = nil
	_, err = n0.Report(t.Context(), uneven)
	code("n0 reports times without their steps", err, codes.InvalidArgument)
	_, err = n0.Report(t.Context(), exit("n0", 0, 0))
	code("n0 reports without its lease", err, codes.InvalidArgument)
	_, err = n0.Report(t.Context(), exit("n0", lease1, 0))
	code("n0 reports with n1's lease", err, codes.PermissionDenied)
	_, err = n0.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: g.Number + 5, Node: "n0", LeaseId: lease0, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: 0}}})
	code("a report of a generation that is not current", err, codes.FailedPrecondition)
	if js, err := user.Status(t.Context(), &pb.StatusRequest{}); err != nil || len(js.Jobs) != 1 || js.Jobs[0].State.GetPhase() != pb.JobState_RUNNING {
		t.Fatalf("after refused reports, status = %v, %v: want job j running", js, err)
	}

	// Tokens: an admin makes one for nodes, a node joins with it, and
	// after its revocation no one does.
	made, err := admin.CreateToken(t.Context(), &pb.CreateTokenRequest{Roles: []string{pki.RoleNode}, TtlSeconds: 3600, Description: "test"})
	if err != nil {
		t.Fatal(err)
	}
	nodeTok, err := pki.ParseToken(made.Token)
	if err != nil {
		t.Fatal(err)
	}
	joined(t, addr, nodeTok, pki.RoleNode, "n2")
	if _, err := join.Join(t.Context(), []string{addr}, nodeTok, pki.Identity{Role: pki.RoleAdmin, Name: "x"}, 0); err == nil || !strings.Contains(err.Error(), "does not allow the admin role") {
		t.Errorf("a node token joins as admin: %v", err)
	}
	list, err := admin.ListTokens(t.Context(), &pb.ListTokensRequest{})
	if err != nil || len(list.Tokens) != 2 {
		t.Fatalf("list = %v, %v: want the bootstrap token and the new one", list, err)
	}
	for _, ti := range list.Tokens {
		if strings.Contains(ti.String(), nodeTok.Secret) || strings.Contains(ti.String(), tok.Secret) {
			t.Errorf("a token's secret is listed: %v", ti)
		}
	}
	if _, err := admin.RevokeToken(t.Context(), &pb.RevokeTokenRequest{Id: nodeTok.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := join.Join(t.Context(), []string{addr}, nodeTok, pki.Identity{Role: pki.RoleNode, Name: "n3"}, 0); err == nil || !strings.Contains(err.Error(), "revoked, expired") {
		t.Errorf("join with a revoked token: %v", err)
	}
	_, err = admin.RevokeToken(t.Context(), &pb.RevokeTokenRequest{Id: nodeTok.ID})
	code("revoking twice", err, codes.NotFound)
	if _, err := n0.Leave(t.Context(), &pb.LeaveRequest{Node: "n0", LeaseId: lease0}); err != nil {
		t.Errorf("n0 leaves as itself: %v", err)
	}
}

// TestTokenFileShared: a second coordinator given the same token file
// keeps the token in it; one whose token was revoked refuses to start, and
// says how to get a new one.
func TestTokenFileShared(t *testing.T) {
	endpoints := testEtcd(t)
	file := filepath.Join(t.TempDir(), "token")
	a, _ := testCoordinator(t, endpoints, func(c *Config) { c.TokenFile = file })
	tok := readToken(t, file)
	b, _ := testCoordinator(t, endpoints, func(c *Config) { c.TokenFile = file })
	if got := readToken(t, file); got != tok {
		t.Fatalf("the second coordinator replaced the token file")
	}
	// Both coordinators serve certificates of the same CA: credentials
	// bought at one work at the other.
	creds := joined(t, a.Addr(), tok, pki.RoleClient, "me")
	if _, err := tlsClient(t, b.Addr(), creds).Status(t.Context(), &pb.StatusRequest{}); err != nil {
		t.Errorf("status at the second coordinator: %v", err)
	}
	admin := tlsClient(t, a.Addr(), joined(t, a.Addr(), tok, pki.RoleAdmin, "ops"))
	if _, err := admin.RevokeToken(t.Context(), &pb.RevokeTokenRequest{Id: tok.ID}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listen, cfg.Etcd.Endpoints, cfg.TokenFile = "127.0.0.1:0", endpoints, file
	if _, err := New(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "revoked or expired: remove the file") {
		t.Errorf("a coordinator with a revoked token file: %v", err)
	}
}

// TestTokenRecordAllows: a token record's rule, at given times.
func TestTokenRecordAllows(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	tok, err := pki.NewToken(strings.Repeat("cd", 32))
	if err != nil {
		t.Fatal(err)
	}
	r := tok.Record([]string{pki.RoleNode}, now, time.Hour, "")
	bad := tok
	bad.Secret = strings.Repeat("1", 32)
	tests := []struct {
		name string
		tok  pki.Token
		role string
		at   time.Time
		want string
	}{
		{"in time", tok, pki.RoleNode, now.Add(59 * time.Minute), ""},
		{"expired", tok, pki.RoleNode, now.Add(time.Hour), "expired"},
		{"wrong secret", bad, pki.RoleNode, now, "wrong secret"},
		{"role not allowed", tok, pki.RoleClient, now, "does not allow the client role"},
	}
	for _, tc := range tests {
		err := r.Allows(tc.tok, tc.role, tc.at)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), tok.Secret) {
			t.Errorf("%s: the error shows the secret", tc.name)
		}
	}
	if r0 := tok.Record([]string{pki.RoleNode}, now, 0, ""); r0.Allows(tok, pki.RoleNode, now.Add(100*365*24*time.Hour)) != nil {
		t.Error("a token without expiry expired")
	}
}
