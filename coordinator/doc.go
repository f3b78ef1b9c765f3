// Package coordinator is gpucoord's control plane: it keeps every job's
// state in etcd and serves the Coordinator gRPC service (package
// gpucoordpb) to worker agents, launch and status.
//
// # State
//
// etcd is the only state (see keys for the layout under Config.Prefix). A
// node's key is leased: it lives while the node's Watch stream keeps the
// lease alive, and is revoked at once when the stream drops without Leave.
// Writes that must agree are transactions on the revision they read.
//
// # Roles
//
// Every coordinator serves every call: Watch and Follow translate etcd
// watches, Register, Report, Submit and Cancel write etcd. One coordinator
// at a time is the leader (etcd's concurrency.Election); it alone runs the
// state machine: rendezvous (enough free nodes, a last call for more, then
// the generation is frozen with its members and layout), and the end of a
// generation (every rank exited 0: succeeded; a rank failed or a member
// node was lost: failed, naming them). A standby that is elected resumes
// from etcd; the leader keeps only timers in memory.
//
// # Generations
//
// A generation is one frozen membership of a job with its layout; every
// membership change the leader acts on makes a new one, and agents drop
// anything of an older generation. This package makes generation 1 and
// ends a job on failure; recovery into generation g+1 builds on it.
//
// # Usage
//
//	c, err := coordinator.New(ctx, cfg) // binds the port, opens etcd
//	err = c.Run(ctx)                    // serves until ctx ends
//
// # Concurrency
//
// Run owns every goroutine it starts and returns after they end; the gRPC
// handlers run concurrently and share nothing but the etcd client.
package coordinator
