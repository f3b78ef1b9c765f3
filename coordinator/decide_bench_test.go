package coordinator

import (
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// BenchmarkDecideRendezvous2048 times the decision that freezes a 2,048-node
// job's first generation.
func BenchmarkDecideRendezvous2048(b *testing.B) { benchDecideRendezvous(b, 2048) }

// BenchmarkDecideRendezvous16384 is the same at 16,384 nodes.
func BenchmarkDecideRendezvous16384(b *testing.B) { benchDecideRendezvous(b, 16384) }

func benchDecideRendezvous(b *testing.B, n int) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%05d", i)
	}
	j := pending(int32(n), func(s *pb.JobSpec) { s.GpusPerNode, s.Tp, s.Pp, s.MinNodes = 8, 8, 1, 1 })
	v := pool(j, names...)
	for _, n := range v.nodes {
		n.Gpus = 8
	}
	for b.Loop() {
		if d := decide(v, t0, testPolicy); d.gen == nil {
			b.Fatal("no generation")
		}
	}
}

// BenchmarkAssignments16384 times one change of a 16,384-node job's
// assignment as the coordinator's streams see it: the job's assignment
// made once (its replicas placed), then each node's part built and
// encoded.
func BenchmarkAssignments16384(b *testing.B) {
	g := bigGeneration(16384)
	a := &pb.Assignment{Job: "j", Spec: &pb.JobSpec{Id: "j", Nodes: 16384, GpusPerNode: 8, Tp: 8, Pp: 1}, Generation: g, Master: "10.0.0.1:29500"}
	for b.Loop() {
		ja := newJobAssignment(a)
		for _, m := range g.Members {
			ja.forNode(m.Node)
		}
	}
}

// bigGeneration is generation 2 of an n-node job of 8 GPUs a node, in
// racks of 32.
func bigGeneration(n int) *pb.Generation {
	g := &pb.Generation{Job: "j", Number: 2, World: 8 * int32(n), Dp: int32(n), Tp: 8, Pp: 1}
	for i := range n {
		g.Members = append(g.Members, &pb.Member{Node: fmt.Sprintf("n%05d", i), Host: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255),
			FirstRank: int32(8 * i), Ranks: 8, Instance: "0123456789abcdef", CheckpointAddr: "10.0.0.1:7000", Domain: fmt.Sprintf("rack-%d", i/32)})
	}
	return g
}

// BenchmarkGenerationValue16384 times a 16,384-node generation's value in
// etcd: the leader encodes it once, and every coordinator's cache decodes
// it.
func BenchmarkGenerationValue16384(b *testing.B) {
	g := bigGeneration(16384)
	v := encode(g)
	b.Logf("%d bytes", len(v))
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			encode(g)
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeGeneration([]byte(v)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkGenerationTxn16384 times, against an embedded etcd, the
// transaction that writes a 16,384-node job's generation: the first
// (every node new) and the next after one node is lost. Neither writes a
// key per node: both compare and write the one generations key.
func BenchmarkGenerationTxn16384(b *testing.B) {
	e, err := OpenEtcd(b.Context(), EtcdConfig{DataDir: b.TempDir(), DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	k := keys("/bench/")
	gen1 := bigGeneration(16384)
	gen1.Number = 1
	gen2 := proto.Clone(gen1).(*pb.Generation)
	gen2.Number, gen2.Members = 2, gen2.Members[:16383]
	gen2.Stopping = stoppingOf(gen1.Members)
	for b.Loop() {
		b.StopTimer()
		if _, err := e.Client.Delete(b.Context(), "/bench/", clientv3.WithPrefix()); err != nil {
			b.Fatal(err)
		}
		j := &job{spec: &pb.JobSpec{Id: "j"}}
		cmps, ops := generationTxn(k, &view{job: j}, gen1, nil)
		b.StartTimer()
		t0 := time.Now()
		if resp, err := e.Client.Txn(b.Context()).If(cmps...).Then(ops...).Commit(); err != nil || !resp.Succeeded {
			b.Fatalf("generation 1: %v, %v", resp, err)
		}
		first := time.Since(t0)
		gr, err := e.Client.Get(b.Context(), k.generation("j"))
		if err != nil {
			b.Fatal(err)
		}
		j.gen, j.commitRev = gen1, 0
		cmps, ops = generationTxn(k, &view{job: j, gensRev: gr.Kvs[0].ModRevision}, gen2, nil)
		t1 := time.Now()
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.generation("j")), "=", gr.Kvs[0].ModRevision))
		if resp, err := e.Client.Txn(b.Context()).If(cmps...).Then(ops...).Commit(); err != nil || !resp.Succeeded {
			b.Fatalf("generation 2: %v, %v", resp, err)
		}
		b.ReportMetric(float64(first.Milliseconds()), "ms/gen1")
		b.ReportMetric(float64(time.Since(t1).Milliseconds()), "ms/gen2")
		b.ReportMetric(float64(len(ops)), "ops/gen2")
	}
}

// BenchmarkDecideWaiting16384 times the decision taken again and again
// while a 16,384-node generation waits for its members' Stopped reports
// (half of them in): the leader's work in the seconds before the opening.
func BenchmarkDecideWaiting16384(b *testing.B) {
	const n = 16384
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%05d", i)
	}
	j := runningOn(pending(n, func(s *pb.JobSpec) { s.GpusPerNode, s.Tp, s.Pp, s.MinNodes = 8, 8, 1, 1 }), 2, names...)
	j.open = 1
	j.stopped = map[string]int64{}
	for _, m := range j.gen.Members {
		j.gen.Stopping = append(j.gen.Stopping, &pb.Member{Node: m.Node, Instance: m.Instance})
		if len(j.stopped) < n/2 {
			j.stopped[m.Node] = 2
		}
	}
	v := pool(j, names...)
	for _, name := range names {
		v.nodes[name].Gpus = 8
	}
	for b.Loop() {
		if d := decide(v, t0, testPolicy); d.open != 0 {
			b.Fatal("opened before every member reported")
		}
	}
}

// BenchmarkView16384 times the leader's view of a running 16,384-node job
// while the pool does not change (each recheck of its compute times, five
// times a second by default): the pool's maps are made once a change.
func BenchmarkView16384(b *testing.B) {
	const n = 16384
	c := newTestCache()
	k := c.k
	kvs := []*mvccpb.KeyValue{
		c.kv(k.spec("j"), encode(&pb.JobSpec{Id: "j", Nodes: n, GpusPerNode: 8, Tp: 8, Pp: 1, Command: []string{"true"}}), 0),
		c.kv(k.state("j"), encode(&pb.JobState{Phase: pb.JobState_RUNNING}), 0),
		c.kv(k.generation("j"), encode(bigGeneration(n)), 0),
	}
	for i := range n {
		name := fmt.Sprintf("n%05d", i)
		kvs = append(kvs, c.kv(k.node(name), encode(&pb.Node{Name: name, Host: "10.0.0.1", Gpus: 8}), int64(i+1)), c.kv(k.conn(name), "c/1", int64(i+1)))
	}
	c.reset(kvs...)
	for b.Loop() {
		if v := c.view(b, "j"); len(v.busy) != n || len(v.connected) != n {
			b.Fatalf("a view of %d busy and %d connected nodes, want %d", len(v.busy), len(v.connected), n)
		}
	}
}
