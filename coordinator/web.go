package coordinator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/topology"
)

// The dashboard (Config.HTTP): the page, embedded in the binary
// (webui/), and what it reads, from the cache every coordinator keeps
// (webhub.go): a standby's dashboard shows what the leader's does, a
// moment apart at most.
//
//	GET  /                         the page (index.html, app.js, style.css)
//	GET  /events[?view=pool|jobs|?job=ID]
//	                               server-sent events: "snapshot", the model
//	                               (the pool's part, or a job's), then a
//	                               "delta" per change (webMessage)
//	GET  /api/snapshot[?...]       the model, as the first event
//	GET  /api/pool                 the pool by failure domain (gpucoord.web-pool/1)
//	GET  /api/jobs                 every job's head
//	GET  /api/jobs/{job}           a job: head, grid, members, generations,
//	                               commit, hung ranks' stacks, curves (gpucoord.web-job/1)
//	GET  /api/jobs/{job}/logs?rank=R[&lines=N]
//	                               the tail of a rank's log, from its node's agent
//	POST /api/jobs/{job}/cancel    cancel (the admin role; see access below)
//	POST /api/plan                 plan --json and plan --svg of flags or a job file
//	GET  /api/whoami               the caller's identity and what it may do
//	GET  /api/stats                what the model costs: builds, bytes, viewers
//	GET  /api/presets              the planner's cluster and model presets
//
// # Access
//
// On loopback the dashboard is plaintext and open, as the gRPC service is
// on loopback: to a request for a loopback host name only (a page
// elsewhere cannot rebind its name to this port), and its cancel only
// where the gRPC service is plaintext too. Off loopback it is TLS under
// the coordinator's CA, and the handshake requires a client certificate
// of that CA: a client without one gets nothing. A client's or an admin's
// certificate reads; only an admin's cancels; a node's gets 403. Every
// POST needs the header X-Gpucoord-Request, which a cross-site form
// cannot send.

//go:embed webui
var webFiles embed.FS

// PlanFunc answers the dashboard's plan form with what gpucoord plan
// computes. args are plan's flags (the answer's --json and --svg are the
// function's to add); job, when not empty, is a job file's text, whose
// replan section names the model and cluster. An input that cannot be
// planned is an answer with Error set, not an error. The dashboard calls
// it one call at a time.
type PlanFunc func(ctx context.Context, args []string, job []byte) (*PlanAnswer, error)

// PlanAnswer is a plan as plan --json and plan --svg give it.
type PlanAnswer struct {
	// Command is the plan command line that gives the same numbers.
	Command string `json:"command"`
	// Plan is plan --json's document; SVG is plan --svg's picture.
	Plan json.RawMessage `json:"plan,omitempty"`
	SVG  string          `json:"svg,omitempty"`
	Fits bool            `json:"fits"`
	// Error says why the input cannot be planned.
	Error string `json:"error,omitempty"`
}

// web is a coordinator's dashboard server.
type web struct {
	c    *Coordinator
	log  *slog.Logger
	ln   net.Listener
	tls  *tls.Config // nil: plaintext, on loopback
	hub  *webHub
	plan PlanFunc
	// cancelOpen says a loopback dashboard may cancel: the gRPC service
	// is plaintext too (no one has an identity there).
	cancelOpen bool
	// agents reads rank logs from the agents' node servers; scheme is
	// "https" where they serve TLS.
	agents *http.Client
	scheme string
	// planning admits one plan at a time.
	planning chan struct{}
}

// validateHTTP checks Config.HTTP: off loopback the coordinator must
// serve mutual TLS, whose CA the dashboard's clients present certificates
// of.
func (c *Config) validateHTTP() error {
	if c.HTTP == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(c.HTTP)
	if err != nil {
		return errorf(ErrInvalid, "--http %q: want HOST:PORT, such as 127.0.0.1:8080: %v", c.HTTP, err)
	}
	if !IsLoopback(host) && !c.secure() {
		return errorf(ErrInvalid, "--http %s is not loopback: off loopback the dashboard is TLS and needs a client certificate of the cluster's CA; give --token-file (or --tls-ca, --tls-cert and --tls-key), or serve it on 127.0.0.1", c.HTTP)
	}
	return nil
}

// openWeb binds the dashboard's address when Config.HTTP names one.
func (c *Coordinator) openWeb(cp *clusterPKI) error {
	if c.cfg.HTTP == "" {
		return nil
	}
	ln, err := net.Listen("tcp", c.cfg.HTTP)
	if err != nil {
		return errorf(ErrUnavailable, "dashboard: listen on %s: %v", c.cfg.HTTP, errors.Unwrap(err))
	}
	host, _, _ := net.SplitHostPort(c.cfg.HTTP)
	w := &web{c: c, log: c.log.With("component", "web"), ln: ln, plan: c.cfg.Planner, planning: make(chan struct{}, 1), scheme: "http",
		hub: newWebHub(c.cache, c.cfg.Name, c.leading.Load, c.log.With("component", "web")), cancelOpen: cp == nil}
	w.hub.renewals, w.hub.deaths = c.srv.renewals, c.srv.deaths
	w.agents = &http.Client{Timeout: 10 * time.Second}
	if cp != nil {
		if !IsLoopback(host) {
			t := cp.tls.Clone()
			t.ClientAuth = tls.RequireAndVerifyClientCert
			t.NextProtos = []string{"h2", "http/1.1"}
			w.tls = t
		}
		w.scheme = "https"
		if tc, err := dashboardClient(cp, c.cfg.Name); err != nil {
			w.log.Warn("dashboard: no client certificate to read rank logs with: the logs tail is off", "err", err)
			w.agents = nil
		} else {
			w.agents.Transport = &http.Transport{TLSClientConfig: tc}
		}
	}
	c.web = w
	return nil
}

// dashboardClient is the TLS the dashboard reads agents' rank logs with:
// a client certificate of the cluster's CA, made now, named for this
// coordinator. A coordinator whose CA it has no key of has none.
func dashboardClient(cp *clusterPKI, name string) (*tls.Config, error) {
	if cp.ca == nil {
		return nil, errors.New("the organisation's CA is given without its key")
	}
	id := pki.Identity{Role: pki.RoleClient, Name: "dashboard@" + name}
	key, csr, err := pki.NewRequest(id)
	if err != nil {
		return nil, err
	}
	cert, err := cp.ca.SignRequest(csr, id, time.Now())
	if err != nil {
		return nil, err
	}
	return pki.AgentTLS(pki.Credentials{CA: cp.ca.PEM(), Cert: cert, Key: key})
}

// WebAddr returns the address the dashboard listens on, or "".
func (c *Coordinator) WebAddr() string {
	if c.web == nil {
		return ""
	}
	return c.web.ln.Addr().String()
}

// WebURL returns the dashboard's URL, or "". An unspecified host (0.0.0.0)
// is this machine's name.
func (c *Coordinator) WebURL() string {
	if c.web == nil {
		return ""
	}
	return c.web.url("")
}

// url is the dashboard's URL; a listener on every address is named by
// local, the address its caller reached this machine at, when given.
func (w *web) url(local string) string {
	host, port, _ := net.SplitHostPort(w.ln.Addr().String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = local
		if host == "" {
			host, _ = os.Hostname()
		}
	}
	scheme := "http"
	if w.tls != nil {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/"
}

// withDashboard is a unary interceptor that names the dashboard in the
// answers of Status and Submit, as reached by the caller.
func (c *Coordinator) withDashboard(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil || c.web == nil {
		return resp, err
	}
	local := ""
	if p, ok := peer.FromContext(ctx); ok && p.LocalAddr != nil {
		local, _, _ = net.SplitHostPort(p.LocalAddr.String())
	}
	switch r := resp.(type) {
	case *pb.StatusResponse:
		r.Dashboard = c.web.url(local)
	case *pb.SubmitResponse:
		r.Dashboard = c.web.url(local)
	}
	return resp, err
}

// run serves the dashboard and keeps its model until ctx ends.
func (w *web) run(ctx context.Context) error {
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.hub.run(hctx)
	}()
	defer func() { <-done }()
	srv := &http.Server{Handler: w.handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: w.tls,
		BaseContext: func(net.Listener) context.Context { return hctx },
		ErrorLog:    slog.NewLogLogger(w.log.Handler(), slog.LevelDebug)}
	go func() {
		<-hctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	ln := w.ln
	if w.tls != nil {
		ln = tls.NewListener(ln, w.tls)
	}
	w.log.Info("dashboard serving", "url", w.url(""))
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: %w", err)
	}
	return nil
}

// webCaller is who asks, and what they may do.
type webCaller struct {
	Name   string `json:"name"`
	Role   string `json:"role"` // empty on loopback
	Cancel bool   `json:"may_cancel"`
	Plan   bool   `json:"may_plan"`
}

type webCallerKey struct{}

func (w *web) handler() http.Handler {
	mux := http.NewServeMux()
	ui, _ := fs.Sub(webFiles, "webui")
	mux.Handle("GET /", http.FileServerFS(ui))
	mux.HandleFunc("GET /events", w.events)
	mux.HandleFunc("GET /api/whoami", func(rw http.ResponseWriter, r *http.Request) { writeJSON(rw, callerOf(r)) })
	mux.HandleFunc("GET /api/snapshot", func(rw http.ResponseWriter, r *http.Request) { writeRaw(rw, w.hub.snapshot(eventScope(r))) })
	mux.HandleFunc("GET /api/stats", func(rw http.ResponseWriter, r *http.Request) { writeJSON(rw, w.hub.statsNow()) })
	mux.HandleFunc("GET /api/presets", func(rw http.ResponseWriter, r *http.Request) {
		writeJSON(rw, map[string][]string{"clusters": topology.ClusterPresets(), "models": topology.ModelPresets()})
	})
	mux.HandleFunc("GET /api/pool", w.poolDoc)
	mux.HandleFunc("GET /api/jobs", w.jobsDoc)
	mux.HandleFunc("GET /api/jobs/{job}", w.jobDoc)
	mux.HandleFunc("GET /api/jobs/{job}/logs", w.logs)
	mux.HandleFunc("POST /api/jobs/{job}/cancel", w.cancel)
	mux.HandleFunc("POST /api/plan", w.planForm)
	return w.guard(mux)
}

// guard lets a request through to h only from a caller who may read, and
// sets the headers every answer carries.
func (w *web) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		hd := rw.Header()
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		var who webCaller
		if w.tls == nil {
			host := r.Host
			if h, _, err := net.SplitHostPort(r.Host); err == nil {
				host = h
			}
			if !IsLoopback(strings.Trim(host, "[]")) {
				http.Error(rw, "this dashboard listens on loopback and answers requests for a loopback host only (127.0.0.1, ::1, localhost)", http.StatusMisdirectedRequest)
				return
			}
			who = webCaller{Name: "local", Cancel: w.cancelOpen}
		} else {
			id, err := pki.PeerIdentity(r.TLS)
			if err != nil {
				http.Error(rw, "a client certificate of the cluster's CA is required", http.StatusUnauthorized)
				return
			}
			if id.Role != pki.RoleClient && id.Role != pki.RoleAdmin {
				http.Error(rw, fmt.Sprintf("the dashboard is for clients and admins, not for %s", id), http.StatusForbidden)
				return
			}
			who = webCaller{Name: id.Name, Role: id.Role, Cancel: id.Role == pki.RoleAdmin}
		}
		who.Plan = w.plan != nil
		if r.Method == http.MethodPost && r.Header.Get("X-Gpucoord-Request") == "" {
			http.Error(rw, "a POST needs the header X-Gpucoord-Request", http.StatusForbidden)
			return
		}
		h.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), webCallerKey{}, who)))
	})
}

func callerOf(r *http.Request) webCaller {
	who, _ := r.Context().Value(webCallerKey{}).(webCaller)
	return who
}

func writeJSON(rw http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	writeRaw(rw, b)
}

func writeRaw(rw http.ResponseWriter, b []byte) {
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Cache-Control", "no-store")
	rw.Write(b)
}

// eventScope is the part of the model a request asks for (inScope):
// ?view=pool (the nodes), ?view=jobs (the jobs' heads only), ?job=ID, or
// (none) all of it.
func eventScope(r *http.Request) string {
	q := r.URL.Query()
	switch v := q.Get("view"); {
	case q.Get("job") != "":
		return "job:" + q.Get("job")
	case v == "pool" || v == "jobs":
		return v
	}
	return ""
}

// events streams the model: the whole of it, then its changes, until the
// viewer leaves, falls behind (it connects again) or the coordinator
// stops.
func (w *web) events(rw http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(rw)
	hd := rw.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	sub, snap := w.hub.subscribe(eventScope(r))
	defer w.hub.unsubscribe(sub)
	bw := bufio.NewWriterSize(rw, 64<<10)
	send := func(event string, data []byte) error {
		bw.WriteString("event: " + event + "\ndata: ")
		bw.Write(data)
		bw.WriteString("\n\n")
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := send("snapshot", snap); err != nil {
		return
	}
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case msg, ok := <-sub.ch:
			if !ok {
				return
			}
			if err := send("delta", msg); err != nil {
				return
			}
		case <-ping.C:
			bw.WriteString(": ping\n\n")
			if bw.Flush() != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// webPoolDoc is /api/pool: the pool by failure domain.
type webPoolDoc struct {
	Schema      string          `json:"schema"`
	Coordinator string          `json:"coordinator"`
	Leader      string          `json:"leader"`
	Leading     bool            `json:"leading"`
	Revision    int64           `json:"revision"`
	Counts      map[string]int  `json:"counts"`
	Domains     []webDomainRows `json:"domains"`
	// Renewals are the last lease renewals this coordinator sent
	// (webRenewals).
	Renewals json.RawMessage `json:"renewals,omitempty"`
}

type webDomainRows struct {
	Name string `json:"name"`
	// Pool counts the domain's registered nodes in its gossip pool.
	Pool  int       `json:"pool"`
	Nodes []webNode `json:"nodes"`
}

func (w *web) poolDoc(rw http.ResponseWriter, r *http.Request) {
	var meta struct {
		Coordinator, Leader string
		Leading             bool
		Revision            int64
	}
	json.Unmarshal(w.hub.section("meta"), &meta)
	doc := webPoolDoc{Schema: "gpucoord.web-pool/1", Coordinator: meta.Coordinator, Leader: meta.Leader, Leading: meta.Leading,
		Revision: meta.Revision, Counts: map[string]int{}, Domains: []webDomainRows{}, Renewals: w.hub.section("renewals")}
	for _, n := range w.hub.pool() {
		if k := len(doc.Domains); k == 0 || doc.Domains[k-1].Name != n.Domain {
			doc.Domains = append(doc.Domains, webDomainRows{Name: n.Domain})
		}
		d := &doc.Domains[len(doc.Domains)-1]
		d.Nodes = append(d.Nodes, n)
		if n.Gossip && n.Health != "lost" {
			d.Pool++
		}
		doc.Counts[n.Health]++
		if n.Spare {
			doc.Counts["spare"]++
		}
		if n.Health != "lost" {
			doc.Counts["gpus"] += int(n.GPUs)
		}
	}
	writeJSON(rw, doc)
}

func (w *web) jobsDoc(rw http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	b.WriteString(`{"schema":"gpucoord.web-jobs/1","jobs":[`)
	for i, id := range w.hub.jobIDs() {
		if i > 0 {
			b.WriteByte(',')
		}
		if s := w.hub.section("job/" + id); s != nil {
			b.Write(s)
		} else {
			b.WriteString("null")
		}
	}
	b.WriteString("]}")
	writeRaw(rw, b.Bytes())
}

// jobDoc is /api/jobs/{job}: every section of the job, by name.
func (w *web) jobDoc(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("job")
	head := w.hub.section("job/" + id)
	if head == nil {
		http.Error(rw, fmt.Sprintf("no job %q", id), http.StatusNotFound)
		return
	}
	doc := map[string]json.RawMessage{"schema": json.RawMessage(`"gpucoord.web-job/1"`), "job": head}
	for _, s := range []struct{ name, prefix string }{{"ranks", "ranks/"}, {"members", "members/"}, {"exits", "exits/"}, {"hangs", "hangs/"},
		{"generations", "gens/"}, {"commit", "commit/"}, {"times", "times/"}, {"points", "points/"}} {
		if b := w.hub.section(s.prefix + id); b != nil {
			doc[s.name] = b
		}
	}
	writeJSON(rw, doc)
}

// logs is the tail of a rank's log, read from the agent of the node that
// runs it in the current generation.
func (w *web) logs(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("job")
	rank, err := strconv.Atoi(r.URL.Query().Get("rank"))
	if err != nil || rank < 0 {
		http.Error(rw, "want ?rank=R, a global rank", http.StatusBadRequest)
		return
	}
	lines := 200
	if v := r.URL.Query().Get("lines"); v != "" {
		if lines, err = strconv.Atoi(v); err != nil || lines < 1 || lines > 10000 {
			http.Error(rw, "lines: want 1 to 10000", http.StatusBadRequest)
			return
		}
	}
	if w.agents == nil {
		http.Error(rw, "this coordinator cannot read rank logs: it has no certificate the agents accept (an organisation's CA without its key)", http.StatusNotImplemented)
		return
	}
	g, _ := w.c.cache.generation(id)
	var node string
	for _, m := range g.GetMembers() {
		if int32(rank) >= m.FirstRank && int32(rank) < m.FirstRank+m.Ranks {
			node = m.Node
		}
	}
	e, ok := w.c.cache.registered(node)
	if node == "" || !ok || e.node.GetCheckpointAddr() == "" {
		http.Error(rw, fmt.Sprintf("job %s: no registered node runs rank %d now (gpucoord logs asks every node)", id, rank), http.StatusNotFound)
		return
	}
	u := w.scheme + "://" + e.node.GetCheckpointAddr() + "/v1/jobs/" + url.PathEscape(id) + "/logs?rank=" + strconv.Itoa(rank)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u, nil)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	resp, err := w.agents.Do(req)
	if err != nil {
		http.Error(rw, fmt.Sprintf("node %s: %v", node, err), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		http.Error(rw, fmt.Sprintf("node %s: %v", node, err), http.StatusBadGateway)
		return
	}
	if resp.StatusCode != http.StatusOK {
		http.Error(rw, fmt.Sprintf("node %s: %s", node, strings.TrimSpace(string(body))), resp.StatusCode)
		return
	}
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.Header().Set("Cache-Control", "no-store")
	rw.Write(tailLines(body, lines))
}

// tailLines is the last n lines of b, each ending in a newline.
func tailLines(b []byte, n int) []byte {
	b = bytes.TrimRight(b, "\n")
	if len(b) == 0 {
		return nil
	}
	from := 0
	for end := len(b); n > 0; n-- {
		i := bytes.LastIndexByte(b[:end], '\n')
		if i < 0 {
			from = 0
			break
		}
		from, end = i+1, i
	}
	return append(b[from:len(b):len(b)], '\n')
}

// cancel cancels a job, for a caller who may.
func (w *web) cancel(rw http.ResponseWriter, r *http.Request) {
	who := callerOf(r)
	if !who.Cancel {
		http.Error(rw, "cancel needs the admin role (over TLS, an admin's certificate); on loopback it is open only where the gRPC service is plaintext", http.StatusForbidden)
		return
	}
	id := r.PathValue("job")
	resp, err := w.c.srv.Cancel(r.Context(), &pb.CancelRequest{Job: id, Reason: "cancelled from the dashboard by " + who.Name})
	if err != nil {
		st := status.Convert(err)
		code := http.StatusInternalServerError
		if st.Code() == codes.NotFound {
			code = http.StatusNotFound
		}
		http.Error(rw, st.Message(), code)
		return
	}
	w.log.Info("job cancelled from the dashboard", "job", id, "by", who.Name, "role", who.Role)
	writeJSON(rw, map[string]string{"phase": phaseOf(resp.GetState()), "reason": resp.GetState().GetReason()})
}

// webPlanRequest is the plan form: plan's flags, and a job file.
type webPlanRequest struct {
	Args []string `json:"args"`
	Job  string   `json:"job"`
}

func (w *web) planForm(rw http.ResponseWriter, r *http.Request) {
	if w.plan == nil {
		http.Error(rw, "this coordinator has no planner", http.StatusNotImplemented)
		return
	}
	var req webPlanRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		http.Error(rw, "want {\"args\": [plan's flags], \"job\": a job file's text}: "+err.Error(), http.StatusBadRequest)
		return
	}
	select {
	case w.planning <- struct{}{}:
		defer func() { <-w.planning }()
	case <-r.Context().Done():
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	ans, err := w.plan(ctx, req.Args, []byte(req.Job))
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(rw, ans)
}
