package collectives

import "context"

// Transport moves frames between the ranks of a world: collectives/tcp over
// sockets, InmemNetwork inside one process. Algorithms see only this
// interface, never a socket.
//
// # Contract
//
// Send may be called from several goroutines at once (one per group using
// the transport); each frame is delivered whole and frames from one sender
// to one receiver keep their order. Every frame that arrives is handed to
// Mailbox() (Deliver or DeliverBytes), one at a time per source. When the
// link from a peer breaks, the transport calls Mailbox().Fail(peer, err)
// with err wrapping ErrPeerLost. Send returns an error wrapping ErrPeerLost,
// ErrUnreachable or ErrTimeout when the frame cannot be delivered, and
// honours ctx.
type Transport interface {
	// Rank returns this process's rank in the world.
	Rank() int
	// Size returns the number of ranks in the world.
	Size() int
	// Mailbox returns where incoming frames are matched with receives.
	Mailbox() *Mailbox
	// Send sends one frame, h followed by payload (h.Len bytes), to peer.
	// It returns once payload may be reused.
	Send(ctx context.Context, peer int, h Header, payload []byte) error
}
