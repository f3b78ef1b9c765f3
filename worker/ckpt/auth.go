package ckpt

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
)

// generationEntry, in a job's directory, is the newest generation of the
// job this node heard of (JSON seen): an agent that restarts still knows
// whom the files it holds are for.
const generationEntry = ".generation"

// seen is a generation of a job as this node heard of it: its number and
// its members' names.
type seen struct {
	Number  int64    `json:"number"`
	Members []string `json:"members"`
}

// Saw records that generation gen of job, with members (node names), is
// the job's newest this node has heard of (an older or equal gen changes
// nothing). The node server serves the job's steps to those members and
// takes replicas of that generation from them; a request waiting for the
// generation (Limits.PeerWait) goes on.
func (h *Holder) Saw(job string, gen int64, members []string) error {
	if !SafeName(job) {
		return fmt.Errorf("bad job name %q", job)
	}
	h.seenMu.Lock()
	defer h.seenMu.Unlock()
	if s, ok := h.newestLocked(job); ok && s.Number >= gen {
		return nil
	}
	s := seen{Number: gen, Members: slices.Clone(members)}
	h.seen[job] = s
	close(h.seenChanged)
	h.seenChanged = make(chan struct{})
	b, _ := json.Marshal(s)
	dir := filepath.Join(h.root, job)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".tmp-"+randHex()+generationEntry)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, generationEntry)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// SetLookup gives the holder a way to ask the coordinators for a job's
// current generation and whether a node is one of its members (members is
// then that node alone, or empty): a node hears from its assignments only
// of the members it exchanges replicas with, and, once it has left the
// job, of no later generation, and would refuse the other members that
// gather from it. Set it before Serve.
func (h *Holder) SetLookup(f func(ctx context.Context, job, node string) (gen int64, members []string, err error)) {
	h.seenMu.Lock()
	h.lookup = f
	h.seenMu.Unlock()
}

// newestLocked is the newest generation of job heard of, from memory or,
// after a restart, from the job's directory. h.seenMu is held.
func (h *Holder) newestLocked(job string) (seen, bool) {
	if s, ok := h.seen[job]; ok {
		return s, true
	}
	b, err := os.ReadFile(filepath.Join(h.root, job, generationEntry))
	if err != nil {
		return seen{}, false
	}
	var s seen
	if json.Unmarshal(b, &s) != nil || s.Number < 1 {
		return seen{}, false
	}
	h.seen[job] = s // what the disk holds already: no new state
	return s, true
}

// forget drops what h heard of job's generations (its files are gone).
func (h *Holder) forget(job string) {
	h.seenMu.Lock()
	delete(h.seen, job)
	h.seenMu.Unlock()
}

// await returns the newest generation of job heard of once it is gen or
// newer, or whatever is known when ctx ends or Limits.PeerWait has passed.
// A job this node holds files of, asked for at a generation it has not
// heard of, is looked up once at the coordinators (SetLookup). It creates
// nothing for a job it holds nothing of: an unknown job waits on the
// holder's one channel.
func (h *Holder) await(ctx context.Context, job, caller string, gen int64) (seen, bool) {
	var expired <-chan time.Time
	asked := false
	for {
		h.seenMu.Lock()
		s, ok := h.newestLocked(job)
		changed, lookup := h.seenChanged, h.lookup
		h.seenMu.Unlock()
		if ok && s.Number >= gen {
			return s, ok
		}
		if ok && lookup != nil && !asked {
			asked = true
			if n, members, err := lookup(ctx, job, caller); err != nil {
				h.log.Warn("asking the coordinators for a job's generation", "job", job, "err", err)
			} else if n > s.Number {
				if err := h.Saw(job, n, members); err != nil {
					h.log.Warn("recording the job's generation", "job", job, "err", err)
				}
				continue
			}
		}
		if expired == nil {
			t := time.NewTimer(h.lim.PeerWait)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-changed:
		case <-expired:
			return s, ok
		case <-ctx.Done():
			return s, ok
		}
	}
}

// allowGet says whether caller, a node asking for job's files while in
// generation gen (0: not said), may have them: it must be a member of the
// newest generation of the job this node heard of, waiting for gen when it
// is newer. An error says why not.
func (h *Holder) allowGet(ctx context.Context, job, caller string, gen int64) error {
	s, ok := h.await(ctx, job, caller, gen)
	switch {
	case !ok:
		return fmt.Errorf("node %s knows no generation of job %s", h.node, job)
	case !h.isMember(ctx, job, caller, s, func(n int64) bool { return n >= s.Number }):
		return fmt.Errorf("node %s is not a member of job %s's generation %d", caller, job, s.Number)
	}
	return nil
}

// allowPut says whether caller may place a replica of its files of job for
// generation gen here: gen must be the newest generation this node heard
// of (waited for when newer), and caller one of its members. The status
// is 409 for a generation that is not the current one here, 403 for a
// caller outside it.
func (h *Holder) allowPut(ctx context.Context, job, caller string, gen int64) (int, error) {
	s, ok := h.await(ctx, job, caller, gen)
	switch {
	case !ok || s.Number < gen:
		return http.StatusConflict, fmt.Errorf("node %s has not heard of generation %d of job %s", h.node, gen, job)
	case s.Number > gen:
		return http.StatusConflict, fmt.Errorf("generation %d of job %s is over here (generation %d runs)", gen, job, s.Number)
	case !h.isMember(ctx, job, caller, s, func(n int64) bool { return n == gen }):
		return http.StatusForbidden, fmt.Errorf("node %s is not a member of job %s's generation %d", caller, job, gen)
	}
	return 0, nil
}

// isMember says whether caller is a member of job's generation s. A node
// knows only the members its assignment names (those it exchanges
// replicas with); of another it asks the coordinators, and takes a yes
// for a generation current accepts, keeping it for the next request.
func (h *Holder) isMember(ctx context.Context, job, caller string, s seen, current func(int64) bool) bool {
	if slices.Contains(s.Members, caller) {
		return true
	}
	h.seenMu.Lock()
	lookup := h.lookup
	h.seenMu.Unlock()
	if lookup == nil {
		return false
	}
	n, members, err := lookup(ctx, job, caller)
	if err != nil {
		h.log.Warn("asking the coordinators whether a node is a member of a job", "job", job, "node", caller, "err", err)
		return false
	}
	if !current(n) || !slices.Contains(members, caller) {
		return false
	}
	h.seenMu.Lock()
	if cur, ok := h.seen[job]; ok && cur.Number == n && !slices.Contains(cur.Members, caller) {
		cur.Members = append(slices.Clip(cur.Members), caller)
		h.seen[job] = cur
	}
	h.seenMu.Unlock()
	return true
}

// callerNode is the node a request over TLS comes from; false after
// answering 403 when it does not come from a node (the node server also
// answers users' clients, for rank output). In plaintext (loopback only)
// the caller is not known, and the rules that need its name do not apply.
func (h *Holder) callerNode(w http.ResponseWriter, r *http.Request) (name string, tls bool, ok bool) {
	if h.server == nil {
		return "", false, true
	}
	id, err := pki.PeerIdentity(r.TLS)
	if err != nil || id.Role != pki.RoleNode {
		http.Error(w, fmt.Sprintf("checkpoints are served to nodes alone, not to %s", id), http.StatusForbidden)
		return "", true, false
	}
	return id.Name, true, true
}

// Peer is a node a step is sent to or fetched from: its name, which its
// certificate must carry, and its node server's address.
type Peer struct {
	Name string
	Addr string
}

// maxPeerClients bounds the clients kept per peer name; beyond it they are
// all dropped and made again as needed.
const maxPeerClients = 256

// ClientFor is the HTTP client that reaches peer: over TLS, it accepts
// only a certificate that names peer (a node's certificate proves which
// node it is, the address proves nothing). Connections are pooled per
// peer name, so one made to another name is never reused for it.
func (h *Holder) ClientFor(peer string) *http.Client {
	if h.clientTLS == nil {
		return h.client
	}
	h.peerMu.Lock()
	defer h.peerMu.Unlock()
	if c := h.peerClients[peer]; c != nil {
		return c
	}
	if len(h.peerClients) >= maxPeerClients {
		for _, c := range h.peerClients {
			c.CloseIdleConnections()
		}
		clear(h.peerClients)
	}
	c := &http.Client{Transport: peerTransport(NamedTLS(h.clientTLS, peer))}
	h.peerClients[peer] = c
	return c
}

// NamedTLS is tc (a node server's client side: pki.PeerTLS's or
// pki.AgentTLS's) accepting only the certificate of the node named node:
// its handshake fails with ErrWrongPeer at another node's server. Pool
// connections per node name with it, never per address alone.
func NamedTLS(tc *tls.Config, node string) *tls.Config {
	tc = tc.Clone()
	verify := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		id, err := pki.PeerIdentity(&cs)
		if err != nil {
			return err
		}
		if id.Role != pki.RoleNode || id.Name != node {
			return fmt.Errorf("%w: the certificate at this address is %s's, not node %s's", ErrWrongPeer, id, node)
		}
		return nil
	}
	return tc
}

// peerTransport is the transport to node servers, over TLS with tc (nil:
// plaintext).
func peerTransport(tc *tls.Config) *http.Transport {
	return &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext}
}
