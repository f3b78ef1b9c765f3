// Package sharding is ZeRO for the flat training state: which data-parallel
// rank owns which slice of the parameter, gradient and optimizer-state
// buffers, how those slices move when the data-parallel degree changes, and
// sharded checkpoints that any degree can read back.
//
// It imports nothing of gpucoord. Partitions, stage semantics and
// re-sharding are pure functions of their inputs (no goroutines, no clock);
// only the checkpoint functions do I/O, and they take a context.
//
// # The flat buffer and the partition
//
// A model's parameter tensors are laid end to end, in a fixed order, in one
// flat buffer; gradients and every optimizer-state vector (master weights,
// Adam's m and v) use the same layout. NewPartition pads the buffer with
// zeros to a multiple of degree*Align elements and gives rank r the block
// [r*ShardLen, (r+1)*ShardLen): all blocks have the same length, so a
// reduce-scatter or all-gather with equal blocks maps onto them directly, as
// in DeepSpeed's ZeRO and PyTorch FSDP. Pieces says which parts of which
// tensors a block covers.
//
// # Stages
//
// Stage.Spec gives, as data, what each ZeRO stage keeps whole and what it
// shards, how gradients are reduced and when parameters are gathered;
// ShardsOptimizer, ShardsGradients and ShardsParams answer the common
// questions. This is the one definition of the stages: the engine
// (worker/engine) allocates and communicates by it, and the planner's
// memory and traffic (topology/estimate, e.g. ModelStates after Rajbhandari
// et al. 2020, Figure 1) count by it. topology, a layer below, only checks
// that a stage is 0-3 and enumerates the stages for the layout search.
//
// # State vectors and re-sharding
//
// A Shard holds one rank's block of each named float32 state vector. When
// the degree changes (an elastic shrink or grow), Transfers lists the runs
// that move from old ranks to new ones, Reshard applies them to all shards
// in memory and ReshardRank builds one new rank's shard from just the old
// shards it overlaps. Values move bit-exactly.
//
// # Checkpoints
//
// A checkpoint of step N lives in <root>/step-<N>/: one file per rank,
// shard-<r>-of-<d>.bin, written atomically by that rank with WriteShard
// (temporary file, fsync, rename, fsync of the directory), or with
// StageShard and Place (the same file straight from the rank's buffers,
// placed later, with no checksums until Seal), then manifest.json,
// written last by Commit. The manifest names the step, the
// degree, the tensors, the vectors and, for each shard, its range, the
// SHA-256 of each 1 MiB chunk of its file and a file checksum (the SHA-256
// of the chunk digests). A step without a manifest is
// incomplete and LatestComplete passes over it. ReadShard loads rank r' of
// any degree d' from a checkpoint written at degree d, reading only the
// chunks it needs and verifying each one. A model split by tensor or
// pipeline parallelism has one flat buffer per (tp, pp) position: give each
// position its own root.
//
// Shard files are little-endian: a header (magic "GCSHARD\x01", version,
// step, rank, degree, block, flat length, a fingerprint of the tensor list,
// vector names) padded to 8 bytes, then each vector's block as float32, in
// sorted name order.
//
// # Usage
//
// The engine's ZeRO step on DP rank r of d, with grads and params the full
// flat buffers of p.PaddedLen() elements:
//
//	p, _ := sharding.NewPartition(tensors, d, nil)
//	state, _ := sharding.ShardOf(p, r, map[string][]float32{"param": params, "m": zeros, "v": zeros})
//	blk, _ := p.Range(r)
//	// reduce-scatter grads: this rank receives grads[blk.Lo:blk.Hi] summed
//	// Adam on state.Vectors["param"], ["m"], ["v"] with that gradient block
//	// all-gather state.Vectors["param"] into params
//	info, _ := sharding.WriteShard(ctx, root, step, p, state)
//	// one rank, with every rank's info: sharding.Commit(ctx, root, step, p, infos)
//
// After a restart at degree d2, each rank r2 calls
// sharding.LatestComplete(ctx, root) and sharding.ReadShard(ctx, root, step,
// p2, r2).
//
// # Concurrency
//
// A Partition is immutable and safe for concurrent use. Functions never keep
// the Shards they are given. Different ranks may call WriteShard for the same
// step at once; Commit must run after all of them have returned.
package sharding
