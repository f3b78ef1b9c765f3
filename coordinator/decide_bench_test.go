package coordinator

import (
	"fmt"
	"testing"

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
