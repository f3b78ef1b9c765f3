// Package estimate computes what a topology.Plan costs: per-GPU memory by
// part and by pipeline stage, FLOPs per step, traffic per process group,
// pipeline bubble and an estimated step time, and whether the plan fits.
//
// Everything here is a pure function of the Plan; every formula cites its
// source in a comment and in docs/PLANNING.md. Pipeline bubbles and the
// number of micro-batches in flight come from the schedule package (the
// same schedules the engine runs), and what each ZeRO stage shards and
// communicates comes from sharding.Stage (the semantics the engine runs),
// so a dry-run and a real run agree. sharding imports nothing of gpucoord,
// so this package may import it without a cycle.
package estimate
