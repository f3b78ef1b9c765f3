package collectives

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// InmemNetwork connects the ranks of a world inside one process, for tests
// and single-process runs. A Send hands the frame straight to the receiver's
// Mailbox, so a posted receive is filled with one copy. Links can be cut,
// slowed or killed to inject faults.
//
// # Concurrency
//
// All methods are safe for concurrent use.
type InmemNetwork struct {
	mu    sync.Mutex
	boxes []*Mailbox
	cut   map[[2]int]bool
	delay map[[2]int]time.Duration
	dead  []bool
}

// NewInmemNetwork returns a network of size ranks, all links up.
func NewInmemNetwork(size int) *InmemNetwork {
	n := &InmemNetwork{boxes: make([]*Mailbox, size), cut: map[[2]int]bool{},
		delay: map[[2]int]time.Duration{}, dead: make([]bool, size)}
	for i := range n.boxes {
		n.boxes[i] = NewMailbox(size, nil)
	}
	return n
}

// Transport returns rank's end of the network.
func (n *InmemNetwork) Transport(rank int) Transport { return &inmem{net: n, self: rank} }

// Partition cuts the link between a and b both ways: sends fail fast with
// ErrUnreachable.
func (n *InmemNetwork) Partition(a, b int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]int{a, b}], n.cut[[2]int{b, a}] = true, true
}

// Heal restores the link between a and b.
func (n *InmemNetwork) Heal(a, b int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.cut, [2]int{a, b})
	delete(n.cut, [2]int{b, a})
}

// Delay makes every frame from src to dst wait d before delivery.
func (n *InmemNetwork) Delay(src, dst int, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.delay[[2]int{src, dst}] = d
}

// Kill makes rank behave like a crashed process: its links close, every
// other rank's receives from it fail with ErrPeerLost, and its own sends
// fail.
func (n *InmemNetwork) Kill(rank int) {
	n.mu.Lock()
	n.dead[rank] = true
	n.mu.Unlock()
	for i, b := range n.boxes {
		if i != rank {
			b.Fail(rank, fmt.Errorf("%w: world rank %d was killed", ErrPeerLost, rank))
		}
	}
}

type inmem struct {
	net  *InmemNetwork
	self int
}

func (t *inmem) Rank() int         { return t.self }
func (t *inmem) Size() int         { return len(t.net.boxes) }
func (t *inmem) Mailbox() *Mailbox { return t.net.boxes[t.self] }

// Send implements Transport.
func (t *inmem) Send(ctx context.Context, dst int, h Header, payload []byte) error {
	if dst < 0 || dst >= len(t.net.boxes) || dst == t.self {
		return fmt.Errorf("%w: no link %d->%d", ErrUnreachable, t.self, dst)
	}
	if int(h.Len) != len(payload) {
		return fmt.Errorf("%w: header says %d bytes, payload has %d", ErrInvalid, h.Len, len(payload))
	}
	n := t.net
	n.mu.Lock()
	cut, d, dead := n.cut[[2]int{t.self, dst}], n.delay[[2]int{t.self, dst}], n.dead[dst] || n.dead[t.self]
	n.mu.Unlock()
	switch {
	case dead:
		return fmt.Errorf("%w: link %d->%d is down", ErrPeerLost, t.self, dst)
	case cut:
		return fmt.Errorf("send %d->%d: %w", t.self, dst, ErrUnreachable)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		}
	}
	return n.boxes[dst].DeliverBytes(t.self, &h, payload)
}

// NewInmemWorld returns the world communicators of n ranks joined by a new
// InmemNetwork, which it also returns for fault injection.
func NewInmemWorld(n int, cfg *Config) (*InmemNetwork, []*Comm, error) {
	if n < 1 {
		return nil, nil, fmt.Errorf("%w: world size %d", ErrInvalid, n)
	}
	net := NewInmemNetwork(n)
	comms := make([]*Comm, n)
	for i := range comms {
		c, err := New(net.Transport(i), cfg)
		if err != nil {
			return nil, nil, err
		}
		comms[i] = c
	}
	return net, comms, nil
}
