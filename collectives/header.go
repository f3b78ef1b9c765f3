package collectives

import (
	"encoding/binary"
	"fmt"
)

// Kind names the operation a frame belongs to.
type Kind uint8

// Frame kinds.
const (
	KindSend          Kind = iota + 1 // point-to-point Send/Recv
	KindAllReduce                     // AllReduce
	KindReduceScatter                 // ReduceScatter
	KindAllGather                     // AllGather
	KindBroadcast                     // Broadcast
	KindBarrier                       // Barrier
	KindAbort                         // a member failed the operation; Arg says why
	kindEnd
)

var kindNames = [...]string{"?", "send", "allreduce", "reducescatter", "allgather", "broadcast", "barrier", "abort"}

// String returns the operation's name.
func (k Kind) String() string {
	if k < kindEnd {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// HeaderSize is the encoded size of a Header in bytes.
const HeaderSize = 32

// Header describes one frame. Every frame of an operation carries the whole
// operation's description, so a receiver detects a peer that called a
// different operation, type, reduction, root or length, and reports it
// instead of corrupting memory.
type Header struct {
	// Tag identifies the group; frames of different groups never match.
	Tag uint64
	// Seq numbers the group's collectives (or, for KindSend, the messages
	// between one ordered pair of members).
	Seq uint32
	// Len is the frame's payload length in bytes.
	Len uint32
	// Total is the length in bytes of the sender's whole buffer.
	Total uint64
	// Kind is the operation.
	Kind Kind
	// DType is the element type.
	DType DType
	// Op is the reduction, where there is one.
	Op Op
	// Arg is the broadcast root, or the reason code of an abort.
	Arg uint32
}

// Put encodes h into b[:HeaderSize].
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.Tag)
	binary.LittleEndian.PutUint32(b[8:], h.Seq)
	binary.LittleEndian.PutUint32(b[12:], h.Len)
	binary.LittleEndian.PutUint64(b[16:], h.Total)
	b[24] = byte(h.Kind)
	b[25] = byte(h.DType)
	b[26] = byte(h.Op)
	b[27] = 0
	binary.LittleEndian.PutUint32(b[28:], h.Arg)
}

// Parse decodes b[:HeaderSize] into h. It rejects a frame whose kind,
// element type or reduction is unknown, so a corrupt or foreign stream is
// reported rather than trusted.
func (h *Header) Parse(b []byte) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: short frame header (%d bytes)", ErrInvalid, len(b))
	}
	h.Tag = binary.LittleEndian.Uint64(b[0:])
	h.Seq = binary.LittleEndian.Uint32(b[8:])
	h.Len = binary.LittleEndian.Uint32(b[12:])
	h.Total = binary.LittleEndian.Uint64(b[16:])
	h.Kind = Kind(b[24])
	h.DType = DType(b[25])
	h.Op = Op(b[26])
	h.Arg = binary.LittleEndian.Uint32(b[28:])
	switch {
	case h.Kind == 0 || h.Kind >= kindEnd || b[27] != 0:
		return fmt.Errorf("%w: bad frame kind %d", ErrInvalid, b[24])
	case h.DType != 0 && h.DType.Size() == 0:
		return fmt.Errorf("%w: bad frame element type %d", ErrInvalid, b[25])
	case h.Op > Min:
		return fmt.Errorf("%w: bad frame reduction %d", ErrInvalid, b[26])
	}
	return nil
}

// p2p reports whether the frame belongs to point-to-point traffic, which is
// matched apart from the group's collectives.
func (h *Header) p2p() bool { return h.Kind == KindSend }

// check compares an arriving frame with the one a receiver expects and
// describes the first difference.
func (want *Header) check(got *Header) error {
	if got.Kind == want.Kind && got.Seq == want.Seq && got.Len == want.Len && got.Total == want.Total &&
		got.DType == want.DType && got.Op == want.Op && got.Arg == want.Arg {
		return nil
	}
	return fmt.Errorf("%w: peer sent %s, this rank expected %s", ErrMismatch, got.describe(), want.describe())
}

func (h *Header) describe() string {
	s := fmt.Sprintf("%s #%d of %d bytes", h.Kind, h.Seq, h.Total)
	if h.DType != 0 {
		s += " " + h.DType.String()
	}
	if h.Op != 0 {
		s += " " + h.Op.String()
	}
	if h.Kind == KindBroadcast {
		s += fmt.Sprintf(" root %d", h.Arg)
	}
	return s + fmt.Sprintf(" (frame %d bytes)", h.Len)
}
