package coordinator_test

import (
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/coordinator"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// program is a valid spec of a user's program: 2 nodes x 4 GPUs, tp 2,
// pp 2, so dp 8/(2*2) = 2.
func program() *pb.JobSpec {
	return &pb.JobSpec{Id: "j", Nodes: 2, GpusPerNode: 4, Tp: 2, Pp: 2, Command: []string{"true"}}
}

// native is a valid native job on 2 nodes x 4 GPUs: tp 1, pp 2, so dp
// 8/(1*2) = 4, and 32/(2*4) = 4 micro-batches per replica, a multiple of
// pp 2 as the interleaved schedule needs.
func native() *pb.JobSpec {
	return &pb.JobSpec{Id: "n", Nodes: 2, GpusPerNode: 4, Tp: 1, Pp: 2, Schedule: "interleaved",
		NativeJob: []byte("steps: 1\n"), GlobalBatch: 32, MicroBatch: 2}
}

// TestValidateSpec: ValidateSpec refuses each rule of a job spec, naming
// the fields as gpucoord.proto does, and needs no etcd.
func TestValidateSpec(t *testing.T) {
	tests := []struct {
		name string
		spec func() *pb.JobSpec
		want string // "" for a valid spec
	}{
		{"program", program, ""},
		{"native, interleaved", native, ""},
		{"elastic with checkpoints", func() *pb.JobSpec {
			s := program()
			s.MaxNodes, s.MinNodes, s.MaxRestarts, s.CheckpointEvery, s.CheckpointDir, s.KeepCheckpoints = 3, 1, 2, 5, "/mnt/ckpt", 2
			s.Workdir, s.Env = "/home/u", map[string]string{"A": "1"}
			return s
		}, ""},
		{"empty id", func() *pb.JobSpec { s := program(); s.Id = ""; return s }, `id "": ` + pb.JobIDRule},
		{"id with a slash", func() *pb.JobSpec { s := program(); s.Id = "a/b"; return s }, `id "a/b": ` + pb.JobIDRule},
		{"id ..", func() *pb.JobSpec { s := program(); s.Id = ".."; return s }, `id "..": want 1 to 63 of the characters`},
		{"id .logs", func() *pb.JobSpec { s := program(); s.Id = ".logs"; return s }, `id ".logs": ` + pb.JobIDRule},
		{"id checkpoints", func() *pb.JobSpec { s := program(); s.Id = "checkpoints"; return s }, `id "checkpoints": ` + pb.JobIDRule},
		{"no nodes", func() *pb.JobSpec { s := program(); s.Nodes = 0; return s }, "nodes 0: want at least 1"},
		{"max_nodes below nodes", func() *pb.JobSpec { s := program(); s.MaxNodes = 1; return s }, "max_nodes 1 is below nodes 2"},
		{"no GPUs", func() *pb.JobSpec { s := program(); s.GpusPerNode = 0; return s }, "gpus_per_node 0: want at least 1"},
		{"nothing to run", func() *pb.JobSpec { s := program(); s.Command = nil; return s }, "neither a command nor a native job"},
		{"two things to run", func() *pb.JobSpec { s := native(); s.Command = []string{"true"}; return s }, "both a command and a native job"},
		{"ZeRO stage 4", func() *pb.JobSpec { s := native(); s.Zero = 4; return s }, "zero 4: want a ZeRO stage of 0, 1, 2 or 3"},
		{"keep one checkpoint", func() *pb.JobSpec { s := program(); s.KeepCheckpoints = 1; return s }, "keep_checkpoints 1: want 0"},
		{"negative max_restarts", func() *pb.JobSpec { s := program(); s.MaxRestarts = -1; return s },
			"checkpoint_every 0, max_restarts -1 and min_nodes 0 must not be negative"},
		{"min_nodes above nodes", func() *pb.JobSpec { s := program(); s.MinNodes = 3; return s }, "min_nodes 3 is above nodes 2"},
		{"relative checkpoint_dir", func() *pb.JobSpec { s := program(); s.CheckpointDir = "ckpt"; return s },
			`checkpoint_dir "ckpt": want an absolute path`},
		{"held checkpoints every 5 steps", func() *pb.JobSpec { s := native(); s.CheckpointEvery = 5; return s }, ""},
		{"restarts of a program, agents holding its checkpoints", func() *pb.JobSpec { s := program(); s.MaxRestarts = 1; return s }, ""},
		{"held checkpoints with a backup tier", func() *pb.JobSpec {
			s := native()
			s.CheckpointReplicas, s.CheckpointBackup, s.BackupEvery, s.HangTimeoutMs = 3, "/mnt/backup", 10, 5000
			return s
		}, ""},
		{"negative replicas", func() *pb.JobSpec { s := native(); s.CheckpointReplicas = -1; return s },
			"checkpoint_replicas -1, backup_every 0 and hang_timeout_ms 0ms must not be negative"},
		{"replicas with a shared directory", func() *pb.JobSpec { s := native(); s.CheckpointDir, s.CheckpointReplicas = "/mnt/c", 2; return s },
			"checkpoint_replicas and checkpoint_backup are for checkpoints the agents hold"},
		{"relative backup", func() *pb.JobSpec { s := native(); s.CheckpointBackup, s.BackupEvery = "b", 5; return s },
			`checkpoint_backup "b": want an absolute path`},
		{"backup without a period", func() *pb.JobSpec { s := native(); s.CheckpointBackup = "/mnt/b"; return s },
			`checkpoint_backup "/mnt/b" and backup_every 0: give both`},
		{"a period without a backup", func() *pb.JobSpec { s := native(); s.BackupEvery = 3; return s },
			`checkpoint_backup "" and backup_every 3: give both`},
		{"hang timeout of 5ms", func() *pb.JobSpec { s := native(); s.HangTimeoutMs = 5; return s },
			"hang_timeout_ms 5ms: want at least 100ms"},
		{"restarts of a native job without a directory", func() *pb.JobSpec { s := native(); s.MaxRestarts = 1; return s }, ""},
		{"relative workdir", func() *pb.JobSpec { s := program(); s.Workdir = "work"; return s }, `workdir "work": want an absolute path`},
		{"env without a name", func() *pb.JobSpec { s := program(); s.Env = map[string]string{"": "x"}; return s }, `env "": want a variable name`},
		{"env name with '='", func() *pb.JobSpec { s := program(); s.Env = map[string]string{"A=B": "x"}; return s }, `env "A=B"`},
		// The shape: topology.NewShape's rules on nodes x gpus_per_node ranks.
		{"8 % (3*1) = 2", func() *pb.JobSpec { s := program(); s.Tp, s.Pp = 3, 1; return s },
			"world size 8 (2 nodes x 4 GPUs) is not divisible by tp*pp = 3"},
		{"2*2*4 = 16, not 8", func() *pb.JobSpec { s := program(); s.Dp = 4; return s }, "dp 4: tp*pp*dp = 16 must equal the world size 8"},
		{"30 % (2*4) = 6", func() *pb.JobSpec { s := native(); s.GlobalBatch = 30; return s },
			"global batch 30 is not divisible by micro-batch*dp = 8 (micro-batch 2 x dp 4)"},
		{"interleaved: 24/(2*4) = 3, 3 % 2 = 1", func() *pb.JobSpec { s := native(); s.GlobalBatch = 24; return s },
			"interleaved schedule: 3 micro-batches per replica"},
		{"interleaved on one stage", func() *pb.JobSpec { s := native(); s.Pp = 1; return s }, "schedule interleaved needs pp of at least 2"},
		{"vpp on 1f1b", func() *pb.JobSpec { s := native(); s.Schedule, s.Vpp = "1f1b", 2; return s }, "vpp 2: virtual pipeline stages need"},
		{"unknown schedule", func() *pb.JobSpec { s := native(); s.Schedule = "2f2b"; return s }, `unknown schedule kind "2f2b"`},
		{"bad order", func() *pb.JobSpec { s := program(); s.Order = "tp-xx-pp"; return s }, `order "tp-xx-pp"`},
		{"tp group across nodes", func() *pb.JobSpec { s := program(); s.Tp, s.Pp, s.Order = 4, 1, "dp-tp-pp"; return s },
			"across NVLink domains"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := coordinator.ValidateSpec(tc.spec())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %v, want one line with %q", err, tc.want)
			}
		})
	}
}

// TestValidateSpecWith names the fields as the caller does: launch by its
// flags.
func TestValidateSpecWith(t *testing.T) {
	flag := func(f string) string { return "--" + strings.ReplaceAll(f, "_", "-") }
	s := native()
	s.CheckpointBackup = "/mnt/b"
	if err := coordinator.ValidateSpecWith(s, flag); err == nil || !strings.Contains(err.Error(), `--checkpoint-backup "/mnt/b" and --backup-every 0`) {
		t.Errorf("err = %v, want --checkpoint-backup and --backup-every", err)
	}
	s = program()
	s.MinNodes = 5
	if err := coordinator.ValidateSpecWith(s, flag); err == nil || !strings.Contains(err.Error(), "--min-nodes 5 is above --nodes 2") {
		t.Errorf("err = %v, want --min-nodes 5 is above --nodes 2", err)
	}
}

// TestLayoutKeepsGlobalBatch: on fewer nodes than asked the layout keeps
// the global batch: 4 nodes x 2 GPUs at tp 2 give dp 4 and 16/(2*4) = 2
// micro-batches per replica; 3 nodes give dp 3, which does not divide
// 16/2 = 8; 2 nodes give dp 2.
func TestLayoutKeepsGlobalBatch(t *testing.T) {
	s := &pb.JobSpec{Id: "j", Nodes: 4, GpusPerNode: 2, Tp: 2, Pp: 1, NativeJob: []byte("steps: 1\n"), GlobalBatch: 16, MicroBatch: 2}
	for _, tc := range []struct {
		nodes, dp int
		want      string
	}{
		{nodes: 4, dp: 4},
		{nodes: 3, want: "global batch 16 is not divisible by micro-batch*dp = 6 (micro-batch 2 x dp 3)"},
		{nodes: 2, dp: 2},
		{nodes: 1, dp: 1},
	} {
		l, err := coordinator.Layout(s, tc.nodes)
		switch {
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%d nodes: err = %v, want %q", tc.nodes, err, tc.want)
		case tc.want == "" && (err != nil || l.DP != tc.dp || l.World() != 2*tc.nodes):
			t.Errorf("%d nodes: dp %d world %d (%v), want dp %d world %d", tc.nodes, l.DP, l.World(), err, tc.dp, 2*tc.nodes)
		}
	}
}
