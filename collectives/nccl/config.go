package nccl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

// Environment variables read by DefaultConfig to point the loader at a
// specific library, e.g. a wheel's nvidia/nccl/lib/libnccl.so.2.
const (
	EnvNCCLLibrary   = "GPUCOORD_NCCL_LIBRARY"
	EnvCUDARTLibrary = "GPUCOORD_CUDART_LIBRARY"
)

// UniqueIDBytes is the size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
const UniqueIDBytes = 128

// Store is the bootstrap store through which rank 0 hands the NCCL unique id
// to the other ranks: the same rendezvous store the TCP transport uses, in
// production the coordinator's jobs/<id>/bootstrap/<gen>/<group> keys.
//
// Set stores val under key. Get blocks until key exists and returns its
// value, or returns ctx's error when ctx ends first. Both may be called from
// several goroutines at once; the Communicator does not keep val.
type Store interface {
	Set(ctx context.Context, key string, val []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}

// Config configures one NCCL communicator. Start from DefaultConfig and set
// Rank, Size, Store and Key.
type Config struct {
	// NCCLLibrary is the file name or path passed to dlopen for NCCL.
	NCCLLibrary string
	// CUDARTLibraries are tried in order with dlopen until one loads; the
	// default covers the unversioned development link and the sonames of
	// CUDA 11, 12 and 13 runtimes.
	CUDARTLibraries []string
	// Rank is this member's rank in the group, 0..Size-1.
	Rank int
	// Size is the number of members in the group.
	Size int
	// Device is the CUDA device ordinal this rank uses (one rank per device).
	Device int
	// Store carries the unique id from rank 0 to the others.
	Store Store
	// Key is the Store key of this group's unique id. It must be new for every
	// communicator (include the generation and the group), because rank 0
	// writes a fresh id under it.
	Key string
	// Timeout bounds every operation, including the communicator's creation;
	// when it passes, the communicator is aborted and the call returns an
	// error wrapping ErrAborted and context.DeadlineExceeded. Zero means only
	// the caller's context bounds calls.
	Timeout time.Duration
	// CheckShapes makes a collective first exchange a 24-byte descriptor
	// (operation, type, count, root) with all members, and a Send/Recv with
	// its peer, so that a mismatch is reported as ErrMismatch instead of
	// hanging or corrupting memory inside NCCL. The exchange is one small
	// extra NCCL operation, made the first time this communicator runs a
	// shape: once every member has agreed on it, later calls of that shape
	// skip it. A member that calls a shape already agreed on while another
	// calls a different one is therefore not caught; CheckEveryCall catches
	// that too.
	CheckShapes bool
	// CheckEveryCall, with CheckShapes, exchanges the descriptor on every
	// call instead of once per shape: one extra NCCL operation per call, for
	// debugging a suspected mismatch.
	CheckEveryCall bool
	// PollInterval is the longest sleep between two polls of the stream and
	// of ncclCommGetAsyncError while waiting for an operation. Polls start
	// back to back and back off to this value.
	PollInterval time.Duration
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults: the system's libnccl.so.2 and
// libcudart (or the paths in GPUCOORD_NCCL_LIBRARY and
// GPUCOORD_CUDART_LIBRARY), device 0, a 5 minute operation timeout, shape
// checks on and a 200µs poll ceiling.
func DefaultConfig() *Config {
	c := &Config{
		NCCLLibrary:     "libnccl.so.2",
		CUDARTLibraries: []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"},
		Size:            1,
		Timeout:         5 * time.Minute,
		CheckShapes:     true,
		PollInterval:    200 * time.Microsecond,
	}
	if p := os.Getenv(EnvNCCLLibrary); p != "" {
		c.NCCLLibrary = p
	}
	if p := os.Getenv(EnvCUDARTLibrary); p != "" {
		c.CUDARTLibraries = strings.Split(p, ":")
	}
	return c
}

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.NCCLLibrary == "":
		return errors.New("nccl: NCCLLibrary is empty")
	case len(c.CUDARTLibraries) == 0:
		return errors.New("nccl: CUDARTLibraries is empty")
	case c.Size < 1:
		return fmt.Errorf("nccl: Size %d must be at least 1", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("nccl: Rank %d is outside 0..%d", c.Rank, c.Size-1)
	case c.Device < 0:
		return fmt.Errorf("nccl: Device %d is negative", c.Device)
	case c.Store == nil && c.Size > 1:
		return errors.New("nccl: Store is nil; ranks other than 0 need it to receive the unique id")
	case c.Key == "" && c.Size > 1:
		return errors.New("nccl: Key is empty; it names the unique id in the Store")
	case c.Timeout < 0:
		return fmt.Errorf("nccl: Timeout %s is negative", c.Timeout)
	case c.PollInterval <= 0:
		return fmt.Errorf("nccl: PollInterval %s must be positive", c.PollInterval)
	}
	for i, p := range c.CUDARTLibraries {
		if p == "" {
			return fmt.Errorf("nccl: CUDARTLibraries[%d] is empty", i)
		}
	}
	return nil
}
