package collectives

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by a Communicator wrap one of these; match
// them with errors.Is. Errors caused by one peer are also a *PeerError, which
// names the peer.
var (
	// ErrInvalid reports a bad argument: an unknown DType or Op, a buffer of
	// the wrong length, a rank out of range.
	ErrInvalid = errors.New("collectives: invalid argument")
	// ErrMismatch reports that members of a group disagreed on an operation:
	// a different operation, element type, reduction, root or buffer length.
	ErrMismatch = errors.New("collectives: mismatched operation across ranks")
	// ErrPeerLost reports that the connection to a peer broke (the process
	// died, or the link was closed).
	ErrPeerLost = errors.New("collectives: peer lost")
	// ErrTimeout reports that a peer sent nothing for the configured timeout.
	ErrTimeout = errors.New("collectives: peer timed out")
	// ErrUnreachable reports a send over a link that does not exist or is
	// partitioned.
	ErrUnreachable = errors.New("collectives: peer unreachable")
	// ErrAborted reports that another member failed the operation and told
	// the group so.
	ErrAborted = errors.New("collectives: aborted by a peer")
	// ErrBroken reports a call on a Communicator that an earlier error left
	// unusable; build a new one (a new generation).
	ErrBroken = errors.New("collectives: communicator broken by an earlier error")
	// ErrClosed reports a call on a closed Communicator or Transport.
	ErrClosed = errors.New("collectives: closed")
	// ErrNotMember reports a sub-group that does not contain the caller.
	ErrNotMember = errors.New("collectives: caller is not a member of the group")
)

// PeerError is an operation that failed because of one peer. Err wraps
// ErrPeerLost, ErrTimeout, ErrMismatch, ErrUnreachable or ErrAborted.
type PeerError struct {
	// Op names the operation, e.g. "allreduce".
	Op string
	// Peer is the peer's rank in the group.
	Peer int
	// World is the peer's rank in the transport's world.
	World int
	// Err is the cause.
	Err error
}

// Error implements error.
func (e *PeerError) Error() string {
	return fmt.Sprintf("collectives: %s: peer rank %d (world rank %d): %v", e.Op, e.Peer, e.World, e.Err)
}

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// abortCode says why a member aborted; it travels in an abort frame.
type abortCode uint32

const (
	abortOther abortCode = iota
	abortMismatch
	abortTimeout
	abortPeerLost
	abortCanceled
	abortUnreachable
	abortRelayed
)

func codeOf(err error) abortCode {
	switch {
	case errors.Is(err, ErrAborted):
		return abortRelayed
	case errors.Is(err, ErrMismatch):
		return abortMismatch
	case errors.Is(err, ErrTimeout):
		return abortTimeout
	case errors.Is(err, ErrPeerLost):
		return abortPeerLost
	case errors.Is(err, ErrUnreachable):
		return abortUnreachable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return abortCanceled
	}
	return abortOther
}

func (c abortCode) String() string {
	switch c {
	case abortMismatch:
		return "mismatched operation"
	case abortTimeout:
		return "peer timed out"
	case abortPeerLost:
		return "peer lost"
	case abortCanceled:
		return "context canceled"
	case abortUnreachable:
		return "peer unreachable"
	case abortRelayed:
		return "relaying an abort"
	}
	return "error"
}
