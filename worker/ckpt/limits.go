package ckpt

import (
	"fmt"
	"time"
)

// Limits bound what a Holder takes from its peers and how long it waits
// for them. Start from DefaultLimits and override fields.
type Limits struct {
	// MaxStepBytes caps one step stream a peer sends (a replica) or serves
	// (a fetch). The cap in force is the larger of it and twice the
	// largest step this node's own ranks wrote, so it never refuses a step
	// the size of the node's own; set it above the largest step any node
	// of the cluster's jobs writes.
	MaxStepBytes int64
	// ReplicaTimeout bounds one replica, sent or fetched: the transfer
	// must end within ReplicaTimeout plus a second per replicaRate bytes
	// of the step (a peer that stops reading or answering fails the step,
	// and its ranks are told "failed N").
	ReplicaTimeout time.Duration
	// PeerWait is how long a request naming a generation this node has not
	// heard of yet waits for its assignment (peers learn of a generation
	// at about the same time, not at once) before it is refused.
	PeerWait time.Duration
}

// replicaRate is the slowest transfer a replica is given time for, in
// bytes a second, on top of ReplicaTimeout.
const replicaRate = 64 << 20

// DefaultLimits are an agent's: steps of up to 4 GiB (or twice the
// node's own), a minute plus a second per 64 MiB for a replica, 5 s for a
// generation to be heard of.
var DefaultLimits = Limits{MaxStepBytes: 4 << 30, ReplicaTimeout: time.Minute, PeerWait: 5 * time.Second}

// Validate names the first field that cannot work; zero fields count as
// DefaultLimits'.
func (l Limits) Validate() error {
	l = l.orDefault()
	switch {
	case l.MaxStepBytes < 1<<20:
		return fmt.Errorf("checkpoint step cap %d bytes: want at least 1 MiB", l.MaxStepBytes)
	case l.ReplicaTimeout < 10*time.Millisecond:
		return fmt.Errorf("replica timeout %s: want at least 10ms", l.ReplicaTimeout)
	case l.PeerWait < 0:
		return fmt.Errorf("peer wait %s: want 0 or more", l.PeerWait)
	}
	return nil
}

// orDefault fills l's zero fields from DefaultLimits.
func (l Limits) orDefault() Limits {
	if l.MaxStepBytes == 0 {
		l.MaxStepBytes = DefaultLimits.MaxStepBytes
	}
	if l.ReplicaTimeout == 0 {
		l.ReplicaTimeout = DefaultLimits.ReplicaTimeout
	}
	if l.PeerWait == 0 {
		l.PeerWait = DefaultLimits.PeerWait
	}
	return l
}

// replicaDeadline is how long a replica of a step of bytes may take.
func (l Limits) replicaDeadline(bytes int64) time.Duration {
	return l.ReplicaTimeout + time.Duration(bytes/replicaRate)*time.Second
}

// SetLimits sets h's limits (zero fields: DefaultLimits'); call it before
// h serves or moves a step.
func (h *Holder) SetLimits(l Limits) { h.lim = l.orDefault() }

// stepCap is the cap in force on one step stream.
func (h *Holder) stepCap() int64 { return max(h.lim.MaxStepBytes, 2*h.ownMax.Load()) }
