package coordinator

import (
	"bytes"
	"slices"
	"sync"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// jobAssignment is one running job's assignment as the cache holds it:
// the whole generation's, and each member's part of it (Assignment's
// generation), made when the node's stream first asks and kept until the
// job's assignment changes. What a node receives so does not grow with
// the job's nodes.
type jobAssignment struct {
	whole    *pb.Assignment
	index    map[string]int // node -> its place among the members
	replicas [][]int        // member -> the members holding its replicas
	sources  [][]int        // member -> the members whose replicas it holds

	mu    sync.Mutex
	nodes map[string]nodeAssignment
}

// nodeAssignment is one node's assignment and its wire form.
type nodeAssignment struct {
	a    *pb.Assignment
	wire encoded
}

func newJobAssignment(a *pb.Assignment) *jobAssignment {
	g := a.Generation
	ja := &jobAssignment{whole: a, index: make(map[string]int, len(g.Members)), nodes: map[string]nodeAssignment{}}
	for i, m := range g.Members {
		ja.index[m.Node] = i
	}
	if pb.HeldCheckpoints(a.Spec) { // the agents replicate
		ja.replicas = pb.Replicas(g.Members, pb.ReplicaCount(a.Spec))
		ja.sources = pb.ReplicaSources(ja.replicas)
	}
	return ja
}

// same reports whether a would be the assignment ja holds (its revision
// aside): the same spec, generation and bootstrap, opened alike, with the
// same pool keys and live jobs.
func (ja *jobAssignment) same(a *pb.Assignment) bool {
	w := ja.whole
	return w.Spec == a.Spec && w.Generation == a.Generation && w.Open == a.Open && w.Master == a.Master && w.Probe == a.Probe &&
		bytes.Equal(w.StoreSecret, a.StoreSecret) && slices.EqualFunc(w.GossipKeys, a.GossipKeys, bytes.Equal) && slices.Equal(w.LiveJobs, a.LiveJobs)
}

// awaitsMaster says the generation opened before rank 0's node reported
// its address (a generation made open, with no earlier ranks to wait
// for), and node does not run rank 0: its agent does nothing with the
// generation until the address comes (it bootstraps before it
// prepares), so its stream sends it once, with the address. Opening a
// generation so costs one message a node, not two; rank 0's node gets
// both.
func (ja *jobAssignment) awaitsMaster(node string) bool {
	w := ja.whole
	if !w.Open || w.Master != "" {
		return false
	}
	i, ok := ja.index[node]
	return ok && w.Generation.Members[i].FirstRank != 0
}

// forNode is node's assignment: the whole one but for the generation,
// which is the node's view (pb.NodeView), with the node's place and the
// nodes it replicates to. It is made outside the lock: at a new
// generation every stream asks at once (16,384 of them), and made under
// it they would take turns on one core.
func (ja *jobAssignment) forNode(node string) (*pb.Assignment, encoded) {
	ja.mu.Lock()
	na, ok := ja.nodes[node]
	ja.mu.Unlock()
	if ok {
		return na.a, na.wire
	}
	i, ok := ja.index[node]
	if !ok {
		return ja.whole, mustMarshal(ja.whole) // not a member: cannot happen for a holder
	}
	w := ja.whole
	a := &pb.Assignment{Job: w.Job, Spec: w.Spec, Master: w.Master, Probe: w.Probe, Revision: w.Revision, StoreSecret: w.StoreSecret,
		GossipKeys: w.GossipKeys, LiveJobs: w.LiveJobs, Open: w.Open, GroupRank: int32(i), GroupWorld: int32(len(w.Generation.Members))}
	var sources []int
	if ja.replicas != nil {
		sources = ja.sources[i]
		for _, j := range ja.replicas[i] {
			a.Replicas = append(a.Replicas, w.Generation.Members[j].Node)
		}
	}
	if r := pb.Relay(i); r != i {
		a.Relay = w.Generation.Members[r].Node
	}
	a.Generation = pb.NodeView(w.Generation, i, ja.replicas, sources)
	na = nodeAssignment{a: a, wire: mustMarshal(a)}
	ja.mu.Lock()
	defer ja.mu.Unlock()
	if first, ok := ja.nodes[node]; ok {
		return first.a, first.wire // made by another stream of the node meanwhile
	}
	ja.nodes[node] = na
	return na.a, na.wire
}

// member is node's entry in generation g of job, found by the running
// job's index when g is the generation the cache runs (a report reads no
// list of thousands), else by looking through g; nil for none.
func (c *cache) member(job string, g *pb.Generation, node string) *pb.Member {
	c.mu.RLock()
	ja := c.assigned[job]
	c.mu.RUnlock()
	if ja != nil && ja.whole.Generation == g {
		if i, ok := ja.index[node]; ok {
			return g.Members[i]
		}
		return nil
	}
	for _, m := range g.GetMembers() {
		if m.Node == node {
			return m
		}
	}
	return nil
}

// relays says whether relay is the member that forwards node's reports in
// generation gen of job (Assignment.relay), as the running job's
// assignment says.
func (c *cache) relays(job string, gen int64, relay, node string) bool {
	r, ok := c.relayIn(job, gen, node)
	return ok && r == relay
}

// relayOf is the relay of node's block in generation gen of job: whose
// key its Stored record is kept under. The node itself when the cache
// runs no such generation.
func (c *cache) relayOf(job string, gen int64, node string) string {
	if r, ok := c.relayIn(job, gen, node); ok {
		return r
	}
	return node
}

// relayIn is node's relay in generation gen of job, if the cache runs
// that generation and node is in it.
func (c *cache) relayIn(job string, gen int64, node string) (string, bool) {
	c.mu.RLock()
	ja := c.assigned[job]
	c.mu.RUnlock()
	if ja == nil || ja.whole.Generation.GetNumber() != gen {
		return "", false
	}
	i, ok := ja.index[node]
	if !ok {
		return "", false
	}
	return ja.whole.Generation.Members[pb.Relay(i)].Node, true
}

// assignmentsChanged is closed once the running jobs' assignments change
// (a generation, a job started or ended).
func (c *cache) assignmentsChanged() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.changed
}

// runningMembers is each running job's generation's members, in order
// (shared: not to be changed).
func (c *cache) runningMembers() [][]*pb.Member {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([][]*pb.Member, 0, len(c.assigned))
	for _, ja := range c.assigned {
		out = append(out, ja.whole.Generation.Members)
	}
	return out
}

// throughRelay says whether relay, a block's first member, forwards to
// member of its block (window renewals, assignments): both have a node
// server. The one place of that rule.
func throughRelay(relay, member *pb.Member) bool {
	return relay.CheckpointAddr != "" && member.CheckpointAddr != ""
}

// route is how a member of a running job gets its job's changes: job's,
// through its block's relay via when via is not "" (throughRelay), else
// on its own stream.
type route struct {
	job, via string
}

// routeOf is node's route in ja's generation: its relay when node's
// assignment may go through it (node is not its block's relay, and the
// relay forwards to it).
func (ja *jobAssignment) routeOf(node string) route {
	r := route{job: ja.whole.Job}
	i, ok := ja.index[node]
	if !ok {
		return r
	}
	ms := ja.whole.Generation.Members
	if j := pb.Relay(i); j != i && throughRelay(ms[j], ms[i]) {
		r.via = ms[j].Node
	}
	return r
}

// block is relay's block's members after it, and relay's entry: none
// unless relay is the first of a block of ja's generation (ja may be nil).
func (ja *jobAssignment) block(relay string) (*pb.Member, []*pb.Member) {
	if ja == nil {
		return nil, nil
	}
	i, ok := ja.index[relay]
	ms := ja.whole.Generation.Members
	if !ok || pb.Relay(i) != i {
		return nil, nil
	}
	return ms[i], ms[i+1 : min(i+pb.RelayBlock, len(ms))]
}

// relayedBy is the members whose route goes through relay (routeOf).
func (c *cache) relayedBy(relay string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, members := c.assigned[c.holder[relay]].block(relay)
	var out []string
	for _, m := range members {
		if c.routes[m.Node].via == relay {
			out = append(out, m.Node)
		}
	}
	return out
}

// relayedMembers calls f, under the cache's lock, with each member of a
// running job whose job's changes may go through its relay (routeOf) and
// the revision of its assignment, but those that wait for rank 0's
// address (awaitsMaster: nothing is sent them yet).
func (c *cache) relayedMembers(f func(node string, rev int64)) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for node, r := range c.routes {
		if r.via == "" {
			continue
		}
		if ja := c.assigned[r.job]; !ja.awaitsMaster(node) {
			f(node, ja.whole.Revision)
		}
	}
}

// blockMember is a member a relay forwards the assignment of.
type blockMember struct {
	node, addr string
	wire       encoded
	rev        int64 // the assignment's revision
}

// relayBlock is the members whose assignments relay forwards now
// (throughRelay), with their assignments: none unless relay is the first
// of a block of a running job. A member that waits for rank 0's
// address (awaitsMaster) is left out: its stream sends nothing yet.
func (c *cache) relayBlock(relay string) []blockMember {
	c.mu.RLock()
	ja := c.assigned[c.holder[relay]]
	c.mu.RUnlock()
	r, members := ja.block(relay)
	var out []blockMember
	for _, m := range members {
		if !throughRelay(r, m) || ja.awaitsMaster(m.Node) {
			continue
		}
		a, wire := ja.forNode(m.Node)
		out = append(out, blockMember{node: m.Node, addr: m.CheckpointAddr, wire: wire, rev: a.Revision})
	}
	return out
}
