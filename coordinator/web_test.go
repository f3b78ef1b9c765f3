package coordinator

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/internal/join"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// webClient is an HTTP client of a dashboard whose connections close with
// the test.
func webClient(t *testing.T, tc *tls.Config) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// sse reads a dashboard's event stream.
type sse struct {
	t    *testing.T
	body io.Closer
	ch   chan sseEvent
}

type sseEvent struct {
	name string
	msg  webMessage
}

// openEvents opens the event stream at url (a dashboard's /events).
func openEvents(t *testing.T, hc *http.Client, url string) *sse {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /events: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	s := &sse{t: t, body: resp.Body, ch: make(chan sseEvent, 256)}
	t.Cleanup(func() { resp.Body.Close() })
	go func() {
		defer close(s.ch)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		var name string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				var m webMessage
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
					t.Errorf("event %s: %v", name, err)
					return
				}
				s.ch <- sseEvent{name, m}
			}
		}
	}()
	return s
}

// until reads events until ok says one is the one waited for; got, when
// given, says what was seen instead.
func (s *sse) until(what string, ok func(sseEvent) bool, got ...func() string) sseEvent {
	s.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, open := <-s.ch:
			if !open {
				s.t.Fatalf("the event stream ended before %s", what)
			}
			if ok(ev) {
				return ev
			}
		case <-timeout:
			for _, g := range got {
				what += " (saw " + g() + ")"
			}
			s.t.Fatalf("no event with %s within 10s", what)
		}
	}
}

func section[T any](t *testing.T, m webMessage, key string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(m.Set[key], &v); err != nil {
		t.Fatalf("section %s: %v (%s)", key, err, m.Set[key])
	}
	return v
}

// TestWebModel: the dashboard's events carry the whole model first, then
// only what changed: a job's generation and grid, a step as its head and
// a point of its curve without the pool's rows, a node lost as its own
// row; the JSON endpoints answer from the same model.
func TestWebModel(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.HTTP = "127.0.0.1:0" })
	c := client(t, co.Addr())
	web := co.WebURL()
	if !strings.HasPrefix(web, "http://127.0.0.1:") {
		t.Fatalf("WebURL() = %q", web)
	}
	hc := webClient(t, nil)
	n0 := node("n0", 2)
	n0.FailureDomain = "rack-a"
	a0, _ := agent(t, c, n0)
	_, kill1 := agent(t, c, node("n1", 2))
	agent(t, c, node("n2", 2))

	ev := openEvents(t, hc, web+"events")
	snap := ev.until("the snapshot", func(e sseEvent) bool { return e.name == "snapshot" })
	if !snap.msg.Reset {
		t.Error("the first event is not a reset")
	}
	// Every node's row, and the lease renewals this coordinator sent them
	// (its memory: renewals are not written to etcd).
	nodes := map[string]bool{}
	var renewed webRenewals
	for e := snap; ; e = ev.until("a change", func(sseEvent) bool { return true }) {
		for k := range e.msg.Set {
			nodes[k] = true
		}
		if _, ok := e.msg.Set["renewals"]; ok {
			renewed = section[webRenewals](t, e.msg, "renewals")
		}
		if nodes["node/n0"] && nodes["node/n1"] && nodes["node/n2"] && len(renewed.Nodes) == 3 {
			break
		}
	}
	if !slices.Equal(renewed.Nodes, []string{"n0", "n1", "n2"}) || renewed.Coordinator != co.cfg.Name || renewed.TTLMs != co.cfg.LeaseTTL.Milliseconds() {
		t.Errorf("renewals: %+v, want n0, n1 and n2's by %s, TTL %s", renewed, co.cfg.Name, co.cfg.LeaseTTL)
	}
	for i, ago := range renewed.AgoMs {
		var n webNode
		if err := json.Unmarshal(co.web.hub.section("node/"+renewed.Nodes[i]), &n); err != nil {
			t.Fatal(err)
		}
		// Renewed since it registered, before the section was built.
		if at := renewed.At - ago; ago < 0 || at < n.Registered {
			t.Errorf("%s: renewed at %d (%d ms before %d), registered at %d", n.Name, at, ago, renewed.At, n.Registered)
		}
	}

	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: &pb.JobSpec{Id: "j", Nodes: 2, GpusPerNode: 2, Tp: 2, Command: []string{"true"},
		CheckpointDir: "/shared/ckpt", MinNodes: 1, MaxRestarts: 2}}); err != nil {
		t.Fatal(err)
	}
	a := next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" && a.Open })
	gen := a.Generation.GetNumber()
	e := ev.until("job j's running grid", func(e sseEvent) bool {
		r, ok := e.msg.Set["ranks/j"]
		return ok && strings.Contains(string(r), `"states":"RRRR"`)
	})
	head := section[webJob](t, e.msg, "job/j")
	if head.Phase != "running" || head.Layout.World != 4 || head.Layout.TP != 2 || head.Layout.DP != 2 || head.Layout.Strides != [3]int{1, 4, 2} {
		t.Errorf("job j's head: %+v", head)
	}

	// A step: the job's head and a point of its curve, no pool row.
	report(t, c, "j", gen, &pb.Step{Step: 7, Loss: 2.5, Seconds: 0.25, Generation: gen})
	e = ev.until("step 7", func(e sseEvent) bool { return len(e.msg.Append["points/j"]) > 0 })
	if p := e.msg.Append["points/j"]; p[len(p)-1] != (webPoint{7, 2.5, 0.25, float64(gen)}) {
		t.Errorf("points appended: %v", p)
	}
	for k := range e.msg.Set {
		if strings.HasPrefix(k, "node/") || k == "ranks/j" || k == "members/j" {
			t.Errorf("a step re-sent section %s", k)
		}
	}

	// A node lost: its row and the next generation, with the one before
	// as it ended.
	kill1()
	seen := webMessage{Set: map[string]json.RawMessage{}}
	ev.until("n1 lost and generation 2", func(e sseEvent) bool {
		if _, ok := e.msg.Set["points/j"]; ok {
			t.Errorf("a later event sets the curve again (it would replace the viewer's): %s", e.msg.Set["points/j"])
		}
		for k, v := range e.msg.Set {
			seen.Set[k] = v
		}
		return strings.Contains(string(seen.Set["node/n1"]), `"health":"lost"`) && seen.Set["prev/j"] != nil
	})
	prev := section[webPrevious](t, seen, "prev/j")
	if prev.Generation != gen || prev.States != "RRLL" {
		t.Errorf("the ended generation: %+v, want generation %d, states RRLL", prev, gen)
	}

	// The JSON endpoints answer from the same model.
	var pool webPoolDoc
	getJSON(t, hc, web+"api/pool", &pool)
	if len(pool.Domains) != 2 || pool.Domains[1].Name != "rack-a" || pool.Counts["lost"] != 1 || pool.Counts["registered"] != 2 || len(pool.Renewals) == 0 {
		t.Errorf("/api/pool: %+v", pool)
	}
	var doc map[string]json.RawMessage
	getJSON(t, hc, web+"api/jobs/j", &doc)
	for _, k := range []string{"job", "ranks", "members", "generations", "points", "commit", "hangs"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("/api/jobs/j lacks %s", k)
		}
	}
	if resp, err := hc.Get(web + "api/jobs/nope"); err != nil {
		t.Error(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/api/jobs/nope: %s, want 404", resp.Status)
	}
	var st webStats
	getJSON(t, hc, web+"api/stats", &st)
	if st.Viewers != 1 || st.Messages == 0 {
		t.Errorf("/api/stats: %+v", st)
	}

	// Status names the dashboard, as the caller reached it.
	resp, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil || resp.Dashboard != web {
		t.Errorf("Status: dashboard %q, %v; want %q", resp.GetDashboard(), err, web)
	}
}

func getJSON(t *testing.T, hc *http.Client, url string, v any) {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestWebAccess: off loopback the dashboard is TLS: a client without a
// certificate of the cluster's CA gets no connection; a client's
// certificate reads but cannot cancel; an admin's cancels; a node's is
// refused. On loopback it is open, to a loopback host name only.
func TestWebAccess(t *testing.T) {
	co, tok := tlsCoordinator(t, func(c *Config) { c.HTTP = "0.0.0.0:0" })
	_, port, _ := net.SplitHostPort(co.WebAddr())
	base := "https://127.0.0.1:" + port + "/"
	creds := func(role, name string) *tls.Config {
		c, err := join.Join(t.Context(), []string{co.Addr()}, tok, pki.Identity{Role: role, Name: name}, 0)
		if err != nil {
			t.Fatal(err)
		}
		tc, err := pki.ClientTLS(c)
		if err != nil {
			t.Fatal(err)
		}
		return tc
	}
	user, admin, nodeCert := creds(pki.RoleClient, "alice"), creds(pki.RoleAdmin, "root"), creds(pki.RoleNode, "n0")

	// No certificate: the handshake fails, nothing is served.
	anon := user.Clone()
	anon.Certificates = nil
	if resp, err := webClient(t, anon).Get(base + "api/pool"); err == nil {
		resp.Body.Close()
		t.Fatalf("GET without a certificate: %s, want a refused handshake", resp.Status)
	}
	raw, err := tls.Dial("tcp", "127.0.0.1:"+port, anon)
	if err == nil {
		raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = raw.Read(make([]byte, 1))
		raw.Close()
	}
	if err == nil {
		t.Fatal("a TLS connection without a certificate read data")
	}

	code := func(hc *http.Client, method, path string, header bool) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, base+path, nil)
		if header {
			req.Header.Set("X-Gpucoord-Request", "1")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	uc, ac, nc := webClient(t, user), webClient(t, admin), webClient(t, nodeCert)
	if got := code(uc, "GET", "api/pool", false); got != http.StatusOK {
		t.Errorf("a client's GET /api/pool: %d", got)
	}
	if got := code(nc, "GET", "api/pool", false); got != http.StatusForbidden {
		t.Errorf("a node's GET /api/pool: %d, want 403", got)
	}
	var who webCaller
	getJSON(t, uc, base+"api/whoami", &who)
	if who.Role != pki.RoleClient || who.Name != "alice" || who.Cancel {
		t.Errorf("a client's whoami: %+v", who)
	}

	c := tlsClient(t, co.Addr(), credentials.NewTLS(admin))
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 1, 4)}); err != nil {
		t.Fatal(err)
	}
	if got := code(uc, "POST", "api/jobs/j/cancel", true); got != http.StatusForbidden {
		t.Errorf("a client's cancel: %d, want 403", got)
	}
	if got := code(ac, "POST", "api/jobs/j/cancel", false); got != http.StatusForbidden {
		t.Errorf("an admin's cancel without X-Gpucoord-Request: %d, want 403", got)
	}
	if got := code(ac, "POST", "api/jobs/j/cancel", true); got != http.StatusOK {
		t.Errorf("an admin's cancel: %d, want 200", got)
	}
	if st := final(t, c, "j"); st.Phase != pb.JobState_CANCELLED || !strings.Contains(st.Reason, "dashboard by root") {
		t.Errorf("after the admin's cancel: %v", st)
	}
	if got := code(ac, "POST", "api/jobs/nope/cancel", true); got != http.StatusNotFound {
		t.Errorf("cancel of no job: %d, want 404", got)
	}
	// Status, as a client over TLS, names the https URL it reached.
	resp, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil || resp.Dashboard != base {
		t.Errorf("Status: dashboard %q, %v; want %q", resp.GetDashboard(), err, base)
	}
}

// TestWebLoopback: on loopback the dashboard is plaintext and open, and
// answers only requests naming a loopback host; a POST needs
// X-Gpucoord-Request. A dashboard off loopback needs the coordinator's
// TLS.
func TestWebLoopback(t *testing.T) {
	cfg := DefaultConfig()
	cfg.HTTP = "0.0.0.0:8080"
	if err := cfg.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--http") {
		t.Errorf("--http off loopback without TLS: %v", err)
	}
	co, _ := testCoordinator(t, testEtcd(t), func(c *Config) { c.HTTP = "127.0.0.1:0" })
	hc := webClient(t, nil)
	do := func(method, host, path string, header bool) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, "http://"+co.WebAddr()+path, nil)
		req.Host = host
		if header {
			req.Header.Set("X-Gpucoord-Request", "1")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := do("GET", co.WebAddr(), "/", false); got != http.StatusOK {
		t.Errorf("GET /: %d", got)
	}
	if got := do("GET", "localhost", "/app.js", false); got != http.StatusOK {
		t.Errorf("GET /app.js as localhost: %d", got)
	}
	if got := do("GET", "evil.example:80", "/api/pool", false); got != http.StatusMisdirectedRequest {
		t.Errorf("GET for another host name: %d, want 421", got)
	}
	if got := do("POST", co.WebAddr(), "/api/plan", false); got != http.StatusForbidden {
		t.Errorf("POST without X-Gpucoord-Request: %d, want 403", got)
	}
	if got := do("POST", co.WebAddr(), "/api/plan", true); got != http.StatusNotImplemented {
		t.Errorf("POST /api/plan with no planner: %d, want 501", got)
	}
}

func TestTailLines(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 5, "a\nb\nc\n"},
		{"a\nb\nc\n", 1, "c\n"},
		{"", 3, ""},
		{"one", 1, "one\n"},
	}
	for _, tc := range tests {
		if got := string(tailLines([]byte(tc.in), tc.n)); got != tc.want {
			t.Errorf("tailLines(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestInScope(t *testing.T) {
	tests := []struct {
		scope, key string
		want       bool
	}{
		{"", "ranks/j", true},
		{"", "node/n1", true},
		{"pool", "node/n1", true},
		{"pool", "job/j", true},
		{"pool", "meta", true},
		{"pool", "ranks/j", false},
		{"pool", "points/j", false},
		{"job:j", "ranks/j", true},
		{"job:j", "points/j", true},
		{"job:j", "ranks/k", false},
		{"job:j", "job/k", true},
		{"job:n1", "node/n1", false},
		{"jobs", "job/j", true},
		{"jobs", "node/n1", false},
		{"jobs", "members/j", false},
	}
	for _, tc := range tests {
		if got := inScope(tc.scope, tc.key); got != tc.want {
			t.Errorf("inScope(%q, %q) = %v, want %v", tc.scope, tc.key, got, tc.want)
		}
	}
}

// TestWebStandby: a standby's dashboard shows what the leader decided (a
// job's generation, running) and says it is a standby of the leader.
func TestWebStandby(t *testing.T) {
	eps := testEtcd(t)
	coA, _ := testCoordinator(t, eps, func(c *Config) { c.Name = "A" })
	ca := client(t, coA.Addr())
	waitLeader(t, ca, "A")
	coB, _ := testCoordinator(t, eps, func(c *Config) { c.Name = "B"; c.HTTP = "127.0.0.1:0" })
	a0, _ := agent(t, ca, node("n0", 2))
	s := spec("j", 1, 2)
	s.Tp = 1
	if _, err := ca.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" && a.Open })
	ev := openEvents(t, webClient(t, nil), coB.WebURL()+"events?job=j")
	seen := webMessage{Set: map[string]json.RawMessage{}}
	ev.until("job j running on B's page", func(e sseEvent) bool {
		for k, v := range e.msg.Set {
			seen.Set[k] = v
		}
		return strings.Contains(string(seen.Set["ranks/j"]), `"states":"RR"`)
	}, func() string {
		keys := slices.Collect(maps.Keys(seen.Set))
		slices.Sort(keys)
		return fmt.Sprint(keys) + " " + string(seen.Set["ranks/j"])
	})
	var meta struct {
		Coordinator, Leader string
		Leading             bool
	}
	if err := json.Unmarshal(seen.Set["meta"], &meta); err != nil || meta.Coordinator != "B" || meta.Leader != "A" || meta.Leading {
		t.Errorf("B's meta: %+v (%v), want B, a standby of A", meta, err)
	}
	for k := range seen.Set {
		if strings.HasPrefix(k, "node/") {
			t.Errorf("a job's viewer received %s", k)
		}
	}
}

// TestWebPoolRenewalsAndDeaths: the pool's view of each node's lease
// renewals and gossip state, from this coordinator's memory, not etcd:
// the renewals section holds the last renewal sent to each node this
// coordinator serves (or served last) and leaves out a node another
// coordinator serves (its row names that one); a node's row counts the
// members of its pool that reported its run dead, and keeps them once the
// node is lost.
func TestWebPoolRenewalsAndDeaths(t *testing.T) {
	c, k := webCache(t, 4)
	h := newWebHub(c, "c", func() bool { return true }, slog.New(slog.NewTextHandler(t.Output(), nil)))
	h.renewals, h.deaths = newRenewals(), newDeathReports()
	now := time.UnixMilli(1_800_000_000_000)
	h.renewals.sent("n0000", now.Add(-500*time.Millisecond), 5000)
	h.renewals.sent("n0001", now.Add(-time.Second), 5000)
	h.renewals.sent("n0003", now.Add(-4*time.Second), 5000) // disconnected since: served last here
	h.renewals.sent("gone", now.Add(-time.Second), 5000)    // not registered: forgotten
	rev := c.rev
	event := func(typ mvccpb.Event_EventType, key, value string) {
		rev++
		c.apply(rev, []*clientv3.Event{{Type: typ, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), ModRevision: rev}}})
	}
	event(mvccpb.PUT, k.conn("n0001"), connValue(1, "other/3"))
	event(mvccpb.DELETE, k.conn("n0003"), "")
	// One member of n0002's pool reports it dead: below the quorum of 2.
	if h.deaths.add(deathKey{member: "n0002#n0002", lease: 7}, "n0000", 2, now.Add(-2*time.Second)) {
		t.Fatal("one report of two acted on")
	}
	h.rebuild(now)

	var r webRenewals
	if err := json.Unmarshal(h.section("renewals"), &r); err != nil {
		t.Fatal(err)
	}
	want := webRenewals{Coordinator: "c", At: now.UnixMilli(), TTLMs: 5000, Nodes: []string{"n0000", "n0003"}, AgoMs: []int64{500, 4000}}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("renewals section: %+v, want %+v", r, want)
	}
	if _, ok := h.renewals.last(func(string) bool { return true })["gone"]; ok {
		t.Error("the renewal of a node no longer registered is kept")
	}
	row := func(name string) webNode {
		t.Helper()
		var n webNode
		if err := json.Unmarshal(h.section("node/"+name), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := row("n0001"); n.Stream != "other" || n.Health != "registered" {
		t.Errorf("n0001, served by another coordinator: %+v", n)
	}
	if n := row("n0002"); n.ReportedDead != 1 || n.ReportedAt != now.Add(-2*time.Second).UnixMilli() || n.Revoked {
		t.Errorf("n0002, reported dead once: %+v", n)
	}
	if n := row("n0000"); n.ReportedDead != 0 || n.ReportedAt != 0 {
		t.Errorf("n0000, not reported: %+v", n)
	}
	if !inScope("pool", "renewals") || inScope("job:j", "renewals") || inScope("jobs", "renewals") {
		t.Error("the renewals section goes to the pool's viewers alone")
	}

	// A second report: the quorum; the lease is revoked and the node goes.
	if !h.deaths.add(deathKey{member: "n0002#n0002", lease: 7}, "n0001", 2, now.Add(-time.Second)) {
		t.Fatal("the second report did not act")
	}
	event(mvccpb.DELETE, k.node("n0002"), "")
	h.rebuild(now.Add(time.Second))
	if n := row("n0002"); n.Health != "lost" || n.ReportedDead != 2 || !n.Revoked {
		t.Errorf("n0002, revoked by its pool's reports: %+v", n)
	}
	// A minute on, the reports are forgotten; the lost row keeps them.
	h.rebuild(now.Add(2 * time.Minute))
	if n := row("n0002"); n.ReportedDead != 2 {
		t.Errorf("n0002 a minute after: %+v", n)
	}
}

// TestMemberState: a generation's member's state, as status and the
// dashboard both show it.
func TestMemberState(t *testing.T) {
	run := &pb.Node{Name: "n", Instance: "a"}
	tests := []struct {
		name      string
		m         *pb.Member
		n         *pb.Node
		connected bool
		revoked   string
		want      string
	}{
		{name: "streaming", m: &pb.Member{Node: "n", Instance: "a"}, n: run, connected: true, want: "alive"},
		{name: "no stream", m: &pb.Member{Node: "n", Instance: "a"}, n: run, want: "disconnected"},
		{name: "not registered", m: &pb.Member{Node: "n", Instance: "a"}, connected: true, want: "lost"},
		{name: "another run registered", m: &pb.Member{Node: "n", Instance: "b"}, n: run, connected: true, want: "lost"},
		{name: "member without a run", m: &pb.Member{Node: "n"}, n: run, connected: true, want: "alive"},
		{name: "its run revoked", m: &pb.Member{Node: "n", Instance: "a"}, n: run, connected: true, revoked: "a", want: "lost"},
		{name: "an earlier run revoked", m: &pb.Member{Node: "n", Instance: "a"}, n: run, connected: true, revoked: "z", want: "alive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := memberState(tc.m, tc.n, tc.connected, tc.revoked); got != tc.want {
				t.Errorf("memberState = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestWebSubscribeFresh: a viewer's first event is the model as the cache
// holds it when the viewer comes, not as the last rebuild left it (once a
// second without viewers): a node that disconnected since is in it, and
// nothing of it comes again as the viewer's first update.
func TestWebSubscribeFresh(t *testing.T) {
	c, k := webCache(t, 4)
	h := newWebHub(c, "c", func() bool { return true }, slog.New(slog.NewTextHandler(t.Output(), nil)))
	h.rebuild(time.Now())
	rev := c.rev + 1
	c.apply(rev, []*clientv3.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(k.conn("n0002")), ModRevision: rev}}})
	sub, snap := h.subscribe("pool")
	defer h.unsubscribe(sub)
	var m webMessage
	if err := json.Unmarshal(snap, &m); err != nil {
		t.Fatal(err)
	}
	var n webNode
	if err := json.Unmarshal(m.Set["node/n0002"], &n); err != nil || n.Health != "disconnected" {
		t.Errorf("n0002 in the first event: %+v %v, want disconnected", n, err)
	}
	h.rebuild(time.Now())
	select {
	case b := <-sub.ch:
		t.Errorf("an update after a fresh first event with nothing changed: %.200s", b)
	default:
	}
}
