package schedule

import (
	"fmt"
	"strings"
)

// OpKind is what one Op does.
type OpKind uint8

// The op kinds. Compute ops (Forward, Backward, WeightGrad) take time in the
// simulator; communication ops and OptimizerStep are instantaneous markers.
const (
	// Forward runs the forward pass of (MicroBatch, Chunk) and keeps its
	// activations until the matching Backward.
	Forward OpKind = iota + 1
	// Backward computes the gradient with respect to the chunk's input. When
	// the schedule does not split the backward pass it also computes the
	// weight gradient.
	Backward
	// WeightGrad computes the weight gradient of (MicroBatch, Chunk). Only
	// schedules whose Kind.SplitBackward is true have it.
	WeightGrad
	// SendAct sends the output activation of (MicroBatch, Chunk) to Peer,
	// where it is the input of PeerChunk.
	SendAct
	// RecvAct receives the input activation of (MicroBatch, Chunk) from Peer,
	// where it is the output of PeerChunk.
	RecvAct
	// SendGrad sends the input gradient of (MicroBatch, Chunk) to Peer, where
	// it is the output gradient of PeerChunk.
	SendGrad
	// RecvGrad receives the output gradient of (MicroBatch, Chunk) from Peer,
	// where it is the input gradient of PeerChunk.
	RecvGrad
	// OptimizerStep applies the accumulated gradients of every chunk on the
	// rank. It is the last op of every rank; MicroBatch and Chunk are -1.
	OptimizerStep
)

var opKindNames = [...]string{
	Forward:       "Forward",
	Backward:      "Backward",
	WeightGrad:    "WeightGrad",
	SendAct:       "SendAct",
	RecvAct:       "RecvAct",
	SendGrad:      "SendGrad",
	RecvGrad:      "RecvGrad",
	OptimizerStep: "OptimizerStep",
}

// String returns the op kind's name, e.g. "Forward".
func (k OpKind) String() string {
	if k >= Forward && k <= OptimizerStep {
		return opKindNames[k]
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// IsCompute reports whether k is Forward, Backward or WeightGrad.
func (k OpKind) IsCompute() bool { return k >= Forward && k <= WeightGrad }

// IsSend reports whether k is SendAct or SendGrad.
func (k OpKind) IsSend() bool { return k == SendAct || k == SendGrad }

// IsRecv reports whether k is RecvAct or RecvGrad.
func (k OpKind) IsRecv() bool { return k == RecvAct || k == RecvGrad }

// Op is one step of a pipeline rank's program.
//
// Chunk is the model chunk on this rank (0..Virtual-1); the chunk's global
// virtual stage is Chunk*Stages + rank (Megatron-LM's layout: rank r holds
// virtual stages r, r+p, r+2p, ...). Peer and PeerChunk name the other side of
// a send or receive and are -1 for every other op.
type Op struct {
	Kind       OpKind
	MicroBatch int
	Chunk      int
	Peer       int
	PeerChunk  int
}

// String formats the op for logs and errors, e.g. "F(mb=3,c=0)" or
// "SendAct(mb=3,c=0 -> rank 2 c=0)".
func (o Op) String() string {
	switch {
	case o.Kind == Forward:
		return fmt.Sprintf("F(mb=%d,c=%d)", o.MicroBatch, o.Chunk)
	case o.Kind == Backward:
		return fmt.Sprintf("B(mb=%d,c=%d)", o.MicroBatch, o.Chunk)
	case o.Kind == WeightGrad:
		return fmt.Sprintf("W(mb=%d,c=%d)", o.MicroBatch, o.Chunk)
	case o.Kind.IsSend():
		return fmt.Sprintf("%s(mb=%d,c=%d -> rank %d c=%d)", o.Kind, o.MicroBatch, o.Chunk, o.Peer, o.PeerChunk)
	case o.Kind.IsRecv():
		return fmt.Sprintf("%s(mb=%d,c=%d <- rank %d c=%d)", o.Kind, o.MicroBatch, o.Chunk, o.Peer, o.PeerChunk)
	case o.Kind == OptimizerStep:
		return "OptimizerStep"
	}
	return fmt.Sprintf("%s(mb=%d,c=%d,peer=%d,peerChunk=%d)", o.Kind, o.MicroBatch, o.Chunk, o.Peer, o.PeerChunk)
}

// String formats the op lists, one line per rank: "rank r: op op ...".
func (s *Schedule) String() string {
	var sb strings.Builder
	for r, ops := range s.Ranks {
		fmt.Fprintf(&sb, "rank %d:", r)
		for _, op := range ops {
			sb.WriteByte(' ')
			sb.WriteString(op.String())
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}
