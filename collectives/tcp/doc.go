// Package tcp is the TCP Transport of gpucoord/collectives, for CPU hosts:
// a full mesh of connections between the ranks of a world, one reader
// goroutine per connection that hands frames to the collectives Mailbox
// (straight into a posted receive, or reduced into it on the fly), and
// framed writes that do not allocate.
//
// # Usage
//
// Ranks rendezvous by a list of addresses (Config.Addrs) or through a
// collectives.Store: each rank listens, publishes its address under
// Config.Prefix, and connects to the others. For local process groups,
// one process serves a store with ServeStore and the others DialStore it,
// every request signed with the store's secret (NewSecret); the same store
// carries other bootstrap data (the NCCL unique id). A served store is
// bounded and its keys are written once.
//
//	st, _ := tcp.DialStore(ctx, storeAddr, secret)
//	cfg := tcp.DefaultConfig()
//	cfg.Rank, cfg.Size, cfg.Store, cfg.Prefix = rank, size, st, "job7/gen3/"
//	t, _ := tcp.New(ctx, cfg)
//	defer t.Close()
//	world, _ := collectives.New(t, collectives.DefaultConfig())
//
// NewLocal builds a whole world inside one process over loopback.
//
// # Failures
//
// A peer whose process dies closes its sockets; the reader sees it at once
// and every receive from that peer fails with collectives.ErrPeerLost
// naming it. A peer that stops reading makes sends block; after
// Config.WriteTimeout they fail with collectives.ErrTimeout. A failed
// connection is not re-established: build a new world (a new generation).
package tcp
