// Package coordinator is gpucoord's control plane: it keeps every job's
// state in etcd and serves the Coordinator gRPC service (package
// gpucoordpb) to worker agents, launch and status.
//
// # State
//
// etcd is the only state (see keys for the layout under Config.Prefix). A
// node's key is leased: it lives while a coordinator keeps the lease alive
// for the node's open Watch stream. A stream that drops leaves the node
// disconnected (its conns/ key goes) until its lease ends; the node keeps
// its place if its agent comes back in time.
//
// # Cache, queue, decide, apply
//
// Every coordinator keeps a cache of the prefix (cache.go): one list, then
// one watch from the list's revision + 1, listed again on compaction.
// Watch streams, Status and Follow read it. One coordinator at a time is
// the leader (etcd's concurrency.Election); it keeps a work queue of jobs
// (queue.go) that events and decision deadlines fill, and for each job
// calls decide (decide.go), a pure function of the job and pool views and
// the time that holds all policy: rendezvous, last call, timeouts, loss,
// settle, pause, resume, spares, grow back, stragglers, strikes, restarts.
// Each decision is written in one transaction fenced by the leader's
// election key (leader.go), so it is all or nothing and a deposed leader's
// write fails. The leader's timers and the nodes' strikes are in etcd too:
// a new leader goes on where the old one stopped.
//
// # Generations
//
// A generation is one frozen membership of a job with its layout; every
// membership change the leader acts on makes a new one, and agents drop
// anything of an older generation.
//
// # Dashboard
//
// With Config.HTTP a coordinator serves a dashboard (web.go): a page
// embedded in the binary (webui/), and JSON and server-sent events built
// from the same cache (webhub.go keeps the model, webview.go reads the
// cache for it): one rebuild per change of the cache, at most every
// 100 ms, whatever the number of viewers, and only the sections that
// changed are sent. A standby's dashboard shows what the leader's does.
//
// # Usage
//
//	c, err := coordinator.New(ctx, cfg) // binds the port, opens etcd
//	err = c.Run(ctx)                    // serves until ctx ends
//
// # Concurrency
//
// Run owns every goroutine it starts and returns after they end. The gRPC
// handlers run concurrently; they share the etcd client, the cache (read
// only) and the compute-time buffer.
package coordinator
