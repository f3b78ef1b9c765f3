// Package gpucoordpb is gpucoord's wire protocol: the messages and the
// Coordinator gRPC service generated from proto/gpucoord.proto (generated
// code committed; `make proto` regenerates it), plus the few constants both
// ends must agree on. It is a leaf: the coordinator and the worker agent
// meet here and never import each other.
//
// The same messages are the values of the coordinator's etcd keys, encoded
// with protojson, and a rank's GPUCOORD_PLAN file is the protojson of its
// node's Assignment.
package gpucoordpb

// ProtocolVersion is the version of this protocol. A coordinator refuses an
// agent that speaks another. 6: a generation carries its own layout (an
// agent of 5 would run a re-planned generation at the spec's), and agents
// check replicated checkpoints with CRC-32C. 7: an assignment carries the
// node's part of the generation, its place and its replica holders (an
// agent of 6 would count GROUP_WORLD_SIZE from the part, and replicate to
// no one). 8: each node gossips in its failure domain's pool, without the
// coordinators, and reports the deaths its pool finds (PoolReport); its
// registration carries its pool address (an agent of 7 would join the
// seeds under the cluster's label, and report no death). 9: Watch requests
// number the agent's streams (session; a node's conns key keeps the
// highest) and say how long the deadlines given before still run
// (deadline_left_ms), and a registration gives none: an agent of 8 would
// send neither, and run ranks for a lease's TTL after it registered, so
// that a fence by a coordinator's window (Config.FenceWindow) could end
// before its ranks. 10: with a fence window, a block's members are renewed
// through its relay (Assignment.relayed_renewals, forwarded to each
// member's node server): an agent of 9 would forward none, and its
// members' ranks would stop at the window's end. 11: neither end pings an
// agent's connection, and a Watch stream's first message says how often
// the stream brings one (Assignment.heartbeat_ms): an agent of 10 would
// not notice a coordinator gone for 30 s, and its compute times
// (RankTimes) would reach a coordinator empty. 12: a job's change reaches
// a block's members through its relay (RelayedRenewal.assignment, checked
// by the stream's relay_key): an agent of 11 would forward none, and its
// members would get each change two seconds late, from their own streams.
const ProtocolVersion = 12
