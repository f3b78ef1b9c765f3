package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// freePorts returns n TCP ports on loopback that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// orgFiles writes a new CA's certificate and key into a temporary
// directory and returns it with their paths.
func orgFiles(t *testing.T) (ca *pki.CA, certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM, err := pki.NewCA("members-test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if ca, err = pki.ParseCA(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return ca, certFile, keyFile
}

// issued returns credentials for id under ca.
func issued(t *testing.T, ca *pki.CA, id pki.Identity) pki.Credentials {
	t.Helper()
	keyPEM, csr, err := pki.NewRequest(id)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignRequest(csr, id, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return pki.Credentials{CA: ca.PEM(), Cert: certPEM, Key: keyPEM}
}

// TestEmbeddedMembers: three coordinators whose embedded etcd servers form
// one static cluster (mutual TLS between the members, each with a peer
// certificate it made from the organisation's CA) elect one leader; the
// leader stopped with its member, the other two keep a majority and one of
// them leads; a certificate the CA issued to a node is refused at a peer
// port, and a member's own is taken.
func TestEmbeddedMembers(t *testing.T) {
	// Runs last: the members' peer connections (etcd's own HTTP clients
	// and servers) end a moment after the members stop; wait for them, so
	// that the package's leak check sees what stays.
	t.Cleanup(func() { awaitNoPeerConns(t) })
	ca, caFile, caKey := orgFiles(t)
	ports := freePorts(t, 3)
	var members []EtcdMember
	for i, p := range ports {
		members = append(members, EtcdMember{Name: fmt.Sprintf("m%d", i), PeerURL: fmt.Sprintf("https://127.0.0.1:%d", p)})
	}
	cos := make([]*Coordinator, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			cfg := DefaultConfig()
			cfg.Name, cfg.Listen = members[i].Name, "127.0.0.1:0"
			cfg.TLS.CA, cfg.TLSCAKey = caFile, caKey
			cfg.Etcd.DataDir, cfg.Etcd.Members, cfg.Etcd.ClusterToken = t.TempDir(), members, "members-test"
			cfg.Etcd.DialTimeout = 30 * time.Second
			cfg.LeaseTTL, cfg.ElectionTTL = 2*time.Second, 2*time.Second
			cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
			cos[i], errs[i] = New(t.Context(), cfg)
		})
	}
	wg.Wait()
	stops := make([]func(), 3)
	for i, co := range cos {
		if errs[i] != nil {
			t.Fatalf("coordinator m%d: %v", i, errs[i])
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- co.Run(ctx) }()
		var once sync.Once
		stops[i] = func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("coordinator m%d: %v", i, err)
				}
			})
		}
		t.Cleanup(stops[i])
	}

	admin, err := pki.ClientTLS(issued(t, ca, pki.Identity{Role: pki.RoleAdmin, Name: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	clients := make([]pb.CoordinatorClient, 3)
	for i, co := range cos {
		clients[i] = tlsClient(t, co.Addr(), credentials.NewTLS(admin))
	}
	leader := agreedLeader(t, clients, "")
	t.Logf("leader %s", leader)

	// A node's certificate is no peer's; a member's own is.
	peerGet := func(c pki.Credentials) error {
		tc, err := pki.ClientTLS(c)
		if err != nil {
			return err
		}
		tc.ServerName = "127.0.0.1"
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}, Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		resp, err := hc.Get(members[1].PeerURL + "/members")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	}
	if err := peerGet(issued(t, ca, pki.Identity{Role: pki.RoleNode, Name: "m0"})); err == nil {
		t.Error("a node's certificate was taken at an etcd peer port")
	}
	peerCert, peerKey, err := ca.PeerCert("m0", []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := peerGet(pki.Credentials{CA: ca.PEM(), Cert: peerCert, Key: peerKey}); err != nil {
		t.Errorf("a member's peer certificate was refused: %v", err)
	}

	// The leader stops, and its member with it: the other two elect one.
	var rest []pb.CoordinatorClient
	for i, co := range cos {
		if co.cfg.Name == leader {
			stops[i]()
		} else {
			rest = append(rest, clients[i])
		}
	}
	if next := agreedLeader(t, rest, leader); next == leader {
		t.Fatalf("leader still %s after it stopped", leader)
	}
}

// agreedLeader waits until every client names the same leader, other than
// not, and returns it.
func agreedLeader(t *testing.T, clients []pb.CoordinatorClient, not string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var names []string
		for _, c := range clients {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			st, err := c.Status(ctx, &pb.StatusRequest{})
			cancel()
			if err == nil {
				names = append(names, st.Leader)
			}
		}
		if len(names) == len(clients) && names[0] != "" && names[0] != not && allSame(names) {
			return names[0]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the coordinators did not agree on a leader (other than %q) within 30 s", not)
	return ""
}

func allSame(s []string) bool {
	for _, x := range s {
		if x != s[0] {
			return false
		}
	}
	return true
}

// awaitNoPeerConns waits up to 10 s until no goroutine serves or reads an
// HTTP connection.
func awaitNoPeerConns(t *testing.T) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "net/http.(*persistConn)") && !strings.Contains(stacks, "net/http.(*conn).serve") {
			return
		}
		if time.Now().After(deadline) {
			t.Error("etcd's peer connections still open 10 s after every member stopped")
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestParseMembers(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{in: "a=https://h1:2380,b=https://10.0.0.2:2380", want: "a=https://h1:2380 b=https://10.0.0.2:2380"},
		{in: "a=https://[fd00::1]:2380/", want: "a=https://[fd00::1]:2380"},
		{in: "a=http://h1:2380", err: "want https://HOST:PORT"},
		{in: "a=https://h1", err: "want https://HOST:PORT"},
		{in: "a=https://h1:2380/x", err: "want https://HOST:PORT"},
		{in: "https://h1:2380", err: "want NAME=https://HOST:PORT"},
		{in: "a/b=https://h1:2380", err: "want NAME=https://HOST:PORT"},
		{in: "a=https://h1:2380,a=https://h2:2380", err: "named twice"},
		{in: "", err: "want NAME="},
	} {
		ms, err := ParseMembers(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseMembers(%q) = %v, %v: want an error with %q", c.in, ms, err, c.err)
			}
			continue
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.Name+"="+m.PeerURL)
		}
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("ParseMembers(%q) = %v, %v: want %s", c.in, got, err, c.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Etcd.Members, _ = ParseMembers("a=https://h1:2380,b=https://h2:2380")
	cfg.Etcd.Name = "c"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `"c" is not among`) {
		t.Errorf("a member not in the cluster: %v", err)
	}
	cfg.Etcd.Name = "a"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--tls-ca-key") {
		t.Errorf("members without a CA key: %v", err)
	}
}
