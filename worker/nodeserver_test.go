package worker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
	"github.com/gpucoord/gpucoord/worker/progress"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

// testPKI issues certificates of one cluster CA.
type testPKI struct {
	t     *testing.T
	ca    *pki.CA
	caPEM []byte
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	certPEM, keyPEM, err := pki.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{t: t, ca: ca, caPEM: certPEM}
}

func (p *testPKI) creds(role, name string) pki.Credentials {
	p.t.Helper()
	id := pki.Identity{Role: role, Name: name}
	key, csr, err := pki.NewRequest(id)
	if err != nil {
		p.t.Fatal(err)
	}
	cert, err := p.ca.SignRequest(csr, id, time.Now())
	if err != nil {
		p.t.Fatal(err)
	}
	return pki.Credentials{CA: p.caPEM, Cert: cert, Key: key}
}

// testNode is a node's holder and output store behind its node server
// (nodeMux over mutual TLS on loopback), as an agent serves them.
type testNode struct {
	holder *ckpt.Holder
	output *ranklog.Store
	addr   string
	client *tls.Config
}

func startTestNode(t *testing.T, p *testPKI, name string, lim ckpt.Limits) *testNode {
	t.Helper()
	server, client, err := pki.PeerTLS(p.creds(pki.RoleNode, name))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	h := ckpt.New(t.TempDir(), name, server, client, log)
	h.SetLimits(lim)
	out := ranklog.New(t.TempDir(), name, ranklog.DefaultLimits, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ckpt.Serve(ctx, ln, server, nodeMux(h, out, nil, nil), log) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return &testNode{holder: h, output: out, addr: ln.Addr().String(), client: client}
}

// TestNodeServerOutsider: z, a node of the cluster outside job j, asks
// b's node server for j's checkpoints, its ranks' output and their logs:
// each is refused with 403, while a, a member, gets the checkpoints and a
// user's client the output.
func TestNodeServerOutsider(t *testing.T) {
	p := newTestPKI(t)
	a := startTestNode(t, p, "a", ckpt.Limits{})
	b := startTestNode(t, p, "b", ckpt.Limits{})
	z := startTestNode(t, p, "z", ckpt.Limits{})
	members := []string{"a", "b"}
	for _, n := range []*testNode{a, b} {
		if err := n.holder.Saw("j", 1, members); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(b.holder.Own("j"), "4")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "shard"), bytes.Repeat([]byte{1}, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.holder.Seal("j", 1, 4); err != nil {
		t.Fatal(err)
	}
	b.output.Line("j", 1, 2, []byte("[b r2] loss 0.25\n"))
	b.output.End("j", 1)
	ctx := t.Context()
	bp := ckpt.Peer{Name: "b", Addr: b.addr}

	if _, err := z.holder.Fetch(ctx, bp, "j", "b", 1, 4); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("z fetching j's checkpoint from b: %v, want 403", err)
	}
	zc := ranklog.NewClient(z.client)
	defer zc.Close()
	var logs bytes.Buffer
	if err := zc.Logs(ctx, "b", b.addr, "j", -1, &logs); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("z reading j's logs on b: %v (%q), want 403", err, logs.String())
	}
	var lines []string
	if err := zc.Follow(ctx, "b", b.addr, "j", 1, -1, func(l []byte) { lines = append(lines, string(l)) }); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("z following j's output on b: %v (%q), want 403", err, lines)
	}

	if n, err := a.holder.Fetch(ctx, bp, "j", "b", 1, 4); err != nil || n < 1<<20 {
		t.Errorf("a, a member, fetching b's step: %d bytes, %v", n, err)
	}
	user, err := pki.AgentTLS(p.creds(pki.RoleClient, "me@here"))
	if err != nil {
		t.Fatal(err)
	}
	uc := ranklog.NewClient(user)
	defer uc.Close()
	logs.Reset()
	if err := uc.Logs(ctx, "b", b.addr, "j", -1, &logs); err != nil || !strings.Contains(logs.String(), "loss 0.25") {
		t.Errorf("a user reading j's logs: %v %q", err, logs.String())
	}
}

// TestStoreStuckPeer: the peer that is to hold this node's replica takes
// connections and never answers. The rank that asked for acks is told
// "failed 1" once the replica's deadline passes, instead of waiting for
// ever (until the hang watchdog blamed it).
func TestStoreStuckPeer(t *testing.T) {
	p := newTestPKI(t)
	a := startTestNode(t, p, "a", ckpt.Limits{ReplicaTimeout: 50 * time.Millisecond})
	stuck, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := stuck.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never read
		}
	}()
	t.Cleanup(func() {
		stuck.Close()
		for c := range accepted {
			c.Close()
		}
	})
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	agent := &Agent{cfg: &Config{Name: "a"}, holder: a.holder, log: log}
	asg := &pb.Assignment{Job: "j", Spec: &pb.JobSpec{CheckpointReplicas: 2}, Replicas: []string{"b"}, GroupWorld: 2, Generation: &pb.Generation{Number: 1, Members: []*pb.Member{
		{Node: "a", FirstRank: 0, Ranks: 1, CheckpointAddr: a.addr},
		{Node: "b", FirstRank: 1, Ranks: 1, CheckpointAddr: stuck.Addr().String()},
	}}}
	if err := a.holder.Saw("j", 1, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	cp := newCheckpoints(agent, asg, []int{0}, newStepTimes(), func(*pb.Step) {})
	pl, err := progress.Listen("", []int{0}, log, cp.handle)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	cp.ack = func(step int64, stored bool) { pl.Stored(0, step, stored) }
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go cp.run(ctx, done, time.Second)
	defer func() { cancel(); <-cp.finished }()

	dir := filepath.Join(a.holder.Own("j"), "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "shard"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	rank, err := net.Dial("unix", pl.Path(0))
	if err != nil {
		t.Fatal(err)
	}
	defer rank.Close()
	if _, err := rank.Write([]byte("acks\ncheckpoint 1\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(rank).ReadString('\n')
	if err != nil || line != "failed 1\n" {
		t.Errorf("the rank was told %q (%v), want \"failed 1\"", line, err)
	}
}
