package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/pki"
	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// statusOf reads the cluster's status as h1 sees it, with the join token.
func (b *boxCluster) statusOf(t *testing.T) *statusJSON {
	t.Helper()
	p := b.run(t, b.Host(1), "status", "--coordinator", b.local, "--json")
	if code := p.wait(t, time.Minute); code != 0 {
		t.Fatalf("status exited %d:\n%s", code, p.output())
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(p.output()), &st); err != nil || st.Schema != statusSchema {
		t.Fatalf("status (schema %q): %v\n%s", st.Schema, err, p.output())
	}
	return &st
}

// rss is the resident memory of process pid, in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// TestClusterStrangers: a job on two hosts with TLS and an encrypted pool,
// and a third host without credentials that does what anyone on the
// network could: joins the gossip pool and forges "dead" messages naming
// every member, reads and writes the rendezvous store, sends it 8 values
// of 16 MiB, calls the coordinator without a certificate and with a
// made-up token, and sends garbage to every port. Then one of the job's
// own nodes, with its certificate, reports for the other node's rank,
// registers and leaves as it, and submits and cancels jobs; and a node
// outside the job, with its own certificate, asks a member's node server
// for the job's checkpoints, output and logs and sends it a 512 MiB
// replica. Each is refused; the job ends with no second generation and the losses of a
// single process; the store's agent grows by less than 64 MiB. The
// coordinator's port shows its certificate to openssl s_client, the
// pool's key rotates under the running job, and a token revoked on the
// coordinator buys a new agent nothing.
func TestClusterStrangers(t *testing.T) {
	t.Parallel() // a cluster of its own: runs beside the others (make test's -parallel)
	const steps = 300
	b := newBoxCluster(t, testcluster.Config{Hosts: 5})
	want := e2e.Reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
	co := b.coordinator(t, b.Host(1), b.local)
	workers := map[string]*proc{"h2": b.worker(t, b.Host(2), 2), "h3": b.worker(t, b.Host(3), 2)}
	p := b.run(t, b.Host(1), "launch", "--coordinator", b.local, "--nodes", "2", "--gpus-per-node", "2", "--tp", "2",
		"--job-id", "guarded", "--steps", strconv.Itoa(steps), "--json", b.job)
	p.waitLine(t, `{"step":5,`, 2*time.Minute)

	// What a stranger can learn by looking: the store's and the pool's
	// addresses, the members' names.
	master := regexp.MustCompile(`master=(\S+)`).FindStringSubmatch(workers["h3"].waitLine(t, "starting ranks", time.Minute))
	if master == nil || master[1] == "" {
		t.Fatalf("no master address in h3's output:\n%s", workers["h3"].output())
	}
	co.waitLine(t, "coordinator serving", time.Minute)
	var gossipAddrs []string // the agents' pool (they name no failure domain: one pool, under the cluster's label)
	for _, w := range workers {
		m := regexp.MustCompile(`msg="gossip member" .*addr=(\S+)`).FindStringSubmatch(w.output())
		if m == nil {
			t.Fatalf("no gossip address in an agent's output:\n%s", w.output())
		}
		gossipAddrs = append(gossipAddrs, m[1])
	}
	st := b.statusOf(t)
	var members []string
	for _, n := range st.Nodes {
		members = append(members, gossip.MemberName(n.Name, n.Instance))
	}
	if len(st.Jobs) != 1 || len(st.Jobs[0].Members) != 2 {
		t.Fatalf("status: %v", st)
	}
	job := st.Jobs[0]
	ranks := map[string]int32{}
	for _, m := range job.Members {
		ranks[m.Node] = m.FirstRank
	}
	storeHost := b.Host(2)
	if ranks["h3"] == 0 {
		storeHost = b.Host(3)
	}
	agentPid := workers[storeHost.Name].cmd.Process.Pid
	before := rss(t, agentPid)

	self := b.Install(os.Args[0])
	stranger := func(h *testcluster.Host, plan strangerPlan) {
		t.Helper()
		js, _ := json.Marshal(plan)
		cmd := h.Command(t.Context(), self)
		cmd.Env = append(cmd.Env, strangerEnv+"="+string(js))
		out, err := cmd.CombinedOutput()
		t.Logf("stranger on %s:\n%s", h.Name, out)
		if err != nil || !strings.Contains(string(out), "stranger: all refused") {
			t.Fatalf("stranger on %s: %v", h.Name, err)
		}
	}
	stranger(b.Host(4), strangerPlan{Coordinator: b.coord, Gossip: gossipAddrs, Members: members,
		Label: "gpucoord:/gpucoord/", Store: master[1], Job: job.ID})
	after := rss(t, agentPid)
	t.Logf("the store's agent (%s): %.1f MiB resident before the stranger, %.1f MiB after", storeHost.Name, float64(before)/(1<<20), float64(after)/(1<<20))
	if grown := after - before; grown > 64<<20 {
		t.Errorf("the store's agent grew by %d MiB under 8 values of 16 MiB", grown>>20)
	}
	tokBytes, err := os.ReadFile(b.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := pki.ParseToken(string(tokBytes))
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join("/tmp/home/.local/state/gpucoord/credentials", tok.CAHash[:16], "node-h2")
	stranger(b.Host(2), strangerPlan{Coordinator: b.coord, Creds: creds, Job: job.ID, Generation: job.Generation.Number,
		Self: "h2", OtherNode: "h3", OtherRank: ranks["h3"]})

	// A node of the cluster outside the job, with its own certificate,
	// asks h2's node server for the job's checkpoints, output and logs, and
	// sends it a 512 MiB replica: each is refused.
	b.worker(t, b.Host(4), 2)
	nodeServer := regexp.MustCompile(`msg="node server" .*addr=(\S+)`).FindStringSubmatch(workers["h2"].output())
	if nodeServer == nil {
		t.Fatalf("no node server address in h2's output:\n%s", workers["h2"].output())
	}
	st = b.statusOf(t)
	stranger(b.Host(4), strangerPlan{Coordinator: b.coord, Creds: filepath.Join(filepath.Dir(creds), "node-h4"), Job: job.ID,
		Generation: job.Generation.Number, Self: "h4", OtherNode: "h2", NodeServer: nodeServer[1], Step: st.Jobs[0].CommittedStep})

	// The pool's key rotates while the job runs: each step reaches both
	// agents before the next, and no node is lost.
	for _, action := range []string{"install", "use", "remove"} {
		r := b.run(t, b.Host(1), "gossip-key", action, "--coordinator", b.local, "--token-file", b.tokenFile)
		if code := r.wait(t, time.Minute); code != 0 {
			t.Fatalf("gossip-key %s exited %d:\n%s", action, code, r.output())
		}
		_, list, ok := strings.Cut(strings.TrimSpace(r.output()), "(in use first): ")
		if !ok {
			t.Fatalf("gossip-key %s printed %q", action, r.output())
		}
		want := "keys=" + strings.ReplaceAll(strings.ReplaceAll(list, " (retired)", ""), ", ", ",")
		for _, w := range workers {
			w.waitLine(t, want, time.Minute)
		}
	}

	// The job must outlive the strangers and the rotation, or they were
	// tried against a finished job.
	select {
	case <-p.done:
		t.Fatalf("the job ended before the strangers and the key's rotation were done (raise steps):\n%s", p.output())
	default:
	}
	t.Logf("strangers and rotation done at %d of %d steps", strings.Count(p.output(), `{"step":`), steps)

	// The coordinator's port speaks TLS and shows its certificate.
	ossl := b.Host(4).Command(t.Context(), "openssl", "s_client", "-connect", b.coord, "-servername", "h1", "-showcerts")
	ossl.Stdin = strings.NewReader("")
	out, err := ossl.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "BEGIN CERTIFICATE") || !strings.Contains(string(out), "OU = coordinator") {
		t.Errorf("openssl s_client: %v\n%s", err, out)
	}

	// A token made and then revoked buys a new agent nothing; a live one
	// lets it join.
	made := b.run(t, b.Host(1), "token", "create", "--coordinator", b.local, "--token-file", b.tokenFile, "--roles", "node", "--ttl", "1h")
	if code := made.wait(t, time.Minute); code != 0 {
		t.Fatalf("token create exited %d:\n%s", code, made.output())
	}
	newTok, err := pki.ParseToken(strings.Fields(made.output())[0])
	if err != nil {
		t.Fatalf("token create printed %q: %v", made.output(), err)
	}
	revoked := filepath.Join(t.TempDir(), "revoked")
	if err := os.WriteFile(revoked, []byte(newTok.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	revokedFile := b.Install(revoked)
	if r := b.run(t, b.Host(1), "token", "revoke", newTok.ID, "--coordinator", b.local, "--token-file", b.tokenFile); r.wait(t, time.Minute) != 0 {
		t.Fatalf("token revoke:\n%s", r.output())
	}
	list := b.run(t, b.Host(1), "token", "list", "--coordinator", b.local, "--token-file", b.tokenFile)
	if list.wait(t, time.Minute) != 0 || strings.Contains(list.output(), newTok.ID) || strings.Contains(list.output(), tok.Secret) {
		t.Errorf("token list after the revocation:\n%s", list.output())
	}
	w := b.run(t, b.Host(5), "worker", "--coordinator", b.coord, "--name", "h5", "--gpus-per-node", "2", "--token-file", revokedFile)
	if code := w.wait(t, time.Minute); code == 0 || !strings.Contains(w.output(), "revoked, expired") {
		t.Errorf("a worker with a revoked token exited %d:\n%s", code, w.output())
	}

	if code := p.wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), "generation 2") {
		t.Errorf("a stranger made a new generation:\n%s", p.output())
	}
	e2e.SameLosses(t, e2e.Losses(t, p.output()), want)
}
