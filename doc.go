// Package gpucoord is a distributed 3D-parallelism training coordinator.
//
// This root package holds no code; it is the tour of the module.
//
//   - topology: a cluster, a model and a parallel configuration become a
//     Plan: the rank map, every process group, validation and auto-search.
//     Its Layout (tp, pp, dp and their order: coordinates and groups, no
//     cluster) is the one rank layout the planner, the engine, the
//     coordinator and the agents share.
//   - topology/estimate: memory, FLOPs, traffic and step time of a Plan, as
//     pure functions with their formulas cited (docs/PLANNING.md).
//   - schedule: micro-batch pipeline schedules as data (GPipe, 1F1B,
//     interleaved 1F1B, ZB-H1), a validator, a simulator and renderers. Both
//     the planner and the engine read bubbles and in-flight counts from here,
//     so the dry-run and a real run never disagree.
//   - sharding: ZeRO stage 0-3 ownership of the flat parameter, gradient and
//     optimizer buffers, re-sharding across data-parallel degrees and sharded
//     checkpoints.
//   - collectives: process groups and ring collectives over a Transport,
//     with an in-memory network for tests; collectives/tcp (sockets and the
//     TCP bootstrap store), collectives/shm (shared memory between processes
//     of one host), collectives/nccl (NCCL loaded at run time, no cgo, on
//     host or device memory; its fakes for tests in nccltest), and
//     collectives/collectivestest (the conformance suite every transport
//     runs).
//   - internal/localproc: runs a world of local worker processes, or this
//     node's part of one, joined through a rendezvous store; each rank in
//     its own process group, stopped with SIGTERM then SIGKILL, dying with
//     its parent (train, bench and the worker agent use it).
//   - internal/bench: the driver behind `gpucoord bench`, which times the
//     collectives over TCP, shared memory, in process or NCCL on GPU memory,
//     as nccl-tests does.
//   - proto: the wire protocol (proto/gpucoord.proto, generated code in
//     proto/gpucoordpb): the Coordinator gRPC service and the messages that
//     are also the values of the coordinator's etcd keys.
//   - coordinator: the control plane: job state in etcd (embedded or
//     external), the gRPC service every coordinator serves, and, in the
//     elected leader, rendezvous into generations and failure handling;
//     with --http, a dashboard built from the coordinator's cache
//     (coordinator/webui, embedded; docs/DASHBOARD.md).
//   - worker: the agent on each node: registers, keeps its lease alive,
//     runs the ranks of its assignment with torchrun's environment and
//     reports how they end; also the native-engine rank started by it.
//   - worker/engine: a native Go training engine running the schedules with
//     tensor-parallel layers and ZeRO-sharded Adam.
//   - worker/ckpt and worker/ranklog: what a node's agent holds and serves
//     on its node server: its ranks' checkpoints and peers' replicas (to
//     nodes), and what its ranks print (to launch and gpucoord logs).
//   - internal/backoff: the exponential backoff with jitter of every retry
//     loop that reaches coordinators.
//   - client: the Go API of the coordinators (submit, follow a job with
//     failover and resume from a revision, cancel, status) that launch and
//     status are built on.
//   - internal/inproc: the pieces of a cluster in this process: a Node (a
//     coordinator with its embedded etcd member, and an agent) and a whole
//     Cluster on one machine (launch --standalone).
//   - internal/slurm and internal/slurmboot: Slurm's host lists and step
//     environment, and how the tasks of a step agree on a CA and the
//     coordinators' addresses through MUNGE (srun gpucoord launch).
//   - deploy/kubernetes: the manifests, decoded strictly in its tests.
//   - cmd/gpucoord: the command line; flags and wiring only.
//
// Imports point one way: proto, topology and schedule at the bottom, then
// sharding and collectives, then client, then worker and coordinator
// (which never import each other: they meet in proto; worker uses client
// only to describe an unreachable coordinator), then cmd.
// docs/ARCHITECTURE.md draws the map.
package gpucoord
