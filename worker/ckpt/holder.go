// Package ckpt keeps a node's checkpoints when the agents hold them rather
// than a shared file system: the files this node's ranks wrote, and the
// replicas of its peers' files, in a node-local directory (memory-backed
// where it fits), served to peers over mutual TLS and fetched from them.
//
// Under a Holder's root, a job's files are:
//
//	<job>/.generation              the job's newest generation heard of, with
//	                               its members: whom the node server serves
//	<job>/own/<step>/...           what this node's ranks wrote for step (their
//	                               GPUCOORD_CHECKPOINT_DIR is <job>/own), and,
//	                               after a restore, what they gathered
//	<job>/peers/<node>/<step>/...  a replica of node's files of step
//	.../<step>/.whole              the step is whole (Has): sealed once every
//	                               local rank wrote it, or placed by its one
//	                               rename
//
// A step's files move as one tar stream whose last entry lists every
// file's CRC-32C; a receiver places nothing it has not checked. The
// sender writes each file's bytes from the file straight into the TLS
// connection, and may spread them over part of a step (SendPaced, Pace)
// so that they do not take the ranks' cores in a burst. They are read
// and encrypted in user space: crypto/tls has no kernel TLS, so sendfile
// or splice from the file to the socket cannot be used. A step
// that comes in is staged in a directory of its own (fsynced when the root
// is on a disk), marked whole and renamed into place once, so a crash
// leaves either the step or nothing that counts.
//
// # Who is served
//
// Over TLS the node server (Handle) serves a job's steps to the members of
// the job's newest generation the node heard of (Saw) and takes a replica
// only of the caller's own files, for that generation, up to a cap
// (Limits). Send and Fetch accept only a peer whose certificate names the
// node they meant, and give up after a deadline.
//
// # Concurrency
//
// A Holder's methods are safe for concurrent use; a job's steps are
// placed by rename, so a reader sees a step whole or not at all.
package ckpt

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// maxStepFiles bounds the files of one step stream.
const maxStepFiles = 1 << 16

// streamSlack is what a step stream carries beyond its files' bytes, at
// most: a header and padding per file, and the checksums entry.
const streamSlack = maxStepFiles*1024 + 17<<20

// sumsEntry is the last entry of a step's tar stream: "<crc32c>  <name>"
// lines, one per file. The stream runs over mutual TLS, whose AES-GCM
// already authenticates every byte against a peer: the checksum catches a
// file that changed while it was read or a stream cut short, for which
// CRC-32C (hardware-computed, Castagnoli) is enough at a fraction of
// SHA-256's cost (BenchmarkReplicate: 30% of the replication's CPU was
// SHA-256).
const sumsEntry = ".crc32c"

// castagnoli is CRC-32C's table.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Holder is one node's store of checkpoints.
type Holder struct {
	root   string
	node   string
	log    *slog.Logger
	client *http.Client
	scheme string
	server *tls.Config
	// clientTLS dials peers (nil: plaintext); clientFor checks their names.
	clientTLS *tls.Config
	lim       Limits

	seenMu      sync.Mutex
	seen        map[string]seen // each job's newest generation heard of (Saw)
	seenChanged chan struct{}   // closed and replaced at each Saw
	// lookup asks the coordinators for a job's current generation (its
	// number and members' names); nil: none (SetLookup).
	lookup func(ctx context.Context, job, node string) (int64, []string, error)

	peerMu      sync.Mutex
	peerClients map[string]*http.Client // by peer name (clientFor)

	placeMu  sync.Mutex   // serialises placing steps (place)
	ownMax   atomic.Int64 // the largest own step sealed, for the cap
	diskOnce sync.Once
	onDisk   bool // the root is on a disk: steps are fsynced (durable)
}

// New returns the holder of node's checkpoints under root. server and
// client are PeerTLS's configurations; both nil means plaintext, which
// Serve allows only on loopback.
func New(root, node string, server, client *tls.Config, log *slog.Logger) *Holder {
	if log == nil {
		log = slog.Default()
	}
	tr := peerTransport(client)
	scheme := "https"
	if client == nil {
		scheme = "http"
	}
	return &Holder{root: root, node: node, log: log.With("component", "checkpoints"), server: server,
		client: &http.Client{Transport: tr}, scheme: scheme, clientTLS: client, lim: DefaultLimits,
		seen: map[string]seen{}, seenChanged: make(chan struct{}), peerClients: map[string]*http.Client{}}
}

// Root is the holder's directory.
func (h *Holder) Root() string { return h.root }

// Own is the directory job's ranks on this node write their checkpoints
// under (GPUCOORD_CHECKPOINT_DIR): step N's files go in Own(job)/N.
func (h *Holder) Own(job string) string { return filepath.Join(h.root, job, "own") }

func (h *Holder) peers(job string) string { return filepath.Join(h.root, job, "peers") }

// stepDir is where src's files of step are on this node.
func (h *Holder) stepDir(job, src string, step int64) string {
	if src == h.node {
		return filepath.Join(h.Own(job), strconv.FormatInt(step, 10))
	}
	return filepath.Join(h.peers(job), src, strconv.FormatInt(step, 10))
}

// Begin prepares job's directories for generation gen resuming after
// step resume: steps after resume were never committed (or belong to a
// generation that failed) and are removed, here and in the replicas this
// node holds, so that a step's files are only ever the new generation's.
// This node's own files of resume stay only when it wrote them in the
// generation that committed resume (wrote): otherwise they are of an
// attempt at that step that was never committed (this node's generation
// failed before its commit, and a generation without it committed the
// step since), and the step's files are gathered into an empty
// directory, never next to them. What a crash left half-placed goes too.
// (Which generations' replicas are taken is what the node heard of, Saw.)
func (h *Holder) Begin(job string, gen, resume int64, wrote bool) error {
	h.sweep(job)
	if err := os.MkdirAll(h.Own(job), 0o755); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	if !wrote && resume > 0 {
		if err := os.RemoveAll(h.stepDir(job, h.node, resume)); err != nil {
			return fmt.Errorf("checkpoint directory: %w", err)
		}
	}
	for _, dir := range h.stepRoots(job) {
		for _, s := range steps(dir) {
			if s > resume {
				if err := os.RemoveAll(filepath.Join(dir, strconv.FormatInt(s, 10))); err != nil {
					return fmt.Errorf("checkpoint directory: %w", err)
				}
			}
		}
	}
	return nil
}

// stepRoots are the directories of job whose entries are step directories:
// own, and each peer's.
func (h *Holder) stepRoots(job string) []string {
	dirs := []string{h.Own(job)}
	entries, _ := os.ReadDir(h.peers(job))
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(h.peers(job), e.Name()))
		}
	}
	return dirs
}

// steps lists the step directories in dir, ascending.
func steps(dir string) []int64 {
	entries, _ := os.ReadDir(dir)
	var out []int64
	for _, e := range entries {
		if n, err := strconv.ParseInt(e.Name(), 10, 64); err == nil && n >= 0 && e.IsDir() && strconv.FormatInt(n, 10) == e.Name() {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Prune keeps, in every step root of job, the steps after committed and
// the newest keep steps at or before it; keep below 1 counts as 1.
func (h *Holder) Prune(job string, keep int, committed int64) {
	keep = max(keep, 1)
	for _, dir := range h.stepRoots(job) {
		var old []int64
		for _, s := range steps(dir) {
			if s <= committed {
				old = append(old, s)
			}
		}
		for _, s := range old[:max(0, len(old)-keep)] {
			if err := os.RemoveAll(filepath.Join(dir, strconv.FormatInt(s, 10))); err != nil {
				h.log.Warn("removing an old checkpoint", "job", job, "step", s, "err", err)
			}
		}
	}
}

// Jobs lists the jobs this node holds files of: the directories of its
// root named as a job may be (gpucoordpb.CheckJobID).
func (h *Holder) Jobs() []string {
	entries, _ := os.ReadDir(h.root)
	var jobs []string
	for _, e := range entries {
		if e.IsDir() && pb.CheckJobID(e.Name()) == nil {
			jobs = append(jobs, e.Name())
		}
	}
	return jobs
}

// Remove deletes everything of job; a name no job may have
// (gpucoordpb.CheckJobID) is refused, so that nothing outside a job's
// directory goes.
func (h *Holder) Remove(job string) error {
	if err := pb.CheckJobID(job); err != nil {
		return err
	}
	h.forget(job)
	return os.RemoveAll(filepath.Join(h.root, job))
}

// ---- moving steps ----

// Send streams this node's files of step (sealed: Seal) to peer, which
// keeps them as its replica; gen is the sender's generation. The peer's
// certificate must name it, and the whole replica must be placed within
// Limits.ReplicaTimeout plus a second per 64 MiB of the step.
func (h *Holder) Send(ctx context.Context, peer Peer, job string, gen, step int64) (int64, error) {
	return h.SendPaced(ctx, peer, job, gen, step, Pace{})
}

// SendPaced is Send with its work spread as pace says (Pace): the agent
// paces each step's replicas by the ranks' step time, so that they do not
// take the cores of the step in a burst.
func (h *Holder) SendPaced(ctx context.Context, peer Peer, job string, gen, step int64, pace Pace) (int64, error) {
	dir := h.stepDir(job, h.node, step)
	if !h.Has(job, h.node, step) {
		return 0, fmt.Errorf("replicating step %d to %s: %w", step, peer.Name, ErrNotWhole)
	}
	size, err := dirBytes(dir)
	if err != nil {
		return 0, fmt.Errorf("replicating step %d to %s: %w", step, peer.Name, err)
	}
	deadline := h.lim.replicaDeadline(size)
	ctx, cancel := context.WithTimeoutCause(ctx, deadline, fmt.Errorf("no replica placed within %s", deadline))
	defer cancel()
	body := &tarBody{write: func(w io.Writer) error { return writeTar(ctx, w, dir, newPacer(pace, size)) }}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, h.url(peer.Addr, job, h.node, step, gen), body)
	if err != nil {
		return 0, err
	}
	resp, err := h.ClientFor(peer.Name).Do(req)
	if err != nil {
		if cause := context.Cause(ctx); ctx.Err() != nil && cause != ctx.Err() {
			err = cause
		}
		return 0, fmt.Errorf("replicating step %d to %s (%s): %w", step, peer.Name, peer.Addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("replicating step %d to %s (%s): %s: %s", step, peer.Name, peer.Addr, resp.Status, strings.TrimSpace(string(msg)))
	}
	return body.n.Load(), nil
}

// tarBody is a step's tar stream as a request body. The transport copies
// it with WriteTo, which writes the stream straight into the connection:
// no pipe and no goroutine between the files and TLS. Read, for a
// transport that reads instead, runs WriteTo through a pipe.
type tarBody struct {
	write func(w io.Writer) error
	n     atomic.Int64 // bytes written
	once  sync.Once
	pr    *io.PipeReader
}

// WriteTo writes the stream to w.
func (b *tarBody) WriteTo(w io.Writer) (int64, error) {
	cw := &sentCounter{w: w, n: &b.n}
	err := b.write(cw)
	return cw.sent, err
}

func (b *tarBody) Read(p []byte) (int, error) {
	b.once.Do(func() {
		var pw *io.PipeWriter
		b.pr, pw = io.Pipe()
		go func() {
			_, err := b.WriteTo(pw)
			pw.CloseWithError(err)
		}()
	})
	return b.pr.Read(p)
}

// Close ends a stream being read; one written with WriteTo is over when
// WriteTo returns.
func (b *tarBody) Close() error {
	b.once.Do(func() {}) // no pipe from here on
	if b.pr != nil {
		b.pr.Close()
	}
	return nil
}

// sentCounter passes writes to w and counts them.
type sentCounter struct {
	w    io.Writer
	n    *atomic.Int64
	sent int64
}

func (c *sentCounter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.sent += int64(n)
	c.n.Add(int64(n))
	return n, err
}

// stepBytesHeader, on a step served, is the size of its files: the
// fetcher's deadline grows with it.
const stepBytesHeader = "Gpucoord-Step-Bytes"

// Fetch copies src's files of step from peer (whose certificate must name
// it) into this node's own directory of step (Own(job)/step), next to
// what is there; gen is the fetcher's generation. The stream is staged,
// checked, fsynced on a disk root and placed with one rename as a replica
// of src held here (as this node's own step when src is this node), then
// linked into Own(job)/step. It must end within Limits.ReplicaTimeout plus
// a second per 64 MiB of the step, and be no larger than the cap.
func (h *Holder) Fetch(ctx context.Context, peer Peer, job, src string, gen, step int64) (int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	expire := func(d time.Duration) func() {
		return func() { cancel(fmt.Errorf("step %d not fetched from %s within %s", step, peer.Name, d)) }
	}
	timer := time.AfterFunc(h.lim.ReplicaTimeout, expire(h.lim.ReplicaTimeout))
	defer func() { timer.Stop() }() // the one running at the end
	fail := func(err error) (int64, error) {
		if cause := context.Cause(ctx); ctx.Err() != nil && cause != nil {
			err = cause
		}
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.url(peer.Addr, job, src, step, gen), nil)
	if err != nil {
		return 0, err
	}
	resp, err := h.ClientFor(peer.Name).Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	limit := h.stepCap()
	if size, err := strconv.ParseInt(resp.Header.Get(stepBytesHeader), 10, 64); err == nil && size >= 0 {
		if size > limit {
			return 0, fmt.Errorf("step %d of node %s is %d bytes: %w (%d bytes)", step, src, size, ErrTooLarge, limit)
		}
		d := h.lim.replicaDeadline(size)
		timer.Stop()
		timer = time.AfterFunc(d, expire(d))
	}
	var n countWriter
	dst := h.stepDir(job, src, step)
	staged, err := stage(filepath.Dir(dst))
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(staged)
	if err := readTar(io.TeeReader(resp.Body, &n), staged, limit); err != nil {
		return fail(err)
	}
	own := h.stepDir(job, h.node, step)
	if src == h.node {
		if _, err := os.Stat(own); errors.Is(err, fs.ErrNotExist) {
			return int64(n), h.place(staged, own, gen)
		}
		// Others' files were gathered here first: this node's go next to
		// them, and the step is whole once they all are.
		if err := linkTree(staged, own); err != nil {
			return 0, err
		}
		return int64(n), h.markWhole(own, gen)
	}
	if err := h.place(staged, dst, gen); err != nil {
		return 0, err
	}
	return int64(n), linkTree(dst, own)
}

// CopyLocal copies src's files of step, held on this node as a replica
// (or src is this node), into Own(job)/step.
func (h *Holder) CopyLocal(job, src string, step int64) error {
	return copyTree(h.stepDir(job, src, step), h.stepDir(job, h.node, step))
}

// ToBackup copies this node's own files of step into dir/<step> (the
// job's shared second tier).
func (h *Holder) ToBackup(job string, step int64, dir string) error {
	return copyTree(h.stepDir(job, h.node, step), filepath.Join(dir, strconv.FormatInt(step, 10)))
}

// FromBackup copies the whole of step from the second tier dir into
// Own(job)/step.
func (h *Holder) FromBackup(job string, step int64, dir string) error {
	src := filepath.Join(dir, strconv.FormatInt(step, 10))
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return fmt.Errorf("step %d is not in the backup directory %s", step, dir)
	}
	return copyTree(src, h.stepDir(job, h.node, step))
}

// PruneBackup keeps the newest keep steps (at least 1) at or before
// committed in the second tier dir.
func PruneBackup(dir string, keep int, committed int64) {
	var old []int64
	for _, s := range steps(dir) {
		if s <= committed {
			old = append(old, s)
		}
	}
	for _, s := range old[:max(0, len(old)-max(keep, 1))] {
		os.RemoveAll(filepath.Join(dir, strconv.FormatInt(s, 10)))
	}
}

func (h *Holder) url(addr, job, src string, step, gen int64) string {
	u := url.URL{Scheme: h.scheme, Host: addr, Path: "/v1/jobs/" + job + "/nodes/" + src + "/steps/" + strconv.FormatInt(step, 10)}
	if gen > 0 {
		u.RawQuery = "generation=" + strconv.FormatInt(gen, 10)
	}
	return u.String()
}

// Scheme is how the node servers are reached: https, or http in
// plaintext (loopback alone).
func (h *Holder) Scheme() string { return h.scheme }

// ---- serving ----

// Serve answers peers on ln until ctx ends: GET a step of a node's files
// that this node holds, to the members of the job's newest generation it
// heard of (Saw), PUT a replica of the caller's own files for that
// generation. Plaintext is served only on a loopback listener.
func (h *Holder) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	h.Handle(mux)
	return Serve(ctx, ln, h.server, mux, h.log)
}

// Handle serves the checkpoints h holds on mux, to the job's nodes alone:
//
//	GET /v1/jobs/{job}/nodes/{node}/steps/{step}?generation=G
//	    a whole step of node's files, to a member of the job's newest
//	    generation heard of (G, when newer, is waited for)
//	PUT /v1/jobs/{job}/nodes/{node}/steps/{step}?generation=G
//	    a replica of the caller's own files, from a member of generation G,
//	    the job's newest here; at most the cap (Limits.MaxStepBytes)
func (h *Holder) Handle(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/jobs/{job}/nodes/{node}/steps/{step}", h.get)
	mux.HandleFunc("PUT /v1/jobs/{job}/nodes/{node}/steps/{step}", h.put)
}

// Serve serves handler on ln until ctx ends: an agent's node server, over
// mutual TLS with server (pki.PeerTLS), or in plaintext when server is nil,
// which only a loopback listener takes.
func Serve(ctx context.Context, ln net.Listener, server *tls.Config, handler http.Handler, log *slog.Logger) error {
	if server == nil {
		if ap, ok := ln.Addr().(*net.TCPAddr); !ok || !ap.IP.IsLoopback() {
			ln.Close()
			return fmt.Errorf("ckpt: plaintext on %s: peers off loopback need mutual TLS (a join token or TLS files)", ln.Addr())
		}
	} else {
		ln = tls.NewListener(ln, server)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// target reads and checks a request's job, node and step.
func (h *Holder) target(w http.ResponseWriter, r *http.Request) (job, node string, step int64, ok bool) {
	job, node = r.PathValue("job"), r.PathValue("node")
	step, err := strconv.ParseInt(r.PathValue("step"), 10, 64)
	switch {
	case !SafeName(job) || !SafeName(node):
		http.Error(w, "bad job or node name", http.StatusBadRequest)
	case err != nil || step < 0:
		http.Error(w, "bad step", http.StatusBadRequest)
	default:
		return job, node, step, true
	}
	return "", "", 0, false
}

func (h *Holder) get(w http.ResponseWriter, r *http.Request) {
	job, src, step, ok := h.target(w, r)
	if !ok {
		return
	}
	caller, authed, ok := h.callerNode(w, r)
	if !ok {
		return
	}
	gen, _ := strconv.ParseInt(r.URL.Query().Get("generation"), 10, 64)
	if authed {
		if err := h.allowGet(r.Context(), job, caller, gen); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
	}
	dir := h.stepDir(job, src, step)
	size, err := dirBytes(dir)
	if !h.Has(job, src, step) || err != nil {
		http.Error(w, fmt.Sprintf("node %s holds no files of node %s for step %d of job %s", h.node, src, step, job), http.StatusNotFound)
		return
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(h.lim.replicaDeadline(size)))
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set(stepBytesHeader, strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	if err := writeTar(r.Context(), w, dir, nil); err != nil {
		// The stream ends without its checksums: the reader fails.
		h.log.Warn("serving a checkpoint", "job", job, "node", src, "step", step, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// put takes a replica of the caller's own files for a generation it is
// in, no larger than the cap, within the replica deadline of the cap.
func (h *Holder) put(w http.ResponseWriter, r *http.Request) {
	job, src, step, ok := h.target(w, r)
	if !ok {
		return
	}
	caller, authed, ok := h.callerNode(w, r)
	if !ok {
		return
	}
	if authed && caller != src {
		http.Error(w, fmt.Sprintf("a node sends only its own files (%s is not %s)", caller, src), http.StatusForbidden)
		return
	}
	if src == h.node {
		http.Error(w, "a node does not replicate to itself", http.StatusBadRequest)
		return
	}
	gen, err := strconv.ParseInt(r.URL.Query().Get("generation"), 10, 64)
	if err != nil || gen < 1 {
		http.Error(w, "bad generation", http.StatusBadRequest)
		return
	}
	if authed {
		if code, err := h.allowPut(r.Context(), job, caller, gen); err != nil {
			http.Error(w, err.Error(), code)
			return
		}
	} else {
		h.seenMu.Lock()
		s, _ := h.newestLocked(job)
		h.seenMu.Unlock()
		if gen < s.Number {
			http.Error(w, fmt.Sprintf("generation %d of job %s is over here (generation %d runs)", gen, job, s.Number), http.StatusConflict)
			return
		}
	}
	limit := h.stepCap()
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.lim.replicaDeadline(limit)))
	body := http.MaxBytesReader(w, r.Body, limit+streamSlack)
	dst := h.stepDir(job, src, step)
	staged, err := stage(filepath.Dir(dst))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer os.RemoveAll(staged)
	if err := readTar(body, staged, limit); err != nil {
		code := http.StatusBadRequest
		var tooLarge *http.MaxBytesError
		if errors.Is(err, ErrTooLarge) || errors.As(err, &tooLarge) {
			code = http.StatusRequestEntityTooLarge
		}
		http.Error(w, err.Error(), code)
		return
	}
	if err := h.place(staged, dst, gen); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SafeName says whether s is a job id or a node name: gpucoord's one rule
// of names (gpucoordpb.CheckNodeName, of which job ids are a shorter
// case), one path element, never hidden, never a directory gpucoord keeps
// for itself.
func SafeName(s string) bool { return pb.CheckNodeName(s) == nil }

// ---- the tar stream ----

// writeTar writes the files under dir (not those whose name starts with a
// dot), then the checksums entry. A file's bytes go from the file straight
// to w, in pieces of paceChunk bytes when pc paces (it is told of each
// piece and pauses as its Pace says), else of 1 MiB; only the tar headers
// and padding are buffered.
func writeTar(ctx context.Context, w io.Writer, dir string, pc *pacer) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	tw := tar.NewWriter(bw)
	var sums strings.Builder
	buf := make([]byte, 1<<20)
	if pc != nil {
		buf = buf[:paceChunk]
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil // directories come with their files
		}
		rel, _ := filepath.Rel(dir, path)
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Size: fi.Size(), ModTime: fi.ModTime(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		// The header goes out now, so that the file's bytes pass the
		// buffer by (bufio writes a piece larger than its free space
		// straight through when it holds nothing).
		if err := bw.Flush(); err != nil {
			return err
		}
		hash := crc32.New(castagnoli)
		var n int64
		for n < fi.Size() {
			k, err := f.Read(buf[:min(int64(len(buf)), fi.Size()-n)])
			if k > 0 {
				hash.Write(buf[:k])
				if _, err := tw.Write(buf[:k]); err != nil {
					return err
				}
				n += int64(k)
				if err := pc.sent(ctx, k); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
		}
		if n != fi.Size() {
			return fmt.Errorf("%s shrank while it was sent", rel)
		}
		fmt.Fprintf(&sums, "%x  %s\n", hash.Sum(nil), filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	s := sums.String()
	if err := tw.WriteHeader(&tar.Header{Name: sumsEntry, Mode: 0o644, Size: int64(len(s)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.WriteString(tw, s); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// readTar places the files of a stream writeTar wrote under dst, each
// written to a temporary file and renamed once the stream's checksums
// have confirmed it: a stream cut short, or a file that does not match,
// places nothing. Files of more than limit bytes in all are refused
// (ErrTooLarge) at the header that crosses it, before its bytes are read.
func readTar(r io.Reader, dst string, limit int64) error {
	// A small buffer for the headers: a file's bytes, read in pieces
	// larger than it, pass it by.
	tr := tar.NewReader(bufio.NewReaderSize(r, 64<<10))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	var files []staged
	defer func() {
		for _, f := range files {
			os.Remove(f.tmp)
		}
	}()
	seen := map[string]bool{}
	buf := make([]byte, 1<<20)
	var total int64
	for {
		hdr, err := tr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the stream ended before its checksums")
			}
			return fmt.Errorf("checkpoint stream: %w", err)
		}
		if hdr.Name == sumsEntry {
			b, err := io.ReadAll(io.LimitReader(tr, 16<<20))
			if err != nil {
				return fmt.Errorf("checkpoint stream: %w", err)
			}
			if err := checkSums(string(b), files); err != nil {
				return err
			}
			for _, f := range files {
				if err := os.Rename(f.tmp, f.final); err != nil {
					return err
				}
			}
			files = nil
			return nil
		}
		name := filepath.FromSlash(hdr.Name)
		if hdr.Typeflag != tar.TypeReg || !filepath.IsLocal(name) || strings.HasPrefix(filepath.Base(name), ".") || seen[name] {
			return fmt.Errorf("checkpoint stream: refusing entry %q", hdr.Name)
		}
		seen[name] = true
		if len(files) >= maxStepFiles {
			return fmt.Errorf("checkpoint stream: more than %d files: %w", maxStepFiles, ErrTooLarge)
		}
		if hdr.Size > limit-total {
			return fmt.Errorf("checkpoint stream: %s: %w (%d bytes)", hdr.Name, ErrTooLarge, limit)
		}
		total += hdr.Size
		final := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
			return err
		}
		tmp := filepath.Join(filepath.Dir(final), ".tmp-"+randHex()+"-"+filepath.Base(final))
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		files = append(files, staged{tmp: tmp, final: final})
		hash := crc32.New(castagnoli)
		_, err = io.CopyBuffer(io.MultiWriter(f, hash), tr, buf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("checkpoint stream: %s: %w", hdr.Name, err)
		}
		files[len(files)-1].sum = hex.EncodeToString(hash.Sum(nil)) + "  " + filepath.ToSlash(name)
	}
}

// staged is a received file waiting for the stream's checksums.
type staged struct{ tmp, final, sum string }

// checkSums compares the stream's checksum lines with the files read.
func checkSums(listed string, files []staged) error {
	want := strings.Split(strings.TrimSuffix(listed, "\n"), "\n")
	if listed == "" {
		want = nil
	}
	got := make([]string, len(files))
	for i, f := range files {
		got[i] = f.sum
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(want, got) {
		return fmt.Errorf("checkpoint stream: the files do not match their checksums (%d listed, %d read)", len(want), len(got))
	}
	return nil
}

// copyTree copies the files under src (not dot files) into dst, each
// through a temporary file and a rename.
func copyTree(src, dst string) error { return eachFile(src, dst, copyFile) }

// eachFile makes dst's directories as src's (not dot files or dot
// directories) and puts each regular file of src at its place in dst
// with place.
func eachFile(src, dst string, place func(path, target string) error) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != src && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return place(path, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := filepath.Join(filepath.Dir(dst), ".tmp-"+randHex()+"-"+filepath.Base(dst))
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func randHex() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }
