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
	asg := &pb.Assignment{Job: "j", Master: "10.0.0.1:29500",
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
}
