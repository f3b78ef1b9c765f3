package coordinator

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/topology"
)

// This file reads the cache for the dashboard (web.go): a copy of what it
// shows, taken under the cache's read lock and built into the dashboard's
// rows outside it. The shapes follow status --json (gpucoord.status/1):
// the same names for a layout, a generation, a step and a member's state.

// webCopy is what the dashboard reads of the cache at one revision: maps
// of its own, holding the cache's messages (shared: read only).
type webCopy struct {
	rev        int64
	leader     string
	nodes      map[string]nodeEntry
	conns      map[string]string
	nodePol    map[string]nodePolicy
	fences     map[string]fence
	holds      map[string]string
	pooled     map[string]bool // nodes that are members of their domain's gossip pool
	jobs       []*webJobCopy
	timesPrint int64 // changes when any job's compute times do
	// deaths are the deaths of nodes their pools reported to this
	// coordinator, by node (the hub's, not the cache's).
	deaths map[string]deathSeen
}

// webJobCopy is one job's part of a webCopy.
type webJobCopy struct {
	*job
	// stored is each node's Stored record; storedPrint changes when they
	// or the commit do.
	stored      map[string]*pb.Stored
	storedPrint int64
	timesPrint  int64
}

// webCopy copies what the dashboard shows. withStored copies the jobs'
// stored records too, for the jobs whose storedPrint differs from
// printed's.
func (c *cache) webCopy(printed map[string]int64) *webCopy {
	c.mu.RLock()
	defer c.mu.RUnlock()
	w := &webCopy{rev: c.rev, nodes: maps.Clone(c.nodes), conns: maps.Clone(c.conns), nodePol: maps.Clone(c.nodePol),
		fences: maps.Clone(c.fences), holds: maps.Clone(c.holds), pooled: map[string]bool{}}
	var first candidate
	for _, cand := range c.candidates {
		if first.created == 0 || cand.created < first.created {
			first = cand
		}
	}
	w.leader = first.name
	for _, pool := range c.pools {
		for name := range pool {
			w.pooled[name] = true
		}
	}
	for _, e := range c.jobs {
		if e.spec == nil {
			continue
		}
		jc := &webJobCopy{job: e.job(), storedPrint: e.commitRv}
		for _, b := range e.blocks {
			jc.storedPrint = jc.storedPrint*31 + b.rev
		}
		jc.storedPrint = jc.storedPrint*31 + int64(len(e.blocks))
		if g := e.gen; g != nil {
			for _, t := range e.times[g.Number] {
				jc.timesPrint = jc.timesPrint*31 + t.rev
			}
			jc.timesPrint = jc.timesPrint*31 + g.Number
		}
		if printed[e.spec.Id] != jc.storedPrint {
			jc.stored = maps.Clone(e.stored)
		}
		w.timesPrint = w.timesPrint*31 + jc.timesPrint
		w.jobs = append(w.jobs, jc)
	}
	slices.SortFunc(w.jobs, func(a, b *webJobCopy) int { return int(a.created - b.created) })
	return w
}

// webNode is one node of the pool as the dashboard shows it.
type webNode struct {
	Name string `json:"name"`
	Host string `json:"host,omitempty"`
	GPUs int32  `json:"gpus"`
	// Domain is the node's failure domain (gpucoordpb.FailureDomain).
	Domain string `json:"domain"`
	// Health is registered (its agent's Watch stream open), disconnected
	// (registered, no stream: its lease runs out unless it comes back) or
	// lost (a job's member whose registration is gone or revoked).
	Health string `json:"health"`
	// Job is the job whose generation holds the node.
	Job string `json:"job,omitempty"`
	// Spare says the node is registered, connected and held by no job.
	Spare bool `json:"spare,omitempty"`
	// Gossip says the node is a member of its domain's gossip pool.
	Gossip bool `json:"gossip"`
	// Stream names the coordinator holding the node's Watch stream: it
	// renews the node's lease every third of its TTL.
	Stream     string `json:"stream,omitempty"`
	Registered int64  `json:"registered_unix_ms,omitempty"`
	Version    string `json:"version,omitempty"`
	Strikes    int    `json:"strikes,omitempty"`
	// CooldownUntil is when a struck node may be taken again.
	CooldownUntil int64 `json:"cooldown_until_unix_ms,omitempty"`
	// Lost is when this coordinator saw the node's registration go (Unix
	// ms): it shows a lost node for a while after its job moved on.
	Lost int64 `json:"lost_unix_ms,omitempty"`
	// ReportedDead is how many members of the node's gossip pool reported
	// its run dead to this coordinator (PoolReport) within the last
	// minute, ReportedAt when the first did (Unix ms), and Revoked that
	// they made the quorum and this coordinator revoked the node's lease.
	// A pool's suspicion before it declares a death is not reported.
	ReportedDead int   `json:"reported_dead,omitempty"`
	ReportedAt   int64 `json:"reported_dead_unix_ms,omitempty"`
	Revoked      bool  `json:"revoked,omitempty"`
}

// reported sets the row's death reports from d, those of the node's run
// instance ("": of any run).
func (n *webNode) reported(d deathSeen, ok bool, instance string) {
	if !ok || instance != "" && d.instance != instance {
		return
	}
	n.ReportedDead, n.ReportedAt, n.Revoked = d.reporters, d.first.UnixMilli(), d.acted
}

// webRenewals is the "renewals" section (the pool's): the last lease
// renewal this coordinator sent to each node whose Watch stream it holds,
// or held last (the node disconnected since), by column: AgoMs is each
// renewal's age at At. A node whose stream another coordinator holds is
// not here; its row names that coordinator (webNode.Stream). Renewals
// come a third of a TTL apart for every node: the section is rebuilt at
// the hub's slow interval, or when its nodes change, never per renewal.
type webRenewals struct {
	Coordinator string `json:"coordinator"`
	At          int64  `json:"at_unix_ms"`
	// TTLMs is the leases' TTL (the longest, should nodes' differ).
	TTLMs int64    `json:"ttl_ms"`
	Nodes []string `json:"nodes"`
	AgoMs []int64  `json:"ago_ms"`
}

// webRenewals builds the renewals section from last (renewals.last) as
// of now: the nodes this coordinator serves, or served last.
func (w *webCopy) webRenewals(self string, last map[string]renewal, now time.Time) webRenewals {
	r := webRenewals{Coordinator: self, At: now.UnixMilli(), Nodes: []string{}, AgoMs: []int64{}}
	for node := range last {
		if s, ok := w.conns[node]; ok && connBy(s) != self {
			continue
		}
		r.Nodes = append(r.Nodes, node)
	}
	slices.Sort(r.Nodes)
	for _, node := range r.Nodes {
		x := last[node]
		r.AgoMs = append(r.AgoMs, max(0, now.Sub(x.at).Milliseconds()))
		r.TTLMs = max(r.TTLMs, x.ttlMs)
	}
	return r
}

// webNodes is every node of the pool, registered or lost, by name.
func (w *webCopy) webNodes() map[string]webNode {
	out := make(map[string]webNode, len(w.nodes))
	for name, e := range w.nodes {
		n := e.node
		row := webNode{Name: name, Host: n.GetHost(), GPUs: n.GetGpus(), Domain: pb.FailureDomain(n), Health: "registered",
			Job: w.holds[name], Gossip: w.pooled[name], Registered: n.GetRegisteredUnixMs(), Version: n.GetVersion()}
		if s, ok := w.conns[name]; ok {
			row.Stream = connBy(s)
		} else {
			row.Health = "disconnected"
		}
		if p, ok := w.nodePol[name]; ok {
			row.Strikes, row.CooldownUntil = p.Strikes, p.CooldownUntil
		}
		row.Spare = row.Health == "registered" && row.Job == ""
		d, ok := w.deaths[name]
		row.reported(d, ok, n.GetInstance())
		out[name] = row
	}
	// A running job's member that is gone, or revoked since: lost.
	for _, j := range w.jobs {
		if j.terminal() || j.gen == nil {
			continue
		}
		for _, m := range j.gen.Members {
			if w.memberState(m) != "lost" {
				continue
			}
			row, ok := out[m.Node]
			if !ok {
				row = webNode{Name: m.Node, Host: m.Host, Domain: m.Domain, GPUs: m.Ranks}
			}
			row.Health, row.Job, row.Spare, row.Stream = "lost", j.spec.Id, false, ""
			d, ok := w.deaths[m.Node]
			row.reported(d, ok, m.Instance)
			out[m.Node] = row
		}
	}
	return out
}

// memberState is m's state in the copy (memberState).
func (w *webCopy) memberState(m *pb.Member) string {
	var n *pb.Node
	if e, ok := w.nodes[m.Node]; ok {
		n = e.node
	}
	return memberState(m, n, w.conns[m.Node] != "", w.fences[m.Node].Instance)
}

// webLayout is a layout as status --json shows it, with what the grid
// needs: each axis's stride in rank order.
type webLayout struct {
	Nodes       int32  `json:"nodes"`
	GPUsPerNode int32  `json:"gpus_per_node"`
	World       int32  `json:"world"`
	TP          int32  `json:"tp"`
	PP          int32  `json:"pp"`
	DP          int32  `json:"dp"`
	VPP         int32  `json:"vpp,omitempty"`
	Zero        int32  `json:"zero"`
	Schedule    string `json:"schedule,omitempty"`
	Order       string `json:"order"`
	// Strides are the rank distance between neighbours along tp, pp and
	// dp: rank r's coordinate on an axis is r / stride % size.
	Strides [3]int `json:"strides"`
	Label   string `json:"label"`
}

func layoutOf(spec *pb.JobSpec, g *pb.Generation) webLayout {
	grid := pb.SpecGrid(spec)
	l := webLayout{Nodes: spec.GetNodes(), GPUsPerNode: spec.GetGpusPerNode(), TP: grid.TP, PP: grid.PP, VPP: grid.VPP, Zero: grid.Zero,
		Schedule: spec.GetSchedule(), Order: spec.GetOrder()}
	if l.Order == "" {
		l.Order = topology.DefaultOrder
	}
	if g != nil {
		grid = pb.GenerationGrid(spec, g)
		l.Nodes, l.World, l.DP, l.TP, l.PP, l.VPP, l.Zero = int32(len(g.Members)), g.World, g.Dp, grid.TP, grid.PP, grid.VPP, grid.Zero
	} else if lay, err := Layout(spec, int(spec.GetNodes())); err == nil {
		l.World, l.DP = int32(lay.World()), int32(lay.DP)
	}
	if lay, err := topology.NewLayout(int(max(l.TP, 1)), int(max(l.PP, 1)), int(max(l.DP, 1)), spec.GetOrder()); err == nil {
		l.Strides = [3]int{int(lay.Rank(topology.Coord{TP: 1})), int(lay.Rank(topology.Coord{PP: 1})), int(lay.Rank(topology.Coord{DP: 1}))}
	}
	l.Label = grid.Label(l.DP)
	return l
}

// webJob is a job's head: what changes with every step, small.
type webJob struct {
	ID      string   `json:"id"`
	Phase   string   `json:"phase"` // pending, running, succeeded, failed, cancelled
	Reason  string   `json:"reason,omitempty"`
	Native  bool     `json:"native"`
	Command []string `json:"command,omitempty"`
	// Order is the job's place in submission order.
	Order  int64     `json:"order"`
	Layout webLayout `json:"layout"`
	// Generation is the current one; Open says its ranks may start (every
	// node of the one before has stopped its ranks).
	Generation *webGeneration `json:"generation,omitempty"`
	Open       bool           `json:"open"`
	Step       *webStep       `json:"step,omitempty"`
	Committed  int64          `json:"committed_step"`
	Backup     int64          `json:"backup_step,omitempty"`
	Stragglers []webStraggler `json:"stragglers,omitempty"`
	Failure    *webFailure    `json:"failure,omitempty"`
	// States counts the ranks in each state of the grid.
	States map[string]int `json:"states"`
	Spec   webSpec        `json:"spec"`
}

// webSpec is what the dashboard shows of a job's spec besides its layout.
type webSpec struct {
	Nodes          int32  `json:"nodes"`
	MinNodes       int32  `json:"min_nodes,omitempty"`
	MaxNodes       int32  `json:"max_nodes,omitempty"`
	MaxRestarts    int32  `json:"max_restarts"`
	CheckpointDir  string `json:"checkpoint_dir,omitempty"`
	CheckpointEach int32  `json:"checkpoint_every,omitempty"`
	Replicas       int32  `json:"checkpoint_replicas,omitempty"`
	HangTimeoutMs  int64  `json:"hang_timeout_ms,omitempty"`
	GlobalBatch    int32  `json:"global_batch,omitempty"`
	MicroBatch     int32  `json:"micro_batch,omitempty"`
	Replan         string `json:"replan,omitempty"`
}

type webGeneration struct {
	Number int64 `json:"number"`
	// Nodes names the first maxGenNodes members; NodeCount counts them
	// all.
	Nodes      []string `json:"nodes,omitempty"`
	NodeCount  int      `json:"node_count"`
	World      int32    `json:"world"`
	ResumeStep int64    `json:"resume_step"`
	Reason     string   `json:"reason,omitempty"`
	Hangs      int32    `json:"hangs"`
	FromBackup bool     `json:"from_backup,omitempty"`
	Layout     string   `json:"layout"`
	Estimate   string   `json:"estimate,omitempty"`
	// Seen is when this coordinator first saw the generation (Unix ms):
	// its start, unless the coordinator started after it.
	Seen int64 `json:"seen_unix_ms"`
	// Output is what the rank whose failure made it last printed: a
	// traceback's tail, or a hung rank's stacks.
	Output string `json:"output,omitempty"`
}

type webStep struct {
	Step          int64   `json:"step"`
	Loss          float64 `json:"loss"`
	Seconds       float64 `json:"seconds"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	Generation    int64   `json:"generation"`
	DP            int32   `json:"dp"`
}

type webStraggler struct {
	Rank      int32   `json:"rank"`
	Node      string  `json:"node"`
	LocalRank int32   `json:"local_rank"`
	Ratio     float64 `json:"ratio"`
}

type webFailure struct {
	Rank      int32    `json:"rank"`
	Node      string   `json:"node,omitempty"`
	ExitCode  int32    `json:"exit_code"`
	Output    string   `json:"output,omitempty"`
	LostNodes []string `json:"lost_nodes,omitempty"`
}

// webMember is a current generation's member, as status --json shows it.
type webMember struct {
	Node      string `json:"node"`
	Domain    string `json:"domain,omitempty"`
	FirstRank int32  `json:"first_rank"`
	Ranks     int32  `json:"ranks"`
	State     string `json:"state"` // alive, disconnected, lost
}

// webMembers are a generation's members, encoded by column (a list of
// each field, the states a letter each: A alive, D disconnected, L lost):
// 2,048 members are 50 KB so, 150 KB as objects, and a page parses them
// at each new generation.
type webMembers []webMember

type webMemberColumns struct {
	Nodes     []string `json:"nodes"`
	Domains   []string `json:"domains,omitempty"`
	FirstRank []int32  `json:"first_rank"`
	Ranks     []int32  `json:"ranks"`
	States    string   `json:"states"`
}

var memberLetters = map[string]byte{"alive": 'A', "disconnected": 'D', "lost": 'L'}

// MarshalJSON implements json.Marshaler: the columns.
func (ms webMembers) MarshalJSON() ([]byte, error) {
	c := webMemberColumns{Nodes: make([]string, len(ms)), FirstRank: make([]int32, len(ms)), Ranks: make([]int32, len(ms))}
	states := make([]byte, len(ms))
	domains := false
	for i, m := range ms {
		c.Nodes[i], c.FirstRank[i], c.Ranks[i], states[i] = m.Node, m.FirstRank, m.Ranks, memberLetters[m.State]
		domains = domains || m.Domain != ""
	}
	if domains {
		c.Domains = make([]string, len(ms))
		for i, m := range ms {
			c.Domains[i] = m.Domain
		}
	}
	c.States = string(states)
	return json.Marshal(c)
}

// UnmarshalJSON implements json.Unmarshaler.
func (ms *webMembers) UnmarshalJSON(b []byte) error {
	var c webMemberColumns
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	if len(c.FirstRank) != len(c.Nodes) || len(c.Ranks) != len(c.Nodes) || len(c.States) != len(c.Nodes) || c.Domains != nil && len(c.Domains) != len(c.Nodes) {
		return fmt.Errorf("members: columns of %d nodes, %d first ranks, %d ranks, %d states", len(c.Nodes), len(c.FirstRank), len(c.Ranks), len(c.States))
	}
	*ms = make(webMembers, len(c.Nodes))
	for i := range c.Nodes {
		m := webMember{Node: c.Nodes[i], FirstRank: c.FirstRank[i], Ranks: c.Ranks[i]}
		for name, l := range memberLetters {
			if c.States[i] == l {
				m.State = name
			}
		}
		if c.Domains != nil {
			m.Domain = c.Domains[i]
		}
		(*ms)[i] = m
	}
	return nil
}

// webHang is a rank its agent found hung, with the stacks it printed.
type webHang struct {
	Rank       int32  `json:"rank"`
	Node       string `json:"node,omitempty"`
	Generation int64  `json:"generation"`
	LastStep   int64  `json:"last_step"`
	IdleMs     int64  `json:"idle_ms"`
	Stopped    bool   `json:"stopped,omitempty"`
	Found      int64  `json:"found_unix_ms"`
	Stacks     string `json:"stacks"`
}

// webExit is how a rank of the current generation ended.
type webExit struct {
	Rank  int32  `json:"rank"`
	Node  string `json:"node,omitempty"`
	Code  int32  `json:"code"`
	Error string `json:"error,omitempty"`
	Hung  bool   `json:"hung,omitempty"`
}

// webRanks is the grid's state: a letter per rank (rankStates names
// them) of the current generation.
type webRanks struct {
	Generation int64  `json:"generation"`
	States     string `json:"states"`
}

// rankStates names the letters of webRanks.States.
var rankStates = map[byte]string{
	'P': "pending", 'W': "starting", 'T': "restarting", 'R': "running", 'S': "straggling", 'H': "hung",
	'F': "failed", 'X': "exited", 'D': "disconnected", 'L': "lost", 'E': "ended",
}

// webPrevious is a job's generation before the current one, as it ended:
// its members and its ranks' last states, those of a node that the next
// generation left out and that was not alive then lost ('L').
type webPrevious struct {
	Generation int64      `json:"generation"`
	Layout     webLayout  `json:"layout"`
	Members    webMembers `json:"members"`
	States     string     `json:"states"`
	Ended      int64      `json:"ended_unix_ms"`
	instances  []string   // each member's run of its agent
}

// webTimes is each rank's mean compute time per step over its last
// reported window, in milliseconds (0: none reported).
type webTimes struct {
	Generation int64     `json:"generation"`
	Ms         []float64 `json:"ms"`
	MedianMs   float64   `json:"medianMs"`
}

// webCommit is a job's last commit and where its files are.
type webCommit struct {
	Step       int64       `json:"step"`
	Generation int64       `json:"generation"`
	Backup     bool        `json:"backup,omitempty"`
	BackupOnly bool        `json:"backup_only,omitempty"`
	Earlier    []int64     `json:"earlier,omitempty"`
	Copies     []webCopies `json:"copies,omitempty"`
	// Held is, for each node that holds checkpoint files, the steps it
	// holds and who holds copies of the newest.
	Held []webHeld `json:"held,omitempty"`
}

// webCopies is a node's files of a commit and the nodes holding copies.
type webCopies struct {
	Node    string   `json:"node"`
	Holders []string `json:"holders"`
}

type webHeld struct {
	Node  string  `json:"node"`
	Steps []int64 `json:"steps"`
	// Holders hold copies of its newest step's files (itself included).
	Holders []string `json:"holders,omitempty"`
}

func phaseOf(s *pb.JobState) string { return strings.ToLower(s.GetPhase().String()) }

// head builds a job's head and its grid of rank states.
func (w *webCopy) head(j *webJobCopy) (webJob, webRanks, webMembers, []webExit) {
	spec, st, g := j.spec, j.state, j.gen
	h := webJob{ID: spec.GetId(), Phase: phaseOf(st), Reason: st.GetReason(), Native: len(spec.GetCommand()) == 0, Command: spec.GetCommand(),
		Order: j.created, Layout: layoutOf(spec, g), States: map[string]int{},
		Spec: webSpec{Nodes: spec.GetNodes(), MinNodes: spec.GetMinNodes(), MaxNodes: spec.GetMaxNodes(), MaxRestarts: spec.GetMaxRestarts(),
			CheckpointDir: spec.GetCheckpointDir(), CheckpointEach: spec.GetCheckpointEvery(), Replicas: spec.GetCheckpointReplicas(),
			HangTimeoutMs: spec.GetHangTimeoutMs(), GlobalBatch: spec.GetGlobalBatch(), MicroBatch: spec.GetMicroBatch(), Replan: ReplanMode(spec)}}
	if g != nil {
		h.Generation = generationOf(spec, g)
		h.Open = j.open >= g.Number
	}
	if s := j.step; s != nil {
		h.Step = &webStep{Step: s.Step, Loss: s.Loss, Seconds: s.Seconds, SamplesPerSec: s.SamplesPerSec, Generation: s.Generation, DP: s.Dp}
	}
	if j.commit != nil {
		h.Committed = j.commit.Step
	}
	if j.backup != nil {
		h.Backup = j.backup.Step
	}
	for _, s := range j.stragglers.GetRanks() {
		h.Stragglers = append(h.Stragglers, webStraggler{Rank: s.Rank, Node: s.Node, LocalRank: s.LocalRank, Ratio: s.Ratio})
	}
	if st.GetPhase() == pb.JobState_FAILED {
		h.Failure = &webFailure{Rank: st.FailedRank, Node: st.FailedNode, ExitCode: st.ExitCode, Output: st.Output, LostNodes: st.LostNodes}
	}
	ranks := webRanks{}
	var members webMembers
	var exits []webExit
	if g == nil {
		world := int(h.Layout.World)
		ranks.States = strings.Repeat("P", world)
		h.States["pending"] = world
		return h, ranks, members, exits
	}
	ranks.Generation = g.Number
	states := make([]byte, g.World)
	for i := range states {
		states[i] = 'R'
	}
	open := j.open >= g.Number
	for _, m := range g.Members {
		state := w.memberState(m)
		members = append(members, webMember{Node: m.Node, Domain: m.Domain, FirstRank: m.FirstRank, Ranks: m.Ranks, State: state})
		var c byte
		switch {
		case pb.Terminal(st):
			c = 'E'
		case state == "lost":
			c = 'L'
		case state == "disconnected":
			c = 'D'
		case st.GetPhase() == pb.JobState_PENDING:
			c = 'P'
		case !open && g.Number > 1:
			c = 'T'
		case !open:
			c = 'W'
		}
		if c != 0 {
			for r := m.FirstRank; r < m.FirstRank+m.Ranks && int(r) < len(states); r++ {
				states[r] = c
			}
		}
	}
	nodeOf := func(r int32) string {
		for _, m := range g.Members {
			if r >= m.FirstRank && r < m.FirstRank+m.Ranks {
				return m.Node
			}
		}
		return ""
	}
	if !pb.Terminal(st) {
		for _, s := range j.stragglers.GetRanks() {
			if int(s.Rank) < len(states) && states[s.Rank] == 'R' {
				states[s.Rank] = 'S'
			}
		}
	}
	for _, r := range j.exitOrder {
		e := j.exits[r]
		x := webExit{Rank: r, Node: nodeOf(r), Code: e.Code, Error: e.Error, Hung: e.Hang != nil}
		exits = append(exits, x)
		if int(r) >= len(states) || states[r] == 'L' {
			continue
		}
		switch {
		case e.Hang != nil:
			states[r] = 'H'
		case e.Code != 0:
			states[r] = 'F'
		default:
			states[r] = 'X'
		}
	}
	if st.GetPhase() == pb.JobState_FAILED && st.FailedRank >= 0 && int(st.FailedRank) < len(states) {
		states[st.FailedRank] = 'F'
	}
	for _, c := range states {
		h.States[rankStates[c]]++
	}
	ranks.States = string(states)
	return h, ranks, members, exits
}

// generationOf is g as the dashboard shows it, without its output.
func generationOf(spec *pb.JobSpec, g *pb.Generation) *webGeneration {
	x := &webGeneration{Number: g.Number, World: g.World, ResumeStep: g.ResumeStep, Reason: g.Reason, Hangs: g.Hangs, FromBackup: g.FromBackup,
		Layout: pb.GenerationGrid(spec, g).Label(g.Dp), Estimate: g.Estimate}
	x.NodeCount = len(g.Members)
	for _, m := range g.Members[:min(len(g.Members), maxGenNodes)] {
		x.Nodes = append(x.Nodes, m.Node)
	}
	return x
}

// maxGenNodes bounds the node names a generation's entry carries: the
// page lists them, and 64 generations of 2,048 names were a megabyte.
const maxGenNodes = 64

// hangs are the current generation's hung ranks, with their stacks.
func (j *webJobCopy) hangs() []webHang {
	var out []webHang
	for _, r := range j.exitOrder {
		e := j.exits[r]
		if e.Hang == nil {
			continue
		}
		h := webHang{Rank: r, Generation: j.gen.GetNumber(), LastStep: e.Hang.LastStep, IdleMs: e.Hang.IdleMs, Stopped: e.Hang.Stopped,
			Found: e.Hang.FoundUnixMs, Stacks: e.Output}
		for _, m := range j.gen.GetMembers() {
			if r >= m.FirstRank && r < m.FirstRank+m.Ranks {
				h.Node = m.Node
			}
		}
		out = append(out, h)
	}
	return out
}

// rankTimes is each rank's latest compute time per step in ms, where the
// coordinators' summaries carry it (a job of at most 1,024 ranks; in a
// larger one, the ranks that may be stragglers), and the job's median.
func (j *webJobCopy) rankTimes() webTimes {
	t := webTimes{Generation: j.gen.GetNumber(), Ms: make([]float64, j.gen.GetWorld())}
	set := func(rank int32, secs float64) {
		if rank >= 0 && int(rank) < len(t.Ms) {
			// Three significant figures: a grid cell shows no more, and
			// equal values are not sent again.
			t.Ms[rank] = round3(secs * 1000)
		}
	}
	for rank, secs := range j.times.ranks {
		set(rank, secs)
	}
	for _, s := range j.times.slow {
		set(s.Rank, s.Latest)
	}
	median, _ := histMedian(j.times.latest)
	t.MedianMs = round3(median * 1000)
	return t
}

// commitView is the job's last commit and the steps each node holds.
func (j *webJobCopy) commitView() webCommit {
	var c webCommit
	if s := j.commit; s != nil {
		c = webCommit{Step: s.Step, Generation: s.Generation, Backup: s.Backup, BackupOnly: s.BackupOnly}
		for _, e := range s.Earlier {
			c.Earlier = append(c.Earlier, e.Step)
		}
		for _, cp := range s.Copies {
			c.Copies = append(c.Copies, webCopies{Node: cp.Node, Holders: cp.Holders})
		}
	}
	names := slices.Sorted(maps.Keys(j.stored))
	for _, node := range names {
		r := j.stored[node]
		h := webHeld{Node: node}
		var newest *pb.StoredStep
		for _, s := range r.GetSteps() {
			h.Steps = append(h.Steps, s.Step)
			if newest == nil || s.Step > newest.Step {
				newest = s
			}
		}
		slices.Sort(h.Steps)
		h.Steps = slices.Compact(h.Steps)
		if newest != nil {
			h.Holders = newest.Holders
		}
		c.Held = append(c.Held, h)
	}
	return c
}
