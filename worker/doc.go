// Package worker is the agent that runs on every node: it registers the
// node with a coordinator, keeps its lease alive through its Watch stream,
// and runs the ranks of its assignment as local processes
// (internal/localproc), the native engine (RunNativeRank) or the job's
// command, each with torchrun's environment plus gpucoord's (RankEnv).
//
// The agent of rank 0's node bootstraps a generation: for a native job it
// serves the rendezvous store the ranks join; for a command it finds a free
// port for the program's own store (torch's TCPStore on rank 0). Every rank
// output line is tagged "[node rR tpT ppP dpD]".
//
// # Failure
//
// Ranks run in their own process groups with a parent-death signal, so
// they die with the agent even when it is killed with SIGKILL. They are
// stopped with SIGTERM, then SIGKILL after Config.Grace, when their
// generation ends, when the agent stops, or when the node's lease
// deadline passes: the last renewal a coordinator sent on the Watch stream
// plus the lease TTL (the fence: after it, the coordinator may have given
// the ranks to another node). The agent moves between coordinators without
// stopping its ranks, and never starts a generation it already ran.
//
// The agent's member of its failure domain's gossip pool (internal/gossip;
// Config.FailureDomain) finds a frozen, crashed or cut-off node of the
// domain in about a second, and the agent reports it to every coordinator
// (PoolReport), members of no pool themselves. While its pool counts fewer
// members than the coordinators have registered in the domain, the agent
// asks them for members to join.
//
// # Addresses
//
// ResolveNetwork finds what the node advertises (the address that routes
// to a coordinator, unless told), what its listeners bind and the
// interface gloo and NCCL are pointed at.
//
// The agent never imports package coordinator: they meet in gpucoordpb.
package worker
