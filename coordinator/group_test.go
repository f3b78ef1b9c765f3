package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sync"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestGroupCommit: the first item of a key is written at once; the items
// that arrive while that write is under way go together in the next; each
// report gets its own outcome; keys are written apart; a report whose
// context ends stops waiting; the items added together are in one group.
func TestGroupCommit(t *testing.T) {
	var bg sync.WaitGroup
	defer bg.Wait()
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	calls := map[string][][]string{}
	w := newGroupCommit(&bg, func(_ context.Context, k string, items map[string]int) map[string]string {
		mu.Lock()
		calls[k] = append(calls[k], slices.Sorted(maps.Keys(items)))
		first := k == "j" && len(calls[k]) == 1
		mu.Unlock()
		if first {
			close(started)
			<-release
		}
		out := map[string]string{}
		for name, v := range items {
			out[name] = fmt.Sprintf("%s/%s=%d", k, name, v)
		}
		return out
	})
	type result struct{ name, got string }
	results := make(chan result, 12)
	add := func(ctx context.Context, k, name string, v int) {
		got, err := w.add(ctx, k, name, v)
		if err != nil {
			got = err.Error()
		}
		results <- result{name, got}
	}
	go add(t.Context(), "j", "a", 1)
	<-started
	for i := range 10 {
		go add(t.Context(), "j", fmt.Sprintf("n%d", i), i)
	}
	// Another key is written apart, while j's write is under way.
	if got, err := w.add(t.Context(), "k", "a", 7); err != nil || got != "k/a=7" {
		t.Errorf("k: %q, %v", got, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := w.add(ctx, "j", "late", 0); status.Code(err) != codes.Canceled {
		t.Errorf("a report whose context ended: %v, want Canceled", err)
	}
	// Every report is in j's next group before the first write ends.
	for {
		w.mu.Lock()
		n := len(w.open["j"].items)
		w.mu.Unlock()
		if n == 11 { // n0..n9 and late
			break
		}
		runtime.Gosched()
	}
	close(release)
	for range 11 {
		r := <-results
		want := "j/a=1"
		if r.name != "a" {
			want = fmt.Sprintf("j/%s=%c", r.name, r.name[1])
		}
		if r.got != want {
			t.Errorf("%s: %q, want %q", r.name, r.got, want)
		}
	}
	bg.Wait()
	want := [][]string{{"a"}, {"late", "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"}}
	if fmt.Sprint(calls["j"]) != fmt.Sprint(want) {
		t.Errorf("j's writes: %v, want %v", calls["j"], want)
	}
	// A call's items (a relay's block) go in one group, waited for once.
	out, err := w.addAll(t.Context(), "m", map[string]int{"x": 1, "y": 2})
	if err != nil || out["x"] != "m/x=1" || out["y"] != "m/y=2" {
		t.Errorf("addAll: %v, %v", out, err)
	}
	if fmt.Sprint(calls["m"]) != "[[x y]]" {
		t.Errorf("m's writes: %v, want one of x and y", calls["m"])
	}
}

// TestStoppedReportsGrouped: Stopped reports of many nodes at once, as
// at every new generation, are all written (in groups); a later report of
// a lower generation leaves each alone.
func TestStoppedReportsGrouped(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	reg, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("m", 1)})
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := watch(t, c, "m", reg.LeaseId, 0)
	s := spec("j", 1, 1)
	s.Tp, s.Pp = 1, 1
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	next(t, ch, func(a *pb.Assignment) bool { return a.Job == "j" }) // generation 1
	const n = 150                                                    // more than one transaction's worth
	report := func(node string, below int64) error {
		_, err := c.Report(t.Context(), &pb.ReportRequest{Job: "j", Node: node, Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: below}}})
		return err
	}
	for _, below := range []int64{1, 0} {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				if err := report(fmt.Sprintf("n%03d", i), 1+below); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	resp, err := co.etcd.Client.Get(t.Context(), keys(co.cfg.Prefix).job("j")+"stoppedb/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, kv := range resp.Kvs {
		b := &pb.StoppedBucket{}
		if err := decode(kv.Value, b); err != nil {
			t.Fatalf("%s: %v", kv.Key, err)
		}
		for node, below := range b.Below {
			if node == "m" {
				continue // the watching node's own (the test's agent reports it)
			}
			got++
			if below != 2 || kv.Key == nil || string(kv.Key) != keys(co.cfg.Prefix).stoppedBucket("j", stoppedBucketOf(node)) {
				t.Errorf("%s in %s: below %d, want 2 (a lower report after it changes nothing) in its bucket's key", node, kv.Key, below)
			}
		}
	}
	// A bucket a key: the reports of n nodes are fewer keys than nodes.
	if got != n || len(resp.Kvs) >= n {
		t.Errorf("%d nodes' records in %d keys, want %d in fewer keys", got, len(resp.Kvs), n)
	}
	if err := report("n000", 1); err != nil {
		t.Error(err)
	}
	if err := report("x", 1); err != nil {
		t.Error(err)
	}
	_, err = c.Report(t.Context(), &pb.ReportRequest{Job: "nosuch", Node: "n000", Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: 1}}})
	if status.Code(err) != codes.NotFound {
		t.Errorf("a job that does not exist: %v, want NotFound", err)
	}
}

// TestOthersGetTheMaster: a generation reaches the nodes that do not run
// rank 0 once, with rank 0's address; rank 0's node gets it first without
// (it bootstraps: its test agent reports testMaster), then with.
func TestOthersGetTheMaster(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	ch0, _ := agent(t, c, node("n0", 4))
	ch1, _ := agent(t, c, node("n1", 4))
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: spec("j", 2, 4)}); err != nil {
		t.Fatal(err)
	}
	a0 := next(t, ch0, func(a *pb.Assignment) bool { return a.Job == "j" })
	if m := a0.Generation.Members[0]; m.FirstRank != 0 || m.Node != "n0" {
		t.Fatalf("n0's view: %v: want n0 running rank 0 (members in name order)", a0.Generation.Members)
	}
	if a0.Master != "" || !a0.Open {
		t.Fatalf("rank 0's node first got %v: want the generation opened, without the address", a0)
	}
	next(t, ch0, func(a *pb.Assignment) bool { return a.Job == "j" && a.Master == testMaster })
	if a1 := next(t, ch1, func(a *pb.Assignment) bool { return a.Job == "j" }); a1.Master != testMaster {
		t.Errorf("n1 first got the generation without rank 0's address: %v", a1)
	}
}

// TestOpeningCarriesMaster: a generation that waits for the ranks of the
// one before to stop reaches its nodes first closed, never with rank 0's
// address; rank 0's node reports the address meanwhile (its test agent
// does so before it says it stopped, as a real agent does), and the
// opening brings every node, rank 0's too, the address in its one
// message.
func TestOpeningCarriesMaster(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	ch0, _ := agent(t, c, node("n0", 4))
	ch1, _ := agent(t, c, node("n1", 4))
	s := spec("j", 2, 4)
	s.MaxRestarts = 1
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	next(t, ch1, func(a *pb.Assignment) bool { return a.Job == "j" && a.Open && a.Master == testMaster })
	report(t, c, "j", 1, &pb.RankExit{Rank: 5, Code: 1})
	for name, ch := range map[string]<-chan *pb.Assignment{"n0": ch0, "n1": ch1} {
		var closed int
		a := next(t, ch, func(a *pb.Assignment) bool {
			if a.Generation.GetNumber() != 2 {
				return false
			}
			if !a.Open {
				closed++
				if a.Master != "" {
					t.Errorf("%s: generation 2 not open yet, with rank 0's address %q", name, a.Master)
				}
				return false
			}
			return true
		})
		if closed == 0 || a.Master != testMaster {
			t.Errorf("%s: generation 2 came %d times closed, then opened with address %q: want closed first, then opened with %q", name, closed, a.Master, testMaster)
		}
	}
	if g, _ := co.cache.generation("j"); len(g.GetStopping()) != 2 {
		t.Fatalf("generation 2 waited for %v: want both nodes", g.GetStopping())
	}
}

// TestConnsGrouped: the conns keys of streams that open together go in
// transactions of 64; a node whose lease is gone fails alone, the others
// of its transaction are written, each under its own lease.
func TestConnsGrouped(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	cli := co.srv.cli
	items := map[string]connItem{}
	var gone string
	for i := range 100 { // two transactions
		l, err := cli.Grant(t.Context(), 60)
		if err != nil {
			t.Fatal(err)
		}
		node := fmt.Sprintf("n%03d", i)
		items[node] = connItem{id: "c/" + node, lease: l.ID}
		if i == 7 {
			gone = node
			if _, err := cli.Revoke(t.Context(), l.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := co.srv.writeConns(t.Context(), items)
	for node, it := range items {
		resp, err := cli.Get(t.Context(), co.srv.k.conn(node))
		if err != nil {
			t.Fatal(err)
		}
		if node == gone {
			if out[node] == nil || len(resp.Kvs) != 0 {
				t.Errorf("%s, its lease revoked: %v, %d keys; want an error and no key", node, out[node], len(resp.Kvs))
			}
			continue
		}
		if out[node] != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != connValue(it.session, it.id) || clientv3.LeaseID(resp.Kvs[0].Lease) != it.lease {
			t.Errorf("%s: %v, %v; want %s under lease %x", node, out[node], resp.Kvs, it.id, it.lease)
		}
	}
}

// TestStoppedKeysMerge: a node's Stopped record is the highest of its
// bucket's key and its own key (written by earlier versions), whatever
// the order the keys come in.
func TestStoppedKeysMerge(t *testing.T) {
	k := keys("/m/")
	kv := func(key string, v proto.Message) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(encode(v)), CreateRevision: 1, ModRevision: 1}
	}
	spec := kv(k.spec("j"), &pb.JobSpec{Id: "j"})
	own := kv(k.stopped("j", "a"), &pb.Stopped{Below: 3})
	bucket := kv(k.stoppedBucket("j", 7), &pb.StoppedBucket{Below: map[string]int64{"a": 2, "b": 5}})
	for _, order := range [][]*mvccpb.KeyValue{{spec, own, bucket}, {spec, bucket, own}} {
		c := newCache(nil, k, slog.New(slog.NewTextHandler(io.Discard, nil)))
		c.reset(2, order)
		v, ok := c.view("j")
		if !ok || v.job.stopped["a"] != 3 || v.job.stopped["b"] != 5 {
			t.Errorf("stopped %v, want a 3 (its own key) and b 5 (its bucket's)", v.job.stopped)
		}
	}
}
