package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// webHub keeps the dashboard's model of the cluster and sends its changes
// to every viewer. The model is a set of sections, each a JSON value under
// a key ("meta", "node/NAME", "job/ID", "ranks/ID", ...; web.go lists
// them), rebuilt from the cache when the cache moves, at most once a tick:
// a burst of events costs one rebuild, and a section whose bytes did not
// change is not sent. A viewer gets the whole model once, then each
// rebuild's changed sections as one message, the same bytes for every
// viewer: a 2,048-node pool is sent once per viewer, then a node's row
// when that node changes.
//
// The loss and step-time curves, the generations and the hung ranks'
// stacks outlive what etcd keeps of a job (its current generation and
// last step): the hub remembers what it saw, since this coordinator
// started. The curves are sampled at the hub's tick, once a second while
// no one watches (the JSON endpoints are then up to a second behind).
//
// # Concurrency
//
// run is the only writer of the model; subscribe, snapshot and the
// accessors may be called from any goroutine.
type webHub struct {
	cache   *cache
	self    string
	leading func() bool
	log     *slog.Logger
	// tick is the least time between two rebuilds; slow, between two
	// rebuilds of the ranks' compute times (a thousand numbers a second
	// for a big job are not worth sending every tick).
	tick, slow time.Duration

	mu       sync.Mutex
	seq      int64
	sections map[string]json.RawMessage
	nodes    map[string]webNode
	jobs     map[string]*webHistory
	subs     map[*webSub]struct{}
	joined   chan struct{}    // a viewer subscribed: end an idle wait
	stored   map[string]int64 // each job's stored print at its last commit section
	timesAt  time.Time
	times    int64 // the times print at timesAt
	// renewals and deaths are the server's lease renewals and the deaths
	// pools reported (nil: none); renewed are the nodes of the renewals
	// section last sent, at renewedAt.
	renewals  *renewals
	deaths    *deathReports
	renewed   []string
	renewedAt time.Time
	stats     webStats
}

// webHistory is what the hub remembers of a job beyond the cache.
type webHistory struct {
	gens   []webGeneration
	hangs  []webHang
	points []webPoint
	sent   int   // points viewers have
	reset  bool  // the points were thinned: viewers get them all again
	gen    int64 // the newest generation in gens
	// last is the current generation's grid as the last rebuild saw it,
	// to show as it ended once the next generation replaces it.
	last *webPrevious
	// ranks and members are the grid and the members last sent.
	ranks   webRanks
	members webMembers
}

// webPoint is a curve's point: step, loss, seconds a step, generation.
type webPoint [4]float64

const (
	maxPoints = 4096 // a curve's points; past it every other is dropped
	maxGens   = 64   // generations remembered per job
	maxHangs  = 16   // hung ranks remembered per job
	maxOutput = 32 << 10
	// lostFor is how long the pool shows a node whose registration went.
	lostFor = 10 * time.Minute
)

// webSub is one viewer's stream of messages. A viewer that falls behind
// (its buffer full) is dropped: its page connects again and gets the
// model whole.
type webSub struct {
	ch    chan []byte
	scope string
}

// inScope says whether a viewer of scope receives the section key: ""
// receives every section; "pool" the pool's (every node's row and the
// lease renewals); "job:ID" job ID's; any other scope ("jobs") none but
// those every scope receives: meta and every job's head (the page's
// lists). A job's grid, members and compute times, a megabyte at 2,048
// nodes, go only to its viewers.
func inScope(scope, key string) bool {
	if scope == "" || key == "meta" || strings.HasPrefix(key, "job/") {
		return true
	}
	kind, name, _ := strings.Cut(key, "/")
	if scope == "pool" {
		return kind == "node" || key == "renewals"
	}
	id, ok := strings.CutPrefix(scope, "job:")
	return ok && kind != "node" && name == id
}

// filter is the part of m a viewer of scope receives.
func (m webMessage) filter(scope string) webMessage {
	if scope == "" {
		return m
	}
	out := webMessage{Seq: m.Seq, Reset: m.Reset, Set: map[string]json.RawMessage{}}
	for k, v := range m.Set {
		if inScope(scope, k) {
			out.Set[k] = v
		}
	}
	for _, k := range m.Del {
		if inScope(scope, k) {
			out.Del = append(out.Del, k)
		}
	}
	for k, v := range m.Append {
		if inScope(scope, k) {
			if out.Append == nil {
				out.Append = map[string][]webPoint{}
			}
			out.Append[k] = v
		}
	}
	return out
}

// webStats says what the hub cost, for /api/stats and the benchmark.
type webStats struct {
	Builds       int64   `json:"builds"`
	LastBuildMs  float64 `json:"last_build_ms"`
	MaxBuildMs   float64 `json:"max_build_ms"`
	Messages     int64   `json:"messages"`
	LastBytes    int     `json:"last_message_bytes"`
	MaxBytes     int     `json:"max_message_bytes"`
	BytesSent    int64   `json:"bytes_sent"`
	SnapshotSize int     `json:"snapshot_bytes"`
	Viewers      int     `json:"viewers"`
	Dropped      int64   `json:"viewers_dropped"`
}

func newWebHub(c *cache, self string, leading func() bool, log *slog.Logger) *webHub {
	return &webHub{cache: c, self: self, leading: leading, log: log, tick: 100 * time.Millisecond, slow: 2 * time.Second,
		sections: map[string]json.RawMessage{}, nodes: map[string]webNode{}, jobs: map[string]*webHistory{},
		subs: map[*webSub]struct{}{}, stored: map[string]int64{}, joined: make(chan struct{}, 1)}
}

// advancedCh is the channel the cache closes when its view moves.
func (c *cache) advancedCh() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.advanced
}

// run rebuilds the model whenever the cache moves, at most once a tick,
// and every slow interval (compute times, leadership), until ctx ends.
func (h *webHub) run(ctx context.Context) error {
	slow := time.NewTicker(h.slow / 2)
	defer slow.Stop()
	for {
		moved := h.cache.advancedCh()
		h.rebuild(time.Now())
		select {
		case <-ctx.Done():
			h.closeAll()
			return nil
		case <-moved:
		case <-slow.C:
		}
		// What else comes within the tick goes in the same rebuild. With
		// no viewer the model is kept (its curves and generations) once a
		// second, not ten times.
		tick := h.tick
		h.mu.Lock()
		if len(h.subs) == 0 {
			tick = max(tick, time.Second)
		}
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			h.closeAll()
			return nil
		case <-time.After(tick):
		case <-h.joined:
		}
	}
}

// webMessage is what a viewer receives: sections set (whole), sections
// deleted, and points appended to curves; reset says it is the whole
// model.
type webMessage struct {
	Seq    int64                      `json:"seq"`
	Reset  bool                       `json:"reset,omitempty"`
	Set    map[string]json.RawMessage `json:"set,omitempty"`
	Del    []string                   `json:"del,omitempty"`
	Append map[string][]webPoint      `json:"append,omitempty"`
}

// jobSections are the prefixes of a job's sections.
var jobSections = []string{"job/", "prev/", "ranks/", "members/", "exits/", "hangs/", "gens/", "commit/", "times/", "points/"}

// rebuild reads the cache, updates the model and sends what changed.
func (h *webHub) rebuild(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rebuildLocked(now)
}

// rebuildLocked is rebuild; the caller holds h.mu.
func (h *webHub) rebuildLocked(now time.Time) {
	begin := time.Now()
	cp := h.cache.webCopy(h.stored)
	cp.deaths = h.deaths.byNode(now)
	msg := webMessage{Set: map[string]json.RawMessage{}, Append: map[string][]webPoint{}}
	set := func(key string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			h.log.Warn("dashboard: section not encoded", "key", key, "err", err)
			return
		}
		if old, ok := h.sections[key]; !ok || !bytes.Equal(old, b) {
			h.sections[key] = b
			msg.Set[key] = b
		}
	}
	set("meta", map[string]any{"coordinator": h.self, "leader": cp.leader, "leading": h.leading(), "revision": cp.rev,
		"nodes": len(cp.nodes), "jobs": len(cp.jobs)})

	// The pool: a row per node, sent when it changes.
	nodes := cp.webNodes()
	for name, n := range nodes {
		if old, ok := h.nodes[name]; ok && n.Health == "lost" && n.ReportedAt == 0 {
			// A lost node keeps the death its pool reported: the reports
			// are forgotten after a minute.
			n.ReportedDead, n.ReportedAt, n.Revoked = old.ReportedDead, old.ReportedAt, old.Revoked
		}
		if old, ok := h.nodes[name]; !ok || old != n {
			h.nodes[name] = n
			set("node/"+name, n)
		}
	}
	for name, old := range h.nodes {
		if _, ok := nodes[name]; ok {
			continue
		}
		switch {
		case old.Lost == 0:
			// Gone: shown lost for lostFor, with the death its pool
			// reported, if it did (the revocation that removed it).
			old.Health, old.Lost, old.Spare, old.Job, old.Stream = "lost", now.UnixMilli(), false, "", ""
			d, ok := cp.deaths[name]
			old.reported(d, ok, "")
			h.nodes[name] = old
			set("node/"+name, old)
		case now.Sub(time.UnixMilli(old.Lost)) > lostFor:
			delete(h.nodes, name)
			delete(h.sections, "node/"+name)
			msg.Del = append(msg.Del, "node/"+name)
		}
	}

	// The lease renewals of the nodes this coordinator serves: each node's
	// moves every third of a TTL, so the section is rebuilt at the slow
	// interval, or at once when its nodes change.
	last := h.renewals.last(func(node string) bool { _, ok := cp.nodes[node]; return ok })
	if r := cp.webRenewals(h.self, last, now); now.Sub(h.renewedAt) >= h.slow || !slices.Equal(r.Nodes, h.renewed) {
		h.renewedAt, h.renewed = now, r.Nodes
		set("renewals", r)
	}

	slowDue := now.Sub(h.timesAt) >= h.slow && cp.timesPrint != h.times
	if slowDue {
		h.timesAt, h.times = now, cp.timesPrint
	}
	seen := map[string]bool{}
	for _, j := range cp.jobs {
		id := j.spec.Id
		seen[id] = true
		hist := h.jobs[id]
		if hist == nil {
			hist = &webHistory{}
			h.jobs[id] = hist
		}
		head, ranks, members, exits := cp.head(j)
		set("job/"+id, head)
		// The grid and the members, a letter and a row per rank and node,
		// are encoded only when they changed.
		if _, ok := h.sections["ranks/"+id]; !ok || ranks != hist.ranks {
			hist.ranks = ranks
			set("ranks/"+id, ranks)
		}
		if _, ok := h.sections["members/"+id]; !ok || !slices.Equal(members, hist.members) {
			hist.members = members
			set("members/"+id, members)
		}
		set("exits/"+id, exits)
		if g := j.gen; g != nil && g.Number != hist.gen {
			if p := hist.last; p != nil && p.Generation < g.Number {
				p.Ended, p.Members = now.UnixMilli(), slices.Clone(p.Members)
				for i := range p.Members {
					p.Members[i].Domain = "" // the grid does not show it
				}
				states := []byte(p.States)
				for i, m := range p.Members {
					var c byte
					// A node the next generation left out that is not alive
					// (gone, or its stream dropped: the leader counted it
					// lost) is lost to the job.
					in := slices.ContainsFunc(g.Members, func(x *pb.Member) bool { return x.Node == m.Node })
					if !in && cp.memberState(&pb.Member{Node: m.Node, Instance: p.instances[i]}) != "alive" {
						c, p.Members[i].State = 'L', "lost"
					}
					for r := m.FirstRank; c != 0 && r < m.FirstRank+m.Ranks && int(r) < len(states); r++ {
						states[r] = c
					}
				}
				p.States = string(states)
				set("prev/"+id, p)
			}
			hist.gen = g.Number
			x := generationOf(j.spec, g)
			x.Seen, x.Output = now.UnixMilli(), truncateOutput(g.Output)
			hist.gens = append(hist.gens, *x)
			if len(hist.gens) > maxGens {
				hist.gens = slices.Delete(hist.gens, 0, len(hist.gens)-maxGens)
			}
			set("gens/"+id, hist.gens)
		} else if _, ok := h.sections["gens/"+id]; !ok {
			set("gens/"+id, hist.gens)
		}
		if g := j.gen; g != nil {
			hist.last = &webPrevious{Generation: g.Number, Layout: head.Layout, Members: members, States: ranks.States}
			hist.last.instances = make([]string, len(g.Members))
			for i, m := range g.Members {
				hist.last.instances[i] = m.Instance
			}
		}
		for _, hg := range j.hangs() {
			if !slices.ContainsFunc(hist.hangs, func(x webHang) bool { return x.Generation == hg.Generation && x.Rank == hg.Rank }) {
				hg.Stacks = truncateOutput(hg.Stacks)
				hist.hangs = append(hist.hangs, hg)
				if len(hist.hangs) > maxHangs {
					hist.hangs = slices.Delete(hist.hangs, 0, len(hist.hangs)-maxHangs)
				}
			}
		}
		set("hangs/"+id, hist.hangs)
		if _, ok := h.sections["commit/"+id]; !ok || j.stored != nil || h.stored[id] != j.storedPrint {
			h.stored[id] = j.storedPrint
			set("commit/"+id, j.commitView())
		}
		if _, ok := h.sections["times/"+id]; !ok || slowDue {
			set("times/"+id, j.rankTimes())
		}
		if s, n := j.step, len(hist.points); s != nil && (n == 0 || hist.points[n-1][0] != float64(s.Step) || hist.points[n-1][3] != float64(s.Generation)) {
			hist.points = append(hist.points, webPoint{float64(s.Step), s.Loss, s.Seconds, float64(s.Generation)})
			if len(hist.points) > maxPoints {
				thin := make([]webPoint, 0, maxPoints/2+1)
				for i := 0; i < len(hist.points)-1; i += 2 {
					thin = append(thin, hist.points[i])
				}
				hist.points = append(thin, hist.points[len(hist.points)-1])
				hist.reset = true
			}
		}
		// A curve is sent whole in a viewer's first event (snapshotLocked)
		// and when it was thinned, else by its new points.
		key := "points/" + id
		switch {
		case hist.reset:
			hist.reset = false
			b, _ := json.Marshal(hist.points)
			msg.Set[key] = b
		case len(hist.points) > hist.sent:
			msg.Append[key] = slices.Clone(hist.points[hist.sent:])
		}
		hist.sent = len(hist.points)
	}
	for id := range h.jobs {
		if seen[id] {
			continue
		}
		delete(h.jobs, id)
		delete(h.stored, id)
		for _, p := range jobSections {
			if _, ok := h.sections[p+id]; ok || p == "points/" {
				delete(h.sections, p+id)
				msg.Del = append(msg.Del, p+id)
			}
		}
	}
	h.stats.Builds++
	h.stats.LastBuildMs = float64(time.Since(begin).Microseconds()) / 1000
	h.stats.MaxBuildMs = max(h.stats.MaxBuildMs, h.stats.LastBuildMs)
	if len(msg.Set) == 0 && len(msg.Del) == 0 && len(msg.Append) == 0 {
		return
	}
	h.seq++
	msg.Seq = h.seq
	if len(msg.Append) == 0 {
		msg.Append = nil
	}
	// Each scope's part, encoded once for all its viewers; nothing for a
	// scope the change does not touch.
	encoded := map[string][]byte{}
	encode := func(scope string) []byte {
		if b, ok := encoded[scope]; ok {
			return b
		}
		m := msg.filter(scope)
		var b []byte
		if len(m.Set) > 0 || len(m.Del) > 0 || len(m.Append) > 0 {
			var err error
			if b, err = json.Marshal(m); err != nil {
				h.log.Warn("dashboard: message not encoded", "err", err)
			}
		}
		encoded[scope] = b
		if b != nil {
			h.stats.Messages++
			h.stats.LastBytes = len(b)
			h.stats.MaxBytes = max(h.stats.MaxBytes, len(b))
		}
		return b
	}
	for sub := range h.subs {
		b := encode(sub.scope)
		if b == nil {
			continue
		}
		select {
		case sub.ch <- b:
			h.stats.BytesSent += int64(len(b))
		default:
			// Behind by a buffer's worth: dropped, it starts again whole.
			delete(h.subs, sub)
			close(sub.ch)
			h.stats.Dropped++
		}
	}
}

// truncateOutput keeps the end of an output longer than maxOutput.
func truncateOutput(s string) string {
	if len(s) <= maxOutput {
		return s
	}
	return "[...]\n" + s[len(s)-maxOutput:]
}

// snapshotLocked is the model as a message, the part scope receives.
// The caller holds h.mu.
func (h *webHub) snapshotLocked(scope string) []byte {
	msg := webMessage{Seq: h.seq, Reset: true, Set: map[string]json.RawMessage{}}
	for k, v := range h.sections {
		if inScope(scope, k) {
			msg.Set[k] = v
		}
	}
	for id, hist := range h.jobs {
		if inScope(scope, "points/"+id) {
			b, _ := json.Marshal(hist.points[:hist.sent])
			msg.Set["points/"+id] = b
		}
	}
	b, _ := json.Marshal(msg)
	h.stats.SnapshotSize = len(b)
	return b
}

// snapshot is the model as a message, the part scope receives.
func (h *webHub) snapshot(scope string) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snapshotLocked(scope)
}

// subscribe returns the model, the part scope receives (inScope), and a
// viewer's subscription to the messages that follow it. The model is
// rebuilt first: without viewers it is kept once a second, and a page
// whose snapshot was a second old would redraw every node that changed
// in that second as its first update (a job that started: 2,048 nodes).
func (h *webHub) subscribe(scope string) (*webSub, []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rebuildLocked(time.Now())
	sub := &webSub{ch: make(chan []byte, 64), scope: scope}
	h.subs[sub] = struct{}{}
	select {
	case h.joined <- struct{}{}:
	default:
	}
	h.stats.Viewers = len(h.subs)
	return sub, h.snapshotLocked(scope)
}

// unsubscribe ends a viewer's subscription.
func (h *webHub) unsubscribe(sub *webSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[sub]; ok {
		delete(h.subs, sub)
		close(sub.ch)
	}
	h.stats.Viewers = len(h.subs)
}

// closeAll ends every subscription.
func (h *webHub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		delete(h.subs, sub)
		close(sub.ch)
	}
}

// section returns one section's JSON, or nil.
func (h *webHub) section(key string) json.RawMessage {
	h.mu.Lock()
	defer h.mu.Unlock()
	if strings.HasPrefix(key, "points/") {
		if hist := h.jobs[strings.TrimPrefix(key, "points/")]; hist != nil {
			b, _ := json.Marshal(hist.points[:hist.sent])
			return b
		}
		return nil
	}
	return h.sections[key]
}

// pool returns the node rows, sorted by failure domain and name.
func (h *webHub) pool() []webNode {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Collect(maps.Values(h.nodes))
	slices.SortFunc(out, func(a, b webNode) int {
		if c := strings.Compare(a.Domain, b.Domain); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// jobIDs returns the jobs the model holds, in submission order.
func (h *webHub) jobIDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	type row struct {
		id    string
		order int64
	}
	var rows []row
	for id := range h.jobs {
		var head struct {
			Order int64 `json:"order"`
		}
		json.Unmarshal(h.sections["job/"+id], &head)
		rows = append(rows, row{id, head.Order})
	}
	slices.SortFunc(rows, func(a, b row) int { return int(a.order - b.order) })
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

// statsNow returns the hub's costs so far.
func (h *webHub) statsNow() webStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.stats
	s.Viewers = len(h.subs)
	return s
}
