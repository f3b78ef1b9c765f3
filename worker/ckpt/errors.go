package ckpt

import "errors"

// ErrTooLarge is a step stream longer than the receiver's cap
// (Limits.MaxStepBytes, or twice the largest step of this node's own): it
// is refused where the cap is crossed, at a file's header or in its bytes.
var ErrTooLarge = errors.New("ckpt: step larger than the cap")

// ErrWrongPeer is a peer whose certificate names another node than the one
// a replica is sent to or fetched from.
var ErrWrongPeer = errors.New("ckpt: the peer is another node")

// ErrNotWhole is a step of this node's own that is not sealed (Seal): its
// ranks have not all written it, or it was never stored.
var ErrNotWhole = errors.New("ckpt: the step is not whole here")
