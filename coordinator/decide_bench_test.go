package coordinator

import (
	"fmt"
	"testing"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// BenchmarkDecideRendezvous2048 times the decision that freezes a 2,048-node
// job's first generation.
func BenchmarkDecideRendezvous2048(b *testing.B) {
	names := make([]string, 2048)
	for i := range names {
		names[i] = fmt.Sprintf("n%04d", i)
	}
	j := pending(2048, func(s *pb.JobSpec) { s.GpusPerNode, s.Tp, s.Pp, s.MinNodes = 8, 8, 1, 1 })
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
