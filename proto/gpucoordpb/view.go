package gpucoordpb

import (
	"cmp"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// DefaultReplicas is how many nodes hold each node's held checkpoint
// files of a step, the writer included, when the job does not say.
const DefaultReplicas = 2

// HeldCheckpoints says the agents hold spec's checkpoints (and replicate
// them), as they do when it names no shared checkpoint directory.
func HeldCheckpoints(spec *JobSpec) bool { return spec.GetCheckpointDir() == "" }

// ReplicaCount is how many nodes hold each node's files of a step under
// spec, the writer included.
func ReplicaCount(spec *JobSpec) int {
	if c := spec.GetCheckpointReplicas(); c > 0 {
		return int(c)
	}
	return DefaultReplicas
}

// Replicas chooses, for each member, the members that hold a replica of
// its held checkpoint files (by index). Member i's c-th replica goes c*S
// places after it in the generation's order (a ring, as Gemini places its
// replicas; S is the most members any one failure domain has), or to the
// first member after that whose domain (Member.domain; empty counts as
// the node's own) is not yet used, while any is left; then to the first
// not yet chosen. For members listed domain by domain, as a cluster's
// nodes are, each replica is in another domain and every member holds
// copies-1 others' files: none is a hot spot for its neighbours' racks.
// It costs O(members x copies) for such a list.
func Replicas(members []*Member, copies int) [][]int {
	n := len(members)
	doms := make([]string, n)
	count := map[string]int{}
	stride := 1
	for i, m := range members {
		doms[i] = cmp.Or(m.GetDomain(), "node:"+m.GetNode())
		count[doms[i]]++
		stride = max(stride, count[doms[i]])
	}
	want := min(copies-1, n-1)
	out := make([][]int, n)
	for i := range members {
		used := map[string]bool{doms[i]: true}
		var chosen []int
		free := func(j int) bool { return j != i && !slices.Contains(chosen, j) }
		for c := 1; len(chosen) < want; c++ {
			start, pick := (i+c*stride)%n, -1
			for k := 0; k < n && pick < 0; k++ {
				if j := (start + k) % n; free(j) && (len(used) == len(count) || !used[doms[j]]) {
					pick = j
				}
			}
			chosen, used[doms[pick]] = append(chosen, pick), true
		}
		out[i] = chosen
	}
	return out
}

// RelayBlock is how many members share a relay (Assignment.relay).
const RelayBlock = 32

// Relay is the member that forwards member i's Stored and Times reports:
// the first of its block of RelayBlock (i itself for a relay).
func Relay(i int) int { return i - i%RelayBlock }

// NodeView is what one node of a generation receives of it (Assignment's
// generation): the node itself, its relay and the members it exchanges
// checkpoint replicas with (those it sends to and those that send to it),
// in the generation's order, without stopping, reason and output.
// replicas[i] are member i's replica holders (Replicas). It shares the
// messages of g it keeps; the caller must not change them.
func NodeView(g *Generation, i int, replicas [][]int, sources []int) *Generation {
	v := &Generation{}
	dst := v.ProtoReflect()
	g.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		if !viewLeavesOut[fd.Name()] {
			dst.Set(fd, val) // shared, not copied
		}
		return true
	})
	keep := append([]int{i, Relay(i)}, sources...)
	if i < len(replicas) {
		keep = append(keep, replicas[i]...)
	}
	slices.Sort(keep)
	for _, j := range slices.Compact(keep) {
		v.Members = append(v.Members, g.Members[j])
	}
	return v
}

// viewLeavesOut are the fields of a Generation a node's view does not
// carry: members (it carries its own), stopping, reason and output.
var viewLeavesOut = map[protoreflect.Name]bool{"members": true, "stopping": true, "reason": true, "output": true}

// ReplicaSources inverts replicas: for each member, the members that send
// it their replicas, in the generation's order.
func ReplicaSources(replicas [][]int) [][]int {
	out := make([][]int, len(replicas))
	for i, to := range replicas {
		for _, j := range to {
			out[j] = append(out[j], i)
		}
	}
	return out
}
