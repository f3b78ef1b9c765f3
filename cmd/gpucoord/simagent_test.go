package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/backoff"
	"github.com/gpucoord/gpucoord/internal/e2e"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// The simulated agents' backoff before a new Watch (or a new
// registration) after a stream ended: short, as a real agent's retry, and
// jittered, so that agents whose streams ended together (a coordinator
// restarted) do not come back together.
const (
	simRetry    = 50 * time.Millisecond
	simMaxRetry = time.Second
)

// simFleet is the simulated agents of one benchmark run, each a gRPC
// connection of the test with its own lease and Watch stream, against one
// coordinator (TestControlPlaneLoad, TestWebLoad). Like a real agent
// (worker.Agent's session), an agent whose stream ends while the run goes
// on watches again with its lease after a short backoff, and registers
// again first when the coordinator says its lease is gone (codes.NotFound).
//
// # Concurrency
//
// register and watch may be called from many goroutines. Every goroutine
// of an agent ends when the agent is stopped or the fleet's context ends;
// wait waits for them.
type simFleet struct {
	ctx  context.Context // the run's: every agent ends with it
	addr string
	full bool // decode assignments whole (see watchSlim)
	wg   sync.WaitGroup

	// reconnects counts the Watch streams opened after one ended while
	// the run went on; reregistrations the registrations made because
	// the coordinator said a lease was gone.
	reconnects, reregistrations atomic.Int64

	mu    sync.Mutex
	ended map[codes.Code]*streamEnds // why streams ended (or were refused) while the run went on
	// relayRefused is why the coordinator did not take reports relayed
	// (simRelay): their nodes then sent them themselves.
	relayRefused map[codes.Code]*streamEnds
	// byName are the agents watching, by name: a relay hands its
	// members their assignments (forward).
	byName map[string]*simAgent
}

// refusedRelayed counts a relayed report the coordinator did not take.
func (f *simFleet) refusedRelayed(c codes.Code, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.relayRefused == nil {
		f.relayRefused = map[codes.Code]*streamEnds{}
	}
	e := f.relayRefused[c]
	if e == nil {
		e = &streamEnds{first: msg}
		f.relayRefused[c] = e
	}
	e.count++
}

// streamEnds is how many streams ended with one code, and the first one's
// message.
type streamEnds struct {
	count int
	first string
}

// streamEnded notes that a stream ended with err while the run went on.
func (f *simFleet) streamEnded(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := status.Convert(err)
	e := f.ended[st.Code()]
	if e == nil {
		e = &streamEnds{first: st.Message()}
		f.ended[st.Code()] = e
	}
	e.count++
}

func newSimFleet(ctx context.Context, addr string, full bool) *simFleet {
	return &simFleet{ctx: ctx, addr: addr, full: full, ended: map[codes.Code]*streamEnds{}, byName: map[string]*simAgent{}}
}

// simAgent is one simulated agent.
type simAgent struct {
	name string
	node *pb.Node
	cc   *grpc.ClientConn
	cl   pb.CoordinatorClient
	ctx  context.Context
	// cancel stops the agent, as a node lost: its stream ends and it does
	// not come back.
	cancel context.CancelFunc
	lease  atomic.Int64 // the lease of its latest registration
	// streams counts the Watch streams it opened; an assigned hook reads
	// it to tell which stream a message came on.
	streams atomic.Int64

	mu   sync.Mutex
	drop context.CancelFunc // ends the current stream alone

	hooks simHooks
	// hmu guards what the agent holds of its assignments, taken from its
	// stream and, through its block's relay, on the relay's goroutine.
	hmu      sync.Mutex
	stopped  int64  // the generation below which this node said it runs nothing
	booted   int64  // the last generation whose rank 0's address this node reported
	session  uint64 // the stream open
	relayKey []byte // its relay key
	// applied is the newest revision taken, relayedRev the newest taken
	// through the relay: each revision is taken once, as by a real agent.
	applied, relayedRev int64
}

// Lease is the agent's current lease.
func (a *simAgent) Lease() int64 { return a.lease.Load() }

// dropStream ends the agent's current Watch stream, as a network fault
// does, without stopping the agent: it watches again.
func (a *simAgent) dropStream() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.drop != nil {
		a.drop()
	}
}

func (a *simAgent) close() {
	a.cancel()
	a.cc.Close()
}

// register dials the coordinator and registers node, with ctx bounding
// the registration. The agent does nothing more until watch.
func (f *simFleet) register(ctx context.Context, node *pb.Node) (*simAgent, *pb.RegisterResponse, error) {
	cc, err := pb.DialAgent(f.addr, nil, 0)
	if err != nil {
		return nil, nil, err
	}
	cl := pb.NewCoordinatorClient(cc)
	resp, err := cl.Register(ctx, &pb.RegisterRequest{Node: node})
	if err != nil {
		cc.Close()
		return nil, nil, fmt.Errorf("register %s: %w", node.Name, err)
	}
	actx, cancel := context.WithCancel(f.ctx)
	a := &simAgent{name: node.Name, node: node, cc: cc, cl: cl, ctx: actx, cancel: cancel}
	a.lease.Store(resp.LeaseId)
	return a, resp, nil
}

// simHooks is what an agent does with its assignments beyond what every
// simulated agent does.
type simHooks struct {
	// rank0 says the node runs rank 0: it reports rank 0's address once
	// a generation that has none, opened or not.
	rank0 bool
	// relay, if not nil, is the node's relay (Assignment.relay), through
	// which it says it stopped earlier ranks.
	relay *simRelay
	// bootstrap, if not nil, is called as rank 0's node reports the
	// address.
	bootstrap func()
	// stopped, if not nil, is called once the node's report that it
	// stopped earlier ranks is answered.
	stopped func()
	// assigned, if not nil, is called with every assignment but
	// renewals, after the agent's own reports: on the agent's goroutine,
	// or its relay's for one that came through it.
	assigned func(*slimAssignment)
	// again, if not nil, is called with an assignment the agent's stream
	// brought after its relay had (the agent leaves it alone).
	again func(*slimAssignment)
}

// watch opens the agent's first Watch stream and follows it, and the
// streams after it, on a goroutine of the fleet until the agent stops or
// the fleet's context ends. Following a stream, the agent reports it
// stopped earlier ranks when a generation waits for them (as every real
// agent does) and, for rank 0's node, rank 0's address. If the first
// stream cannot be opened the agent is closed and the error returned.
func (f *simFleet) watch(a *simAgent, hooks simHooks) error {
	recv, err := f.openWatch(a)
	if err != nil {
		a.close()
		return err
	}
	a.hooks = hooks
	f.mu.Lock()
	f.byName[a.name] = a
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer a.close()
		register := false // the coordinator said the lease is gone
		for failed := 0; ; failed++ {
			received, err := f.follow(a, recv)
			if a.ctx.Err() != nil {
				return
			}
			// The stream ended while the run goes on: come back, as a
			// real agent does.
			if received {
				failed = 0
			}
			f.streamEnded(err)
			if status.Code(err) == codes.NotFound {
				register = true
			}
			t := time.NewTimer(backoff.Next(failed, simRetry, simMaxRetry))
			select {
			case <-a.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if register {
				resp, err := a.cl.Register(a.ctx, &pb.RegisterRequest{Node: a.node})
				if err != nil {
					recv = func() (*slimAssignment, error) { return nil, err }
					continue
				}
				a.lease.Store(resp.LeaseId)
				f.reregistrations.Add(1)
				register = false
			}
			f.reconnects.Add(1)
			if recv, err = f.openWatch(a); err != nil {
				recv = func() (*slimAssignment, error) { return nil, err }
			}
		}
	}()
	return nil
}

// openWatch opens a Watch stream for a with its current lease, ended by
// dropStream or when the agent stops.
func (f *simFleet) openWatch(a *simAgent) (func() (*slimAssignment, error), error) {
	sctx, drop := context.WithCancel(a.ctx)
	a.mu.Lock()
	if a.drop != nil {
		a.drop() // the stream before, ended already: its context goes
	}
	a.drop = drop
	a.mu.Unlock()
	session := uint64(a.streams.Add(1))
	a.hmu.Lock()
	a.session, a.relayKey, a.applied, a.relayedRev = session, nil, 0, 0
	a.hmu.Unlock()
	return watchSlim(sctx, a.cc, &pb.WatchRequest{Node: a.name, LeaseId: a.lease.Load(), Session: session}, f.full)
}

// follow reads one stream until it ends; received says whether it
// brought anything. A relay's message hands its block's members theirs.
func (f *simFleet) follow(a *simAgent, recv func() (*slimAssignment, error)) (received bool, err error) {
	for {
		asg, err := recv()
		if err != nil {
			return received, err
		}
		received = true
		if len(asg.relayKey) > 0 {
			a.hmu.Lock()
			a.relayKey = asg.relayKey
			a.hmu.Unlock()
		}
		if len(asg.relayed) > 0 {
			f.forward(a, asg)
		}
		if !asg.renewal {
			a.take(f, asg, false)
		}
	}
}

// take acts on a new assignment, from the agent's stream or (relayed)
// through its relay: once a revision. Like a real agent, the node reports
// it stopped earlier ranks when a generation waits for them and, for rank
// 0's node, rank 0's address.
func (a *simAgent) take(f *simFleet, asg *slimAssignment, relayed bool) {
	hooks := a.hooks
	a.hmu.Lock()
	// The worker's session loop's rule: a relayed one newer than any
	// taken, a stream's unless a relay brought it or a newer one.
	if relayed && asg.revision <= a.applied || !relayed && a.relayedRev != 0 && asg.revision <= a.relayedRev {
		a.hmu.Unlock()
		if !relayed && hooks.again != nil {
			hooks.again(asg)
		}
		return
	}
	a.applied = max(a.applied, asg.revision)
	if relayed {
		a.relayedRev = asg.revision
	}
	var boot *pb.ReportRequest
	if asg.job != "" && asg.master == "" && hooks.rank0 && asg.gen > a.booted {
		// This node runs rank 0: it reports its address once a
		// generation, opened or not, as a real agent does.
		a.booted = asg.gen
		if hooks.bootstrap != nil {
			hooks.bootstrap()
		}
		boot = &pb.ReportRequest{Job: asg.job, Generation: asg.gen, Node: a.name,
			Kind: &pb.ReportRequest_Bootstrap{Bootstrap: &pb.Bootstrap{Master: "127.0.0.1:29500"}}}
	}
	stop := asg.job != "" && !asg.open && asg.gen > a.stopped
	if stop {
		a.stopped = asg.gen
	}
	a.hmu.Unlock()
	if stop {
		// A generation that waits for earlier ranks to stop: the node
		// stops its own and says so, as every real agent does, after
		// its address when it runs rank 0.
		req := &pb.ReportRequest{Job: asg.job, Node: a.name, LeaseId: a.lease.Load(),
			Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: asg.gen}}}
		f.wg.Go(func() {
			if boot != nil {
				a.report(boot)
			}
			if hooks.relay != nil {
				req.Generation = asg.gen
				hooks.relay.report(a, req)
			} else {
				a.report(req)
			}
			if hooks.stopped != nil {
				hooks.stopped()
			}
		})
	} else if boot != nil {
		f.wg.Go(func() { a.report(boot) })
	}
	if hooks.assigned != nil {
		hooks.assigned(asg)
	}
}

// forward hands the members' assignments relay's message asg carries to
// them, as a relay's agent posts each to its member's node server, and
// reports those they took (Delivered). The member checks each as a real
// agent does (its stream's session, the MAC of its relay key); the hop
// itself is a call here, as the members' reports to their relay are
// (simRelay): on a cluster it is the relay's and the member's machines'
// work, not the coordinator's.
func (f *simFleet) forward(relay *simAgent, asg *slimAssignment) {
	var took pb.Delivered
	for _, r := range asg.relayed {
		f.mu.Lock()
		m := f.byName[r.Node]
		f.mu.Unlock()
		if m == nil || !m.takeRelayed(f, r) {
			continue
		}
		took.Nodes, took.Sessions = append(took.Nodes, r.Node), append(took.Sessions, r.Session)
	}
	if len(took.Nodes) == 0 {
		return
	}
	took.Revision = asg.revision
	sent := time.Now()
	f.wg.Go(func() {
		_, err := relay.cl.Report(relay.ctx, &pb.ReportRequest{Job: asg.job, Generation: asg.gen, Node: relay.name, LeaseId: relay.lease.Load(),
			Kind: &pb.ReportRequest_Delivered{Delivered: &took}})
		switch {
		case err != nil && relay.ctx.Err() == nil:
			f.refusedRelayed(status.Code(err), "delivered: "+err.Error())
		case time.Since(sent) > pb.RelayWait:
			f.refusedRelayed(codes.DeadlineExceeded, fmt.Sprintf("delivered, answered after %s", time.Since(sent).Round(time.Millisecond)))
		}
	})
}

// takeRelayed takes an assignment forwarded by a relay when it is for the
// stream open and passes its MAC, as a real agent's node server does.
func (a *simAgent) takeRelayed(f *simFleet, r *pb.RelayedRenewal) bool {
	a.hmu.Lock()
	key, session := a.relayKey, a.session
	a.hmu.Unlock()
	if r.Session != session || !pb.RelayMACValid(key, r) {
		return false
	}
	asg := &slimAssignment{}
	if asg.parse(r.Assignment) != nil {
		return false
	}
	asg.size = 0 // the coordinator sent its bytes in the relay's message
	a.take(f, asg, true)
	return true
}

// simRelay is a block's relay (the worker's relay.go) as the simulated
// agents have it: the block's nodes hand it their Stopped reports, and it
// sends those that come within 5 ms, or while its last call is under way,
// in one Relayed call of its own node (via). A report the coordinator does
// not take in a relayed call, for a reason another try could mend, its
// node sends itself, as a real one does.
type simRelay struct {
	fleet   *simFleet
	via     *simAgent // set before any job
	mu      sync.Mutex
	pending []simRelayed
	busy    bool
}

type simRelayed struct {
	from *simAgent
	r    *pb.ReportRequest
	done chan struct{}
}

// report hands r, from's, to the relay and returns once it is answered.
func (rl *simRelay) report(from *simAgent, r *pb.ReportRequest) {
	x := simRelayed{from, r, make(chan struct{})}
	rl.mu.Lock()
	rl.pending = append(rl.pending, x)
	lead := !rl.busy
	rl.busy = true
	rl.mu.Unlock()
	if !lead {
		select {
		case <-x.done:
		case <-from.ctx.Done():
		}
		return
	}
	time.Sleep(5 * time.Millisecond) // the relay's gathering window (relayGather)
	for {
		rl.mu.Lock()
		batch := rl.pending
		rl.pending = nil
		if len(batch) == 0 {
			rl.busy = false
			rl.mu.Unlock()
			return
		}
		rl.mu.Unlock()
		reports := make([]*pb.ReportRequest, len(batch))
		for i, x := range batch {
			reports[i] = x.r
		}
		resp, err := rl.via.cl.Report(rl.via.ctx, &pb.ReportRequest{Job: batch[0].r.Job, Generation: batch[0].r.Generation, Node: rl.via.name,
			LeaseId: rl.via.lease.Load(), Kind: &pb.ReportRequest_Relayed{Relayed: &pb.Relayed{Reports: reports}}})
		var direct []simRelayed
		for i, x := range batch {
			switch {
			case err != nil:
				rl.fleet.refusedRelayed(status.Code(err), err.Error())
			case i >= len(resp.Relayed):
				rl.fleet.refusedRelayed(codes.Internal, "no answer")
			case codes.Code(resp.Relayed[i].Code) != codes.OK:
				rl.fleet.refusedRelayed(codes.Code(resp.Relayed[i].Code), resp.Relayed[i].Error)
			default:
				close(x.done)
				continue
			}
			direct = append(direct, x)
		}
		for _, x := range direct {
			go func() {
				x.from.report(x.r)
				close(x.done)
			}()
		}
	}
}

// wait waits until every agent's goroutines have ended: call it after
// the fleet's context ended.
func (f *simFleet) wait() { f.wg.Wait() }

// counts says how often the agents watched and registered again, and
// why their streams ended or were refused (each code's count and first
// message).
func (f *simFleet) counts() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var why []string
	for _, c := range slices.Sorted(maps.Keys(f.ended)) {
		why = append(why, fmt.Sprintf("%s %d (the first: %q)", c, f.ended[c].count, f.ended[c].first))
	}
	s := fmt.Sprintf("agents: %d reconnections, %d re-registrations", f.reconnects.Load(), f.reregistrations.Load())
	for _, c := range slices.Sorted(maps.Keys(f.relayRefused)) {
		s += fmt.Sprintf("; relayed reports refused %s %d (the first: %q)", c, f.relayRefused[c].count, f.relayRefused[c].first)
	}
	if len(why) > 0 {
		s += "; streams ended or refused: " + strings.Join(why, ", ")
	}
	return s
}

// TestSimAgentsComeBack checks the benchmarks' simulated agents come back
// as real agents do, against a coordinator process: one whose stream is
// cut watches again with its lease, one whose lease is revoked (Leave)
// registers again first, and all of them watch again when the
// coordinator restarts; once the fleet's context ends, every goroutine
// of theirs ends.
func TestSimAgentsComeBack(t *testing.T) {
	bin := e2e.Binary(t)
	addr, data := freeAddr(t), t.TempDir()
	coordinator := func() *proc {
		co := start(t, bin, "coordinator", "--listen", addr, "--data-dir", data, "--log-level", "warn")
		co.waitLine(t, "coordinator listening", 30*time.Second)
		return co
	}
	co := coordinator()
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	fleet := newSimFleet(ctx, addr, false)

	// Each stream's first message is the node's assignment (no job: an
	// empty one), which says which stream it came on.
	type seen struct {
		node   string
		stream int64
	}
	seenCh := make(chan seen, 64)
	agents := make([]*simAgent, 3)
	for i := range agents {
		name := fmt.Sprintf("n%04d", i)
		a, _, err := fleet.register(ctx, &pb.Node{Name: name, Host: "127.0.0.1", Gpus: 8, Protocol: pb.ProtocolVersion, Instance: name})
		if err != nil {
			t.Fatal(err)
		}
		err = fleet.watch(a, simHooks{assigned: func(*slimAssignment) {
			select {
			case seenCh <- seen{name, a.streams.Load()}:
			case <-ctx.Done():
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		agents[i] = a
	}
	// waitStream waits for a message to a on a stream after its stream
	// number after (a stream refused counts too: no message comes on it).
	latest := map[string]int64{} // node -> the latest stream a message came on
	waitStream := func(a *simAgent, after int64) {
		t.Helper()
		timeout := time.After(time.Minute)
		for latest[a.name] <= after {
			select {
			case s := <-seenCh:
				latest[s.node] = max(latest[s.node], s.stream)
			case <-timeout:
				t.Fatalf("%s: no message on a stream after its %d within a minute (%s)", a.name, after, fleet.counts())
			}
		}
	}
	for _, a := range agents {
		waitStream(a, 0)
	}

	// A stream cut: the agent watches again with the same lease.
	lease1 := agents[1].Lease()
	agents[1].dropStream()
	waitStream(agents[1], 1)
	if got := agents[1].Lease(); got != lease1 {
		t.Errorf("%s: lease %x after its stream was cut, want %x still", agents[1].name, got, lease1)
	}
	if r, rr := fleet.reconnects.Load(), fleet.reregistrations.Load(); r != 1 || rr != 0 {
		t.Errorf("after a stream cut: %d reconnections, %d re-registrations, want 1 and 0", r, rr)
	}
	t.Logf("a stream cut: %s", fleet.counts())

	// The lease gone: the coordinator ends the stream with NotFound, and
	// the agent registers again before it watches.
	lease2 := agents[2].Lease()
	if _, err := agents[0].cl.Leave(ctx, &pb.LeaveRequest{Node: agents[2].name, LeaseId: lease2}); err != nil {
		t.Fatal(err)
	}
	waitStream(agents[2], 1)
	if got := agents[2].Lease(); got == lease2 {
		t.Errorf("%s: still lease %x after it was revoked", agents[2].name, got)
	}
	if r, rr := fleet.reconnects.Load(), fleet.reregistrations.Load(); r != 2 || rr != 1 {
		t.Errorf("after a lease revoked: %d reconnections, %d re-registrations, want 2 and 1", r, rr)
	}
	t.Logf("a lease revoked: %s", fleet.counts())

	// The coordinator restarted: every stream ends, every agent watches
	// again once it is back.
	streams := make([]int64, len(agents))
	for i, a := range agents {
		streams[i] = a.streams.Load()
	}
	co.cmd.Process.Signal(syscall.SIGTERM)
	co.wait(t, 30*time.Second)
	coordinator()
	for i, a := range agents {
		waitStream(a, streams[i])
	}
	if r := fleet.reconnects.Load(); r < 5 {
		t.Errorf("after a restart: %d reconnections, want at least 5", r)
	}
	t.Logf("the coordinator restarted: %s", fleet.counts())

	stop()
	done := make(chan struct{})
	go func() {
		fleet.wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the agents' goroutines still run 30 s after the fleet's context ended")
	}
}

// report sends r until the coordinator takes it or refuses it for good,
// as a real agent's reportResp does: a generation opens only with every
// Stopped report and rank 0's address, and one the coordinator could not
// write (etcd slow under the load) is said again.
func (a *simAgent) report(r *pb.ReportRequest) {
	for {
		_, err := a.cl.Report(a.ctx, r)
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		default:
			return
		}
		select {
		case <-a.ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}
