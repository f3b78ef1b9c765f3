package sharding_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/gpucoord/gpucoord/sharding"
)

// The partition of a small model over 4 data-parallel ranks: equal aligned
// blocks, the padding at the tail, and the tensor pieces of each block.
func ExampleNewPartition() {
	tensors := []sharding.Tensor{
		{Name: "fc1.weight", Shape: []int{8, 4}},
		{Name: "fc1.bias", Shape: []int{8}},
		{Name: "fc2.weight", Shape: []int{2, 8}},
	}
	p, err := sharding.NewPartition(tensors, 4, &sharding.Config{Align: 4})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("len %d, padded %d, shard %d, padding %d\n", p.Len(), p.PaddedLen(), p.ShardLen(), p.Padding())
	for r := range p.Degree() {
		blk, _ := p.Range(r)
		pieces, _ := p.Pieces(r)
		fmt.Printf("rank %d %v:", r, blk)
		for _, pc := range pieces {
			fmt.Printf(" %s%v@%d", tensors[pc.Tensor].Name, pc.Elems, pc.ShardOff)
		}
		fmt.Println()
	}
	// Output:
	// len 56, padded 64, shard 16, padding 8
	// rank 0 {0 16}: fc1.weight{0 16}@0
	// rank 1 {16 32}: fc1.weight{16 32}@0
	// rank 2 {32 48}: fc1.bias{0 8}@0 fc2.weight{0 8}@8
	// rank 3 {48 64}: fc2.weight{8 16}@0
}

// A checkpoint written by 2 data-parallel ranks and read back after the job
// grew to 3: every new rank loads its shard straight from the old files.
func Example() {
	ctx := context.Background()
	root, err := os.MkdirTemp("", "ckpt")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)

	tensors := []sharding.Tensor{{Name: "w", Shape: []int{3, 3}}, {Name: "b", Shape: []int{3}}}
	param := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	old, _ := sharding.NewPartition(tensors, 2, &sharding.Config{Align: 1})
	var infos []sharding.ShardInfo
	for r := range 2 { // each rank of the job, in its own process
		s, _ := sharding.ShardOf(old, r, map[string][]float32{"param": param, "m": make([]float32, 12)})
		info, err := sharding.WriteShard(ctx, root, 100, old, s)
		if err != nil {
			log.Fatal(err)
		}
		infos = append(infos, info)
	}
	if err := sharding.Commit(ctx, root, 100, old, infos); err != nil {
		log.Fatal(err)
	}

	step, _ := sharding.LatestComplete(ctx, root)
	grown, _ := sharding.NewPartition(tensors, 3, &sharding.Config{Align: 1})
	for r := range 3 {
		s, err := sharding.ReadShard(ctx, root, step, grown, r)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("step", step, "rank", r, s.Range, s.Vectors["param"])
	}
	// Output:
	// step 100 rank 0 {0 4} [1 2 3 4]
	// step 100 rank 1 {4 8} [5 6 7 8]
	// step 100 rank 2 {8 12} [9 10 11 12]
}
