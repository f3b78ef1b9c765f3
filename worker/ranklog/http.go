package ranklog

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
	"github.com/gpucoord/gpucoord/worker/ckpt"
)

// Handle serves s on mux, to users' clients and admins (over TLS, the
// caller's certificate must carry one of those roles: a node's is refused
// with 403; in plaintext, which an agent serves on loopback only, anyone):
//
//	GET /v1/jobs/{job}/output?generation=N[&rank=R]
//	    generation N's lines as they come, until it ends on this node
//	GET /v1/jobs/{job}/logs[?rank=R]
//	    the rank's log file (every rank's this node holds, by rank)
//
// rank is a global rank; without it every rank of the node is shown.
// Reading creates nothing: a follower of a job the node has not heard of
// waits for its first line without a record of it.
func (s *Store) Handle(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/jobs/{job}/output", s.serveOutput)
	mux.HandleFunc("GET /v1/jobs/{job}/logs", s.serveLogs)
}

// fromUser checks that a request over TLS comes from a user's client or
// an admin, answering 403 when not.
func fromUser(w http.ResponseWriter, r *http.Request) bool {
	if r.TLS == nil {
		return true
	}
	id, err := pki.PeerIdentity(r.TLS)
	if err != nil || id.Role != pki.RoleClient && id.Role != pki.RoleAdmin {
		http.Error(w, fmt.Sprintf("rank output is served to clients and admins, not to %s", id), http.StatusForbidden)
		return false
	}
	return true
}

// target reads a request's job and rank (-1: all), once the caller is
// one that may read them.
func target(w http.ResponseWriter, r *http.Request) (job string, rank int, ok bool) {
	if !fromUser(w, r) {
		return "", 0, false
	}
	job, rank = r.PathValue("job"), -1
	if !ckpt.SafeName(job) {
		http.Error(w, "bad job name", http.StatusBadRequest)
		return "", 0, false
	}
	if v := r.URL.Query().Get("rank"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			http.Error(w, "bad rank "+strconv.Quote(v), http.StatusBadRequest)
			return "", 0, false
		}
		rank = n
	}
	return job, rank, true
}

func (s *Store) serveOutput(w http.ResponseWriter, r *http.Request) {
	job, rank, ok := target(w, r)
	if !ok {
		return
	}
	gen, err := strconv.ParseInt(r.URL.Query().Get("generation"), 10, 64)
	if err != nil || gen < 1 {
		http.Error(w, "bad generation", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	flush := func() { rc.Flush() }
	s.follow(w, flush, job, gen, rank, r.Context().Done())
}

func (s *Store) serveLogs(w http.ResponseWriter, r *http.Request) {
	job, rank, ok := target(w, r)
	if !ok {
		return
	}
	// The files are read into memory first (a few MiB at most): a missing
	// log is a 404, not an empty 200.
	var sb strings.Builder
	found, err := s.logs(&sb, job, rank)
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	case !found:
		http.Error(w, fmt.Sprintf("node %s holds no log of job %s", s.node, job), http.StatusNotFound)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, sb.String())
	}
}

// ErrNone is what Client.Logs returns when the node holds no log of the
// job (or of the rank).
var ErrNone = errors.New("no log here")

// Client reads the output nodes serve. Over TLS it accepts, at each
// address, only the certificate of the node it names there
// (ckpt.NamedTLS). Its methods are safe for concurrent use.
type Client struct {
	tc     *tls.Config
	scheme string

	mu     sync.Mutex
	byNode map[string]*http.Client // plaintext: one, under ""
}

// NewClient reads over mutual TLS with tc, or in plaintext when tc is nil
// (agents serve plaintext on loopback only).
func NewClient(tc *tls.Config) *Client {
	scheme := "https"
	if tc == nil {
		scheme = "http"
	}
	return &Client{tc: tc, scheme: scheme, byNode: map[string]*http.Client{}}
}

// forNode is the HTTP client for node's server.
func (c *Client) forNode(node string) *http.Client {
	if c.tc == nil {
		node = ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.byNode[node]; hc != nil {
		return hc
	}
	var tc *tls.Config
	if c.tc != nil {
		tc = ckpt.NamedTLS(c.tc, node)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ResponseHeaderTimeout: 10 * time.Second}}
	c.byNode[node] = hc
	return hc
}

// Close drops the client's idle connections.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, hc := range c.byNode {
		hc.CloseIdleConnections()
	}
}

func (c *Client) url(addr, job, what string, q url.Values) string {
	u := url.URL{Scheme: c.scheme, Host: addr, Path: "/v1/jobs/" + job + "/" + what, RawQuery: q.Encode()}
	return u.String()
}

func (c *Client) get(ctx context.Context, node, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.forNode(node).Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			return nil, ErrNone
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// Follow hands each line generation gen's ranks on node, at addr, print
// (rank's alone when rank >= 0) to line, until the generation ends there
// or ctx ends.
func (c *Client) Follow(ctx context.Context, node, addr, job string, gen int64, rank int, line func([]byte)) error {
	q := url.Values{"generation": {strconv.FormatInt(gen, 10)}}
	if rank >= 0 {
		q.Set("rank", strconv.Itoa(rank))
	}
	resp, err := c.get(ctx, node, c.url(addr, job, "output", q))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 {
			line(b)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Logs copies the log files of job's ranks (rank's alone when rank >= 0)
// node, at addr, holds to w; ErrNone when it holds none.
func (c *Client) Logs(ctx context.Context, node, addr, job string, rank int, w io.Writer) error {
	q := url.Values{}
	if rank >= 0 {
		q.Set("rank", strconv.Itoa(rank))
	}
	resp, err := c.get(ctx, node, c.url(addr, job, "logs", q))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}
