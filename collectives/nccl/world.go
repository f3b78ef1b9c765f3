package nccl

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/gpucoord/gpucoord/collectives"
)

// World is a world Communicator whose sub-groups are NCCL communicators:
// collectives.NewGroup on it (what the engine calls for its TP, PP and DP
// groups) builds an NCCL communicator of the members, while the world's own
// calls (barriers, flags) stay on the world's transport.
type World struct {
	collectives.Communicator

	base Config
	mu   sync.Mutex
	made map[string]int // groups made per member list
}

var _ collectives.Grouper = (*World)(nil)

// NewWorld returns world with NCCL sub-groups configured by base: NewGroup
// fills in Rank, Size and Key, the rest (libraries, Device, Store, Timeout,
// CheckShapes, Logger) is used as it is. Each group's unique id goes through
// base.Store under base.Key/<members>/<n>, n counting the groups made with
// the same members, so base.Key must be new for every world (put the job
// and its generation in it).
func NewWorld(world collectives.Communicator, base *Config) *World {
	w := &World{Communicator: world, base: *base, made: map[string]int{}}
	w.base.CUDARTLibraries = append([]string(nil), base.CUDARTLibraries...)
	return w
}

// NewGroup implements collectives.Grouper: every member listed in ranks
// (ranks of the world) calls it with the same list, in the same order
// relative to its other NewGroup calls, and it returns once all of them have
// joined the new NCCL communicator (New), or fails as New does. Member i of
// the group is ranks[i]. Close the group when done.
func (w *World) NewGroup(ctx context.Context, ranks []int) (collectives.Communicator, error) {
	me, err := collectives.MemberIndex(ranks, w.Size(), w.Rank())
	if err != nil {
		return nil, err
	}
	members := make([]string, len(ranks))
	for i, r := range ranks {
		members[i] = strconv.Itoa(r)
	}
	list := strings.Join(members, ",")
	w.mu.Lock()
	n := w.made[list]
	w.made[list]++
	w.mu.Unlock()
	cfg := w.base
	cfg.Rank, cfg.Size, cfg.Key = me, len(ranks), fmt.Sprintf("%s/%s/%d", w.base.Key, list, n)
	c, err := New(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}
