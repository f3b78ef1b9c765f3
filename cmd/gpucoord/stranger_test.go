package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/collectives/tcp"
	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
)

// The stranger is this test binary run on a host of a test cluster with
// strangerEnv set to a strangerPlan: it does what someone on the network
// could do to a running job, and checks that each is refused. With Creds
// it is instead a node's agent gone bad: it holds that node's certificate
// and tries to act for another node.
const strangerEnv = "GPUCOORD_TEST_STRANGER"

type strangerPlan struct {
	// Coordinator is the coordinator's gRPC address, as dialled.
	Coordinator string
	// Gossip are the pool's addresses, and Members the names in it
	// (node#instance) that forged messages declare dead; Label is the
	// pool's label (guessable).
	Gossip  []string
	Members []string
	Label   string
	// Store is the running job's rendezvous store.
	Store string
	// Creds is a node's credentials directory: the node checks instead.
	Creds string
	// Job, Generation, OtherNode and OtherRank name a rank of another
	// node, for the node checks.
	Job        string
	Generation int64
	Self       string
	OtherNode  string
	OtherRank  int32
	// NodeServer is OtherNode's node server, Step a step it holds of Job:
	// with Creds, Self is a node outside the job, and only the node
	// server is tried.
	NodeServer string
	Step       int64
}

// strangerMain runs the plan in the environment and returns the exit
// code: 0 when everything was refused.
func strangerMain() int {
	var p strangerPlan
	if err := json.Unmarshal([]byte(os.Getenv(strangerEnv)), &p); err != nil {
		fmt.Println("stranger: plan:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var failed []string
	check := func(what string, err error) {
		if err != nil {
			failed = append(failed, what+": "+err.Error())
			fmt.Printf("stranger: FAIL %s: %v\n", what, err)
			return
		}
		fmt.Printf("stranger: refused: %s\n", what)
	}
	switch {
	case p.Creds != "" && p.NodeServer != "":
		nodeServerChecks(ctx, p, check)
	case p.Creds != "":
		nodeChecks(ctx, p, check)
	default:
		strangerChecks(ctx, p, check)
	}
	if len(failed) > 0 {
		return 1
	}
	fmt.Println("stranger: all refused")
	return 0
}

// wantCode is nil when err is a gRPC error with code want.
func wantCode(err error, want codes.Code) error {
	if status.Code(err) != want {
		return fmt.Errorf("got %v, want %v", err, want)
	}
	return nil
}

func strangerChecks(ctx context.Context, p strangerPlan, check func(string, error)) {
	// Gossip: a member without the key cannot join, with the label or
	// with a key of its own; forged "dead" messages, plain and labelled,
	// name every member at every incarnation up to 32.
	self, _ := os.Hostname()
	for i, sec := range []gossip.Secure{{Label: p.Label}, {Keys: [][]byte{make([]byte, 32)}, Label: p.Label}} {
		m, err := gossip.New(fmt.Sprintf("stranger-%d", i), net.JoinHostPort(localAddr(p.Coordinator), "0"), "", gossip.DefaultTuning(), sec, nil, nil)
		if err != nil {
			check("gossip member", err)
			continue
		}
		n, err := m.Join(p.Gossip)
		var joinErr error
		if err == nil && n > 0 {
			joinErr = fmt.Errorf("joined %d members; the pool lists %d", n, m.NumMembers())
		}
		check(fmt.Sprintf("gossip join (%d keys of its own, label %q)", len(sec.Keys), sec.Label), joinErr)
		m.Shutdown()
	}
	var sent int
	for _, addr := range p.Gossip {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			check("gossip dial", err)
			continue
		}
		for _, member := range p.Members {
			for inc := range uint32(33) {
				msg := append([]byte{5}, msgpackDead(inc, member, self)...) // memberlist's deadMsg
				labelled, _ := memberlist.AddLabelHeaderToPacket(msg, p.Label)
				conn.Write(msg)
				conn.Write(labelled)
				sent += 2
			}
		}
		conn.Close()
	}
	fmt.Printf("stranger: sent %d forged dead packets\n", sent)

	// The rendezvous store: without its secret nothing is read or
	// written, and 8 values of 16 MiB sent at once are refused at their
	// length fields.
	wrong, _ := tcp.NewSecret()
	if st, err := tcp.DialStore(ctx, p.Store, wrong); err != nil {
		check("store dial", err)
	} else {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := st.Get(sctx, "rank/0")
		cancel()
		check("store read without the secret", refusedBy(err, "unauthenticated"))
		st.Close()
		if st, err = tcp.DialStore(ctx, p.Store, wrong); err == nil {
			check("store write without the secret", refusedBy(st.Set(ctx, "rank/0", []byte("198.51.100.1:1")), "unauthenticated"))
			st.Close()
		}
	}
	var wg sync.WaitGroup
	accepted := make([]int64, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Go(func() { accepted[i], errs[i] = bigValue(ctx, p.Store, 16<<20) })
	}
	wg.Wait()
	for i := range 8 {
		check(fmt.Sprintf("16 MiB value %d (%d bytes taken before the store hung up)", i, accepted[i]), errs[i])
	}

	// gRPC: without a certificate only Join answers, and it refuses a
	// token with the wrong secret; plaintext gets no answer at all.
	caHash, err := coordinatorCA(ctx, p.Coordinator)
	if err != nil {
		check("the coordinator's CA", err)
		return
	}
	anon, err := pb.Dial(p.Coordinator, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}), 0)
	if err == nil {
		c := pb.NewCoordinatorClient(anon)
		_, err := c.Status(ctx, &pb.StatusRequest{})
		check("status without a client certificate", wantCode(err, codes.Unauthenticated))
		_, err = c.Submit(ctx, &pb.SubmitRequest{Spec: &pb.JobSpec{Id: "evil", Nodes: 1, GpusPerNode: 1, Command: []string{"true"}}})
		check("submit without a client certificate", wantCode(err, codes.Unauthenticated))
		_, err = c.Cancel(ctx, &pb.CancelRequest{Job: p.Job})
		check("cancel without a client certificate", wantCode(err, codes.Unauthenticated))
		forged, _ := pki.NewToken(caHash)
		_, err = c.Join(ctx, &pb.JoinRequest{Token: forged.String(), Role: pki.RoleAdmin, Name: "evil"})
		check("join with a made-up token", wantCode(err, codes.Unauthenticated))
		anon.Close()
	}
	plain, err := pb.Dial(p.Coordinator, nil, 0)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := pb.NewCoordinatorClient(plain).Status(cctx, &pb.StatusRequest{})
		cancel()
		if err == nil {
			err = errors.New("answered")
		} else {
			err = nil
		}
		check("plaintext gRPC", err)
		plain.Close()
	}

	// Garbage to every port: TCP and UDP.
	for _, addr := range append([]string{p.Coordinator, p.Store}, p.Gossip...) {
		junk := make([]byte, 64<<10)
		rand.Read(junk)
		if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write(junk)
			c.Close()
		}
		if c, err := net.Dial("udp", addr); err == nil {
			for range 64 {
				c.Write(junk[:1400])
				rand.Read(junk[:1400])
			}
			c.Close()
		}
		fmt.Printf("stranger: sent garbage to %s\n", addr)
	}
}

// refusedBy is nil when err is a refusal mentioning word.
func refusedBy(err error, word string) error {
	if err == nil {
		return errors.New("accepted")
	}
	if !strings.Contains(err.Error(), word) {
		return fmt.Errorf("failed, but not as refused: %v", err)
	}
	return nil
}

// bigValue sends a store request whose value is n bytes long and returns
// how many bytes the store took before it hung up; nil when it did.
func bigValue(ctx context.Context, addr string, n int) (int64, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	head := []byte{'S'}
	head = binary.LittleEndian.AppendUint32(head, 1)
	head = append(head, 'k')
	head = binary.LittleEndian.AppendUint32(head, uint32(n))
	if _, err := c.Write(head); err != nil {
		return 0, nil
	}
	w, err := io.Copy(c, io.LimitReader(zeros{}, int64(n)))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return w, errors.New("the store neither read the value nor hung up within 30s")
	}
	if err != nil {
		return w, nil // the store closed the connection
	}
	// All of it went into buffers: the store must still end the
	// connection, unread.
	if _, err := c.Read(make([]byte, 1)); err == nil {
		return w, errors.New("the store answered a 16 MiB value")
	}
	return w, nil
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// coordinatorCA is the hash of the CA the coordinator presents: anyone who
// connects sees it.
func coordinatorCA(ctx context.Context, addr string) (string, error) {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	certs := c.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) < 2 {
		return "", errors.New("no CA in the coordinator's chain")
	}
	return pki.Hash(certs[1]), nil
}

// localAddr is this host's address on the way to addr.
func localAddr(addr string) string {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "0.0.0.0"
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// msgpackDead encodes memberlist's dead message {Incarnation, Node, From}
// as msgpack, as memberlist does.
func msgpackDead(inc uint32, node, from string) []byte {
	str := func(b []byte, s string) []byte {
		if len(s) < 32 {
			return append(append(b, 0xa0|byte(len(s))), s...)
		}
		return append(append(b, 0xd9, byte(len(s))), s...)
	}
	b := []byte{0x83}
	b = str(b, "Incarnation")
	b = binary.BigEndian.AppendUint32(append(b, 0xce), inc)
	b = str(str(b, "Node"), node)
	return str(str(b, "From"), from)
}

func nodeChecks(ctx context.Context, p strangerPlan, check func(string, error)) {
	c, err := pki.LoadDir(p.Creds)
	if err != nil {
		check("the node's credentials", err)
		return
	}
	cfg, err := pki.ClientTLS(c)
	if err != nil {
		check("the node's credentials", err)
		return
	}
	cc, err := pb.Dial(p.Coordinator, credentials.NewTLS(cfg), 0)
	if err != nil {
		check("dial", err)
		return
	}
	defer cc.Close()
	cl := pb.NewCoordinatorClient(cc)
	exit := func(node string, rank int32) *pb.ReportRequest {
		return &pb.ReportRequest{Job: p.Job, Generation: p.Generation, Node: node, Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: rank, Code: 1, Error: "forged"}}}
	}
	_, err = cl.Report(ctx, exit(p.OtherNode, p.OtherRank))
	check("report as "+p.OtherNode, wantCode(err, codes.PermissionDenied))
	// A report carries the node's lease, which this process never had:
	// refused before anything else is looked at.
	_, err = cl.Report(ctx, exit(p.Self, p.OtherRank))
	check(fmt.Sprintf("report of %s's rank %d", p.OtherNode, p.OtherRank), wantCode(err, codes.InvalidArgument))
	_, err = cl.Submit(ctx, &pb.SubmitRequest{Spec: &pb.JobSpec{Id: "evil", Nodes: 1, GpusPerNode: 1, Command: []string{"true"}}})
	check("a node submits a job", wantCode(err, codes.PermissionDenied))
	_, err = cl.Cancel(ctx, &pb.CancelRequest{Job: p.Job})
	check("a node cancels a job", wantCode(err, codes.PermissionDenied))
	_, err = cl.Register(ctx, &pb.RegisterRequest{Node: &pb.Node{Name: p.OtherNode, Host: "198.51.100.1", Gpus: 2, Protocol: pb.ProtocolVersion}})
	check("register as "+p.OtherNode, wantCode(err, codes.PermissionDenied))
	_, err = cl.Leave(ctx, &pb.LeaveRequest{Node: p.OtherNode, LeaseId: 1})
	check("leave as "+p.OtherNode, wantCode(err, codes.PermissionDenied))
	_, err = cl.PoolReport(ctx, &pb.PoolReportRequest{Node: p.OtherNode, LeaseId: 1, Dead: []string{p.Self}})
	check("a pool report as "+p.OtherNode, wantCode(err, codes.PermissionDenied))
	// As itself, but without its lease (the agent's alone).
	_, err = cl.PoolReport(ctx, &pb.PoolReportRequest{Node: p.Self, LeaseId: 1, Dead: []string{p.OtherNode}})
	check(p.OtherNode+" reported dead without "+p.Self+"'s lease", wantCode(err, codes.PermissionDenied))
	_, err = cl.CreateToken(ctx, &pb.CreateTokenRequest{Roles: []string{pki.RoleAdmin}})
	check("a node creates a token", wantCode(err, codes.PermissionDenied))
}

// nodeServerChecks: a node outside the job, with its own certificate of
// the cluster, asks a member's node server for the job's checkpoint files,
// its ranks' output and their logs (403 each), and sends it a 512 MiB
// "replica" of a step of its own, which is refused before the server has
// read more than a few MiB of it.
func nodeServerChecks(ctx context.Context, p strangerPlan, check func(string, error)) {
	c, err := pki.LoadDir(p.Creds)
	if err != nil {
		check("the node's credentials", err)
		return
	}
	_, cli, err := pki.PeerTLS(c)
	if err != nil {
		check("the node's credentials", err)
		return
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: ckpt.NamedTLS(cli, p.OtherNode)}}
	defer hc.CloseIdleConnections()
	base := "https://" + p.NodeServer + "/v1/jobs/" + p.Job
	forbidden := func(method, url string, body io.Reader) error {
		req, err := http.NewRequestWithContext(ctx, method, url, body)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusForbidden {
			return fmt.Errorf("%s (%d bytes)", resp.Status, len(got))
		}
		return nil
	}
	for _, src := range []string{p.OtherNode, p.Self} {
		check(fmt.Sprintf("%s's checkpoint of step %d from %s", src, p.Step, p.OtherNode),
			forbidden(http.MethodGet, fmt.Sprintf("%s/nodes/%s/steps/%d?generation=%d", base, src, p.Step, p.Generation), nil))
	}
	check("the ranks' output on "+p.OtherNode, forbidden(http.MethodGet, fmt.Sprintf("%s/output?generation=%d", base, p.Generation), nil))
	check("the ranks' logs on "+p.OtherNode, forbidden(http.MethodGet, base+"/logs", nil))
	var sent countingReader
	sent.r = io.LimitReader(zeroReader{}, 512<<20)
	err = forbidden(http.MethodPut, fmt.Sprintf("%s/nodes/%s/steps/%d?generation=%d", base, p.Self, p.Step+1, p.Generation), &sent)
	if err != nil && sent.n.Load() < 64<<20 {
		err = nil // the server hung up first: refused too
	}
	if n := sent.n.Load(); err == nil && n >= 64<<20 {
		err = fmt.Errorf("the server read %d MiB before refusing", n>>20)
	}
	check(fmt.Sprintf("a 512 MiB replica to %s (%d MiB sent)", p.OtherNode, sent.n.Load()>>20), err)
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// countingReader counts what was read of r: atomically, since the HTTP
// client's transport may still be sending the body when the answer (a
// refusal) has come back.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}
