package worker

import (
	"os"
	"path/filepath"
	"syscall"
)

// OwnDir is the directory gpucoord makes in every directory it is given
// (worker --state-dir and --checkpoint-local, launch --checkpoint-dir and
// --checkpoint-backup) and keeps all its files in. Nothing outside it is
// ever written or removed, so a directory that holds a user's files
// (/mnt/nvme with its datasets) can be given safely; within it, what is
// removed is named by a job id or node name that passed
// gpucoordpb.CheckJobID or CheckNodeName. launch --workdir, where ranks
// start, gets nothing of gpucoord's.
//
// Under an agent's --state-dir:
//
//	gpucoord/jobs/<job>/<node>/gen-<n>/   a generation's plan file and error files
//	gpucoord/logs/<node>/<job>/           what the ranks printed (ranklog)
//	gpucoord/checkpoints/<node>/<job>/    held checkpoints, when /dev/shm has no room
//
// Under --checkpoint-local (or /dev/shm): gpucoord/checkpoints/<node>/<job>/.
// Under a --checkpoint-dir or --checkpoint-backup: gpucoord/<job>/, the
// job's own (its ranks' GPUCOORD_CHECKPOINT_DIR, or its second tier), and
// gpucoord/.probe-* while a generation starts.
const OwnDir = "gpucoord"

// Owned is dir's directory of gpucoord's own: dir/gpucoord.
func Owned(dir string) string { return filepath.Join(dir, OwnDir) }

// SharedCheckpointDir is job's directory in dir, a shared checkpoint
// directory or a backup tier (a spec's checkpoint_dir or
// checkpoint_backup): dir/gpucoord/<job>. A shared directory's ranks
// write their checkpoints there (GPUCOORD_CHECKPOINT_DIR); a job's fence
// and steps never meet another job's.
func SharedCheckpointDir(dir, job string) string { return filepath.Join(Owned(dir), job) }

// CheckpointRoot is the directory an agent named node keeps the
// checkpoints it holds in (its ckpt.Holder's root):
// base/gpucoord/checkpoints/<node>, base being local (--checkpoint-local)
// when given, else /dev/shm when it has shmMinFree free (memory is where
// a checkpoint every step costs least), else workDir (--state-dir).
func CheckpointRoot(node, local, workDir string) string {
	base := local
	if base == "" {
		base = workDir
		if ShmHasRoom() {
			base = "/dev/shm"
		}
	}
	return filepath.Join(Owned(base), "checkpoints", node)
}

// ShmHasRoom says whether /dev/shm has room for held checkpoints.
func ShmHasRoom() bool {
	var st syscall.Statfs_t
	return syscall.Statfs("/dev/shm", &st) == nil && uint64(st.Bavail)*uint64(st.Bsize) >= shmMinFree
}

// TempCheckpointRoot makes a directory of the caller's own for an agent's
// held checkpoints (its CheckpointRoot), named as os.MkdirTemp names with
// pattern: in /dev/shm when it has room, else in dir. The caller removes
// it, and with it everything the agent kept there.
func TempCheckpointRoot(dir, pattern string) (string, error) {
	if ShmHasRoom() {
		dir = "/dev/shm"
	}
	return os.MkdirTemp(dir, pattern)
}

// jobsDir is where an agent with work directory workDir keeps its jobs'
// plan files: workDir/gpucoord/jobs.
func jobsDir(workDir string) string { return filepath.Join(Owned(workDir), "jobs") }

// logsDir is where an agent named node keeps its ranks' logs.
func logsDir(node, workDir string) string { return filepath.Join(Owned(workDir), "logs", node) }

// mkOwned makes dir/gpucoord, readable by everyone (what is inside says
// who may read it).
func mkOwned(dir string) error { return os.MkdirAll(Owned(dir), 0o755) }
