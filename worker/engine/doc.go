// Package engine is gpucoord's native training engine: a float32 residual
// MLP trained with Adam on CPU, split three ways across ranks exactly as a
// GPU framework would split a transformer.
//
//   - Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): each block's
//     first linear is column-parallel (its hidden units split across the TP
//     group; forward operator f is the identity, its backward an all-reduce)
//     and the second is row-parallel (its input rows split; forward operator
//     g is an all-reduce, its backward the identity). Biases after g and the
//     head are replicated.
//   - Pipeline parallelism: blocks are cut into PP*Virtual chunks; pipeline
//     rank s holds chunks s, s+PP, s+2*PP, ... (Megatron's interleaving). The
//     op lists of package schedule are executed as they are: forward,
//     backward (or split input-gradient and weight-gradient passes for
//     zero-bubble schedules), and Send/Recv of activations and gradients over
//     the PP group.
//   - Data parallelism with ZeRO (Rajbhandari et al. 2020) stage 0-3 over
//     package sharding's partition of each chunk's flat buffer: stage 0
//     all-reduces gradients; stage 1 reduce-scatters them at the step and
//     runs Adam on the owned shard, then all-gathers the parameters; stage 2
//     reduce-scatters every micro-batch's gradient as soon as its weight pass
//     ends, so only the shard persists; stage 3 also keeps only the parameter
//     shard and all-gathers a chunk's parameters before each pass that needs
//     them, freeing them after.
//
// Data is synthetic and deterministic: sample i of step s depends only on
// (seed, s, i), and replica d's micro-batch j holds samples
// (d*M + j)*micro ... + micro-1, so every layout sees the same global batch.
// The loss gradient is scaled by 1/global batch and gradients are summed, so
// every layout computes the single-process step up to float32 rounding.
//
// # Checkpoints
//
// Rank.Checkpoint writes one sharded checkpoint root (package sharding's
// format) per (TP rank, chunk) position, root/tp<t>-of-<T>/chunk<c>-of-<C>
// with C = PP*Virtual, each sharded over the DP ranks as the ZeRO stage's
// partition cuts the chunk's flat buffer; with Config.LocalCheckpoints the
// ranks write their shards on their own nodes (Rank.StageLocal) and
// Rank.RestoreLocal seals the gathered files. Tensors are named for the
// whole model (block<i>.w1 ..., head.w), so Rank.Restore reads a
// checkpoint written at any layout of the same model: any TP, PP,
// Virtual, DP degree and ZeRO stage. At the rank's own TP and C it reads
// each root as it is, only its own block where its buffers are sharded;
// at another it cuts every tensor of its chunks out of the old roots
// whose pieces overlap it. The state is the parameters and Adam's two
// moments, all elementwise, so a resumed run continues exactly where the
// old one stopped, up to the float32 rounding of the new layout's sums.
// The layout that wrote a step is Config.CheckpointLayout, or the one
// found under the directory holding that step.
//
// # Usage
//
// Parse a job, build a Config, and run it in one process with RunInProc,
// or build one Rank per process with its three Communicators and call Step.
//
// # Concurrency
//
// A Rank is driven by one goroutine. Ranks of one job run concurrently, each
// with its own Communicators.
package engine
