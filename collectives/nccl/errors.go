package nccl

import (
	"errors"
	"fmt"

	"github.com/gpucoord/gpucoord/collectives"
)

// The sentinels below that have a transport-independent meaning wrap the
// matching collectives sentinel, so a caller written against
// collectives.Communicator matches them without knowing the backend:
// ErrMismatch is collectives.ErrMismatch, ErrClosed is collectives.ErrClosed,
// ErrAborted wraps collectives.ErrBroken, ErrRemote collectives.ErrPeerLost,
// ErrTimeout collectives.ErrTimeout, and ErrInvalidArgument and
// ErrUnsupported collectives.ErrInvalid.

// ErrUnavailable means NCCL cannot be used on this machine: libnccl.so.2 or
// libcudart could not be loaded, lacks a symbol this package calls, is older
// than NCCL 2.14, or no CUDA device is present. The wrapping error names the
// library and the reason.
var ErrUnavailable = errors.New("nccl: NCCL is not available")

// ErrClosed is returned by calls on a Communicator after Close.
var ErrClosed = collectives.ErrClosed

// ErrAborted means an operation did not complete (its context ended, or NCCL
// or CUDA reported an asynchronous error) and the communicator was aborted
// with ncclCommAbort. The communicator cannot be used again: build a new one,
// typically for the next generation.
var ErrAborted = fmt.Errorf("nccl: communicator aborted: %w", collectives.ErrBroken)

// ErrMismatch means the members of the group called the same collective with
// different element counts, types, roots or operations, or a Send was paired
// with a Recv of another length. It is detected before any data moves
// (Config.CheckShapes), so no buffer was corrupted; the error is a
// *collectives.PeerError naming the first rank that disagreed.
var ErrMismatch = collectives.ErrMismatch

// ErrUnsupported means the call asked for a data type or reduction that this
// package does not map to NCCL.
var ErrUnsupported = fmt.Errorf("nccl: unsupported data type or operation: %w", collectives.ErrInvalid)

// ErrCUDA wraps a failed CUDA runtime call (cudaMalloc, cudaMemcpyAsync,
// cudaStreamQuery, ...); the message carries cudaGetErrorString's text.
var ErrCUDA = errors.New("nccl: CUDA runtime error")

// Sentinels for the ncclResult_t codes of nccl.h (NCCL 2.14 and later). An
// *Error from a failed NCCL call unwraps to one of them.
var (
	// ErrUnhandledCUDA is ncclUnhandledCudaError (1): a CUDA call inside NCCL failed.
	ErrUnhandledCUDA = errors.New("nccl: unhandled CUDA error")
	// ErrSystem is ncclSystemError (2): a system call (socket, malloc, ...) failed.
	ErrSystem = errors.New("nccl: system error")
	// ErrInternal is ncclInternalError (3): an NCCL bug or corrupted state.
	ErrInternal = errors.New("nccl: internal error")
	// ErrInvalidArgument is ncclInvalidArgument (4); this package also uses it
	// for arguments it rejects before calling NCCL (bad peer, root or length).
	ErrInvalidArgument = fmt.Errorf("nccl: invalid argument: %w", collectives.ErrInvalid)
	// ErrInvalidUsage is ncclInvalidUsage (5): calls made in a wrong order or state.
	ErrInvalidUsage = errors.New("nccl: invalid usage")
	// ErrRemote is ncclRemoteError (6): a peer exited or the network failed.
	ErrRemote = fmt.Errorf("nccl: remote process exited or network error: %w", collectives.ErrPeerLost)
	// ErrTimeout is ncclTimeout (8, NCCL 2.23 and later); this package also
	// uses it when Config.Timeout passes.
	ErrTimeout = fmt.Errorf("nccl: timeout: %w", collectives.ErrTimeout)
)

// ncclResult_t values from nccl.h.
const (
	resSuccess          = 0
	resUnhandledCUDA    = 1
	resSystemError      = 2
	resInternalError    = 3
	resInvalidArgument  = 4
	resInvalidUsage     = 5
	resRemoteError      = 6
	resInProgress       = 7
	resTimeout          = 8
	cudaSuccess         = 0
	cudaErrorNotReady   = 600 // cudaStreamQuery: work still pending (CUDA >= 10)
	cudaMemcpyHostToDev = 1   // cudaMemcpyKind
	cudaMemcpyDevToHost = 2   // cudaMemcpyKind
)

// resultSentinel maps an ncclResult_t to its sentinel; unknown codes map to
// ErrInternal so that an error is never lost.
func resultSentinel(code int32) error {
	switch code {
	case resUnhandledCUDA:
		return ErrUnhandledCUDA
	case resSystemError:
		return ErrSystem
	case resInternalError:
		return ErrInternal
	case resInvalidArgument:
		return ErrInvalidArgument
	case resInvalidUsage:
		return ErrInvalidUsage
	case resRemoteError:
		return ErrRemote
	case resTimeout:
		return ErrTimeout
	}
	return ErrInternal
}

// Error is a failed NCCL call. It unwraps to the sentinel of its Code, so
// callers match with errors.Is(err, nccl.ErrRemote) and the like.
type Error struct {
	// Func is the NCCL function that failed, e.g. "ncclAllReduce".
	Func string
	// Code is the ncclResult_t it returned.
	Code int32
	// Text is ncclGetErrorString(Code).
	Text string
	// Detail is ncclGetLastError(comm): NCCL's own description of the last
	// failure, often naming the peer or the system call. It may be empty.
	Detail string
}

// Error implements error.
func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (ncclResult_t %d)", e.Func, e.Text, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the sentinel for Code.
func (e *Error) Unwrap() error { return resultSentinel(e.Code) }
