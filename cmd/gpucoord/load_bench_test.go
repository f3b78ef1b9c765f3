package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/gossip"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestControlPlaneLoad measures the control plane under simulated agents:
// a real coordinator process (gpucoord coordinator, embedded etcd) and N
// agents as goroutines of this test (simFleet), each over its own gRPC
// connection with its own Watch stream and lease, as real agents. Per
// size it reports
//   - registration: until every agent is registered and its stream has
//     brought its first message (its conns key is written);
//   - rendezvous: from Submit of an N-node job until every agent holds
//     generation 1, opened, and rank 0's address;
//   - loss: the last agent, a real member of its failure domain's pool
//     (with one other), stops (its member without leaving, its stream
//     cut): its pool finds it dead and the other member reports it. Until
//     every surviving agent holds generation 2, and until it opens with
//     its rank 0's address (each agent reports it stopped generation 1's
//     ranks, through its block's relay, and rank 0's node its address
//     before that, as real agents do; and the lost node's own deadline,
//     its lease or its fence window, must pass: the fence);
//   - the coordinator process's CPU (seconds, from /proc) over the
//     rendezvous and over the loss, to the opening;
//   - the coordinator process's CPU (cores, from /proc) over 5 s of lease
//     renewals and rank 0's 10 steps a second alone, then over 10 s
//     (GPUCOORD_BENCH_LOAD_STEADY) of steady state: rank 0 reporting 10
//     steps a second and every agent, each second, its 8 ranks' compute
//     times and that it stored the last 10th step (each such step
//     committed once all have); its resident memory, and
//     its etcd requests and writes per step (from
//     gpucoord_etcd_requests_total);
//   - the bytes of the assignments the coordinator sent each agent for
//     generations 1 and 2 (renewals aside): a relay's messages carry its
//     block's members' (counted as the relay's), which it hands them;
//   - how often the agents watched again after a stream ended while the
//     run went on, and registered again because the coordinator said
//     their lease was gone (simFleet: they come back as real agents do).
//     Both are 0 in a healthy run; a run in which they are not measured
//     agents coming back too. The table's last column, "reconnections /
//     re-registrations", is new: the tables of earlier runs in
//     docs/BENCHMARKS.md end at the bytes of generation 2.
//
// It is a benchmark, not a test: it runs only with
// GPUCOORD_BENCH_LOAD=256,1024,2048 (make bench-load); docs/BENCHMARKS.md
// has the figures. GPUCOORD_BENCH_LOAD_BIN (with
// GPUCOORD_BENCH_LOAD_PROTOCOL, the protocol version it speaks) times
// another build of gpucoord, GPUCOORD_BENCH_LOAD_ARGS adds flags to the
// coordinator's (--lease-ttl 15s), and GPUCOORD_BENCH_LOAD_LOG=path keeps
// the coordinator's output in path.N for N nodes, and
// GPUCOORD_BENCH_LOAD_DATA=/dev/shm puts etcd's data there.
// GPUCOORD_BENCH_LOAD_NOSTORED leaves the Stored reports out of the steady
// state (to tell their cost from the rest), GPUCOORD_BENCH_LOAD_STEADY=60s
// lengthens it (10 s by default), and GPUCOORD_PPROF=1 serves
// the coordinator's Go profiles beside its metrics (/debug/pprof/) and the
// embedded etcd's own series (/debug/metrics).
func TestControlPlaneLoad(t *testing.T) {
	sizes := os.Getenv("GPUCOORD_BENCH_LOAD")
	if sizes == "" {
		t.Skip("a benchmark: set GPUCOORD_BENCH_LOAD=256,1024,2048 (make bench-load)")
	}
	// Another build, e.g. an earlier commit's, to compare, with the
	// protocol version it speaks.
	bin := os.Getenv("GPUCOORD_BENCH_LOAD_BIN")
	if bin == "" {
		bin = e2e.Binary(t)
	}
	if v := os.Getenv("GPUCOORD_BENCH_LOAD_PROTOCOL"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("GPUCOORD_BENCH_LOAD_PROTOCOL=%q: %v", v, err)
		}
		loadProtocol = int32(p)
	}
	var rows []string
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 {
			t.Fatalf("GPUCOORD_BENCH_LOAD: %q: want node counts of at least 2", s)
		}
		t.Run(strconv.Itoa(n), func(t *testing.T) { rows = append(rows, loadRun(t, bin, n)) })
	}
	t.Logf("control plane under load:\n| nodes | registration | rendezvous | loss through the pool: every agent has generation 2 (it opens) | coordinator CPU, cores (leases and steps alone) | resident MB | etcd requests / step | etcd writes / step | bytes / node, generation 1 | bytes / node, generation 2 | reconnections / re-registrations |\n|---|---|---|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
}

// slimAssignment is what a simulated agent reads of an Assignment: the
// job, the generation's number and rank 0's address. A real agent decodes
// the whole message (every member) on its own machine; 2,048 of them
// decoding on this machine's cores would measure the benchmark, not the
// coordinator (GPUCOORD_BENCH_LOAD_DECODE=full does, to show it).
type slimAssignment struct {
	job, master   string
	gen, revision int64
	renewal, open bool
	size          int // bytes on the wire
	// relayKey is the stream's (its first message's), and relayed the
	// members' assignments a relay's message carries (those of its
	// relayed_renewals that carry one: renewals alone are not read).
	relayKey []byte
	relayed  []*pb.RelayedRenewal
}

// parse reads the fields of pb.Assignment (job 1, generation 3, master 4,
// revision 7, renewal 8, open 12, relay key 20, and the relayed renewals
// 18 that carry an assignment) and the generation's number (2), skipping
// the rest.
func (s *slimAssignment) parse(b []byte) error {
	*s = slimAssignment{size: len(b)}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			s.job, n = string(v), m
		case num == 3 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			n = m
			for len(v) > 0 {
				gnum, gtyp, k := protowire.ConsumeTag(v)
				if k < 0 {
					return protowire.ParseError(k)
				}
				v = v[k:]
				if gnum == 2 && gtyp == protowire.VarintType {
					x, k := protowire.ConsumeVarint(v)
					s.gen, v = int64(x), v[max(k, 0):]
					continue
				}
				if k = protowire.ConsumeFieldValue(gnum, gtyp, v); k < 0 {
					return protowire.ParseError(k)
				}
				v = v[k:]
			}
		case num == 4 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			s.master, n = string(v), m
		case num == 8 && typ == protowire.VarintType:
			x, m := protowire.ConsumeVarint(b)
			s.renewal, n = x != 0, m
		case num == 12 && typ == protowire.VarintType:
			x, m := protowire.ConsumeVarint(b)
			s.open, n = x != 0, m
		case num == 7 && typ == protowire.VarintType:
			x, m := protowire.ConsumeVarint(b)
			s.revision, n = int64(x), m
		case num == 20 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			s.relayKey, n = slices.Clone(v), m
		case num == 18 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			n = m
			if r, err := relayedAssignment(v); err != nil {
				return err
			} else if r != nil {
				s.relayed = append(s.relayed, r)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// relayedAssignment is the pb.RelayedRenewal b encodes when it carries an
// assignment (field 6), nil when it is a renewal alone: a relay's window
// renewals are looked through, not decoded.
func relayedAssignment(b []byte) (*pb.RelayedRenewal, error) {
	carries := false
	for v := b; len(v) > 0; {
		num, typ, k := protowire.ConsumeTag(v)
		if k < 0 {
			return nil, protowire.ParseError(k)
		}
		v = v[k:]
		carries = carries || num == 6
		if k = protowire.ConsumeFieldValue(num, typ, v); k < 0 {
			return nil, protowire.ParseError(k)
		}
		v = v[k:]
	}
	if !carries {
		return nil, nil
	}
	r := &pb.RelayedRenewal{}
	return r, proto.Unmarshal(b, r)
}

// slimCodec decodes a *slimAssignment with parse, and everything else as
// gRPC's protobuf codec does.
type slimCodec struct{ encoding.CodecV2 }

func (c slimCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if s, ok := v.(*slimAssignment); ok {
		return s.parse(data.Materialize())
	}
	return c.CodecV2.Unmarshal(data, v)
}

// watchSlim opens a Watch stream whose messages are read as slim
// assignments, or in full (then converted) when full.
func watchSlim(ctx context.Context, cc *grpc.ClientConn, req *pb.WatchRequest, full bool) (func() (*slimAssignment, error), error) {
	if full {
		stream, err := pb.NewCoordinatorClient(cc).Watch(ctx, req)
		if err != nil {
			return nil, err
		}
		return func() (*slimAssignment, error) {
			a, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			s := &slimAssignment{job: a.Job, master: a.Master, gen: a.Generation.GetNumber(), revision: a.Revision, renewal: a.Renewal, open: a.Open,
				size: proto.Size(a), relayKey: a.RelayKey}
			for _, r := range a.RelayedRenewals {
				if len(r.Assignment) > 0 {
					s.relayed = append(s.relayed, r)
				}
			}
			return s, nil
		}, nil
	}
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, pb.Coordinator_Watch_FullMethodName,
		grpc.ForceCodecV2(slimCodec{encoding.GetCodecV2("proto")}))
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(req); err != nil {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	return func() (*slimAssignment, error) {
		s := &slimAssignment{}
		return s, cs.RecvMsg(s)
	}, nil
}

// freeAddr returns a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// holding counts the agents whose latest assignment is generation gen of
// the job with rank 0's address, and tells when a target is reached. It
// also counts the bytes of the assignments (renewals aside) each agent
// received since the last expect.
type holding struct {
	mu      sync.Mutex
	job     string
	gen     int64
	count   int
	target  int
	reached chan struct{}
	at      map[string]int64 // agent -> generation it holds
	bytes   map[string]int   // agent -> assignment bytes since expect

	// The phases of a rendezvous: when the first agent and the last got
	// the generation (before rank 0's address), and when rank 0's node
	// reported its address.
	named         map[string]bool
	first, all    time.Time
	bootstrapSent time.Time
	// stoppedLast is when the last of the agents' Stopped reports since
	// expect was answered, stopped how many were.
	stoppedLast time.Time
	stopped     int

	// heard are the agents whose stream brought its first message (sent
	// once the coordinator has written the stream's conns key): the
	// registration ends when all of them have.
	heard    map[string]bool
	heardAll chan struct{}
	agents   int
}

// allHeard is closed once each of the n agents' streams has brought its
// first message.
func (h *holding) allHeard() <-chan struct{} { return h.heardAll }

// phases says when, after begin, the first and the last agent got the
// expected generation and rank 0's node reported its address.
func (h *holding) phases(begin time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Sub(begin).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("first agent %s, every agent %s, rank 0's address reported %s, %d Stopped reports answered by %s", d(h.first), d(h.all), d(h.bootstrapSent), h.stopped, d(h.stoppedLast))
}

// allAt is when the last agent got the expected generation, opened or
// not.
func (h *holding) allAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.all
}

func (h *holding) stoppedAnswered() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stoppedLast = time.Now()
	h.stopped++
}

func (h *holding) bootstrapped() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bootstrapSent.IsZero() {
		h.bootstrapSent = time.Now()
	}
}

func (h *holding) expect(job string, gen int64, target int) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.job, h.gen, h.target, h.reached = job, gen, target, make(chan struct{})
	h.count, h.bytes = 0, map[string]int{}
	h.named, h.first, h.all, h.bootstrapSent = map[string]bool{}, time.Time{}, time.Time{}, time.Time{}
	h.stoppedLast, h.stopped = time.Time{}, 0
	for _, g := range h.at {
		if g == gen {
			h.count++
		}
	}
	if h.count >= target {
		close(h.reached)
	}
	return h.reached
}

// received is the mean and the largest of the bytes the agents holding
// the expected generation received since expect.
func (h *holding) received() (mean float64, most int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	total, n := 0, 0
	for agent, g := range h.at {
		if g == h.gen {
			total, n, most = total+h.bytes[agent], n+1, max(most, h.bytes[agent])
		}
	}
	return float64(total) / float64(max(n, 1)), most
}

// sawAgain counts the bytes of an assignment agent's stream brought after
// its relay had: the agent leaves it alone.
func (h *holding) sawAgain(agent string, a *slimAssignment) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bytes[agent] += a.size
}

func (h *holding) saw(agent string, a *slimAssignment) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.heard[agent] {
		h.heard[agent] = true
		if len(h.heard) == h.agents {
			close(h.heardAll)
		}
	}
	h.bytes[agent] += a.size
	if a.job == h.job && a.gen == h.gen && h.named != nil && !h.named[agent] {
		h.named[agent] = true
		if len(h.named) == 1 {
			h.first = time.Now()
		}
		if len(h.named) == h.target {
			h.all = time.Now()
		}
	}
	g := int64(0)
	if a.job == h.job && a.open && a.master != "" {
		g = a.gen
	}
	if h.at[agent] == g {
		return
	}
	if h.at[agent] == h.gen && h.gen != 0 {
		h.count--
	}
	h.at[agent] = g
	if g == h.gen && h.gen != 0 {
		h.count++
		if h.count == h.target {
			close(h.reached)
		}
	}
}

// procStat reads a process's CPU time (user + system) and resident memory.
func procStat(t *testing.T, pid int) (cpu time.Duration, rssMB float64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)       // utime, field 14 of stat
	st, _ := strconv.ParseInt(f[12], 10, 64)       // stime, field 15
	cpu = time.Duration(ut+st) * time.Second / 100 // clock ticks of 10 ms (USER_HZ 100)
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(s)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			rssMB = kb / 1024
		}
	}
	return cpu, rssMB
}

var etcdRequestLine = regexp.MustCompile(`^gpucoord_etcd_requests_total\{method="(\w+)"\} (\S+)$`)

// metricLines scrapes the coordinator's metrics, a line each.
func metricLines(t *testing.T, metrics string) []string {
	t.Helper()
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Split(string(b), "\n")
}

// relayCounts reads the coordinator's counts of the assignments its
// streams sent through relays and of those a member's own stream then sent
// (its relay reported no delivery in time); -1 when a build has none.
func relayCounts(t *testing.T, metrics string) (relayed, fallbacks int64) {
	t.Helper()
	relayed, fallbacks = -1, -1
	for _, l := range metricLines(t, metrics) {
		if v, ok := strings.CutPrefix(l, "gpucoord_relayed_assignments_total "); ok {
			relayed, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(l, "gpucoord_relay_fallbacks_total "); ok {
			fallbacks, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return relayed, fallbacks
}

// etcdRequests scrapes the coordinator's etcd request counters: all, and
// the writes (Put, Txn, DeleteRange).
func etcdRequests(t *testing.T, metrics string) (all, writes float64) {
	t.Helper()
	for _, l := range metricLines(t, metrics) {
		if m := etcdRequestLine.FindStringSubmatch(l); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			all += v
			if m[1] == "Put" || m[1] == "Txn" || m[1] == "DeleteRange" {
				writes += v
			}
		}
	}
	return all, writes
}

// loadSteadySteps is the steady state's length in steps of 100 ms: 10 s,
// or GPUCOORD_BENCH_LOAD_STEADY. At 16,384 nodes the coordinator collects
// its garbage about every 20 s, for 2 s of CPU: a 10 s window holds a
// collection or not, and the cores measured swing by a tenth with it.
func loadSteadySteps(t *testing.T) int {
	v := os.Getenv("GPUCOORD_BENCH_LOAD_STEADY")
	if v == "" {
		return 100
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Second {
		t.Fatalf("GPUCOORD_BENCH_LOAD_STEADY=%q: a duration of at least 1s (e.g. 60s)", v)
	}
	return int(d / (100 * time.Millisecond))
}

// loadProtocol is the protocol version the simulated agents speak.
var loadProtocol = int32(pb.ProtocolVersion)

func loadRun(t *testing.T, bin string, n int) string {
	addr, metrics := freeAddr(t), freeAddr(t)
	data := t.TempDir()
	if dir := os.Getenv("GPUCOORD_BENCH_LOAD_DATA"); dir != "" {
		// etcd's data elsewhere, e.g. /dev/shm: what is measured is then
		// the control plane, not the fsyncs of a disk others write to.
		var err error
		if data, err = os.MkdirTemp(dir, "bench-load-"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(data)
	}
	args := []string{"coordinator", "--listen", addr, "--metrics", metrics, "--data-dir", data, "--log-level", "warn"}
	args = append(args, strings.Fields(os.Getenv("GPUCOORD_BENCH_LOAD_ARGS"))...) // e.g. --lease-ttl 15s
	co := start(t, bin, args...)
	co.waitLine(t, "coordinator listening", 30*time.Second)
	pid := co.cmd.Process.Pid
	defer func() {
		// Stopped, not killed, on every path: a profile it writes
		// (GPUCOORD_CPUPROFILE) is whole.
		co.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-co.done:
		case <-time.After(30 * time.Second):
		}
		if path := os.Getenv("GPUCOORD_BENCH_LOAD_LOG"); path != "" { // the coordinator's log, e.g. with ARGS="--log-level info"
			if err := os.WriteFile(fmt.Sprintf("%s.%d", path, n), []byte(co.output()), 0o644); err != nil {
				t.Log(err)
			}
		}
	}()

	h := &holding{at: map[string]int64{}, bytes: map[string]int{}, heard: map[string]bool{}, heardAll: make(chan struct{}), agents: n}
	agents := make([]*simAgent, n)
	// Names of one width (n00000 to n16383 at 16,384: n10000 sorted
	// before n1001 when they were n%04d), so that the generations, which
	// order their members by name here, order them as the agents are:
	// rank 0 and the blocks of 32 (their relays) are the benchmark's.
	width := max(4, len(strconv.Itoa(n-1)))
	rank0 := fmt.Sprintf("n%0*d", width, 0)
	direct := os.Getenv("GPUCOORD_BENCH_LOAD_DIRECT") != "" // every agent reports itself, as before relays
	ctx, stop := context.WithCancel(t.Context())
	fleet := newSimFleet(ctx, addr, os.Getenv("GPUCOORD_BENCH_LOAD_DECODE") == "full")
	defer fleet.wait() // after stop, which ends them
	defer stop()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	// The last two agents are a failure domain of their own, each with a
	// real member of its pool, as real agents: the last is the node that
	// will be lost, and the other finds it dead and reports it
	// (PoolReport), as an agent does. They register after the others, one
	// after the other, so that the second joins the first's pool. Each
	// member is a process of its own (poolMemberMain), as on a real node:
	// beside the simulated agents' goroutines they would miss their
	// probes and find each other dead.
	const lostRack = "rack-lost"
	relays := make([]*simRelay, (n+pb.RelayBlock-1)/pb.RelayBlock)
	for i := range relays {
		relays[i] = &simRelay{fleet: fleet}
	}
	var victim *proc // the last agent's member
	registering := time.Now()
	register := func(rctx context.Context, i int) error {
		name := fmt.Sprintf("n%0*d", width, i)
		// Each node says it has a node server, as real agents do: a
		// job's changes then reach a block's members through its relay,
		// and with a fence window they are renewed through it
		// (relayed_renewals), one message a block. The simulated relays
		// hand the members their assignments (simFleet.forward) and
		// forward no renewals (the members keep no deadline): the
		// members' side of it is the agents' machines' work, not the
		// coordinator's.
		node := &pb.Node{Name: name, Host: "127.0.0.1", Gpus: 8, Protocol: loadProtocol, Instance: name, CheckpointAddr: "127.0.0.1:9"}
		pooled := i >= n-2
		if pooled {
			node.FailureDomain, node.GossipAddr = lostRack, freeAddr(t)
		}
		a, resp, err := fleet.register(rctx, node)
		if err != nil {
			return err
		}
		if pooled {
			m := poolMember{Name: gossip.MemberName(name, name), Addr: node.GossipAddr, Gossip: resp.GetGossip(), Join: i == n-1}
			js, err := json.Marshal(m)
			if err != nil {
				a.close()
				return err
			}
			p := startEnv(t, []string{poolMemberEnv + "=" + string(js)}, os.Args[0])
			p.waitLine(t, "pool member ready", 30*time.Second)
			if m.Join {
				victim = p
			} else {
				go witness(ctx, a, p)
			}
		}
		// Its relay in both generations: the first of its block of 32
		// (the generations order their members by name, and the lost
		// node is the last).
		rl := relays[i/pb.RelayBlock]
		if i%pb.RelayBlock == 0 {
			rl.via, rl = a, nil // a relay reports its own
		}
		if direct {
			rl = nil
		}
		if err := fleet.watch(a, simHooks{rank0: name == rank0, bootstrap: h.bootstrapped, relay: rl, stopped: h.stoppedAnswered,
			assigned: func(asg *slimAssignment) { h.saw(name, asg) }, again: func(asg *slimAssignment) { h.sawAgain(name, asg) }}); err != nil {
			return err
		}
		agents[i] = a
		return nil
	}
	for i := range n - 2 {
		g.Go(func() error { return register(gctx, i) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for i := n - 2; i < n; i++ {
		if err := register(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	// Watching: each stream has brought its first message, which the
	// coordinator sends once it has written the stream's conns key (the
	// node is then free for a job, as the leader's view will say).
	select {
	case <-h.allHeard():
	case <-time.After(2 * time.Minute):
		h.mu.Lock()
		heard := len(h.heard)
		h.mu.Unlock()
		t.Fatalf("%d of %d agents had their stream's first message after 2 minutes", heard, n)
	}
	registration := time.Since(registering)
	t.Logf("%d agents registered and watching (each stream's first message) in %s", n, registration.Round(time.Millisecond))
	cl := agents[0].cl

	// Rendezvous.
	job := "load"
	reached := h.expect(job, 1, n)
	cpuR0, _ := procStat(t, pid)
	begin := time.Now()
	if _, err := cl.Submit(ctx, &pb.SubmitRequest{Spec: &pb.JobSpec{Id: job, Nodes: int32(n), GpusPerNode: 8, Tp: 8, Pp: 1,
		Command: []string{"true"}, MinNodes: 1, MaxRestarts: 3, CheckpointDir: "/shared/ckpt"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, reached, "every agent holding generation 1", h)
	rendezvous := time.Since(begin)
	cpuR1, _ := procStat(t, pid)
	bytes1, _ := h.received()
	t.Logf("rendezvous in %s, %.0f bytes a node (%s); the coordinator's CPU %.2f s", rendezvous.Round(time.Millisecond), bytes1, h.phases(begin), (cpuR1 - cpuR0).Seconds())

	// The floor: for 5 s only the leases are renewed (every stream's,
	// every third of the TTL) and rank 0 reports 10 steps a second.
	cpuA, _ := procStat(t, pid)
	wallA := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	for s := 1; s <= 50; s++ {
		<-tick.C
		if _, err := cl.Report(ctx, &pb.ReportRequest{Job: job, Generation: 1, Node: agents[0].name,
			Kind: &pb.ReportRequest_Step{Step: &pb.Step{Step: int64(s), Loss: 1, Seconds: 0.1}}}); err != nil {
			t.Fatal(err)
		}
	}
	cpuB, _ := procStat(t, pid)
	floor := (cpuB - cpuA).Seconds() / time.Since(wallA).Seconds()
	t.Logf("leases and steps alone: %.2f cores", floor)

	// Steady state: rank 0 reports 10 steps a second, every agent its
	// compute times each second.
	steps := loadSteadySteps(t)
	cpu0, _ := procStat(t, pid)
	req0, wr0 := etcdRequests(t, metrics)
	wall0 := time.Now()
	tctx, stopTimes := context.WithCancel(ctx)
	var checkpointed atomic.Int64 // the last 10th step
	var times sync.WaitGroup
	// As real agents do, the nodes of each block of 32 report through
	// the block's first (Assignment.relay), which forwards their times
	// and stored steps in one call a second (Relayed). The first node of
	// each block is rank 0's node for the first: the assignments say so,
	// as the generation orders its members by name here.
	noStored := os.Getenv("GPUCOORD_BENCH_LOAD_NOSTORED") != ""
	for b := 0; b < n; b += pb.RelayBlock {
		block := agents[b:min(b+pb.RelayBlock, n)]
		times.Add(1)
		go func() {
			defer times.Done()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-tctx.Done():
					return
				case <-tick.C:
				}
				var reports []*pb.ReportRequest
				for j, a := range block {
					// Its 8 ranks' means, spread as a real job's are
					// (within 2% of each other).
					ranks := &pb.RankTimes{}
					for r := range 8 {
						ranks.Add(int32(8*(b+j)+r), 0.09*(1+0.02*rand.Float64()), 10)
					}
					reports = append(reports, &pb.ReportRequest{Job: job, Generation: 1, Node: a.name, Kind: &pb.ReportRequest_Times{Times: ranks}})
					// Every node's ranks have written the last 10th step:
					// the node reports it stored (a commit needs them all).
					if c := checkpointed.Load(); c > 0 && !noStored {
						reports = append(reports, &pb.ReportRequest{Job: job, Generation: 1, Node: a.name, Kind: &pb.ReportRequest_Stored{Stored: &pb.Stored{
							Steps: []*pb.StoredStep{{Step: c, Generation: 1}}}}})
					}
				}
				if !direct {
					block[0].cl.Report(tctx, &pb.ReportRequest{Job: job, Generation: 1, Node: block[0].name,
						Kind: &pb.ReportRequest_Relayed{Relayed: &pb.Relayed{Reports: reports}}})
					continue
				}
				var wg sync.WaitGroup
				for _, r := range reports {
					wg.Add(1)
					go func() {
						defer wg.Done()
						block[slices.IndexFunc(block, func(a *simAgent) bool { return a.name == r.Node })].cl.Report(tctx, r)
					}()
				}
				wg.Wait()
			}
		}()
	}
	for s := 51; s <= 50+steps; s++ {
		<-tick.C
		if _, err := cl.Report(ctx, &pb.ReportRequest{Job: job, Generation: 1, Node: agents[0].name,
			Kind: &pb.ReportRequest_Step{Step: &pb.Step{Step: int64(s), Loss: 1, Seconds: 0.1}}}); err != nil {
			t.Fatal(err)
		}
		if s%10 == 0 {
			checkpointed.Store(int64(s))
		}
	}
	tick.Stop()
	stopTimes()
	times.Wait()
	wall := time.Since(wall0)
	cpu1, rss := procStat(t, pid)
	req1, wr1 := etcdRequests(t, metrics)

	// A node lost: the last agent stops at once, its pool member
	// without leaving and its stream cut. Nothing reports it: the pool
	// finds it dead, the coordinator revokes its lease and the leader
	// makes the next generation.
	reached = h.expect(job, 2, n-1)
	cpuL0, _ := procStat(t, pid)
	begin = time.Now()
	victim.cmd.Process.Kill()
	agents[n-1].cancel()
	waitFor(t, reached, "every surviving agent holding generation 2", h)
	loss := time.Since(begin)
	cpuL1, _ := procStat(t, pid)
	relayed, fallbacks := relayCounts(t, metrics)
	t.Logf("loss to generation 2 in %s (%s); %s; assignments through relays %d, sent on members' own streams after a relay's silence %d; the coordinator's CPU from the loss to the opening %.2f s",
		loss.Round(time.Millisecond), h.phases(begin), fleet.counts(), relayed, fallbacks, (cpuL1 - cpuL0).Seconds())
	everyAgent := h.allAt().Sub(begin)
	bytes2, most2 := h.received()
	stop()
	co.cmd.Process.Signal(syscall.SIGTERM)
	co.wait(t, 30*time.Second)
	row := fmt.Sprintf("| %d | %s | %s | %s | %.2f (%.2f) | %.0f | %.1f | %.1f | %.0f | %.0f (max %d) | %d / %d |", n, registration.Round(time.Millisecond),
		rendezvous.Round(time.Millisecond), fmt.Sprintf("%s (%s)", everyAgent.Round(time.Millisecond), loss.Round(time.Millisecond)),
		(cpu1-cpu0).Seconds()/wall.Seconds(), floor, rss, (req1-req0)/float64(steps), (wr1-wr0)/float64(steps), bytes1, bytes2, most2,
		fleet.reconnects.Load(), fleet.reregistrations.Load())
	t.Log(row)
	return row
}

// witness reports each member its node's pool member (p, a process of
// poolMemberMain) declares dead, as an agent does (PoolReport), with the
// agent's current lease.
func witness(ctx context.Context, a *simAgent, p *proc) {
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-p.lines:
			if member, ok := strings.CutPrefix(l, "pool member dead: "); ok {
				go a.cl.PoolReport(ctx, &pb.PoolReportRequest{Node: a.name, LeaseId: a.Lease(), Dead: []string{member}})
			}
		}
	}
}

// poolMemberEnv set to a poolMember's JSON makes the test binary that
// member of a gossip pool (poolMemberMain) instead of running tests.
const poolMemberEnv = "GPUCOORD_BENCH_POOL_MEMBER"

// poolMember is a simulated agent's member of its failure domain's pool,
// as the coordinator's registration answer configures it.
type poolMember struct {
	Name, Addr string
	Gossip     *pb.Gossip
	Join       bool // join the answer's seeds
}

// poolMemberMain runs the member in the environment until it is killed,
// printing "pool member ready" once it is in the pool and "pool member
// dead: <member>" for each member it finds dead.
func poolMemberMain() int {
	var m poolMember
	if err := json.Unmarshal([]byte(os.Getenv(poolMemberEnv)), &m); err != nil {
		fmt.Println("pool member:", err)
		return 2
	}
	gs := m.Gossip
	tune := gossip.Tuning{ProbeInterval: time.Duration(gs.GetProbeIntervalMs()) * time.Millisecond,
		ProbeTimeout: time.Duration(gs.GetProbeTimeoutMs()) * time.Millisecond, SuspicionMult: int(gs.GetSuspicionMult())}
	p, err := gossip.New(m.Name, m.Addr, "", tune, gossip.Secure{Keys: gs.GetKeys(), Label: gs.GetLabel()}, deadPrinter{}, nil)
	if err != nil {
		fmt.Println("pool member:", err)
		return 1
	}
	defer p.Shutdown()
	if m.Join {
		if _, err := p.Join(gs.GetSeeds()); err != nil {
			fmt.Println("pool member: joining:", err)
			return 1
		}
	}
	fmt.Println("pool member ready")
	select {} // until killed (the test's cleanup, or the loss it measures)
}

type deadPrinter struct{}

func (deadPrinter) Dead(member string) { fmt.Println("pool member dead: " + member) }

func waitFor(t *testing.T, ch <-chan struct{}, what string, h *holding) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Minute):
		h.mu.Lock()
		n := h.count
		h.mu.Unlock()
		t.Fatalf("no %s within 2 minutes: %d of %d", what, n, h.target)
	}
}
