package coordinator

import (
	"errors"
	"fmt"
	"strings"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// ValidateSpec names the first field of a job that cannot work.
func ValidateSpec(j *pb.JobSpec) error {
	switch {
	case j.GetId() == "" || strings.ContainsAny(j.GetId(), "/ \t\n"):
		return fmt.Errorf("job id %q: want a non-empty id without '/' or spaces", j.GetId())
	case j.GetNodes() < 1:
		return fmt.Errorf("nodes %d: want at least 1", j.GetNodes())
	case j.GetMaxNodes() != 0 && j.GetMaxNodes() < j.GetNodes():
		return fmt.Errorf("max nodes %d is below nodes %d", j.GetMaxNodes(), j.GetNodes())
	case j.GetGpusPerNode() < 1:
		return fmt.Errorf("gpus per node %d: want at least 1", j.GetGpusPerNode())
	case len(j.GetCommand()) == 0 && len(j.GetNativeJob()) == 0:
		return errors.New("neither a command nor a native job")
	case len(j.GetCommand()) > 0 && len(j.GetNativeJob()) > 0:
		return errors.New("both a command and a native job")
	case sharding.CheckKeep(int(j.GetKeepCheckpoints())) != nil:
		return fmt.Errorf("keep checkpoints %d: %v", j.GetKeepCheckpoints(), sharding.CheckKeep(int(j.GetKeepCheckpoints())))
	case j.GetCheckpointEvery() < 0 || j.GetMaxRestarts() < 0 || j.GetMinNodes() < 0:
		return fmt.Errorf("checkpoint every %d, max restarts %d and min nodes %d must not be negative", j.GetCheckpointEvery(), j.GetMaxRestarts(), j.GetMinNodes())
	}
	_, err := Layout(j, int(j.GetNodes()))
	return err
}

// Layout returns the rank layout of spec on n nodes: TP and PP as asked,
// DP from the world size unless fixed. A TP group must stay inside a node.
func Layout(spec *pb.JobSpec, n int) (topology.Layout, error) {
	world := n * int(spec.GetGpusPerNode())
	tp, pp := int(spec.GetTp()), int(spec.GetPp())
	if tp < 1 || pp < 1 {
		return topology.Layout{}, fmt.Errorf("tp %d and pp %d must be at least 1", tp, pp)
	}
	if world%(tp*pp) != 0 {
		return topology.Layout{}, fmt.Errorf("world size %d (%d nodes x %d GPUs) is not divisible by tp*pp = %d", world, n, spec.GetGpusPerNode(), tp*pp)
	}
	dp := world / (tp * pp)
	if spec.GetDp() != 0 && int(spec.GetDp()) != dp {
		return topology.Layout{}, fmt.Errorf("dp %d: tp*pp*dp = %d must equal the world size %d", spec.GetDp(), tp*pp*int(spec.GetDp()), world)
	}
	// The global batch is kept in every generation: each replica runs
	// global/(micro*dp) micro-batches, so dp must divide global/micro (and,
	// interleaved, leave a multiple of pp micro-batches).
	if g, m := int(spec.GetGlobalBatch()), int(spec.GetMicroBatch()); g > 0 && m > 0 {
		if g%(m*dp) != 0 {
			return topology.Layout{}, fmt.Errorf("dp %d on %d nodes does not divide the global batch %d into micro-batches of %d", dp, n, g, m)
		}
		if spec.GetSchedule() == "interleaved" && (g/(m*dp))%pp != 0 {
			return topology.Layout{}, fmt.Errorf("dp %d on %d nodes leaves %d micro-batches per replica, not a multiple of pp %d (interleaved)", dp, n, g/(m*dp), pp)
		}
	}
	l, err := topology.NewLayout(tp, pp, dp, spec.GetOrder())
	if err != nil {
		return topology.Layout{}, err
	}
	if err := l.CheckDomains(int(spec.GetGpusPerNode())); err != nil {
		return topology.Layout{}, err
	}
	return l, nil
}
