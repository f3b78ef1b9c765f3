// Package slurmboot lets the tasks of one Slurm step agree, with no
// shared file and nothing on a command line, on what a gpucoord cluster
// needs: a CA of the step's own, and the addresses of the coordinators
// that run on its first nodes.
//
// The task on the step's first node serves; the others ask it. The server
// makes the CA, listens on the first free port of a list every task
// derives from the job and step ids (Ports), and answers each task once
// every coordinator task has told it its addresses. The connection is TLS
// with a certificate of the moment; what makes it trusted is the Sealer
// (MUNGE): a request is sealed by the job's user and names the
// fingerprint of the server certificate its maker saw, so the server
// knows it comes from one of the job's tasks and was not relayed through
// someone in the middle; the answer is sealed by the job's user too (and
// with MUNGE only that user can read it), so the task knows it comes from
// the job's first task. Coordinator tasks get the CA's key (each issues
// its own certificates); the others get a node certificate for their
// node, signed from the request's key. docs/SECURITY.md has the threat
// model.
package slurmboot

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/big"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
)

// Member is a coordinator task: its node, the coordinator's gRPC address
// and its etcd member's peer URL.
type Member struct {
	Name    string `json:"name"`
	Addr    string `json:"addr"`
	PeerURL string `json:"peer_url"`
}

// Config is one task's part in the agreement.
type Config struct {
	// Job and Step are SLURM_JOB_ID and SLURM_STEP_ID: only tasks of the
	// same step agree.
	Job, Step string
	// Node is this task's node name and NodeID its index in the step.
	Node   string
	NodeID int
	// Coordinators is how many of the step's first nodes run a
	// coordinator.
	Coordinators int
	// Self is this task's coordinator when NodeID < Coordinators.
	Self *Member
	// Sealer vouches for requests and answers.
	Sealer Sealer
	// Server is the first node's host (a name or an address), where Fetch
	// asks; Bind is where Serve listens (this host's address).
	Server, Bind string
	// Ports are the candidate ports, in order (Ports' result).
	Ports []int
	// Timeout bounds Fetch and Serve's wait for the coordinators.
	Timeout time.Duration
	// Logger receives what goes wrong on the way; nil discards it.
	Logger *slog.Logger
}

// Grant is what a task learns.
type Grant struct {
	// CA is the step's CA certificate, PEM.
	CA []byte `json:"ca"`
	// CAKey is its key, PEM: for coordinator tasks alone.
	CAKey []byte `json:"ca_key,omitempty"`
	// Cert is this node's certificate (role node, the node's name), PEM,
	// for the key Fetch made (Key): for the other tasks.
	Cert []byte `json:"cert,omitempty"`
	Key  []byte `json:"-"`
	// ClientCert is the certificate of the task's launch (role client,
	// "launch@" and the node's name), for ClientKey: for the other tasks,
	// which follow the job too.
	ClientCert []byte `json:"client_cert,omitempty"`
	ClientKey  []byte `json:"-"`
	// Members are the coordinators, in node order.
	Members []Member `json:"members"`
}

// Ports returns n candidate ports for the step's bootstrap server:
// SLURM_STEP_RESV_PORTS' first port when srun reserved ports (--resv-ports),
// then ports in [20000, 32000) drawn from a hash of the job and step ids,
// so that every task of the step derives the same list and two steps
// rarely share one. The range stays below Linux's ephemeral ports.
func Ports(job, step, reserved string, n int) []int {
	var ports []int
	if reserved != "" {
		first, _, _ := cut(reserved)
		if p, err := strconv.Atoi(first); err == nil && p > 0 && p < 65536 {
			ports = append(ports, p)
		}
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "gpucoord %s.%s", job, step)
	x := h.Sum64()
	for len(ports) < n {
		ports = append(ports, 20000+int(x%12000))
		x = x*6364136223846793005 + 1442695040888963407
	}
	return ports
}

// cut splits "A-B,C" at its first '-' or ','.
func cut(s string) (string, string, bool) {
	for i, c := range s {
		if c == '-' || c == ',' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// request and response are the wire messages, one each way, JSON.
type request struct {
	Cred []byte `json:"cred"`
}

type response struct {
	Cred  []byte `json:"cred,omitempty"`
	Error string `json:"error,omitempty"`
	// Other is set when the server is not this step's: the asker moves on
	// to the next port.
	Other bool `json:"other,omitempty"`
}

// claim is a request's sealed payload.
type claim struct {
	Job    string  `json:"job"`
	Step   string  `json:"step"`
	Node   string  `json:"node"`
	NodeID int     `json:"node_id"`
	Nonce  string  `json:"nonce"`
	Server string  `json:"server"` // the fingerprint of the certificate the asker saw
	Member *Member `json:"member,omitempty"`
	CSR    []byte  `json:"csr,omitempty"`
	// ClientCSR is the request for the task's launch's certificate.
	ClientCSR []byte `json:"client_csr,omitempty"`
	Version   int    `json:"version"`
}

// answer is a response's sealed payload.
type answer struct {
	Nonce string `json:"nonce"`
	Grant
}

const protocolVersion = 1

// maxMessage bounds a message read from the network.
const maxMessage = 1 << 20

// Server is the first task's side.
type Server struct {
	cfg   Config
	ln    net.Listener
	ca    *pki.CA
	caKey []byte
	fp    string
	tls   *tls.Config

	mu      sync.Mutex
	members map[int]Member
	full    chan struct{} // closed once every coordinator has told its addresses
	done    chan struct{}
	wg      sync.WaitGroup
}

// Serve makes the step's CA and serves the others until ctx ends or Close.
// It listens on the first of cfg.Ports it can bind.
func Serve(ctx context.Context, cfg Config) (*Server, error) {
	certPEM, keyPEM, err := pki.NewCA("slurm-"+cfg.Job+"."+cfg.Step, time.Now())
	if err != nil {
		return nil, err
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf, fp, err := momentCert()
	if err != nil {
		return nil, err
	}
	var ln net.Listener
	var errs []error
	for _, p := range cfg.Ports {
		if ln, err = net.Listen("tcp", net.JoinHostPort(cfg.Bind, strconv.Itoa(p))); err == nil {
			break
		}
		errs = append(errs, err)
	}
	if ln == nil {
		return nil, fmt.Errorf("the step's bootstrap: no port of %v free on %s: %w", cfg.Ports, cfg.Bind, errors.Join(errs...))
	}
	s := &Server{cfg: cfg, ln: ln, ca: ca, caKey: keyPEM, fp: fp, members: map[int]Member{}, full: make(chan struct{}), done: make(chan struct{}),
		tls: &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS13}}
	if cfg.Self != nil {
		s.register(cfg.NodeID, *cfg.Self)
	}
	s.wg.Go(func() { s.accept() })
	s.wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-s.done:
		}
		ln.Close()
	})
	return s, nil
}

// Addr is where the server listens.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving and waits for the connections in flight.
func (s *Server) Close() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.ln.Close()
	s.wg.Wait()
}

// Grant waits until every coordinator task has told its addresses (at
// most cfg.Timeout) and returns the first task's own grant.
func (s *Server) Grant(ctx context.Context) (Grant, error) {
	ms, err := s.awaitMembers(ctx)
	if err != nil {
		return Grant{}, err
	}
	return Grant{CA: s.ca.PEM(), CAKey: s.caKey, Members: ms}, nil
}

func (s *Server) awaitMembers(ctx context.Context) ([]Member, error) {
	t := time.NewTimer(s.cfg.Timeout)
	defer t.Stop()
	select {
	case <-s.full:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, errors.New("the step's bootstrap server stopped")
	case <-t.C:
		s.mu.Lock()
		var missing []int
		for id := range s.cfg.Coordinators {
			if _, ok := s.members[id]; !ok {
				missing = append(missing, id)
			}
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("the coordinator tasks of nodes %v did not reach this node's task (%s) within %s: did their tasks start? (each node runs one task: srun --ntasks-per-node=1)", missing, s.Addr(), s.cfg.Timeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ms := make([]Member, s.cfg.Coordinators)
	for id := range ms {
		ms[id] = s.members[id]
	}
	return ms, nil
}

func (s *Server) register(id int, m Member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members[id] = m
	if len(s.members) == s.cfg.Coordinators {
		select {
		case <-s.full:
		default:
			close(s.full)
		}
	}
}

func (s *Server) accept() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() {
			defer conn.Close()
			if err := s.serve(conn); err != nil {
				s.log().Warn("a bootstrap request was refused", "from", conn.RemoteAddr(), "err", err)
			}
		})
	}
}

func (s *Server) log() *slog.Logger {
	return cmp.Or(s.cfg.Logger, slog.New(slog.DiscardHandler))
}

// serve answers one connection.
func (s *Server) serve(raw net.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout+10*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Now()) })
	defer stop()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn := tls.Server(raw, s.tls)
	var req request
	if err := json.NewDecoder(io.LimitReader(conn, maxMessage)).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	reply := func(r response) error { return json.NewEncoder(conn).Encode(r) }
	payload, err := s.cfg.Sealer.Open(ctx, req.Cred)
	if err != nil {
		reply(response{Error: "refused: " + err.Error(), Other: true})
		return err
	}
	var c claim
	if err := json.Unmarshal(payload, &c); err != nil {
		reply(response{Error: "refused: a request that is not JSON", Other: true})
		return err
	}
	if err := s.check(c); err != nil {
		reply(response{Error: err.Error(), Other: c.Job != s.cfg.Job || c.Step != s.cfg.Step})
		return err
	}
	var a answer
	a.Nonce, a.CA = c.Nonce, s.ca.PEM()
	if c.Member != nil {
		s.register(c.NodeID, *c.Member)
		a.CAKey = s.caKey
	} else {
		if a.Cert, err = s.ca.SignRequest(c.CSR, pki.Identity{Role: pki.RoleNode, Name: c.Node}, time.Now()); err == nil {
			a.ClientCert, err = s.ca.SignRequest(c.ClientCSR, LaunchIdentity(c.Node), time.Now())
		}
		if err != nil {
			reply(response{Error: "refused: " + err.Error()})
			return err
		}
	}
	if a.Members, err = s.awaitMembers(ctx); err != nil {
		reply(response{Error: err.Error()})
		return err
	}
	b, _ := json.Marshal(a)
	cred, err := s.cfg.Sealer.Seal(ctx, b)
	if err != nil {
		reply(response{Error: "the first task could not seal its answer: " + err.Error()})
		return err
	}
	return reply(response{Cred: cred})
}

// check refuses a claim of another step, one made for another server, and
// one whose role does not fit its node.
func (s *Server) check(c claim) error {
	switch {
	case c.Version != protocolVersion:
		return fmt.Errorf("refused: protocol %d, this gpucoord speaks %d: run the same gpucoord on every node", c.Version, protocolVersion)
	case c.Job != s.cfg.Job || c.Step != s.cfg.Step:
		return fmt.Errorf("refused: a task of step %s.%s asked the bootstrap of step %s.%s", c.Job, c.Step, s.cfg.Job, s.cfg.Step)
	case c.Server != s.fp:
		return errors.New("refused: the request was made for another server's certificate (relayed?)")
	case c.NodeID < 0 || c.Node == "":
		return fmt.Errorf("refused: node %q, index %d", c.Node, c.NodeID)
	case (c.NodeID < s.cfg.Coordinators) != (c.Member != nil):
		return fmt.Errorf("refused: node %d of the step %s a coordinator, and its request says otherwise", c.NodeID, map[bool]string{true: "runs", false: "does not run"}[c.NodeID < s.cfg.Coordinators])
	case c.Member != nil && c.Member.Name != c.Node:
		return fmt.Errorf("refused: node %s sent a coordinator named %s", c.Node, c.Member.Name)
	case c.Member == nil && (len(c.CSR) == 0 || len(c.ClientCSR) == 0):
		return errors.New("refused: no certificate request")
	}
	return nil
}

// LaunchIdentity is the client identity of the launch in a step's task on
// node: it follows the job, and the first task's submits and prints it.
func LaunchIdentity(node string) pki.Identity {
	return pki.Identity{Role: pki.RoleClient, Name: "launch@" + node}
}

// momentCert makes a self-signed certificate for one run of the server.
func momentCert() (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpucoord slurm bootstrap"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, fingerprint(der), nil
}

func fingerprint(der []byte) string {
	h := sha256.Sum256(der)
	return hex.EncodeToString(h[:])
}

// Fetch asks the first task for this task's grant, trying cfg.Ports in
// turn until one answers for this step, for at most cfg.Timeout.
func Fetch(parent context.Context, cfg Config) (Grant, error) {
	ctx, cancel := context.WithTimeout(parent, cfg.Timeout)
	defer cancel()
	var g Grant
	var csr, clientCSR []byte
	if cfg.Self == nil {
		var err error
		if g.Key, csr, err = pki.NewRequest(pki.Identity{Role: pki.RoleNode, Name: cfg.Node}); err != nil {
			return Grant{}, err
		}
		if g.ClientKey, clientCSR, err = pki.NewRequest(LaunchIdentity(cfg.Node)); err != nil {
			return Grant{}, err
		}
	}
	// last is the last failure; heard the last answer that was a refusal,
	// which says more than a port where nothing listens.
	var last, heard error
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
		for _, p := range cfg.Ports {
			addr := net.JoinHostPort(cfg.Server, strconv.Itoa(p))
			got, again, err := ask(ctx, cfg, addr, csr, clientCSR)
			if err == nil {
				got.Key, got.ClientKey = g.Key, g.ClientKey
				return got, nil
			}
			if ctx.Err() != nil {
				break
			}
			last = fmt.Errorf("%s: %w", addr, err)
			if !errors.Is(err, errConnect) {
				heard = last
			}
			if !again {
				// This step's server answered and refused: say why.
				return Grant{}, last
			}
		}
		select {
		case <-ctx.Done():
			if parent.Err() != nil {
				return Grant{}, parent.Err()
			}
			return Grant{}, fmt.Errorf("the task on the step's first node (%s) did not answer within %s: did it fail at start? (its error is in the Slurm job's output) Last try: %w", cfg.Server, cfg.Timeout, cmp.Or(heard, last))
		case <-time.After(pause):
		}
	}
}

var errConnect = errors.New("no connection")

// ask makes one request at addr; again is true when another try may go
// better: no server there yet, another step's, a connection cut.
func ask(ctx context.Context, cfg Config, addr string, csr, clientCSR []byte) (Grant, bool, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Grant{}, true, fmt.Errorf("%w: %v", errConnect, err)
	}
	defer raw.Close()
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Now()) })
	defer stop()
	var seen string
	conn := tls.Client(raw, &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The server's certificate is of the moment: what vouches for the
		// server is its sealed answer, bound to this fingerprint.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			seen = fingerprint(cs.PeerCertificates[0].Raw)
			return nil
		},
	})
	if err := conn.HandshakeContext(ctx); err != nil {
		return Grant{}, true, err
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	c := claim{Job: cfg.Job, Step: cfg.Step, Node: cfg.Node, NodeID: cfg.NodeID, Nonce: hex.EncodeToString(nonce), Server: seen,
		Member: cfg.Self, CSR: csr, ClientCSR: clientCSR, Version: protocolVersion}
	b, _ := json.Marshal(c)
	cred, err := cfg.Sealer.Seal(ctx, b)
	if err != nil {
		return Grant{}, false, fmt.Errorf("sealing the request with %s: %w", cfg.Sealer, err)
	}
	if err := json.NewEncoder(conn).Encode(request{Cred: cred}); err != nil {
		return Grant{}, true, err
	}
	var resp response
	if err := json.NewDecoder(io.LimitReader(conn, maxMessage)).Decode(&resp); err != nil {
		return Grant{}, true, err
	}
	if resp.Error != "" {
		return Grant{}, resp.Other, errors.New(resp.Error)
	}
	payload, err := cfg.Sealer.Open(ctx, resp.Cred)
	if err != nil {
		return Grant{}, true, fmt.Errorf("the answer: %w", err)
	}
	var a answer
	if err := json.Unmarshal(payload, &a); err != nil {
		return Grant{}, true, fmt.Errorf("the answer: %w", err)
	}
	if a.Nonce != c.Nonce {
		return Grant{}, true, errors.New("the answer is for another request (replayed?)")
	}
	if len(a.Members) != cfg.Coordinators {
		return Grant{}, false, fmt.Errorf("the answer names %d coordinators, want %d", len(a.Members), cfg.Coordinators)
	}
	return a.Grant, false, nil
}
