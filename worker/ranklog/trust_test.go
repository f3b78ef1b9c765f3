package ranklog

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
	"github.com/gpucoord/gpucoord/worker/ckpt"
)

// tlsStore serves a Store over mutual TLS as an agent does (pki.PeerTLS
// with node n1's certificate, ckpt.Serve), and returns a client for each
// identity.
func tlsStore(t *testing.T, ids ...pki.Identity) (*Store, string, map[pki.Identity]*Client) {
	t.Helper()
	certPEM, keyPEM, err := pki.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	creds := func(id pki.Identity) pki.Credentials {
		key, csr, err := pki.NewRequest(id)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := ca.SignRequest(csr, id, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return pki.Credentials{CA: certPEM, Cert: cert, Key: key}
	}
	server, _, err := pki.PeerTLS(creds(pki.Identity{Role: pki.RoleNode, Name: "n1"}))
	if err != nil {
		t.Fatal(err)
	}
	s := New(t.TempDir(), "n1", DefaultLimits, slog.New(slog.DiscardHandler))
	mux := httpMux(s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ckpt.Serve(ctx, ln, server, mux, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	clients := map[pki.Identity]*Client{}
	for _, id := range ids {
		tc, err := pki.AgentTLS(creds(id))
		if err != nil {
			t.Fatal(err)
		}
		c := NewClient(tc)
		t.Cleanup(c.Close)
		clients[id] = c
	}
	return s, ln.Addr().String(), clients
}

// TestServedToUsers: a node's certificate (a node outside the job, or in
// it) reads neither the ranks' output nor their logs (403); a client's and
// an admin's read both.
func TestServedToUsers(t *testing.T) {
	node := pki.Identity{Role: pki.RoleNode, Name: "z"}
	user := pki.Identity{Role: pki.RoleClient, Name: "me@here"}
	admin := pki.Identity{Role: pki.RoleAdmin, Name: "ops@here"}
	s, addr, clients := tlsStore(t, node, user, admin)
	s.Line("j", 1, 0, tagged(0, "secret loss 0.5"))
	s.End("j", 1)
	ctx := t.Context()
	var out bytes.Buffer
	if err := clients[node].Logs(ctx, "n1", addr, "j", -1, &out); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("a node reading logs: %v (%q), want 403", err, out.String())
	}
	var lines []string
	if err := clients[node].Follow(ctx, "n1", addr, "j", 1, -1, func(b []byte) { lines = append(lines, string(b)) }); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("a node following output: %v (%q), want 403", err, lines)
	}
	for _, id := range []pki.Identity{user, admin} {
		out.Reset()
		if err := clients[id].Logs(ctx, "n1", addr, "j", -1, &out); err != nil || !strings.Contains(out.String(), "secret loss") {
			t.Errorf("%s reading logs: %v %q", id, err, out.String())
		}
		lines = nil
		if err := clients[id].Follow(ctx, "n1", addr, "j", 1, -1, func(b []byte) { lines = append(lines, string(b)) }); err != nil || len(lines) != 1 {
			t.Errorf("%s following output: %v %q", id, err, lines)
		}
	}
}

// TestNodeNamed: a user's client asking for node n2's output and logs at
// an address where n1 serves (with n1's own certificate) refuses the
// handshake (ckpt.ErrWrongPeer): what it shows as n2's comes from n2.
func TestNodeNamed(t *testing.T) {
	user := pki.Identity{Role: pki.RoleClient, Name: "me@here"}
	s, addr, clients := tlsStore(t, user)
	s.Line("j", 1, 0, tagged(0, "n1's line"))
	s.End("j", 1)
	var out bytes.Buffer
	if err := clients[user].Logs(t.Context(), "n2", addr, "j", -1, &out); !errors.Is(err, ckpt.ErrWrongPeer) {
		t.Errorf("n2's logs from n1: %v (%q), want %v", err, out.String(), ckpt.ErrWrongPeer)
	}
	var lines []string
	if err := clients[user].Follow(t.Context(), "n2", addr, "j", 1, -1, func(b []byte) { lines = append(lines, string(b)) }); !errors.Is(err, ckpt.ErrWrongPeer) {
		t.Errorf("n2's output from n1: %v (%q), want %v", err, lines, ckpt.ErrWrongPeer)
	}
	if err := clients[user].Logs(t.Context(), "n1", addr, "j", -1, &out); err != nil || !strings.Contains(out.String(), "n1's line") {
		t.Errorf("n1's logs from n1: %v %q", err, out.String())
	}
}

// TestReadCreatesNothing: a follower of a job the node never heard of
// leaves no record of it; it gets the job's lines once they come.
func TestReadCreatesNothing(t *testing.T) {
	s := New(t.TempDir(), "n1", DefaultLimits, slog.New(slog.DiscardHandler))
	for i := range 100 {
		b := s.read("nope-"+strings.Repeat("x", i), 1, -1, 0)
		if b.done || len(b.text) > 0 {
			t.Fatalf("an unknown job read as %+v", b)
		}
	}
	s.mu.Lock()
	n := len(s.jobs)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("reads of unknown jobs left %d records", n)
	}
	var out bytes.Buffer
	done := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() { done <- s.follow(&out, func() {}, "later", 1, -1, stop) }()
	s.Line("later", 1, 0, tagged(0, "first"))
	s.End("later", 1)
	if err := <-done; err != nil || !strings.Contains(out.String(), "first") {
		t.Errorf("follower of a job heard of later: %v %q", err, out.String())
	}
}

func httpMux(s *Store) *http.ServeMux {
	mux := http.NewServeMux()
	s.Handle(mux)
	return mux
}
