package coordinator

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gpucoord/gpucoord/internal/gossip"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// depose ends co's term as a dead leader's would end: its election lease
// is revoked, so a standby is elected and every fenced write of co fails.
func depose(t *testing.T, cli *clientv3.Client, co *Coordinator) {
	t.Helper()
	resp, err := cli.Get(context.WithoutCancel(t.Context()), keys(co.cfg.Prefix).leader()+"/", clientv3.WithPrefix())
	if err != nil {
		t.Error(err)
		return
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == co.cfg.Name {
			if _, err := cli.Revoke(context.WithoutCancel(t.Context()), clientv3.LeaseID(kv.Lease)); err != nil {
				t.Error(err)
			}
			return
		}
	}
	t.Error("no election key of", co.cfg.Name)
}

// strikesOf reads a node's strikes from etcd.
func strikesOf(t *testing.T, cli *clientv3.Client, prefix, node string) int {
	t.Helper()
	resp, err := cli.Get(t.Context(), keys(prefix).nodePolicy(node))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("policy of %s: %v, %d keys", node, err, len(resp.Kvs))
	}
	var p nodePolicy
	if err := decodeJSON(resp.Kvs[0].Value, &p); err != nil {
		t.Fatal(err)
	}
	return p.Strikes
}

// TestLeaderKilledWhileApplying: the leader dies at either side of writing
// a decision (generation 2 after n1 is lost, with n1's strike). Killed just
// after, the new leader neither makes the generation again nor strikes n1
// twice; killed just before, its write, when it comes, is refused, and the
// new leader makes generation 2 once.
func TestLeaderKilledWhileApplying(t *testing.T) {
	for _, when := range []string{"after", "before"} {
		t.Run(when, func(t *testing.T) {
			eps := testEtcd(t)
			a, _ := testCoordinator(t, eps, nil)
			ca := client(t, a.Addr())
			waitLeader(t, ca, a.cfg.Name)
			b, _ := testCoordinator(t, eps, nil)
			cb := client(t, b.Addr())
			var deposed atomic.Bool
			hook := func(job string, d *decision) {
				if job != "j" || d.gen.GetNumber() != 2 || !deposed.CompareAndSwap(false, true) {
					return
				}
				depose(t, a.etcd.Client, a)
				if when == "after" {
					<-t.Context().Done() // dead: it does nothing more
					return
				}
				// The write comes once the new leader has made generation 2.
				for {
					a0, _, changed := a.cache.assignment("n0")
					if a0.Generation.GetNumber() == 2 {
						return
					}
					select {
					case <-changed:
					case <-t.Context().Done():
						return
					}
				}
			}
			if when == "after" {
				a.hooks.afterApply = hook
			} else {
				a.hooks.beforeApply = hook
			}
			a0, _ := agent(t, cb, node("n0", 4))
			_, kill1 := agent(t, cb, node("n1", 4))
			s := spec("j", 2, 4)
			s.MinNodes, s.MaxRestarts = 1, 3
			if _, err := cb.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
				t.Fatal(err)
			}
			next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 1 })
			kill1()
			waitLeader(t, cb, b.cfg.Name)
			g := whole(t, b, next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 }))
			if when == "before" {
				for deadline := time.Now().Add(10 * time.Second); a.leading.Load(); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) { // the refused write ends a's term
						t.Fatal("the deposed leader still leads 10s after its late write")
					}
				}
			}
			// Once the new leader has answered a job submitted after all
			// this, it has looked at j too (it takes jobs in order).
			probe := spec("probe", 9, 1)
			probe.Tp, probe.Pp = 1, 1
			if _, err := cb.Submit(t.Context(), &pb.SubmitRequest{Spec: probe}); err != nil {
				t.Fatal(err)
			}
			waitJob(t, cb, "probe", func(j *pb.JobStatus) bool { return j.State.GetReason() != "waiting for rendezvous" })
			st := waitJob(t, cb, "j", func(*pb.JobStatus) bool { return true })
			if st.Generation.GetNumber() != 2 || len(g.Members) != 1 || g.Members[0].Node != "n0" || st.State.GetPhase() != pb.JobState_RUNNING {
				t.Fatalf("job j: generation %v, state %v; want generation 2 on n0, running", st.Generation, st.State)
			}
			if n := strikesOf(t, b.etcd.Client, b.cfg.Prefix, "n1"); n != 1 {
				t.Errorf("n1 has %d strikes, want 1", n)
			}
		})
	}
}

// TestWatchMissesNothing: a generation written after a Watch stream read
// the node's assignment, before it waits for the next, reaches the agent.
func TestWatchMissesNothing(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	var once sync.Once
	co.hooks.watchRead = func(string) {
		once.Do(func() {
			if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 1, 4)}); err != nil {
				t.Error(err)
				return
			}
			for { // until the leader has frozen generation 1 on n0
				a, _, changed := co.cache.assignment("n0")
				if a.Job == "j" {
					return
				}
				select {
				case <-changed:
				case <-t.Context().Done():
					return
				}
			}
		})
	}
	a0, _ := agent(t, c, node("n0", 4))
	if a := next(t, a0, func(*pb.Assignment) bool { return true }); a.Job != "" {
		t.Fatalf("first assignment %v, want the empty one read before the job existed", a)
	}
	if a := next(t, a0, func(*pb.Assignment) bool { return true }); a.Job != "j" || a.Generation.GetNumber() != 1 {
		t.Fatalf("second assignment %v, want generation 1 of j", a)
	}
}

// TestCancelRacesNewGeneration: a cancel and the leader's next generation
// at the same moment end the job cancelled, whichever writes first: the
// leader's write is refused when the cancel came first, and the cancel
// reads again and writes when the leader's came first.
func TestCancelRacesNewGeneration(t *testing.T) {
	t.Run("cancel first", func(t *testing.T) {
		co, _ := testCoordinator(t, testEtcd(t), nil)
		c := client(t, co.Addr())
		var refused atomic.Bool
		cancelled := make(chan error, 1)
		co.hooks.beforeApply = func(job string, d *decision) {
			if d.gen.GetNumber() == 2 && refused.CompareAndSwap(false, true) {
				resp, err := c.Cancel(context.WithoutCancel(t.Context()), &pb.CancelRequest{Job: job, Reason: "stop"})
				if err == nil && resp.State.GetPhase() != pb.JobState_CANCELLED {
					err = fmt.Errorf("state %v", resp.State)
				}
				cancelled <- err
			}
		}
		a0, _ := agent(t, c, node("n0", 4))
		_, kill1 := agent(t, c, node("n1", 4))
		s := spec("j", 2, 4)
		s.MinNodes, s.MaxRestarts = 1, 3
		c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
		next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
		kill1()
		// The cancel's answer can come after the watch sees its write.
		if err := <-cancelled; err != nil {
			t.Fatalf("cancel: %v", err)
		}
		if st := final(t, c, "j"); st.Phase != pb.JobState_CANCELLED || st.Reason != "stop" {
			t.Fatalf("state = %v, want cancelled", st)
		}
		next(t, a0, func(a *pb.Assignment) bool { return a.Job == "" })
		if st := waitJob(t, c, "j", func(*pb.JobStatus) bool { return true }); !refused.Load() || st.Generation.GetNumber() != 1 {
			t.Fatalf("generation %d (leader's write raced: %v), want 1: the leader's write refused", st.Generation.GetNumber(), refused.Load())
		}
	})
	t.Run("generation first", func(t *testing.T) {
		co, _ := testCoordinator(t, testEtcd(t), nil)
		c := client(t, co.Addr())
		a0, _ := agent(t, c, node("n0", 4))
		_, kill1 := agent(t, c, node("n1", 4))
		s := spec("j", 2, 4)
		s.MinNodes, s.MaxRestarts = 1, 3
		c.Submit(t.Context(), &pb.SubmitRequest{Spec: s})
		next(t, a0, func(a *pb.Assignment) bool { return a.Job == "j" })
		var reads atomic.Int32
		co.hooks.cancelRead = func(string) {
			if reads.Add(1) == 1 { // the leader writes generation 2 now
				kill1()
				next(t, a0, func(a *pb.Assignment) bool { return a.Generation.GetNumber() == 2 })
			}
		}
		resp, err := c.Cancel(t.Context(), &pb.CancelRequest{Job: "j"})
		if err != nil || resp.State.GetPhase() != pb.JobState_CANCELLED {
			t.Fatalf("cancel = %v, %v", resp, err)
		}
		if st := final(t, c, "j"); st.Phase != pb.JobState_CANCELLED {
			t.Fatalf("state = %v, want cancelled", st)
		}
		next(t, a0, func(a *pb.Assignment) bool { return a.Job == "" })
	})
}

// TestFence: a leader's write carries its election key's create revision;
// once another coordinator leads, it fails with errDeposed and writes
// nothing, even on keys nobody else wrote.
func TestFence(t *testing.T) {
	a, _ := testCoordinator(t, testEtcd(t), nil)
	cli := a.etcd.Client
	waitLeader(t, client(t, a.Addr()), a.cfg.Name)
	resp, err := cli.Get(t.Context(), keys(a.cfg.Prefix).leader()+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("election keys: %v, %v", resp, err)
	}
	kv := resp.Kvs[0]
	l := &leader{Coordinator: a, k: keys(a.cfg.Prefix), electionKey: string(kv.Key), electionRev: kv.CreateRevision,
		fence: clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)}
	if _, ok, err := l.txn(t.Context(), []clientv3.Op{clientv3.OpPut(l.k.policy("x"), "{}")}); !ok || err != nil {
		t.Fatalf("leader's write: ok %v, %v", ok, err)
	}
	depose(t, cli, a)
	if _, ok, err := l.txn(t.Context(), []clientv3.Op{clientv3.OpPut(l.k.policy("y"), "{}")}); ok || !errors.Is(err, errDeposed) {
		t.Fatalf("deposed leader's write: ok %v, err %v; want errDeposed", ok, err)
	}
	if r, _ := cli.Get(t.Context(), l.k.policy("y")); len(r.Kvs) != 0 {
		t.Fatal("the deposed leader's write landed")
	}
}

// TestGossipKeyShared: coordinators of one cluster (one etcd prefix) use
// the pool key the first created, whichever starts first; a cluster under
// another prefix has its own key and label, so the two clusters' pools do
// not mix. A node naming no failure domain gossips under the cluster's
// label.
func TestGossipKeyShared(t *testing.T) {
	eps := testEtcd(t)
	a, _ := testCoordinator(t, eps, nil)
	b, _ := testCoordinator(t, eps, nil)
	other, _ := testCoordinator(t, eps, func(c *Config) { c.Prefix = "/other/" })
	if !bytes.Equal(a.srv.gossip.Keys[0], b.srv.gossip.Keys[0]) || a.srv.gossip.Label != b.srv.gossip.Label {
		t.Fatal("two coordinators of one cluster have different gossip keys or labels")
	}
	if bytes.Equal(a.srv.gossip.Keys[0], other.srv.gossip.Keys[0]) || a.srv.gossip.Label == other.srv.gossip.Label {
		t.Fatalf("clusters /gpucoord/ and /other/ share a gossip key or label (%q, %q)", a.srv.gossip.Label, other.srv.gossip.Label)
	}
	resp, err := client(t, a.Addr()).Register(t.Context(), &pb.RegisterRequest{Node: node("n0", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.Gossip; len(g.Keys) != 1 || !bytes.Equal(g.Keys[0], a.srv.gossip.Keys[0]) || g.Label != a.srv.gossip.Label {
		t.Fatalf("Register handed the agent %d keys, label %q: want the cluster's", len(g.Keys), g.Label)
	}
}

// TestKeyringSteps: the steps of a rotation of the pool's keys, and the
// orders they refuse.
func TestKeyringSteps(t *testing.T) {
	k := bytes.Repeat([]byte{1}, 32)
	r, err := parseKeyring([]byte(hex.EncodeToString(k))) // as the first coordinator writes it
	if err != nil || len(r) != 1 {
		t.Fatalf("parse a single key: %v, %v", r, err)
	}
	if _, err := r.step("use"); err == nil || !strings.Contains(err.Error(), "install one first") {
		t.Errorf("use with nothing installed: %v", err)
	}
	installed, err := r.step("install")
	if err != nil || len(installed) != 2 || !bytes.Equal(installed[0].key, k) || installed[1].retired {
		t.Fatalf("install: %v, %v", installed, err)
	}
	if _, err := installed.step("install"); err == nil || !strings.Contains(err.Error(), "rotation is under way") {
		t.Errorf("a second install: %v", err)
	}
	used, err := installed.step("use")
	if err != nil || len(used) != 2 || !bytes.Equal(used[0].key, installed[1].key) || !used[1].retired || !bytes.Equal(used[1].key, k) {
		t.Fatalf("use: %v, %v", used, err)
	}
	if _, err := used.step("use"); err == nil {
		t.Error("use twice: the retired key came back into use")
	}
	again, err := parseKeyring([]byte(used.String()))
	if err != nil || again.String() != used.String() {
		t.Fatalf("%q does not read back: %v", used.String(), err)
	}
	removed, err := again.step("remove")
	if err != nil || len(removed) != 1 || !bytes.Equal(removed[0].key, used[0].key) {
		t.Fatalf("remove: %v, %v", removed, err)
	}
	for _, bad := range []string{"", "-" + hex.EncodeToString(k), "zz", hex.EncodeToString(k[:5])} {
		if _, err := parseKeyring([]byte(bad)); err == nil {
			t.Errorf("parseKeyring(%q) took it", bad)
		}
	}
}

// TestGossipKeyRotation: the pools' keys change without a restart.
// Members that take the keys from their assignments (as agents do) reach
// each other after every step; a member that kept the old key still
// reaches them after "install", and no longer after "use".
func TestGossipKeyRotation(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("n0", 1)})
	if err != nil {
		t.Fatal(err)
	}
	assignments, _ := watch(t, c, "n0", resp.LeaseId, 0)
	g := resp.Gossip
	member := func(name string, seeds ...string) *gossip.Pool {
		p, err := gossip.New(name, "127.0.0.1:0", "", co.cfg.GossipTuning, gossip.Secure{Keys: g.Keys, Label: g.Label}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		if _, err := p.Join(seeds); len(seeds) > 0 && err != nil {
			t.Fatal(err)
		}
		return p
	}
	anchor := member("n0#1")
	fresh, stale := member("n1#1", anchor.LocalNode().Address()), member("stale#1", anchor.LocalNode().Address())
	anchorAddr, err := net.ResolveUDPAddr("udp", anchor.LocalNode().Address())
	if err != nil {
		t.Fatal(err)
	}
	reaches := func(p *gossip.Pool) bool {
		_, err := p.Ping(anchor.LocalNode().Name, anchorAddr)
		return err == nil
	}
	for _, step := range []struct {
		action     string
		staleReach bool
	}{{"install", true}, {"use", false}, {"remove", false}} {
		out, err := c.GossipKeys(t.Context(), &pb.GossipKeysRequest{Action: step.action})
		if err != nil {
			t.Fatalf("%s: %v", step.action, err)
		}
		a := next(t, assignments, func(a *pb.Assignment) bool {
			return len(a.GossipKeys) == len(out.Fingerprints) && gossip.Fingerprint(a.GossipKeys[0]) == out.Fingerprints[0]
		})
		for _, p := range []*gossip.Pool{anchor, fresh} {
			if err := p.SetKeys(a.GossipKeys); err != nil {
				t.Fatal(err)
			}
		}
		if !reaches(fresh) {
			t.Errorf("after %s, a member with the assignment's keys cannot reach another", step.action)
		}
		if got := reaches(stale); got != step.staleReach {
			t.Errorf("after %s, a member with the old key only reaches one with the assignment's: %v, want %v", step.action, got, step.staleReach)
		}
	}
	if out, err := c.GossipKeys(t.Context(), &pb.GossipKeysRequest{Action: "list"}); err != nil || len(out.Fingerprints) != 1 {
		t.Errorf("list after remove: %v, %v", out, err)
	}
}

// TestCheckGeneration: the generations the cache takes from etcd.
func TestCheckGeneration(t *testing.T) {
	m := func(first, ranks int32) *pb.Member { return &pb.Member{Node: "n", FirstRank: first, Ranks: ranks} }
	tests := []struct {
		world   int32
		members []*pb.Member
		ok      bool
	}{
		{4, []*pb.Member{m(0, 2), m(2, 2)}, true},
		{1, []*pb.Member{m(0, 1)}, true},
		{4, []*pb.Member{m(0, 2)}, false},                   // ranks 2-3 held by no one
		{4, []*pb.Member{m(0, 2), m(3, 1)}, false},          // a gap
		{4, []*pb.Member{m(0, 2), m(1, 3)}, false},          // an overlap
		{4, []*pb.Member{m(-5, 2147483647)}, false},         // the fuzzer's: 2^31 lost ranks to list
		{2147483647, []*pb.Member{m(0, 2147483647)}, false}, // over maxWorld
		{0, nil, false},
		{2, []*pb.Member{m(0, 0), m(0, 2)}, false},
	}
	for i, tc := range tests {
		err := checkGeneration(&pb.Generation{World: tc.world, Members: tc.members})
		if (err == nil) != tc.ok {
			t.Errorf("case %d: err = %v, want ok %v", i, err, tc.ok)
		}
	}
}

// TestWatchHeartbeat: a stream's first message says how often the stream
// brings one, and while etcd's renewals bring none (dropped here, as when
// they are late), the stream sends an empty renewal in their place, so
// that the agent, whose connection is not pinged, keeps to it.
func TestWatchHeartbeat(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	co.hooks.dropRenewal = func(string) bool { return true }
	c := client(t, co.Addr())
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("n0", 1)})
	if err != nil {
		t.Fatal(err)
	}
	// Without heartbeats the stream would say nothing until this bound.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	stream, err := c.Watch(ctx, &pb.WatchRequest{Node: "n0", LeaseId: resp.LeaseId, Session: testSessions.Add(1)})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// The tests' lease is 2 s: etcd renews it every 666 ms, within the
	// half second of its client's loop.
	if want := (2*time.Second/3 + 600*time.Millisecond).Milliseconds(); first.HeartbeatMs != want {
		t.Errorf("first message's heartbeat %d ms, want %d", first.HeartbeatMs, want)
	}
	for i := range 3 {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("message %d: %v", i+2, err)
		}
		if !m.Renewal || m.LeaseTtlMs != 0 || m.HeartbeatMs != 0 {
			t.Errorf("message %d: %v, want an empty renewal", i+2, m)
		}
	}
}

// TestStallAfter: a stream ends two thirds of a lease without a renewal,
// but never before a heartbeat and half a second: the default lease and
// longer are unchanged, the tests' 2 s gets 1.77 s.
func TestStallAfter(t *testing.T) {
	s := time.Second
	for _, tc := range []struct{ ttl, want time.Duration }{
		{2 * s, 2*s/3 + 1100*time.Millisecond}, // 1.77 s, not 1.33
		{5 * s, 10 * s / 3},
		{15 * s, 10 * s},
	} {
		if got := stallAfter(tc.ttl); got != tc.want {
			t.Errorf("stallAfter(%s) = %s, want %s", tc.ttl, got, tc.want)
		}
	}
}
