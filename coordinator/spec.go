package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// ValidateSpec names the first field of a job that cannot work, by its name
// in proto/gpucoord.proto (checkpoint_every). It is the one authority on a
// job spec: Submit refuses what it refuses, and launch calls it (through
// ValidateSpecWith) on the spec it is about to submit, after filling in
// what only launch knows (--standalone's checkpoint directory). The rules
// of the parallel shape are topology.NewShape's, applied by Layout on the
// spec's nodes.
func ValidateSpec(j *pb.JobSpec) error { return ValidateSpecWith(j, nil) }

// ValidateSpecWith is ValidateSpec naming each field f as name(f), f being
// its name in proto/gpucoord.proto: launch names them by its flags
// (--checkpoint-every). A nil name names them as ValidateSpec does.
func ValidateSpecWith(j *pb.JobSpec, name func(field string) string) error {
	if name == nil {
		name = func(f string) string { return f }
	}
	nodes := j.GetNodes()
	switch {
	case pb.CheckJobID(j.GetId()) != nil:
		return fmt.Errorf("%s %q: %s", name("id"), j.GetId(), pb.JobIDRule)
	case nodes < 1:
		return fmt.Errorf("%s %d: want at least 1", name("nodes"), nodes)
	case j.GetMaxNodes() != 0 && j.GetMaxNodes() < nodes:
		return fmt.Errorf("%s %d is below %s %d", name("max_nodes"), j.GetMaxNodes(), name("nodes"), nodes)
	case j.GetGpusPerNode() < 1:
		return fmt.Errorf("%s %d: want at least 1", name("gpus_per_node"), j.GetGpusPerNode())
	case j.GetTp() > j.GetGpusPerNode():
		return fmt.Errorf("%s %d exceeds %s %d: a tensor-parallel group stays inside a node", name("tp"), j.GetTp(), name("gpus_per_node"), j.GetGpusPerNode())
	case len(j.GetCommand()) == 0 && len(j.GetNativeJob()) == 0:
		return errors.New("neither a command nor a native job")
	case len(j.GetCommand()) > 0 && len(j.GetNativeJob()) > 0:
		return errors.New("both a command and a native job")
	case sharding.Stage(j.GetZero()).Validate() != nil:
		return fmt.Errorf("%s %d: want a ZeRO stage of 0, 1, 2 or 3", name("zero"), j.GetZero())
	case sharding.CheckKeep(int(j.GetKeepCheckpoints())) != nil:
		return fmt.Errorf("%s %d: %v", name("keep_checkpoints"), j.GetKeepCheckpoints(), sharding.CheckKeep(int(j.GetKeepCheckpoints())))
	case j.GetCheckpointEvery() < 0 || j.GetMaxRestarts() < 0 || j.GetMinNodes() < 0:
		return fmt.Errorf("%s %d, %s %d and %s %d must not be negative", name("checkpoint_every"), j.GetCheckpointEvery(),
			name("max_restarts"), j.GetMaxRestarts(), name("min_nodes"), j.GetMinNodes())
	case j.GetMinNodes() > nodes:
		return fmt.Errorf("%s %d is above %s %d: a job cannot shrink to more nodes than it starts on (0 means no shrinking)",
			name("min_nodes"), j.GetMinNodes(), name("nodes"), nodes)
	case j.GetCheckpointDir() != "" && !filepath.IsAbs(j.GetCheckpointDir()):
		return fmt.Errorf("%s %q: want an absolute path, the same on every node", name("checkpoint_dir"), j.GetCheckpointDir())
	case j.GetCheckpointReplicas() < 0 || j.GetBackupEvery() < 0 || j.GetHangTimeoutMs() < 0:
		return fmt.Errorf("%s %d, %s %d and %s %dms must not be negative", name("checkpoint_replicas"), j.GetCheckpointReplicas(),
			name("backup_every"), j.GetBackupEvery(), name("hang_timeout_ms"), j.GetHangTimeoutMs())
	case j.GetCheckpointDir() != "" && (j.GetCheckpointReplicas() != 0 || j.GetCheckpointBackup() != ""):
		return fmt.Errorf("%s and %s are for checkpoints the agents hold: with %s every node already reaches them",
			name("checkpoint_replicas"), name("checkpoint_backup"), name("checkpoint_dir"))
	case j.GetCheckpointBackup() != "" && !filepath.IsAbs(j.GetCheckpointBackup()):
		return fmt.Errorf("%s %q: want an absolute path, the same on every node", name("checkpoint_backup"), j.GetCheckpointBackup())
	case (j.GetCheckpointBackup() == "") != (j.GetBackupEvery() == 0):
		return fmt.Errorf("%s %q and %s %d: give both (a directory every node mounts, and every how many steps it gets a copy) or neither",
			name("checkpoint_backup"), j.GetCheckpointBackup(), name("backup_every"), j.GetBackupEvery())
	case j.GetResumeBackup() != nil && (j.GetCheckpointBackup() == "" || j.GetResumeBackup().GetStep() < 1 || j.GetResumeBackup().GetDp() < 1):
		return fmt.Errorf("%s: step %d at dp %d of %s %q: want a step after 0, its dp, and a backup tier", name("resume_backup"),
			j.GetResumeBackup().GetStep(), j.GetResumeBackup().GetDp(), name("checkpoint_backup"), j.GetCheckpointBackup())
	case j.GetHangTimeoutMs() != 0 && j.GetHangTimeoutMs() < 100:
		return fmt.Errorf("%s %dms: want at least 100ms (0 derives it from the step times)", name("hang_timeout_ms"), j.GetHangTimeoutMs())
	case j.GetCheckpointOverhead() < 0 || j.GetCheckpointOverhead() >= 1:
		return fmt.Errorf("%s %g: want a share of the step time in [0, 1), such as 0.05", name("checkpoint_overhead"), j.GetCheckpointOverhead())
	case j.GetCheckpointOverhead() > 0 && (j.GetCheckpointEvery() > 0 || len(j.GetNativeJob()) == 0):
		return fmt.Errorf("%s chooses the native engine's checkpoint interval: not with %s, nor for a program (which checkpoints when it says)",
			name("checkpoint_overhead"), name("checkpoint_every"))
	case j.GetWorkdir() != "" && !filepath.IsAbs(j.GetWorkdir()):
		return fmt.Errorf("%s %q: want an absolute path", name("workdir"), j.GetWorkdir())
	}
	for _, k := range slices.Sorted(maps.Keys(j.GetEnv())) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("%s %q: want a variable name, without '=' or NUL", name("env"), k)
		}
	}
	if err := checkReplan(j, name); err != nil {
		return err
	}
	_, err := Layout(j, int(nodes))
	return err
}

// Layout returns the rank layout of spec on n nodes, checked by
// topology.NewShape: TP and PP as asked, DP from the world size unless
// fixed, and the batch and schedule rules every generation must keep (the
// global batch is kept: each replica runs global/(micro*dp) micro-batches).
// A TP group must also stay inside a node.
func Layout(spec *pb.JobSpec, n int) (topology.Layout, error) {
	return LayoutOn(spec, pb.SpecGrid(spec), n)
}

// LayoutOn is Layout with grid's tp, pp, vpp and zero in place of the
// spec's: a re-planned generation's layout. dp is derived unless grid is
// the spec's own.
func LayoutOn(spec *pb.JobSpec, grid pb.Grid, n int) (topology.Layout, error) {
	sh, err := shapeOn(spec, grid, n)
	return sh.Layout, err
}

// shapeOn is LayoutOn's shape, its virtual stages resolved.
func shapeOn(spec *pb.JobSpec, grid pb.Grid, n int) (topology.Shape, error) {
	g := int(spec.GetGpusPerNode())
	dp := int(spec.GetDp())
	if grid != pb.SpecGrid(spec) {
		dp = 0
	}
	count := func(n int, thing string) string { // "1 node", "2 nodes"
		if n == 1 {
			return fmt.Sprintf("%d %s", n, thing)
		}
		return fmt.Sprintf("%d %ss", n, thing)
	}
	sh, err := topology.NewShape(n*g, topology.ShapeSpec{TP: int(grid.TP), PP: int(grid.PP), DP: dp,
		Order: spec.GetOrder(), GlobalBatch: int(spec.GetGlobalBatch()), MicroBatch: int(spec.GetMicroBatch()),
		Schedule: schedule.Kind(spec.GetSchedule()), Virtual: int(grid.VPP),
		WorldName: fmt.Sprintf("world size %d (%s x %s)", n*g, count(n, "node"), count(g, "GPU"))})
	if err != nil {
		return topology.Shape{}, err
	}
	if err := sh.CheckDomains(g); err != nil {
		return topology.Shape{}, err
	}
	return sh, nil
}
