// Package collectives implements process-group collectives (all-reduce,
// reduce-scatter, all-gather, broadcast, point-to-point, barrier) over a
// Transport. It knows nothing of jobs or plans.
//
// # Pieces
//
//   - Communicator (communicator.go) is the contract the engine codes
//     against; Buffer is a zero-allocation typed view of caller memory.
//   - Comm implements Communicator over any Transport: the world (New) and
//     sub-groups (Comm.Group, or NewGroup through the Grouper interface).
//   - Transport moves frames: collectives/tcp (sockets), collectives/shm
//     (shared-memory rings for ranks on one host), InmemNetwork (one
//     process, with partition, delay and kill injection). A Transport hands
//     every incoming frame to its Mailbox, which matches frames with posted
//     receives and reads each payload straight into (or reduces it into) the
//     caller's memory.
//   - Store is the bootstrap rendezvous (addresses, the NCCL unique id);
//     MemStore in process, tcp.ServeStore / tcp.DialStore across processes.
//
// # Usage
//
// In one process (tests, --inproc):
//
//	_, comms, err := collectives.NewInmemWorld(4, collectives.DefaultConfig())
//
// Across processes, each rank:
//
//	t, err := tcp.New(ctx, tcpCfg) // Rank, Size, Store (or Addrs)
//	world, err := collectives.New(t, collectives.DefaultConfig())
//	tp, err := world.Group(ctx, []int{0, 1}) // every member calls it
//	err = tp.AllReduce(ctx, collectives.Float32s(grad), collectives.Sum)
//
// # Algorithms
//
// AllReduce picks by size (the same choice on every rank, from Config): up
// to DirectBytes (off by default), one round in which every rank sends its
// buffer to every other and reduces all n in rank order; up to SmallBytes, recursive
// doubling (log2 n rounds; non-powers of two fold the extra ranks in first);
// above, a ring reduce-scatter then ring all-gather, each rank sending
// 2(n-1)/n of the buffer, cut into ChunkBytes pieces that are forwarded as
// soon as they are reduced. ReduceScatter and AllGather are the two halves
// of that ring; Broadcast is a binomial tree (small) or a pipelined chain;
// Barrier is the dissemination algorithm. Every algorithm reduces in a
// fixed order and combines partners' values as (lower rank) op (higher
// rank), so every rank ends with the same bits, run after run.
//
// # Concurrency
//
// Calls on one Comm must not be concurrent. Different Comms over the same
// Transport (the TP, PP and DP groups of one rank) may be used from
// different goroutines at once: frames carry the group's tag and are
// matched per (source, tag), so they never mix.
//
// # Errors
//
// Frames carry the whole operation's description (kind, sequence number,
// type, reduction, root, total length), so a member that calls a different
// operation or length is reported with ErrMismatch instead of corrupting
// memory. A dead peer (ErrPeerLost), a silent one (ErrTimeout after
// Config.Timeout), a partitioned link (ErrUnreachable) come back as a
// *PeerError naming the peer. The member that fails sends an abort frame to
// the others, which fail at once with ErrAborted. After any error the Comm
// is broken (ErrBroken): build a new world, as a new generation does.
//
// # Memory
//
// An operation allocates nothing in steady state: scratch space, receive
// queues and early-frame buffers are kept and reused. Send and a
// Broadcast's root are eager: they return once the data is on its way, and
// frames that arrive before the receive is posted wait in pooled buffers.
package collectives
