package coordinator

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// cache is one coordinator's view of everything under the prefix: listed
// once, then kept current by one etcd watch that starts at the list's
// revision + 1 (listed again when etcd has compacted past it, or the watch
// breaks). Every value is decoded once, when its event arrives. Agents'
// Watch streams, Status and the leader all read it; none of them reads
// etcd per event.
//
// # Concurrency
//
// run is the only writer; every other method may be called from any
// goroutine. Messages handed out are shared and must not be modified.
type cache struct {
	cli *clientv3.Client
	k   keys
	log *slog.Logger

	mu    sync.RWMutex
	rev   int64 // the revision the view is at; 0 until the first list
	nodes map[string]nodeEntry
	// pools indexes the nodes that have a gossip address by their failure
	// domain (gpucoordpb.FailureDomain): the members of each domain's pool.
	pools map[string]map[string]struct{}
	// conns holds the nodes whose agent has a Watch stream open (the value
	// names the stream), so that a node without one is disconnected.
	conns   map[string]string
	nodePol map[string]nodePolicy
	jobs    map[string]*jobEntry
	// candidates are the election's keys: the one created first leads.
	candidates map[string]candidate
	holder     map[string]string // node -> the running job whose generation holds it
	// holds is, for each node an unfinished job's generation has, that
	// job (rebuildHolds); gensRev is the generations key's revision, which
	// the transaction of every generation compares (generationTxn), so
	// that no two unfinished jobs' generations share a node.
	holds   map[string]string
	gensRev int64
	// fences are revoked nodes' latest deadlines, by node; goneLease is
	// the lease each node's key had when it was last seen deleted (since
	// the last listing).
	fences    map[string]fence
	goneLease map[string]int64
	// assigned is each running job's assignment, kept while it does not
	// change, with each node's part made once for its stream; empty is a
	// node's without a job. assignRev is the revision of the last change.
	assigned  map[string]*jobAssignment
	empty     encoded
	live      []string // the jobs not ended (Assignment.live_jobs)
	assignRev int64
	changed   chan struct{} // closed when an assignment may have changed
	// routes is how each running job's member gets its job's changes
	// (routeOf), and routeWake the channels of the members' streams that
	// wait for theirs to change (memberRoute), closed when it does.
	// routeMu guards routeWake; c.mu is taken before it.
	routes    map[string]route
	routeMu   sync.Mutex
	routeWake map[string]chan struct{}
	advanced  chan struct{} // closed when rev moves
	notify    func(jobs []string, pool bool)
	// ring is the gossip pools' keys.
	ring keyring
	// poolVer counts the changes of nodes, conns, nodePol and holds; snap
	// is the pool as the leader's views share it (view), made at most
	// once a change: at 16,384 nodes each decision copied four maps of
	// 16,384 entries (about 20 ms and 4.4 MB), five times a second with
	// the recheck of compute times. snapMu serializes its making among
	// readers (writers hold mu).
	poolVer uint64
	snapMu  sync.Mutex
	snap    *poolSnap
}

// poolSnap is the pool a view holds, shared by every view made while
// the pool does not change: no one writes to its maps.
type poolSnap struct {
	ver        uint64
	nodes      map[string]*pb.Node
	connected  map[string]bool
	busy       map[string]string
	nodePolicy map[string]nodePolicy
}

// nodeEntry is a registered node and its key's create revision (a node
// that registered again has a new one) and lease.
type nodeEntry struct {
	node    *pb.Node
	created int64
	lease   int64
}

// jobEntry is everything the prefix holds about one job, decoded.
type jobEntry struct {
	spec     *pb.JobSpec
	created  int64 // the spec's create revision: submission order
	state    *pb.JobState
	stateRev int64
	gen      *pb.Generation
	genRev   int64
	policy   jobPolicy
	boots    map[int64]*pb.Bootstrap
	step     *pb.Step
	commit   *pb.Step
	commitRv int64 // the commit's mod revision
	open     int64 // the newest generation opened
	// stopped is, by node, the generation below which it runs no rank.
	stopped map[string]int64
	backup  *pb.Step
	// stored is each node's Stored record, and storedN how many records
	// hold each (generation, step): a commit is looked for only when a
	// step's count reaches the members', so a report costs no read of
	// every record. The records are kept in blocks (a key each, by the
	// block's relay): a node's is the one of the block written last that
	// has it (storedAt, its revision).
	stored   map[string]*pb.Stored
	storedN  map[[2]int64]int
	storedAt map[string]storedSource
	blocks   map[string]storedBlock
	exits    map[int64]map[int32]exitKV
	// times holds, per generation, each coordinator's summary of its
	// nodes' compute times, with the revision that wrote it.
	times      map[int64]map[string]timesKV
	stragglers *pb.Stragglers
}

// storedSource is the block a node's record was read from, at its
// revision.
type storedSource struct {
	relay string
	rev   int64
}

// storedBlock is a block's records and the revision that wrote them.
type storedBlock struct {
	rev   int64
	nodes map[string]*pb.Stored
}

type timesKV struct {
	rev   int64
	batch *pb.TimesSummary
}

type candidate struct {
	name    string
	created int64
}

type exitKV struct {
	rev int64
	e   *pb.RankExit
}

func newCache(cli *clientv3.Client, k keys, log *slog.Logger) *cache {
	return &cache{cli: cli, k: k, log: log, changed: make(chan struct{}), advanced: make(chan struct{})}
}

// setNotify sets the function told, after each batch of events, which jobs
// a decision may depend on and whether the pool changed; nil for none. It
// is called without the cache's lock held and must not block.
func (c *cache) setNotify(f func(jobs []string, pool bool)) {
	c.mu.Lock()
	c.notify = f
	c.mu.Unlock()
}

// run keeps the view current until ctx ends.
func (c *cache) run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := c.listAndWatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("etcd watch ended: listing again", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	return nil
}

// listAndWatch lists the prefix, then applies its watch from the list's
// revision + 1 until the watch fails.
func (c *cache) listAndWatch(ctx context.Context) error {
	resp, err := c.cli.Get(ctx, string(c.k), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	c.reset(resp.Header.Revision, resp.Kvs)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := c.cli.Watch(clientv3.WithRequireLeader(wctx), string(c.k), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range w {
		if wr.CompactRevision != 0 {
			return rpctypes.ErrCompacted
		}
		if err := wr.Err(); err != nil {
			return err
		}
		c.apply(viewRev(wr), wr.Events)
	}
	return errors.New("watch closed")
}

// viewRev is the revision the view is at once wr is applied: that of its
// last event. Not the response's header: while a watch catches up, etcd
// sends the events in batches whose header carries the store's newest
// revision, ahead of the events delivered so far. A progress
// notification (no events) is sent only once the watch has caught up,
// and its header is the revision reached; any other response without
// events moves nothing (0).
func viewRev(wr clientv3.WatchResponse) int64 {
	if n := len(wr.Events); n > 0 {
		return wr.Events[n-1].Kv.ModRevision
	}
	if wr.IsProgressNotify() {
		return wr.Header.Revision
	}
	return 0
}

// reset replaces the view with a listing at rev.
func (c *cache) reset(rev int64, kvs []*mvccpb.KeyValue) {
	c.mu.Lock()
	c.nodes, c.conns, c.nodePol, c.jobs = map[string]nodeEntry{}, map[string]string{}, map[string]nodePolicy{}, map[string]*jobEntry{}
	c.pools = map[string]map[string]struct{}{}
	c.candidates, c.holds, c.fences, c.goneLease, c.gensRev = map[string]candidate{}, map[string]string{}, map[string]fence{}, map[string]int64{}, 0
	c.poolVer++
	for _, kv := range kvs {
		c.put(kv)
	}
	c.rebuildHolds()
	ids := c.ids()
	c.finish(rev, true)
	notify := c.notify
	c.mu.Unlock()
	if notify != nil {
		notify(ids, true)
	}
}

// apply adds one watch response's events at rev.
func (c *cache) apply(rev int64, evs []*clientv3.Event) {
	c.mu.Lock()
	dirty := map[string]bool{}
	pool, assign, holders := false, false, false
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete {
			c.del(key)
		} else {
			c.put(ev.Kv)
		}
		switch id, field := c.jobKey(key); {
		case id != "":
			if affectsDecision(field) {
				dirty[id] = true
			}
			holders = holders || field == "spec" || field == "state" || field == "generation"
			assign = assign || field == "spec" || field == "state" || field == "generation" || field == "open" || strings.HasPrefix(field, "bootstrap/")
		case strings.HasPrefix(key, c.k.leader()+"/"):
		case key == c.k.gossipKey():
			assign = true
		case strings.HasPrefix(key, c.k.fences()):
			pool = true
		default:
			pool = pool || strings.HasPrefix(key, c.k.nodes()) || strings.HasPrefix(key, c.k.conns()) || strings.HasPrefix(key, c.k.nodePolicies())
		}
	}
	// Another job's nodes taken or released change every job's decision.
	if holders && c.rebuildHolds() {
		pool, assign = true, true
	}
	if pool {
		c.poolVer++
	}
	var ids []string
	if pool {
		ids = c.ids()
	} else {
		for id := range dirty {
			ids = append(ids, id)
		}
	}
	c.finish(rev, assign)
	notify := c.notify
	c.mu.Unlock()
	if notify != nil && (len(ids) > 0 || pool) {
		notify(ids, pool)
	}
}

// gossipKeys returns the pool's keys as etcd holds them (nil before the
// first read).
func (c *cache) gossipKeys() keyring {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.ring
}

// affectsDecision reports whether a change of a job's field can change
// what the leader decides for it. Progress, times and the leader's own
// stragglers and policy do not: stragglers are checked on a timer, and a
// grow-back waits for a commit, which arrives with its progress.
func affectsDecision(field string) bool {
	switch {
	case field == "spec", field == "state", field == "generation", field == "commit", field == "backup", field == "open",
		strings.HasPrefix(field, "exits/"), strings.HasPrefix(field, "stopped/"), strings.HasPrefix(field, "stoppedb/"):
		return true
	}
	return false
}

// ids lists the jobs that have not ended.
func (c *cache) ids() []string {
	var out []string
	for id, j := range c.jobs {
		if j.spec != nil && !pb.Terminal(j.state) {
			out = append(out, id)
		}
	}
	return out
}

// finish moves the view to rev and wakes whoever waits for it; when assign,
// an assignment may have changed.
func (c *cache) finish(rev int64, assign bool) {
	c.rev = max(c.rev, rev)
	if assign {
		c.assignRev = rev
		c.reindex()
	}
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// rebuildHolds derives holds from the unfinished jobs' generations and
// reports whether it changed. The caller holds c.mu for writing.
func (c *cache) rebuildHolds() bool {
	holds := make(map[string]string, len(c.holds))
	for id, j := range c.jobs {
		if j.spec == nil || j.gen == nil || pb.Terminal(j.state) {
			continue
		}
		for _, m := range j.gen.Members {
			holds[m.Node] = id
		}
	}
	if maps.Equal(holds, c.holds) {
		return false
	}
	c.holds = holds
	return true
}

// reindex rebuilds the node -> running job index and wakes the Watch
// streams.
func (c *cache) reindex() {
	prev := c.assigned
	c.holder, c.assigned = map[string]string{}, map[string]*jobAssignment{}
	keys := c.ring.keys()
	var live []string
	for id, j := range c.jobs {
		if j.spec != nil && !pb.Terminal(j.state) {
			live = append(live, id)
		}
	}
	slices.Sort(live)
	for id, j := range c.jobs {
		if j.spec == nil || j.gen == nil || j.state.GetPhase() != pb.JobState_RUNNING {
			continue
		}
		// A node runs the one unfinished job whose generation has it
		// (etcd's transactions keep two from sharing it).
		for _, m := range j.gen.Members {
			if c.holds[m.Node] == id {
				c.holder[m.Node] = id
			}
		}
		a := &pb.Assignment{Job: id, Spec: j.spec, Generation: j.gen, Open: j.open >= j.gen.Number, Revision: c.assignRev, GossipKeys: keys, LiveJobs: live}
		if a.Open {
			// Rank 0's node may report its address before the generation
			// opens (it bootstraps while the earlier ranks stop): it goes
			// out with the opening, one message a node, and no node waits
			// on it then.
			boot := j.boots[j.gen.Number]
			a.Master, a.Probe, a.StoreSecret = boot.GetMaster(), boot.GetProbe(), boot.GetStoreSecret()
		}
		if ja := prev[id]; ja != nil && ja.same(a) {
			c.assigned[id] = ja
		} else {
			c.assigned[id] = newJobAssignment(a)
		}
	}
	c.live = live
	c.empty = mustMarshal(&pb.Assignment{Revision: c.assignRev, GossipKeys: keys, LiveJobs: live})
	routes := make(map[string]route, len(c.routes))
	for node, id := range c.holder {
		routes[node] = c.assigned[id].routeOf(node)
	}
	c.routeMu.Lock()
	for node, ch := range c.routeWake {
		if routes[node] != c.routes[node] {
			close(ch)
			delete(c.routeWake, node)
		}
	}
	c.routeMu.Unlock()
	c.routes = routes
	close(c.changed)
	c.changed = make(chan struct{})
}

// jobKey splits a key under jobs/ into the job's id and the field; "" for
// another key.
func (c *cache) jobKey(key string) (id, field string) {
	rest, ok := strings.CutPrefix(key, c.k.jobs())
	if !ok {
		return "", ""
	}
	id, field, _ = strings.Cut(rest, "/")
	return id, field
}

// put decodes one key into the view. A value that does not decode is
// logged and left out: nothing but gpucoord writes under the prefix.
func (c *cache) put(kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	bad := func(err error) {
		if err != nil {
			c.log.Warn("undecodable value in etcd: ignored", "key", key, "err", err)
		}
	}
	switch {
	case key == c.k.gossipKey():
		r, err := parseKeyring(kv.Value)
		if err != nil {
			bad(err)
			return
		}
		c.ring = r
	case strings.HasPrefix(key, c.k.leader()+"/"):
		c.candidates[key] = candidate{name: string(kv.Value), created: kv.CreateRevision}
	case strings.HasPrefix(key, c.k.nodes()):
		n := &pb.Node{}
		if err := decode(kv.Value, n); err != nil {
			bad(err)
			return
		}
		name := strings.TrimPrefix(key, c.k.nodes())
		c.unpool(name)
		c.nodes[name] = nodeEntry{node: n, created: kv.CreateRevision, lease: kv.Lease}
		delete(c.goneLease, name)
		if n.GetGossipAddr() != "" {
			d := pb.FailureDomain(n)
			if c.pools[d] == nil {
				c.pools[d] = map[string]struct{}{}
			}
			c.pools[d][name] = struct{}{}
		}
	case strings.HasPrefix(key, c.k.conns()):
		// A key of a stream closed, or of a fenced run, serves no
		// stream: the node is not connected.
		if v := string(kv.Value); connOpen(v) {
			c.conns[strings.TrimPrefix(key, c.k.conns())] = v
		} else {
			delete(c.conns, strings.TrimPrefix(key, c.k.conns()))
		}
	case key == c.k.generations():
		c.gensRev = kv.ModRevision
	case strings.HasPrefix(key, c.k.fences()):
		var f fence
		bad(decodeJSON(kv.Value, &f))
		c.fences[strings.TrimPrefix(key, c.k.fences())] = f
	case strings.HasPrefix(key, c.k.nodePolicies()):
		var p nodePolicy
		bad(decodeJSON(kv.Value, &p))
		c.nodePol[strings.TrimPrefix(key, c.k.nodePolicies())] = p
	default:
		id, field := c.jobKey(key)
		if id == "" {
			return
		}
		j := c.jobs[id]
		if j == nil {
			j = &jobEntry{boots: map[int64]*pb.Bootstrap{}, exits: map[int64]map[int32]exitKV{}, times: map[int64]map[string]timesKV{}}
			c.jobs[id] = j
		}
		c.putJob(j, field, kv, bad)
	}
}

func (c *cache) putJob(j *jobEntry, field string, kv *mvccpb.KeyValue, bad func(error)) {
	switch {
	case field == "spec":
		s := &pb.JobSpec{}
		if err := decode(kv.Value, s); err != nil {
			bad(err)
			return
		}
		j.spec, j.created = s, kv.CreateRevision
	case field == "state":
		s := &pb.JobState{}
		bad(decode(kv.Value, s))
		j.state, j.stateRev = s, kv.ModRevision
	case field == "generation":
		g, err := decodeGeneration(kv.Value)
		if err != nil {
			bad(err)
			return
		}
		j.gen, j.genRev = g, kv.ModRevision
	case field == "policy":
		var p jobPolicy
		bad(decodeJSON(kv.Value, &p))
		j.policy = p
	case field == "progress":
		s := &pb.Step{}
		bad(decode(kv.Value, s))
		j.step = s
	case field == "commit":
		s := &pb.Step{}
		bad(decode(kv.Value, s))
		j.commit, j.commitRv = s, kv.ModRevision
	case field == "open":
		n, err := strconv.ParseInt(string(kv.Value), 10, 64)
		bad(err)
		j.open = n
	case strings.HasPrefix(field, "stopped/"):
		s := &pb.Stopped{}
		if err := decode(kv.Value, s); err != nil {
			bad(err)
			return
		}
		if j.stopped == nil {
			j.stopped = map[string]int64{}
		}
		node := strings.TrimPrefix(field, "stopped/")
		j.stopped[node] = max(j.stopped[node], s.Below)
	case strings.HasPrefix(field, "stoppedb/"):
		b := &pb.StoppedBucket{}
		if err := decode(kv.Value, b); err != nil {
			bad(err)
			return
		}
		if j.stopped == nil {
			j.stopped = map[string]int64{}
		}
		// A node's record only grows, in its bucket's key or its own
		// (written by earlier versions).
		for node, below := range b.Below {
			j.stopped[node] = max(j.stopped[node], below)
		}
	case strings.HasPrefix(field, "stored/"):
		b := &pb.StoredBlock{}
		if err := decode(kv.Value, b); err != nil {
			bad(err)
			return
		}
		j.setBlock(strings.TrimPrefix(field, "stored/"), kv.ModRevision, b.Nodes)
	case field == "backup":
		s := &pb.Step{}
		bad(decode(kv.Value, s))
		j.backup = s
	case field == "stragglers":
		s := &pb.Stragglers{}
		bad(decode(kv.Value, s))
		j.stragglers = s
	case strings.HasPrefix(field, "bootstrap/"):
		g, err := strconv.ParseInt(strings.TrimPrefix(field, "bootstrap/"), 10, 64)
		b := &pb.Bootstrap{}
		if err == nil {
			err = decode(kv.Value, b)
		}
		if err != nil {
			bad(err)
			return
		}
		j.boots[g] = b
	case strings.HasPrefix(field, "exits/"):
		g, _, ok := genAndName(field)
		e := &pb.RankExit{}
		if err := decode(kv.Value, e); !ok || err != nil {
			bad(err)
			return
		}
		if j.exits[g] == nil {
			j.exits[g] = map[int32]exitKV{}
		}
		j.exits[g][e.Rank] = exitKV{rev: kv.ModRevision, e: e}
	case strings.HasPrefix(field, "times/"):
		g, coord, ok := genAndName(field)
		t := &pb.TimesSummary{}
		if err := decode(kv.Value, t); !ok || err != nil {
			bad(err)
			return
		}
		if j.times[g] == nil {
			j.times[g] = map[string]timesKV{}
		}
		j.times[g][coord] = timesKV{rev: kv.ModRevision, batch: t}
	}
}

// setBlock replaces the records of relay's block with nodes, written at
// rev (none: the block's key is gone). A node whose record came from the
// block has none until a block has it again; one whose record a later
// block wrote keeps that (a listing comes in key order, not revision
// order).
func (j *jobEntry) setBlock(relay string, rev int64, nodes map[string]*pb.Stored) {
	if j.blocks == nil {
		j.blocks, j.storedAt = map[string]storedBlock{}, map[string]storedSource{}
	}
	for node := range j.blocks[relay].nodes {
		if j.storedAt[node].relay == relay {
			j.setStored(node, nil)
			delete(j.storedAt, node)
		}
	}
	if nodes == nil {
		delete(j.blocks, relay)
		return
	}
	j.blocks[relay] = storedBlock{rev: rev, nodes: nodes}
	for node, r := range nodes {
		if at, ok := j.storedAt[node]; ok && at.rev > rev {
			continue
		}
		j.setStored(node, r)
		j.storedAt[node] = storedSource{relay: relay, rev: rev}
	}
}

// block is the records of relay's block of job and the revision that
// wrote them (0: none), for a writer to add to.
func (c *cache) block(job, relay string) (map[string]*pb.Stored, int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	b := c.jobs[job].blockOf(relay)
	return maps.Clone(b.nodes), b.rev
}

func (j *jobEntry) blockOf(relay string) storedBlock {
	if j == nil {
		return storedBlock{}
	}
	return j.blocks[relay]
}

// setStored replaces node's Stored record (nil: removes it), keeping the
// counts of each (generation, step).
func (j *jobEntry) setStored(node string, r *pb.Stored) {
	if j.stored == nil {
		j.stored, j.storedN = map[string]*pb.Stored{}, map[[2]int64]int{}
	}
	for _, x := range j.stored[node].GetSteps() {
		k := [2]int64{x.Generation, x.Step}
		if j.storedN[k]--; j.storedN[k] <= 0 {
			delete(j.storedN, k)
		}
	}
	if r == nil {
		delete(j.stored, node)
		return
	}
	j.stored[node] = r
	for _, x := range r.Steps {
		j.storedN[[2]int64{x.Generation, x.Step}]++
	}
}

// nextCommit is the commit the stored records make in job's generation g
// (commitOf), with the revision of the commit it replaces; nil when no
// step after the last commit is stored by as many nodes as g has members
// (then without looking at each member's record).
func (c *cache) nextCommit(job string, g *pb.Generation) (*pb.Step, int64, int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.jobs[job]
	if e == nil {
		return nil, 0, 0
	}
	var committed int64
	if e.commit != nil {
		committed = e.commit.Step
	}
	due := false
	for k, n := range e.storedN {
		if k[0] == g.Number && n >= len(g.Members) && (k[1] > committed || e.commit.GetGeneration() < g.Number) {
			due = true
			break
		}
	}
	if !due {
		return nil, committed, e.commitRv
	}
	next := commitOf(g, e.stored, e.commit)
	if next != nil && e.commit != nil {
		// The commits before it whose steps may still be kept: where a
		// generation falls back when this one cannot be restored.
		keep := int(e.spec.GetKeepCheckpoints())
		if keep == 0 {
			keep = 2 // the agents' and the engine's default
		}
		prev := proto.Clone(e.commit).(*pb.Step)
		prev.Earlier = nil
		next.Earlier = append([]*pb.Step{prev}, e.commit.Earlier...)
		next.Earlier = next.Earlier[:min(len(next.Earlier), keep-1, maxEarlier)]
	}
	// Each holder by the run of its agent registered now, which stored the
	// files: one that registers again later holds none of them.
	for _, cp := range next.GetCopies() {
		cp.Instances = make([]string, len(cp.Holders))
		for i, h := range cp.Holders {
			cp.Instances[i] = c.nodes[h].node.GetInstance()
		}
	}
	return next, committed, e.commitRv
}

// maxEarlier bounds the earlier commits a commit names.
const maxEarlier = 16

// genAndName splits "exits/<gen>/<rank>" or "times/<gen>/<node>".
func genAndName(field string) (int64, string, bool) {
	parts := strings.Split(field, "/")
	if len(parts) != 3 {
		return 0, "", false
	}
	g, err := strconv.ParseInt(parts[1], 10, 64)
	return g, parts[2], err == nil
}

// del removes one key from the view.
func (c *cache) del(key string) {
	switch {
	case strings.HasPrefix(key, c.k.leader()+"/"):
		delete(c.candidates, key)
	case strings.HasPrefix(key, c.k.nodes()):
		name := strings.TrimPrefix(key, c.k.nodes())
		c.unpool(name)
		if e, ok := c.nodes[name]; ok {
			c.goneLease[name] = e.lease
		}
		delete(c.nodes, name)
	case strings.HasPrefix(key, c.k.conns()):
		delete(c.conns, strings.TrimPrefix(key, c.k.conns()))
	case key == c.k.generations():
		c.gensRev = 0
	case strings.HasPrefix(key, c.k.fences()):
		delete(c.fences, strings.TrimPrefix(key, c.k.fences()))
	case strings.HasPrefix(key, c.k.nodePolicies()):
		delete(c.nodePol, strings.TrimPrefix(key, c.k.nodePolicies()))
	default:
		id, field := c.jobKey(key)
		j := c.jobs[id]
		if j == nil {
			return
		}
		switch {
		case field == "spec":
			delete(c.jobs, id) // the job is being forgotten: its keys go in one transaction
		case strings.HasPrefix(field, "stored/"):
			j.setBlock(strings.TrimPrefix(field, "stored/"), 0, nil)
		case field == "stragglers":
			j.stragglers = nil
		case field == "policy":
			j.policy = jobPolicy{}
		case field == "commit":
			j.commit, j.commitRv = nil, 0
		case strings.HasPrefix(field, "stopped/"):
			delete(j.stopped, strings.TrimPrefix(field, "stopped/"))
		case strings.HasPrefix(field, "bootstrap/"):
			if g, err := strconv.ParseInt(strings.TrimPrefix(field, "bootstrap/"), 10, 64); err == nil {
				delete(j.boots, g)
			}
		case strings.HasPrefix(field, "exits/"), strings.HasPrefix(field, "times/"):
			// A replaced generation's keys, deleted by a later generation.
			if g, name, ok := genAndName(field); ok && strings.HasPrefix(field, "exits/") {
				if r, err := strconv.Atoi(name); err == nil {
					delete(j.exits[g], int32(r))
				}
				if len(j.exits[g]) == 0 {
					delete(j.exits, g)
				}
			} else if ok {
				delete(j.times[g], name)
				if len(j.times[g]) == 0 {
					delete(j.times, g)
				}
			}
		}
	}
}

// unpool takes node out of its domain's pool index. The caller holds c.mu
// for writing.
func (c *cache) unpool(node string) {
	e, ok := c.nodes[node]
	if !ok {
		return
	}
	d := pb.FailureDomain(e.node)
	delete(c.pools[d], node)
	if len(c.pools[d]) == 0 {
		delete(c.pools, d)
	}
}

// sync brings the view to etcd's revision at the call, or ctx ends: every
// write made before the call is in the view when it returns. The revision
// is a one-key read's header; the watch, once it has delivered every event
// up to it, says so in a progress notification it is asked for (etcd
// sends one only to a watch that has caught up). Nothing under the prefix
// is read or sorted.
func (c *cache) sync(ctx context.Context) error {
	resp, err := c.cli.Get(ctx, c.k.leader(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	rev := resp.Header.Revision
	ask := time.NewTicker(50 * time.Millisecond)
	defer ask.Stop()
	for {
		c.mu.RLock()
		at, ch := c.rev, c.advanced
		c.mu.RUnlock()
		if at >= rev {
			return nil
		}
		// The watch's stream is the one of the same metadata (listAndWatch
		// requires a leader).
		if err := c.cli.RequestProgress(clientv3.WithRequireLeader(ctx)); err != nil && ctx.Err() == nil {
			c.log.Debug("asking the watch for its progress", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-ask.C:
		}
	}
}

// waitRev blocks until the view is at rev or later, or ctx ends.
func (c *cache) waitRev(ctx context.Context, rev int64) error {
	for {
		c.mu.RLock()
		at, ch := c.rev, c.advanced
		c.mu.RUnlock()
		if at >= rev && at > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// nodeLease is node's lease and its agent's instance as the view holds
// them; false when the node is not registered in the view.
func (c *cache) nodeLease(node string) (int64, string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.nodes[node]
	return e.lease, e.node.GetInstance(), ok
}

// registered is node's registration as the view holds it; false when the
// node is not registered in the view. The Node is shared: read only.
func (c *cache) registered(node string) (nodeEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.nodes[node]
	return e, ok
}

// poolOf returns the gossip addresses of at most most members of domain's
// pool other than except, in no set order (Go's map order: a different
// few each call), and how many members the pool has (except included,
// when it is one).
func (c *cache) poolOf(domain, except string, most int) (seeds []string, members int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	pool := c.pools[domain]
	for name := range pool {
		if len(seeds) == most {
			break
		}
		if name != except {
			seeds = append(seeds, c.nodes[name].node.GetGossipAddr())
		}
	}
	return seeds, len(pool)
}

// assignment returns what node should run now (the generation of the
// running job that holds it, or an empty Assignment), its wire form, and a
// channel closed when that may change. Both are shared: read only.
func (c *cache) assignment(node string) (*pb.Assignment, encoded, <-chan struct{}) {
	c.mu.RLock()
	ja, changed := c.assigned[c.holder[node]], c.changed
	if ja == nil {
		defer c.mu.RUnlock()
		return &pb.Assignment{Revision: c.assignRev, GossipKeys: c.ring.keys(), LiveJobs: c.live}, c.empty, changed
	}
	c.mu.RUnlock()
	// The node's part is made outside the cache's lock (ja does not
	// change; a change since closes changed): 16,384 streams make theirs
	// at once after a new generation, while the watch applies events.
	a, wire := ja.forNode(node)
	return a, wire, changed
}

// memberRoute is what a member's stream looks at first after a change,
// all of one moment of the cache: node's relay when its job's changes may
// go through one (routeOf), and then a channel closed once that route
// moves (routeWake); whether node's job opened before rank 0's node
// reported its address and node does not run rank 0 (jobAssignment's
// awaitsMaster: asked before assignment, so that the 16,383 streams of
// such a job make no part they would not send); and the channel closed
// at the next change.
func (c *cache) memberRoute(node string) (via string, waits bool, moved, changed <-chan struct{}) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r := c.routes[node]
	if ja := c.assigned[r.job]; ja != nil {
		waits = ja.awaitsMaster(node)
	}
	if r.via == "" {
		return "", waits, nil, c.changed
	}
	c.routeMu.Lock()
	defer c.routeMu.Unlock()
	ch := c.routeWake[node]
	if ch == nil {
		if c.routeWake == nil {
			c.routeWake = map[string]chan struct{}{}
		}
		ch = make(chan struct{})
		c.routeWake[node] = ch
	}
	return r.via, waits, ch, c.changed
}

// view is one job and the pool as the cache holds them now, for decide:
// the job's fields of its current generation only, its own; the pool's
// maps (nodes, connected, busy, nodePolicy) shared with the other views
// of the same pool, read only.
func (c *cache) view(id string) (*view, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.jobs[id]
	if e == nil || e.spec == nil {
		return nil, false
	}
	s := c.poolSnapshot()
	v := &view{job: e.job(), nodes: s.nodes, connected: s.connected, busy: s.busy, nodePolicy: s.nodePolicy}
	v.gensRev = c.gensRev
	v.fences = maps.Clone(c.fences)
	for name, f := range v.fences {
		if lease, gone := c.goneLease[name]; gone && f.Window && f.Lease != 0 && f.Lease == lease {
			f.exact = true
			v.fences[name] = f
		}
	}
	return v, true
}

// poolSnapshot is the pool now, made once a change (poolVer). The caller
// holds c.mu for reading.
func (c *cache) poolSnapshot() *poolSnap {
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	if s := c.snap; s != nil && s.ver == c.poolVer {
		return s
	}
	s := &poolSnap{ver: c.poolVer, nodes: make(map[string]*pb.Node, len(c.nodes)), connected: make(map[string]bool, len(c.conns)),
		busy: maps.Clone(c.holds), nodePolicy: maps.Clone(c.nodePol)}
	for name, n := range c.nodes {
		s.nodes[name] = n.node
	}
	for name := range c.conns {
		s.connected[name] = true
	}
	if s.busy == nil {
		s.busy = map[string]string{}
	}
	if s.nodePolicy == nil {
		s.nodePolicy = map[string]nodePolicy{}
	}
	c.snap = s
	return s
}

// job builds the decision input of one job: its current generation's
// exits (in the order they were written) and times.
func (e *jobEntry) job() *job {
	j := &job{spec: e.spec, state: e.state, stateRev: e.stateRev, gen: e.gen, genRev: e.genRev, policy: e.policy,
		step: e.step, commit: e.commit, commitRev: e.commitRv, open: e.open, stopped: maps.Clone(e.stopped), backup: e.backup, created: e.created, exits: map[int32]*pb.RankExit{}}
	if j.state == nil {
		j.state = &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1}
	}
	if e.gen == nil {
		return j
	}
	g := e.gen.Number
	// A node that moved between coordinators is in several summaries
	// until the one it left drops it: the one written last has its newest
	// windows.
	batches := make([]timesKV, 0, len(e.times[g]))
	for _, b := range e.times[g] {
		batches = append(batches, b)
	}
	slices.SortFunc(batches, func(a, b timesKV) int { return int(a.rev - b.rev) })
	summaries := make([]*pb.TimesSummary, len(batches))
	for i, b := range batches {
		summaries[i] = b.batch
	}
	j.times = mergeTimes(summaries)
	if e.stragglers != nil && e.stragglers.Generation == g {
		j.stragglers = e.stragglers
	}
	ex := make([]exitKV, 0, len(e.exits[g]))
	for _, x := range e.exits[g] {
		ex = append(ex, x)
	}
	slices.SortFunc(ex, func(a, b exitKV) int { return int(a.rev - b.rev) })
	for _, x := range ex {
		j.exits[x.e.Rank] = x.e
		j.exitOrder = append(j.exitOrder, x.e.Rank)
	}
	return j
}

// jobsNow returns every job with a spec, in submission order, each as its
// current-generation view.
func (c *cache) jobsNow() []*job {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]*job, 0, len(c.jobs))
	for _, e := range c.jobs {
		if e.spec != nil {
			out = append(out, e.job())
		}
	}
	slices.SortFunc(out, func(a, b *job) int { return int(a.created - b.created) })
	return out
}

// pool returns the registered nodes, the connected ones, the leader and
// the revision.
func (c *cache) pool() (nodes map[string]*pb.Node, connected map[string]bool, leader string, rev int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	nodes, connected = make(map[string]*pb.Node, len(c.nodes)), make(map[string]bool, len(c.conns))
	for name, n := range c.nodes {
		nodes[name] = n.node
	}
	for name := range c.conns {
		connected[name] = true
	}
	var first candidate
	for _, cand := range c.candidates {
		if first.created == 0 || cand.created < first.created {
			first = cand
		}
	}
	return nodes, connected, first.name, c.rev
}

// revoked returns, for each node revoked by its pool's reports, the run
// its fence names (fences/<node>).
func (c *cache) revoked() map[string]string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]string, len(c.fences))
	for name, f := range c.fences {
		out[name] = f.Instance
	}
	return out
}

// jobOf returns one job's view and the revision, or false when there is
// no such job.
func (c *cache) jobOf(id string) (*job, int64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.jobs[id]
	if e == nil || e.spec == nil {
		return nil, c.rev, false
	}
	return e.job(), c.rev, true
}

// running reports whether gen is the current generation of job, and the
// job has not ended.
// timesOf returns the summaries of job's generation gen that coordinators
// other than name wrote, and the generation's ranks (0 when gen is not
// the job's current generation).
func (c *cache) timesOf(job string, gen int64, name string) ([]*pb.TimesSummary, int32) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.jobs[job]
	if e == nil {
		return nil, 0
	}
	var out []*pb.TimesSummary
	for coord, t := range e.times[gen] {
		if coord != name {
			out = append(out, t.batch)
		}
	}
	var world int32
	if e.gen.GetNumber() == gen {
		world = e.gen.GetWorld()
	}
	return out, world
}

func (c *cache) running(job string, gen int64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.jobs[job]
	return e != nil && e.spec != nil && e.gen.GetNumber() == gen && !pb.Terminal(e.state)
}

// generation returns job's current generation and its key's revision, or
// nil.
func (c *cache) generation(job string) (*pb.Generation, int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.jobs[job]
	if e == nil {
		return nil, 0
	}
	return e.gen, e.genRev
}

func mustMarshal(m proto.Message) encoded {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err) // only for messages that cannot be marshalled: a bug
	}
	return b
}

// committed is a job's last committed step as the cache holds it.
func (c *cache) committed(job string) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.jobs[job]; e != nil && e.commit != nil {
		return e.commit.Step
	}
	return 0
}
