package collectives

import (
	"context"
	"unsafe"
)

// DType is the element type of a Buffer.
type DType uint8

// Element types a Buffer may hold.
const (
	Float32  DType = iota + 1 // IEEE 754 binary32
	Float64                   // IEEE 754 binary64
	BFloat16                  // bfloat16 stored as uint16 (top half of a float32)
)

// Size returns the width of one element in bytes.
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Float64:
		return 8
	case BFloat16:
		return 2
	}
	return 0
}

// Op is a reduction operator.
type Op uint8

// Reduction operators.
const (
	Sum Op = iota + 1
	Max
	Min
)

// Buffer is a typed view of caller-owned memory. It is a small value: passing
// it does not allocate, and the collective reads and writes the caller's slice
// in place.
type Buffer struct {
	dtype DType
	data  []byte
}

// Float32s views s as a Buffer.
func Float32s(s []float32) Buffer {
	return Buffer{dtype: Float32, data: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*4)}
}

// Float64s views s as a Buffer.
func Float64s(s []float64) Buffer {
	return Buffer{dtype: Float64, data: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*8)}
}

// BFloat16s views s, bfloat16 values stored as uint16, as a Buffer.
func BFloat16s(s []uint16) Buffer {
	return Buffer{dtype: BFloat16, data: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*2)}
}

// DType returns the element type.
func (b Buffer) DType() DType { return b.dtype }

// Len returns the number of elements.
func (b Buffer) Len() int {
	if b.dtype == 0 {
		return 0
	}
	return len(b.data) / b.dtype.Size()
}

// Bytes returns the underlying memory. It aliases the caller's slice.
func (b Buffer) Bytes() []byte { return b.data }

// Slice returns elements [lo, hi) as a Buffer sharing memory with b.
func (b Buffer) Slice(lo, hi int) Buffer {
	w := b.dtype.Size()
	return Buffer{dtype: b.dtype, data: b.data[lo*w : hi*w]}
}

// Communicator is one process group as seen by one of its members: ranks are
// group ranks, 0..Size()-1.
//
// Every member calls the same collectives in the same order with buffers of
// the same length and type; a mismatch is reported as an error wrapping
// ErrMismatch, not silently corrupted. Calls on one Communicator must not be
// concurrent; different Communicators (sub-groups) may be used from different
// goroutines at once without their messages mixing. Every call honours ctx:
// a dead peer or a cancelled context ends it with an error naming the peer.
type Communicator interface {
	// Rank returns this member's rank in the group.
	Rank() int
	// Size returns the number of members.
	Size() int
	// AllReduce reduces buf element-wise across the group with op and leaves
	// the identical result in buf on every member.
	AllReduce(ctx context.Context, buf Buffer, op Op) error
	// ReduceScatter reduces send (Size()*recv.Len() elements) across the group
	// and leaves block Rank() of the result in recv.
	ReduceScatter(ctx context.Context, send, recv Buffer, op Op) error
	// AllGather concatenates every member's send, in rank order, into recv
	// (Size()*send.Len() elements).
	AllGather(ctx context.Context, send, recv Buffer) error
	// Broadcast copies root's buf into buf on every member.
	Broadcast(ctx context.Context, buf Buffer, root int) error
	// Send sends buf to peer; it pairs with the peer's Recv.
	Send(ctx context.Context, buf Buffer, peer int) error
	// Recv receives into buf from peer; it pairs with the peer's Send.
	Recv(ctx context.Context, buf Buffer, peer int) error
	// Barrier returns once every member has entered it.
	Barrier(ctx context.Context) error
}
