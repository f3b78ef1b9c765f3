package worker

import (
	"slices"
	"testing"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestRankEnvDevices: CUDA_VISIBLE_DEVICES is the local rank on GPU nodes
// (agent --cuda) and absent elsewhere; the coordinates follow Megatron-LM's
// order on the second node.
func TestRankEnvDevices(t *testing.T) {
	asg := &pb.Assignment{Job: "j", Master: "10.0.0.1:29500", GroupRank: 1, GroupWorld: 2,
		Spec: &pb.JobSpec{Tp: 2, Pp: 2, GpusPerNode: 4},
		Generation: &pb.Generation{Number: 3, Dp: 2, World: 8, Members: []*pb.Member{
			{Node: "a", FirstRank: 0, Ranks: 4}, {Node: "b", FirstRank: 4, Ranks: 4}}}}
	gpu, err := RankEnv(asg, NodeEnv{Name: "b", Devices: true}, 6, "/p.json", "/ck")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RANK=6", "LOCAL_RANK=2", "GROUP_RANK=1", "CUDA_VISIBLE_DEVICES=2", "GPUCOORD_TP_RANK=0",
		"GPUCOORD_DP_RANK=1", "GPUCOORD_PP_RANK=1", "GPUCOORD_GENERATION=3", "TORCHELASTIC_RESTART_COUNT=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500"} {
		if !slices.Contains(gpu, want) {
			t.Errorf("GPU node env lacks %s: %v", want, gpu)
		}
	}
	cpu, err := RankEnv(asg, NodeEnv{Name: "b"}, 6, "/p.json", "/ck")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range cpu {
		if len(kv) >= 21 && kv[:21] == "CUDA_VISIBLE_DEVICES=" {
			t.Errorf("CPU node env sets %s", kv)
		}
	}
	if _, err := RankEnv(asg, NodeEnv{Name: "c"}, 0, "", ""); err == nil {
		t.Error("a node outside the generation got an environment")
	}
	// The GPUs Slurm gave the node (CUDA_VISIBLE_DEVICES=4,5,6,7): local
	// rank 2 sees the third alone.
	slurm, err := RankEnv(asg, NodeEnv{Name: "b", DeviceList: []string{"4", "5", "6", "7"}}, 6, "/p.json", "/ck")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(slurm, "CUDA_VISIBLE_DEVICES=6") || slices.Contains(slurm, "CUDA_VISIBLE_DEVICES=2") {
		t.Errorf("rank 6 on GPUs 4-7: %v", slurm)
	}
}

// TestInheritedEnv: a rank inherits what programs need of its agent's
// environment and nothing the agent was given for itself: not the join
// token, nor any GPUCOORD_ variable but the libraries a native rank
// loads, whatever --rank-env says.
func TestInheritedEnv(t *testing.T) {
	environ := []string{"PATH=/usr/bin", "HOME=/home/u", "LANG=C.UTF-8", "LC_ALL=C", "TMPDIR=/scratch", "LD_LIBRARY_PATH=/opt/cuda/lib",
		"PYTHONPATH=/src", "CUDA_HOME=/opt/cuda", "NCCL_DEBUG=INFO", "GLOO_SOCKET_IFNAME=ib0", "TORCH_HOME=/cache", "OMP_NUM_THREADS=4",
		"GPUCOORD_NCCL_LIBRARY=/opt/nccl.so", "GPUCOORD_CUDART_LIBRARY=/opt/cudart.so",
		"GPUCOORD_TOKEN=gct1.abc.secret.hash", "GPUCOORD_RANK_EXECUTABLE=/bin/x", "GPUCOORD_STORE_SECRET=00", "ETCD_PASSWORD=pw",
		"AWS_SECRET_ACCESS_KEY=k", "SSH_AUTH_SOCK=/tmp/ssh", "XDG_STATE_HOME=/home/u/.local/state", "MY_DATA=/d", "MY_OTHER=1", "=odd"}
	tests := []struct {
		name  string
		extra []string
		want  []string
	}{
		{"default", nil, []string{"PATH=/usr/bin", "HOME=/home/u", "LANG=C.UTF-8", "LC_ALL=C", "TMPDIR=/scratch", "LD_LIBRARY_PATH=/opt/cuda/lib",
			"PYTHONPATH=/src", "CUDA_HOME=/opt/cuda", "NCCL_DEBUG=INFO", "GLOO_SOCKET_IFNAME=ib0", "TORCH_HOME=/cache", "OMP_NUM_THREADS=4",
			"GPUCOORD_NCCL_LIBRARY=/opt/nccl.so", "GPUCOORD_CUDART_LIBRARY=/opt/cudart.so"}},
		{"--rank-env MY_DATA", []string{"MY_DATA"}, []string{"MY_DATA=/d"}},
		{"--rank-env MY_*", []string{"MY_*"}, []string{"MY_DATA=/d", "MY_OTHER=1"}},
		{"standalone: all but gpucoord's own", []string{"*"}, []string{"ETCD_PASSWORD=pw", "AWS_SECRET_ACCESS_KEY=k", "SSH_AUTH_SOCK=/tmp/ssh",
			"XDG_STATE_HOME=/home/u/.local/state", "MY_DATA=/d", "MY_OTHER=1"}},
	}
	for _, tc := range tests {
		got := inheritedEnv(environ, tc.extra)
		want := tc.want
		if tc.extra != nil {
			want = append(slices.Clone(tests[0].want), tc.want...)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, got, want)
		}
	}
	for _, p := range []string{"MY_DATA", "MY_*", "HF_*", "*"} {
		if err := CheckRankEnv(p); err != nil {
			t.Errorf("--rank-env %q: %v", p, err)
		}
	}
	for _, p := range []string{"", "GPUCOORD_TOKEN", "GPUCOORD_*", "GPU*", "G*", "A=B", "A*B", "**"} {
		if err := CheckRankEnv(p); err == nil {
			t.Errorf("--rank-env %q accepted", p)
		}
	}
}
