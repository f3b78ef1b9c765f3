// Package shm is a shared-memory Transport of gpucoord/collectives for
// ranks on one host, as NCCL and OpenMPI use inside a node: each ordered
// pair of ranks shares a single-producer single-consumer ring buffer in a
// file under /dev/shm, mapped by both processes. A frame is copied into the
// ring by the sender and out of it (or reduced out of it) by the receiver's
// reader goroutine, with no system call on the data path; a side that finds
// the ring empty (or full) spins briefly and then sleeps on a futex in the
// shared page, which the other side wakes.
//
// # Usage
//
// Ranks rendezvous through a collectives.Store exactly as with
// collectives/tcp; the store carries a session id, and each rank's process
// id:
//
//	cfg := shm.DefaultConfig()
//	cfg.Rank, cfg.Size, cfg.Store, cfg.Prefix = rank, size, st, "job7/gen3/shm/"
//	t, _ := shm.New(ctx, cfg)
//	defer t.Close()
//	world, _ := collectives.New(t, collectives.DefaultConfig())
//
// The ring files are unlinked as soon as every rank has mapped them, so
// nothing is left in /dev/shm even if a process is killed.
//
// # Failures
//
// There is no connection to break when a process dies, so each waiting side
// checks its peer's process every Config.LivenessInterval (kill(pid, 0)); a
// dead peer fails receives from it with collectives.ErrPeerLost. A Transport
// closed with Close marks its rings closed, which peers see at once. A send
// blocked on a full ring for Config.WriteTimeout fails with
// collectives.ErrTimeout.
package shm
