package ckpt

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
)

// node is a holder serving on loopback with its CA's node certificate.
type node struct {
	h    *Holder
	addr string
}

func credentials(t testing.TB, ca *pki.CA, caPEM []byte, id pki.Identity) pki.Credentials {
	t.Helper()
	key, csr, err := pki.NewRequest(id)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.SignRequest(csr, id, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return pki.Credentials{CA: caPEM, Cert: cert, Key: key}
}

func newCA(t testing.TB) (*pki.CA, []byte) {
	t.Helper()
	certPEM, keyPEM, err := pki.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca, certPEM
}

func startNode(t testing.TB, name string, c *pki.Credentials) *node {
	t.Helper()
	return startNodeIn(t, t.TempDir(), name, c)
}

// startNodeIn is startNode with its root at root.
func startNodeIn(t testing.TB, root, name string, c *pki.Credentials) *node {
	t.Helper()
	var h *Holder
	if c == nil {
		h = New(root, name, nil, nil, nil)
	} else {
		srv, cli, err := pki.PeerTLS(*c)
		if err != nil {
			t.Fatal(err)
		}
		h = New(root, name, srv, cli, nil)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &node{h: h, addr: ln.Addr().String()}
}

// peer is n as the peer named name.
func (n *node) peer(name string) Peer { return Peer{Name: name, Addr: n.addr} }

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			out[rel] = string(b)
		}
		return nil
	})
	return out
}

// TestReplicateAndGather: node a's files of a step go to b over mutual
// TLS; c gathers a's files from b and its own from itself.
func TestReplicateAndGather(t *testing.T) {
	ca, caPEM := newCA(t)
	creds := map[string]pki.Credentials{}
	nodes := map[string]*node{}
	for _, n := range []string{"a", "b", "c"} {
		creds[n] = credentials(t, ca, caPEM, pki.Identity{Role: pki.RoleNode, Name: n})
		c := creds[n]
		nodes[n] = startNode(t, n, &c)
		if err := nodes[n].h.Begin("job1", 1, 0, true); err != nil {
			t.Fatal(err)
		}
		if err := nodes[n].h.Saw("job1", 1, []string{"a", "b", "c"}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	big := strings.Repeat("x", 3<<20)
	aFiles := map[string]string{"tp0/shard-0.bin": big, "tp1/shard-0.bin": "small", "__0_0.distcp": "dcp"}
	writeFiles(t, filepath.Join(nodes["a"].h.Own("job1"), "7"), aFiles)
	writeFiles(t, filepath.Join(nodes["a"].h.Own("job1"), "7", ".from-a"), map[string]string{"x": "marker"})
	if err := nodes["a"].h.Seal("job1", 1, 7); err != nil {
		t.Fatal(err)
	}
	n, err := nodes["a"].h.Send(ctx, nodes["b"].peer("b"), "job1", 1, 7)
	if err != nil {
		t.Fatal(err)
	}
	if n < int64(len(big)) {
		t.Errorf("sent %d bytes, less than the files", n)
	}
	if !nodes["b"].h.Has("job1", "a", 7) {
		t.Fatal("b holds no replica of a's step 7")
	}
	writeFiles(t, filepath.Join(nodes["c"].h.Own("job1"), "7"), map[string]string{"__2_0.distcp": "c's"})
	if _, err := nodes["c"].h.Fetch(ctx, nodes["b"].peer("b"), "job1", "a", 1, 7); err != nil {
		t.Fatal(err)
	}
	got := readFiles(t, filepath.Join(nodes["c"].h.Own("job1"), "7"))
	want := map[string]string{"__2_0.distcp": "c's"}
	for k, v := range aFiles {
		want[filepath.FromSlash(k)] = v
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("c's step 7 holds %d files, want %d: %v", len(got), len(want), keys(got))
	}
	// Nobody holds step 8; a node sends only its own files.
	if _, err := nodes["c"].h.Fetch(ctx, nodes["b"].peer("b"), "job1", "a", 1, 8); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("fetch of a missing step: %v", err)
	}
	req := nodes["c"].h.url(nodes["b"].addr, "job1", "a", 7, 1)
	r, _ := newPut(ctx, req, "junk")
	resp, err := nodes["c"].h.ClientFor("b").Do(r)
	if err != nil || resp.StatusCode != 403 {
		t.Errorf("c putting a's files: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	// A replica of an older generation than b runs is refused.
	nodes["b"].h.Saw("job1", 3, []string{"a", "b", "c"})
	if _, err := nodes["a"].h.Send(ctx, nodes["b"].peer("b"), "job1", 2, 7); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("old generation's replica: %v", err)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestStrangers: a node of another CA is refused by TLS, a client's
// certificate by the holder (the node server shows clients rank output
// alone); plaintext serving is refused off loopback.
func TestStrangers(t *testing.T) {
	ca, caPEM := newCA(t)
	c := credentials(t, ca, caPEM, pki.Identity{Role: pki.RoleNode, Name: "b"})
	b := startNode(t, "b", &c)
	writeFiles(t, filepath.Join(b.h.Own("job1"), "1"), map[string]string{"f": "secret"})
	other, otherPEM := newCA(t)
	for name, cr := range map[string]pki.Credentials{
		"other CA": credentials(t, other, otherPEM, pki.Identity{Role: pki.RoleNode, Name: "a"}),
		"a client": credentials(t, ca, caPEM, pki.Identity{Role: pki.RoleClient, Name: "a"}),
	} {
		srv, cli, err := pki.PeerTLS(cr)
		if err != nil {
			t.Fatal(err)
		}
		h := New(t.TempDir(), "a", srv, cli, nil)
		if _, err := h.Fetch(t.Context(), b.peer("b"), "job1", "b", 1, 1); err == nil {
			t.Errorf("%s fetched b's files", name)
		}
	}
	plain := New(t.TempDir(), "a", nil, nil, nil)
	if _, err := plain.Fetch(t.Context(), b.peer("b"), "job1", "b", 1, 1); err == nil {
		t.Error("plaintext fetch from a TLS holder worked")
	}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Serve(t.Context(), ln); err == nil || !strings.Contains(err.Error(), "mutual TLS") {
		t.Errorf("plaintext off loopback: %v", err)
	}
}

// TestStreamChecked: a stream cut short or with a wrong checksum places
// nothing.
func TestStreamChecked(t *testing.T) {
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"a/b": "hello", "c": strings.Repeat("y", 100000)})
	var buf bytes.Buffer
	if err := writeTar(t.Context(), &buf, src, nil); err != nil {
		t.Fatal(err)
	}
	whole := buf.Bytes()
	dst := t.TempDir()
	if err := readTar(bytes.NewReader(whole), dst, 1<<20); err != nil {
		t.Fatal(err)
	}
	if got := readFiles(t, dst); len(got) != 2 || got["a/b"] != "hello" {
		t.Fatalf("placed %v", keys(got))
	}
	for name, stream := range map[string][]byte{
		"cut":     whole[:len(whole)/2],
		"flipped": flip(whole, bytes.Index(whole, []byte("hello"))),
	} {
		dst := t.TempDir()
		if err := readTar(bytes.NewReader(stream), dst, 1<<20); err == nil {
			t.Errorf("%s stream accepted", name)
		}
		if got := readFiles(t, dst); len(got) != 0 {
			t.Errorf("%s stream placed %v", name, keys(got))
		}
	}
}

func flip(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i] ^= 1
	return out
}

// TestBeginAndPrune: a new generation drops steps after its resume step,
// and the resume step's own files when this node did not write them in the
// generation that committed it; pruning keeps the newest committed steps
// and everything after.
func TestBeginAndPrune(t *testing.T) {
	h := New(t.TempDir(), "a", nil, nil, nil)
	for _, s := range []string{"3", "4", "5", "6", "7"} {
		writeFiles(t, filepath.Join(h.Own("j"), s), map[string]string{"f": s})
		writeFiles(t, filepath.Join(h.peers("j"), "b", s), map[string]string{"f": s})
	}
	if err := h.Begin("j", 2, 6, true); err != nil {
		t.Fatal(err)
	}
	h.Prune("j", 2, 5)
	for _, dir := range []string{h.Own("j"), filepath.Join(h.peers("j"), "b")} {
		if got := fmt.Sprint(steps(dir)); got != "[4 5 6]" {
			t.Errorf("%s: steps %s, want [4 5 6]", dir, got)
		}
	}
	// A generation resumes from step 5, which a generation without this
	// node committed: this node's own files of 5 are of an attempt never
	// committed and go; its replicas and earlier steps stay.
	if err := h.Begin("j", 3, 5, false); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(steps(h.Own("j"))); got != "[4]" {
		t.Errorf("own steps %s after a resume it did not write, want [4]", got)
	}
	if got := fmt.Sprint(steps(filepath.Join(h.peers("j"), "b"))); got != "[4 5]" {
		t.Errorf("b's replicas: steps %s, want [4 5]", got)
	}
	if err := h.Remove("j"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.Root(), "j")); !os.IsNotExist(err) {
		t.Errorf("job left: %v", err)
	}
}

func newPut(ctx context.Context, url, body string) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(body))
}
