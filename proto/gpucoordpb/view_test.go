package gpucoordpb

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func members(spec string) []*Member {
	var out []*Member
	for f := range strings.FieldsSeq(spec) {
		name, domain, _ := strings.Cut(f, "@")
		out = append(out, &Member{Node: name, Domain: domain})
	}
	return out
}

func TestReplicas(t *testing.T) {
	tests := []struct {
		name    string
		members string
		copies  int
		want    string
	}{
		{"next in the ring", "a b c", 2, "[[1] [2] [0]]"},
		{"wraps", "a b c", 3, "[[1 2] [2 0] [0 1]]"},
		{"fewer members than copies", "a b", 3, "[[1] [0]]"},
		{"alone", "a", 2, "[[]]"},
		{"one copy", "a b", 1, "[[] []]"},
		{"other rack", "a@r1 b@r1 c@r2 d@r2", 2, "[[2] [3] [0] [1]]"},
		{"then any", "a@r1 b@r1 c@r2 d@r2", 3, "[[2 1] [3 2] [0 3] [1 0]]"},
		{"one rack: neighbours", "a@r b@r c@r", 2, "[[1] [2] [0]]"},
		{"three racks", "a@r1 b@r1 c@r2 d@r2 e@r3 f@r3", 3, "[[2 4] [3 5] [4 0] [5 1] [0 2] [1 3]]"},
		{"racks of unequal size", "a@r1 b@r1 c@r1 d@r2 e@r3", 2, "[[3] [4] [3] [1] [2]]"},
		{"racks not in order", "a@r1 b@r2 c@r1 d@r2", 2, "[[3] [0] [1] [2]]"},
	}
	for _, tc := range tests {
		if got := fmt.Sprint(Replicas(members(tc.members), tc.copies)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestNodeViewFlat: what each node of a generation receives stays the
// same size however many nodes the generation has, and keeps every field
// but those it leaves out.
func TestNodeViewFlat(t *testing.T) {
	size := func(n int) (most int) {
		g := &Generation{Job: "j", Number: 3, World: int32(8 * n), Dp: int32(n), ResumeStep: 40, Tp: 8, Pp: 1, Reason: "node lost", Output: "Traceback",
			Estimate: "41 of 80 GiB", StepSeconds: 1.5}
		for i := range n {
			g.Members = append(g.Members, &Member{Node: fmt.Sprintf("node-%05d", i), Host: fmt.Sprintf("10.0.%d.%d", i/256, i%256),
				FirstRank: int32(8 * i), Ranks: 8, Instance: "0123456789abcdef", CheckpointAddr: "10.0.0.1:7000", Domain: fmt.Sprintf("rack-%d", i/32)})
			g.Stopping = append(g.Stopping, g.Members[i])
		}
		reps := Replicas(g.Members, 3)
		src := ReplicaSources(reps)
		for i := range n {
			v := NodeView(g, i, reps, src[i])
			most = max(most, proto.Size(v))
			if i == n/2 {
				if v.Members[0].Node > g.Members[i].Node || len(v.Members) != 1+len(reps[i])+len(src[i]) && n > 3 {
					t.Errorf("%d nodes: node %d's view has members %v", n, i, v.Members)
				}
				if v.Reason != "" || v.Output != "" || v.Stopping != nil || v.Estimate != g.Estimate || v.ResumeStep != 40 || v.Tp != 8 {
					t.Errorf("%d nodes: view %v", n, v)
				}
			}
		}
		return most
	}
	// Every member holds as many replicas as it sends (none a hot spot).
	g := members("a@r1 b@r1 c@r1 d@r2 e@r2 f@r2 g@r3 h@r3 i@r3")
	for i, from := range ReplicaSources(Replicas(g, 3)) {
		if len(from) != 2 {
			t.Errorf("member %d holds the replicas of %v, want 2", i, from)
		}
	}
	small, large := size(256), size(16384)
	// Only the longer numbers in the names and addresses may grow it.
	if large > small+32 {
		t.Errorf("largest view: %d bytes at 256 nodes, %d at 16,384", small, large)
	}
	t.Logf("largest view: %d bytes at 256 nodes, %d at 16,384", small, large)
}
