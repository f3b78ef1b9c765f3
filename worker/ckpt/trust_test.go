package ckpt

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
)

// cluster starts holders named names under one CA, each with limits lim
// (zero: the defaults) and having heard of generation 1 of job j with
// members.
func cluster(t *testing.T, lim Limits, members []string, names ...string) map[string]*node {
	t.Helper()
	ca, caPEM := newCA(t)
	nodes := map[string]*node{}
	for _, n := range names {
		c := credentials(t, ca, caPEM, pki.Identity{Role: pki.RoleNode, Name: n})
		nodes[n] = startNodeWith(t, n, &c, lim)
		if err := nodes[n].h.Saw("j", 1, members); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

// startNodeWith is startNode with limits set before the holder serves.
func startNodeWith(t *testing.T, name string, c *pki.Credentials, lim Limits) *node {
	t.Helper()
	srv, cli, err := pki.PeerTLS(*c)
	if err != nil {
		t.Fatal(err)
	}
	h := New(t.TempDir(), name, srv, cli, nil)
	h.SetLimits(lim)
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

// ownStep writes and seals n's files of step of job j.
func ownStep(t *testing.T, n *node, step int64, files map[string]string) {
	t.Helper()
	writeFiles(t, filepath.Join(n.h.Own("j"), fmt.Sprint(step)), files)
	if err := n.h.Seal("j", 1, step); err != nil {
		t.Fatal(err)
	}
}

// status is the HTTP status of err from Send or Fetch ("403 Forbidden: ..."
// in its text), or 0.
func status(err error) int {
	for _, code := range []int{403, 404, 409, 413} {
		if err != nil && strings.Contains(err.Error(), fmt.Sprintf("%d %s", code, http.StatusText(code))) {
			return code
		}
	}
	return 0
}

// TestOutsiderRefused: z holds a node certificate of the cluster but is
// in no generation of job j that b heard of: b serves it none of j's
// steps and takes no replica from it (403), while a member fetches. A node
// of a newer generation b has not heard of is refused once PeerWait has
// passed, and served once b hears of it. Reads create nothing on b.
func TestOutsiderRefused(t *testing.T) {
	nodes := cluster(t, Limits{PeerWait: 20 * time.Millisecond}, []string{"a", "b"}, "a", "b", "z", "c")
	a, b, z, c := nodes["a"], nodes["b"], nodes["z"], nodes["c"]
	ctx := t.Context()
	ownStep(t, a, 3, map[string]string{"shard": "a's weights"})
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 1, 3); err != nil {
		t.Fatal(err)
	}
	ownStep(t, b, 3, map[string]string{"shard": "b's weights"})
	before := tree(t, b.h.Root())

	for _, src := range []string{"a", "b"} {
		if _, err := z.h.Fetch(ctx, b.peer("b"), "j", src, 1, 3); status(err) != 403 {
			t.Errorf("z fetching %s's step from b: %v, want 403", src, err)
		}
	}
	ownStep(t, z, 3, map[string]string{"shard": "forged"})
	if _, err := z.h.Send(ctx, b.peer("b"), "j", 1, 3); status(err) != 403 {
		t.Errorf("z placing a replica on b: %v, want 403", err)
	}
	if _, err := z.h.Fetch(ctx, b.peer("b"), "unknown-job", "b", 1, 3); status(err) != 403 {
		t.Errorf("z fetching a job b never heard of: %v, want 403", err)
	}
	// c names generation 2, which b has not heard of: refused after
	// PeerWait; then b hears of it, with c, and serves it.
	if _, err := c.h.Fetch(ctx, b.peer("b"), "j", "a", 2, 3); status(err) != 403 {
		t.Errorf("c fetching for a generation b has not heard of: %v, want 403", err)
	}
	if after := tree(t, b.h.Root()); after != before {
		t.Errorf("refused reads changed b's files:\nbefore %s\nafter  %s", before, after)
	}
	if err := b.h.Saw("j", 2, []string{"b", "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.h.Fetch(ctx, b.peer("b"), "j", "a", 2, 3); err != nil {
		t.Errorf("c, in generation 2, fetching a's step: %v", err)
	}
	// a is not in generation 2: neither its fetches nor its generation 1
	// replicas are taken now.
	if _, err := a.h.Fetch(ctx, b.peer("b"), "j", "b", 1, 3); status(err) != 403 {
		t.Errorf("a, out of generation 2, fetching: %v, want 403", err)
	}
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 1, 3); status(err) != 409 {
		t.Errorf("a sending for generation 1 while 2 runs: %v, want 409", err)
	}
}

// tree lists the files and directories under root, with sizes.
func tree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(&b, "%s:%d ", rel, fi.Size())
		return nil
	})
	return b.String()
}

// TestPutCapped: a member's 512 MiB stream to a holder capped at 1 MiB is
// refused (413) at the file header that crosses the cap, whether it comes
// as one file or as many; b reads a few MiB of it at most and keeps
// nothing. A step within the cap is taken, and so is one within twice
// b's own largest step.
func TestPutCapped(t *testing.T) {
	const capBytes = 1 << 20
	nodes := cluster(t, Limits{MaxStepBytes: capBytes}, []string{"a", "b"}, "a", "b")
	a, b := nodes["a"], nodes["b"]
	tests := []struct {
		name  string
		files int   // entries
		size  int64 // bytes each
	}{
		{"one file of 512 MiB", 1, 512 << 20},
		{"512 files of 1 MiB", 512, 1 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sent atomic.Int64
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(bigStream(&countingWriter{w: pw, n: &sent}, tc.files, tc.size)) }()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, a.h.url(b.addr, "j", "a", 1, 1), pr)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := a.h.ClientFor("b").Do(req)
			pr.Close()
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestEntityTooLarge {
					t.Errorf("status %s, want 413", resp.Status)
				}
			} // else b closed the connection while a was still sending: refused too
			if n := sent.Load(); n > 64<<20 {
				t.Errorf("b read %d MiB of the stream before refusing it", n>>20)
			}
			if n := fileBytes(t, filepath.Join(b.h.Root(), "j", "peers")); n > capBytes {
				t.Errorf("b keeps %d bytes after the refusal, more than the cap", n)
			}
			if b.h.Has("j", "a", 1) {
				t.Error("b holds a's step 1")
			}
		})
	}
	ownStep(t, a, 2, map[string]string{"shard": strings.Repeat("w", capBytes/2)})
	if _, err := a.h.Send(t.Context(), b.peer("b"), "j", 1, 2); err != nil {
		t.Errorf("a step within the cap: %v", err)
	}
	// b's own steps raise its cap to twice the largest of them.
	ownStep(t, b, 4, map[string]string{"shard": strings.Repeat("w", 3*capBytes)})
	ownStep(t, a, 4, map[string]string{"shard": strings.Repeat("w", 5*capBytes)})
	if _, err := a.h.Send(t.Context(), b.peer("b"), "j", 1, 4); err != nil {
		t.Errorf("a step within twice b's own: %v", err)
	}
}

// bigStream writes a step stream of files entries of size bytes each,
// zeros, without its checksums (it is refused before them).
func bigStream(w io.Writer, files int, size int64) error {
	tw := tar.NewWriter(w)
	zeros := make([]byte, 1<<20)
	for i := range files {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%d", i), Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		for left := size; left > 0; {
			n, err := tw.Write(zeros[:min(left, int64(len(zeros)))])
			if err != nil {
				return err
			}
			left -= int64(n)
		}
	}
	return tw.Close()
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// fileBytes is the size of the regular files under dir.
func fileBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			fi, _ := d.Info()
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestPeerNamed: the server at the address given for b is c, with c's own
// certificate of the cluster: a sends no replica there and fetches
// nothing from it (ErrWrongPeer), though c would take both as c.
func TestPeerNamed(t *testing.T) {
	nodes := cluster(t, Limits{}, []string{"a", "b", "c"}, "a", "b", "c")
	a, b, c := nodes["a"], nodes["b"], nodes["c"]
	ctx := t.Context()
	ownStep(t, a, 1, map[string]string{"shard": "a's"})
	ownStep(t, c, 1, map[string]string{"shard": "c's"})
	if _, err := a.h.Send(ctx, c.peer("b"), "j", 1, 1); !errors.Is(err, ErrWrongPeer) {
		t.Errorf("sending to c as b: %v, want %v", err, ErrWrongPeer)
	}
	if c.h.Has("j", "a", 1) {
		t.Error("c took the replica meant for b")
	}
	if _, err := a.h.Fetch(ctx, c.peer("b"), "j", "c", 1, 1); !errors.Is(err, ErrWrongPeer) {
		t.Errorf("fetching from c as b: %v, want %v", err, ErrWrongPeer)
	}
	if _, err := os.Stat(filepath.Join(a.h.Own("j"), "1", "shard")); err != nil || readFiles(t, filepath.Join(a.h.Own("j"), "1"))["shard"] != "a's" {
		t.Errorf("a's own step changed by the refused fetch: %v", err)
	}
	// The same connections, named right, work: the name is what refused.
	if _, err := a.h.Send(ctx, c.peer("c"), "j", 1, 1); err != nil {
		t.Errorf("sending to c as c: %v", err)
	}
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 1, 1); err != nil {
		t.Errorf("sending to b as b: %v", err)
	}
}

// TestStuckPeer: a peer that takes the connection and never answers fails
// a replica sent to it, and a fetch from it, at the replica deadline.
func TestStuckPeer(t *testing.T) {
	lim := Limits{ReplicaTimeout: 50 * time.Millisecond}
	nodes := cluster(t, lim, []string{"a", "b"}, "a")
	a := nodes["a"]
	stuck := stuckPeer(t)
	ownStep(t, a, 1, map[string]string{"shard": strings.Repeat("s", 64<<10)})
	if _, err := a.h.Send(t.Context(), Peer{Name: "b", Addr: stuck}, "j", 1, 1); err == nil || t.Context().Err() != nil {
		t.Errorf("send to a stuck peer: %v", err)
	} else if !strings.Contains(err.Error(), "within") {
		t.Errorf("send to a stuck peer failed, not at its deadline: %v", err)
	}
	if _, err := a.h.Fetch(t.Context(), Peer{Name: "b", Addr: stuck}, "j", "b", 1, 1); err == nil {
		t.Error("fetch from a stuck peer succeeded")
	} else if !strings.Contains(err.Error(), "within") {
		t.Errorf("fetch from a stuck peer failed, not at its deadline: %v", err)
	}
}

// stuckPeer is an address that accepts connections and never reads or
// answers them, until the test ends.
func stuckPeer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestHasWholeOnly: a step directory is whole only once sealed or placed
// by its one rename: a half-written own step, a replica directory without
// its mark and a staging directory left by a crash are not Has, are not
// served or sent, and Begin sweeps the leftovers.
func TestHasWholeOnly(t *testing.T) {
	nodes := cluster(t, Limits{}, []string{"a", "b"}, "a", "b")
	a, b := nodes["a"], nodes["b"]
	ctx := t.Context()
	writeFiles(t, filepath.Join(a.h.Own("j"), "5"), map[string]string{"tp0/shard": "half"})
	if a.h.Has("j", "a", 5) {
		t.Error("a half-written own step is Has")
	}
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 1, 5); !errors.Is(err, ErrNotWhole) {
		t.Errorf("sending an unsealed step: %v, want %v", err, ErrNotWhole)
	}
	if _, err := b.h.Fetch(ctx, a.peer("a"), "j", "a", 1, 5); status(err) != 404 {
		t.Errorf("fetching an unsealed step: %v, want 404", err)
	}
	// A replica directory as a crash between two renames, or a file by
	// file fetch, leaves it.
	writeFiles(t, filepath.Join(b.h.peers("j"), "a", "5"), map[string]string{"tp0/shard": "half"})
	if b.h.Has("j", "a", 5) {
		t.Error("a replica directory without its mark is Has")
	}
	staged := filepath.Join(b.h.peers("j"), "a", stagingPrefix+"x")
	writeFiles(t, staged, map[string]string{"tp0/shard": "half"})
	if err := a.h.Seal("j", 1, 5); err != nil {
		t.Fatal(err)
	}
	if !a.h.Has("j", "a", 5) {
		t.Error("a sealed step is not Has")
	}
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 1, 5); err != nil {
		t.Fatal(err)
	}
	if !b.h.Has("j", "a", 5) || readFiles(t, filepath.Join(b.h.peers("j"), "a", "5"))["tp0/shard"] != "half" {
		t.Error("the placed replica is not whole")
	}
	if err := b.h.Begin("j", 1, 5, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staged); !os.IsNotExist(err) {
		t.Errorf("Begin left a staging directory: %v", err)
	}
	if got := fmt.Sprint(steps(filepath.Join(b.h.peers("j"), "a"))); got != "[5]" {
		t.Errorf("b's replicas of a: steps %s, want [5]", got)
	}
}

// TestLeftHolderLooksUp: b holds a's step of job j but has left the job
// (it heard of generation 1 only); c, in generation 3, gathers from it: b
// asks the coordinators (its lookup) and serves c. A job b holds nothing
// of is never looked up, and a caller outside the generation the lookup
// names is still refused.
func TestLeftHolderLooksUp(t *testing.T) {
	nodes := cluster(t, Limits{PeerWait: 20 * time.Millisecond}, []string{"a", "b"}, "a", "b", "c", "z")
	a, b, c, z := nodes["a"], nodes["b"], nodes["c"], nodes["z"]
	ctx := t.Context()
	ownStep(t, a, 3, map[string]string{"shard": "a's weights"})
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 1, 3); err != nil {
		t.Fatal(err)
	}
	var asked []string
	var mu sync.Mutex
	b.h.SetLookup(func(_ context.Context, job, node string) (int64, []string, error) {
		mu.Lock()
		asked = append(asked, job)
		mu.Unlock()
		return 3, slices.DeleteFunc([]string{"c", "d"}, func(m string) bool { return m != node }), nil
	})
	if _, err := c.h.Fetch(ctx, b.peer("b"), "j", "a", 3, 3); err != nil {
		t.Fatalf("c, in generation 3, gathering from b that left the job: %v", err)
	}
	if _, err := z.h.Fetch(ctx, b.peer("b"), "j", "a", 3, 3); status(err) != 403 {
		t.Errorf("z, in no generation, fetching: %v, want 403", err)
	}
	if _, err := z.h.Fetch(ctx, b.peer("b"), "other", "a", 3, 3); status(err) != 403 {
		t.Errorf("z fetching a job b holds nothing of: %v, want 403", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(asked, "other") {
		t.Errorf("b looked up a job it holds nothing of: %v", asked)
	}
}

// TestMemberOutsideViewLooksUp: a node hears of the members it exchanges
// replicas with alone (its assignment's view of generation 2 names a and
// b); c, a member of generation 2 that b's view leaves out, gathers a's
// step from b: b asks the coordinators once, serves c, and remembers. z,
// no member, is refused, and a lookup that names a later generation
// admits nobody to a put of generation 2.
func TestMemberOutsideViewLooksUp(t *testing.T) {
	nodes := cluster(t, Limits{PeerWait: 20 * time.Millisecond}, []string{"a", "b"}, "a", "b", "c", "z")
	a, b, c, z := nodes["a"], nodes["b"], nodes["c"], nodes["z"]
	ctx := t.Context()
	for _, n := range []*node{a, b} {
		if err := n.h.Saw("j", 2, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	ownStep(t, a, 3, map[string]string{"shard": "a's weights"})
	if _, err := a.h.Send(ctx, b.peer("b"), "j", 2, 3); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []string
	gen := int64(2)
	b.h.SetLookup(func(_ context.Context, job, node string) (int64, []string, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, node)
		if node == "c" || gen == 3 {
			return gen, []string{node}, nil
		}
		return gen, nil, nil
	})
	for range 2 {
		if _, err := c.h.Fetch(ctx, b.peer("b"), "j", "a", 2, 3); err != nil {
			t.Fatalf("c, a member outside b's view, gathering: %v", err)
		}
	}
	if _, err := z.h.Fetch(ctx, b.peer("b"), "j", "a", 2, 3); status(err) != 403 {
		t.Errorf("z, no member, fetching: %v, want 403", err)
	}
	mu.Lock()
	if got := fmt.Sprint(asked); got != "[c z]" {
		t.Errorf("b asked about %s, want [c z] (c once)", got)
	}
	gen = 3
	mu.Unlock()
	ownStep(t, z, 3, map[string]string{"shard": "z's weights"})
	if _, err := z.h.Send(ctx, b.peer("b"), "j", 2, 3); status(err) != 403 {
		t.Errorf("z placing a replica of generation 2: %v, want 403", err)
	}
}
