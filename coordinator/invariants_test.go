package coordinator

import (
	"log/slog"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// txnLeader is a leader of its own etcd for as long as the test runs (its
// election key is put once and never deleted), for applying decisions
// without a coordinator around them.
func txnLeader(t *testing.T) *leader {
	t.Helper()
	e, err := OpenEtcd(t.Context(), EtcdConfig{DataDir: t.TempDir(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	k := keys("/t/")
	key := k.leader() + "/me"
	put, err := e.Client.Put(t.Context(), key, "me")
	if err != nil {
		t.Fatal(err)
	}
	co := &Coordinator{etcd: e, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	return &leader{Coordinator: co, k: k, fence: clientv3.Compare(clientv3.CreateRevision(key), "=", put.Header.Revision),
		electionKey: key, electionRev: put.Header.Revision, now: time.Now}
}

// viewNow is job id and the pool as etcd holds them now: a cache listed
// afresh.
func viewNow(t *testing.T, l *leader, id string) *view {
	t.Helper()
	resp, err := l.etcd.Client.Get(t.Context(), string(l.k), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(l.etcd.Client, l.k, l.log)
	c.reset(resp.Header.Revision, resp.Kvs)
	v, ok := c.view(id)
	if !ok {
		t.Fatalf("job %s is not in etcd", id)
	}
	return v
}

func put(t *testing.T, l *leader, key, value string) {
	t.Helper()
	if _, err := l.etcd.Client.Put(t.Context(), key, value); err != nil {
		t.Fatal(err)
	}
}

func value(t *testing.T, l *leader, key string) (string, bool) {
	t.Helper()
	resp, err := l.etcd.Client.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}

// submitted puts a held-checkpoint job of one 1-GPU node per member, and
// the nodes, as Submit and Register would.
func submitted(t *testing.T, l *leader, id string, nodes ...string) {
	t.Helper()
	s := spec(id, 1, 1)
	s.MinNodes, s.MaxRestarts, s.CheckpointDir = 1, 10, ""
	put(t, l, l.k.spec(id), encode(s))
	for _, n := range nodes {
		put(t, l, l.k.node(n), encode(&pb.Node{Name: n, Gpus: 1, Instance: "run-" + n}))
	}
}

// generationOn applies, from view v, the decision to run v's job's next
// generation on the named nodes, and reports whether etcd took it.
func generationOn(t *testing.T, l *leader, v *view, resume int64, fromBackup bool, names ...string) bool {
	t.Helper()
	var nodes []*pb.Node
	for _, n := range names {
		nodes = append(nodes, &pb.Node{Name: n, Gpus: 1, Instance: "run-" + n})
	}
	gen := buildGeneration(v.job.spec, v.job.gen.GetNumber()+1, nodes, fitting{grid: pb.SpecGrid(v.job.spec)}, len(nodes), restore{resume: resume}, "test")
	gen.FromBackup = fromBackup
	_, ok, err := l.apply(t.Context(), v, &decision{gen: gen, state: &pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1}})
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestGenerationTxnInvariants checks that what spans objects when a
// generation is written is etcd's to keep, whatever the view that decided
// it held: a view behind the commit, or behind another job's generation,
// writes nothing.
func TestGenerationTxnInvariants(t *testing.T) {
	t.Run("a commit written since the view", func(t *testing.T) {
		l := txnLeader(t)
		submitted(t, l, "a", "n1", "n2")
		if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n1") {
			t.Fatal("generation 1 refused")
		}
		stale := viewNow(t, l, "a")
		put(t, l, l.k.commit("a"), encode(&pb.Step{Step: 7, Generation: 1, Copies: []*pb.Copies{{Node: "n1", Holders: []string{"n1"}}}}))
		if generationOn(t, l, stale, 0, false, "n1") {
			t.Fatal("a generation resuming after step 0 was written over a commit of step 7 it did not see")
		}
		if !generationOn(t, l, viewNow(t, l, "a"), 7, false, "n1") {
			t.Fatal("a generation from a current view was refused")
		}
	})
	t.Run("a node another job's generation has", func(t *testing.T) {
		l := txnLeader(t)
		submitted(t, l, "a", "n1", "n2")
		submitted(t, l, "b")
		staleB := viewNow(t, l, "b") // before a took n1: n1 looks free to b
		if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n1") {
			t.Fatal("generation 1 of a refused")
		}
		if generationOn(t, l, staleB, 0, false, "n1") {
			t.Fatal("job b was given n1, which job a's generation has")
		}
		if !generationOn(t, l, viewNow(t, l, "b"), 0, false, "n2") {
			t.Fatal("job b refused the free node n2")
		}
		if v := viewNow(t, l, "b"); v.busy["n1"] != "a" || v.busy["n2"] != "b" {
			t.Fatalf("busy = %v, want n1 a and n2 b", v.busy)
		}
	})
	t.Run("members left out and ended jobs release their nodes, and only theirs", func(t *testing.T) {
		l := txnLeader(t)
		submitted(t, l, "a", "n1", "n2", "n3", "n4")
		submitted(t, l, "b")
		if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n1", "n2") {
			t.Fatal("generation 1 refused")
		}
		if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n2", "n3") {
			t.Fatal("generation 2 refused")
		}
		if v := viewNow(t, l, "b"); !maps.Equal(v.busy, map[string]string{"n2": "a", "n3": "a"}) {
			t.Errorf("after generation 2 on n2,n3: busy = %v, want n2 and n3 a's", v.busy)
		}
		if !generationOn(t, l, viewNow(t, l, "b"), 0, false, "n1", "n4") {
			t.Fatal("job b refused n1, which a's generation 2 left out")
		}
		v := viewNow(t, l, "a")
		if _, ok, err := l.apply(t.Context(), v, &decision{state: &pb.JobState{Phase: pb.JobState_FAILED, FailedRank: -1}}); err != nil || !ok {
			t.Fatalf("failing the job: %v, %v", ok, err)
		}
		if v := viewNow(t, l, "b"); !maps.Equal(v.busy, map[string]string{"n1": "b", "n4": "b"}) {
			t.Errorf("after a failed: busy = %v, want n1 and n4 b's alone", v.busy)
		}
	})
	t.Run("a cancelled job releases its nodes", func(t *testing.T) {
		l := txnLeader(t)
		submitted(t, l, "a", "n1")
		submitted(t, l, "b")
		if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n1") {
			t.Fatal("generation 1 refused")
		}
		s := &server{cli: l.etcd.Client, k: l.k, log: l.log, hooks: &hooks{}}
		if _, err := s.Cancel(t.Context(), &pb.CancelRequest{Job: "a"}); err != nil {
			t.Fatal(err)
		}
		if !generationOn(t, l, viewNow(t, l, "b"), 0, false, "n1") {
			t.Fatal("n1 still held after its job was cancelled")
		}
	})
	t.Run("the keys of the generation before the previous one go", func(t *testing.T) {
		l := txnLeader(t)
		submitted(t, l, "a", "n1")
		for g := int64(1); g <= 3; g++ {
			if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n1") {
				t.Fatalf("generation %d refused", g)
			}
			put(t, l, l.k.exit("a", g, 0), encode(&pb.RankExit{Rank: 0, Code: 1}))
			put(t, l, l.k.times("a", g, "c"), encode(&pb.TimesSummary{}))
			put(t, l, l.k.bootstrap("a", g), encode(&pb.Bootstrap{Master: "x:1"}))
		}
		for g, want := range map[int64]bool{1: false, 2: true, 3: true} {
			for _, key := range []string{l.k.exit("a", g, 0), l.k.times("a", g, "c"), l.k.bootstrap("a", g)} {
				if _, ok := value(t, l, key); ok != want {
					t.Errorf("after generation 3: %s exists = %v, want %v", key, ok, want)
				}
			}
		}
	})
	t.Run("a resume from the backup tier is the commit", func(t *testing.T) {
		l := txnLeader(t)
		submitted(t, l, "a", "n1", "n2")
		if !generationOn(t, l, viewNow(t, l, "a"), 0, false, "n1") {
			t.Fatal("generation 1 refused")
		}
		put(t, l, l.k.backup("a"), encode(&pb.Step{Step: 5, Generation: 1, Backup: true}))
		put(t, l, l.k.commit("a"), encode(&pb.Step{Step: 9, Generation: 1, Copies: []*pb.Copies{{Node: "n1", Holders: []string{"n1"}, Instances: []string{"run-n1"}}}}))
		// n1 is gone: its replicas of step 9 with it.
		if _, err := l.etcd.Client.Delete(t.Context(), l.k.node("n1")); err != nil {
			t.Fatal(err)
		}
		v := viewNow(t, l, "a")
		rp := restorePoint(v)
		resume, fromBackup, lost := rp.resume, rp.fromBackup, rp.lost
		if resume != 5 || !fromBackup || lost != "" {
			t.Fatalf("restore point = %d, backup %v, lost %q: want the backup's step 5", resume, fromBackup, lost)
		}
		if !generationOn(t, l, v, resume, fromBackup, "n2") {
			t.Fatal("generation 2 refused")
		}
		// The next generation resumes from step 5 again, from the backup:
		// never from step 9, whose later files every holder dropped.
		rp = restorePoint(viewNow(t, l, "a"))
		resume, fromBackup, lost = rp.resume, rp.fromBackup, rp.lost
		if resume != 5 || !fromBackup || lost != "" {
			t.Fatalf("after resuming from the backup, restore point = %d, backup %v, lost %q: want step 5 from the backup", resume, fromBackup, lost)
		}
	})
}

// TestRestorePointByInstance checks that a holder counts by the run of
// its agent that stored the files: a node whose agent restarted (an empty
// /dev/shm) under the same name holds nothing.
func TestRestorePointByInstance(t *testing.T) {
	commit := &pb.Step{Step: 9, Generation: 1, Copies: []*pb.Copies{{Node: "n1", Holders: []string{"n1", "n2"}, Instances: []string{"i1", "i2"}}}}
	backup := &pb.Step{Step: 4, Generation: 1, Backup: true}
	tests := []struct {
		name       string
		nodes      map[string]string // registered and connected: name -> instance
		backup     *pb.Step
		wantResume int64
		wantBackup bool
		wantAddrs  []string
		wantLost   bool
	}{
		{name: "both holders as they stored it", nodes: map[string]string{"n1": "i1", "n2": "i2"}, wantResume: 9, wantAddrs: []string{"n1:9", "n2:9"}},
		{name: "one holder restarted", nodes: map[string]string{"n1": "i1-again", "n2": "i2"}, wantResume: 9, wantAddrs: []string{"", "n2:9"}},
		{name: "both restarted, with a backup", nodes: map[string]string{"n1": "x", "n2": "y"}, backup: backup, wantResume: 4, wantBackup: true},
		{name: "both restarted, no backup", nodes: map[string]string{"n1": "x", "n2": "y"}, wantLost: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			held := spec("a", 2, 1)
			held.CheckpointDir = ""
			v := &view{job: &job{spec: held, commit: commit, backup: tc.backup}, nodes: map[string]*pb.Node{}, connected: map[string]bool{}}
			for n, inst := range tc.nodes {
				v.nodes[n], v.connected[n] = &pb.Node{Name: n, Instance: inst, CheckpointAddr: n + ":9"}, true
			}
			rp := restorePoint(v)
			resume, copies, fromBackup, lost := rp.resume, rp.copies, rp.fromBackup, rp.lost
			if resume != tc.wantResume || fromBackup != tc.wantBackup || (lost != "") != tc.wantLost {
				t.Fatalf("restore point %d, backup %v, lost %q: want %d, %v, lost %v", resume, fromBackup, lost, tc.wantResume, tc.wantBackup, tc.wantLost)
			}
			if tc.wantAddrs != nil && (len(copies) != 1 || !slices.Equal(copies[0].Addrs, tc.wantAddrs)) {
				t.Fatalf("copies = %v, want addresses %q", copies, tc.wantAddrs)
			}
		})
	}
}

// TestViewRevision checks that the view's revision is that of the last
// event applied: a catch-up batch's header runs ahead of its events.
func TestViewRevision(t *testing.T) {
	ev := func(rev int64) *clientv3.Event {
		return &clientv3.Event{Kv: &mvccpb.KeyValue{Key: []byte("/t/x"), ModRevision: rev}}
	}
	tests := []struct {
		name string
		wr   clientv3.WatchResponse
		want int64
	}{
		{name: "a catch-up batch", wr: clientv3.WatchResponse{Header: &etcdserverpb.ResponseHeader{Revision: 900}, Events: []*clientv3.Event{ev(10), ev(11)}}, want: 11},
		{name: "a created response", wr: clientv3.WatchResponse{Header: &etcdserverpb.ResponseHeader{Revision: 900}, Created: true}, want: 0},
	}
	for _, tc := range tests {
		if got := viewRev(tc.wr); got != tc.want {
			t.Errorf("%s: view revision %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestWatchFromAnotherCluster checks that a Watch from a revision etcd has
// never reached (the agent's last assignment came from an etcd cluster
// since replaced) ends at once with OutOfRange, so that the agent watches
// afresh, and that the node's lease is kept alive meanwhile.
func TestWatchFromAnotherCluster(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("n1", 1)})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.Watch(t.Context(), &pb.WatchRequest{Node: "n1", LeaseId: resp.LeaseId, FromRevision: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.OutOfRange {
		t.Fatalf("watch from a revision ahead of etcd's: %v, want OutOfRange", err)
	}
	ch, _ := watch(t, c, "n1", resp.LeaseId, 0)
	if a := next(t, ch, func(*pb.Assignment) bool { return true }); a.Revision == 0 {
		t.Fatalf("watching afresh: %v", a)
	}
}

// TestReportFencedByInstance checks that a node that registered again (a
// new run of its agent) reports nothing for the generation its earlier
// run was in, though its name and lease are its own.
func TestReportFencedByInstance(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	n := node("n1", 1)
	n.Instance = "first"
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	ch, disconnect := watch(t, c, "n1", resp.LeaseId, 0)
	s := spec("j", 1, 1)
	s.Tp, s.Pp = 1, 1
	s.MaxRestarts = 0
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	g := whole(t, co, next(t, ch, func(a *pb.Assignment) bool { return a.Job == "j" }))
	step := func(lease int64) error {
		_, err := c.Report(t.Context(), &pb.ReportRequest{Job: "j", Generation: g.Number, Node: "n1", LeaseId: lease,
			Kind: &pb.ReportRequest_Step{Step: &pb.Step{Step: 1}}})
		return err
	}
	if err := step(resp.LeaseId); err != nil {
		t.Fatalf("the member's own report: %v", err)
	}
	// The agent restarts: its stream and lease end, it registers again.
	disconnect()
	if _, err := c.Leave(t.Context(), &pb.LeaveRequest{Node: "n1", LeaseId: resp.LeaseId}); err != nil {
		t.Fatal(err)
	}
	n.Instance = "second"
	again, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	if err := step(again.LeaseId); status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a report of the new run for the old run's generation: %v, want PermissionDenied (or FailedPrecondition once the generation ended)", err)
	}
	if err := step(resp.LeaseId); status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a report with the ended lease: %v, want it refused", err)
	}
}

// TestStatusCatchesUpWithoutSorting checks that Status sees every write
// made before it, the newest of etcd's being outside the prefix (its
// revision never comes as an event of the cache's watch): the watch's
// progress notification brings the view there.
func TestStatusCatchesUpWithoutSorting(t *testing.T) {
	endpoints := testEtcd(t)
	co, _ := testCoordinator(t, endpoints, nil)
	c := client(t, co.Addr())
	if _, err := c.Register(t.Context(), &pb.RegisterRequest{Node: node("n1", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := co.etcd.Client.Put(t.Context(), "/elsewhere/x", "y"); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(t.Context(), &pb.StatusRequest{})
	if err != nil || len(st.Nodes) != 1 {
		t.Fatalf("status = %v, %v: want node n1", st, err)
	}
}

// TestSubmitRetried: a Submit tried again after its answer was lost (the
// same submission) finds its own job; another submission of the id is
// refused.
func TestSubmitRetried(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	s := spec("j", 1, 4)
	s.Submission = "first"
	for range 2 {
		if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
			t.Fatalf("the same submission again: %v", err)
		}
	}
	s.Submission = "second"
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("another submission of job j: %v, want AlreadyExists", err)
	}
}

// TestStoppedReportBounded: a node says it runs nothing of a job below a
// generation that exists, at most the current one's successor (the
// cache's number, and etcd's when the report goes beyond it). "Nothing ever" (an agent that left the
// job said so once) stayed in etcd and covered the ranks of a later
// generation the node joined: its successor opened while they ran (the
// chaos test, seed 11: 774 ms of two generations at once).
func TestStoppedReportBounded(t *testing.T) {
	co, _ := testCoordinator(t, testEtcd(t), nil)
	c := client(t, co.Addr())
	n := node("n1", 1)
	resp, err := c.Register(t.Context(), &pb.RegisterRequest{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := watch(t, c, "n1", resp.LeaseId, 0)
	s := spec("j", 1, 1)
	s.Tp, s.Pp = 1, 1
	if _, err := c.Submit(t.Context(), &pb.SubmitRequest{Spec: s}); err != nil {
		t.Fatal(err)
	}
	g := whole(t, co, next(t, ch, func(a *pb.Assignment) bool { return a.Job == "j" }))
	stopped := func(below int64) error {
		_, err := c.Report(t.Context(), &pb.ReportRequest{Job: "j", Node: "n1", LeaseId: resp.LeaseId,
			Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: below}}})
		return err
	}
	if err := stopped(math.MaxInt64); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stopped below the largest generation: %v, want InvalidArgument", err)
	}
	if err := stopped(g.Number + 2); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stopped below generation %d of a job at %d: %v, want InvalidArgument", g.Number+2, g.Number, err)
	}
	if err := stopped(g.Number + 1); err != nil {
		t.Errorf("stopped below generation %d of a job at %d: %v", g.Number+1, g.Number, err)
	}
	if err := stopped(1); err != nil {
		t.Errorf("stopped below generation 1 after %d: %v (a late report is nothing to do)", g.Number+1, err)
	}
	_, err = c.Report(t.Context(), &pb.ReportRequest{Job: "nosuch", Node: "n1", LeaseId: resp.LeaseId,
		Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: 1}}})
	if status.Code(err) != codes.NotFound {
		t.Errorf("stopped of a job that does not exist: %v, want NotFound", err)
	}
}
