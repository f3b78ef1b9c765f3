// Package nccl runs the collectives.Communicator operations on NVIDIA GPUs
// through NCCL, loaded at run time.
//
// Nothing here needs CUDA, NCCL or a C compiler to build: New dlopens
// libnccl.so.2 and the CUDA runtime (libcudart.so, or the soname of CUDA 11,
// 12 or 13) with github.com/ebitengine/purego and calls them without cgo. On
// a machine without them New returns an error wrapping ErrUnavailable that
// names the library that failed to load; nothing panics.
//
// # Usage
//
// Every member of a process group builds its communicator with the same
// Store and Key; rank 0 creates the NCCL unique id and publishes it there,
// the others wait for it:
//
//	cfg := nccl.DefaultConfig()
//	cfg.Rank, cfg.Size, cfg.Device = rank, size, localRank
//	cfg.Store, cfg.Key = store, fmt.Sprintf("bootstrap/%d/dp%d/nccl", gen, group)
//	comm, err := nccl.New(ctx, cfg)
//	if errors.Is(err, nccl.ErrUnavailable) {
//		// fall back to collectives/tcp
//	}
//	defer comm.Close()
//	err = comm.AllReduce(ctx, collectives.Float32s(grads), collectives.Sum)
//
// The collectives.Communicator methods take host memory. Each call copies
// it to device scratch memory that the communicator keeps (it grows to the
// largest buffer seen), runs the NCCL operation on the communicator's own
// CUDA stream, copies the result back, and returns when it is in the
// caller's buffer.
//
// Memory that lives on the GPU avoids both copies. Alloc returns a
// DeviceBuffer (cudaMalloc), CopyFrom and CopyTo fill and read it, and the
// *Device methods run NCCL on it in place:
//
//	grads, err := comm.Alloc(ctx, collectives.Float32, n)
//	defer grads.Free()
//	err = grads.CopyFrom(ctx, collectives.Float32s(host))
//	err = comm.AllReduceDevice(ctx, grads, collectives.Sum)
//
// NewWorld makes the sub-groups of a world Communicator NCCL communicators
// (the engine's TP, PP and DP groups), Devices is a launcher's pre-flight
// check, and PlaceLocal places the ranks of one machine on its GPUs.
//
// # Failures
//
// The communicator is created non-blocking (ncclConfig_t.blocking = 0), and
// every wait polls ncclCommGetAsyncError and cudaStreamQuery instead of
// blocking in cudaStreamSynchronize. When the context ends, Config.Timeout
// passes, Abort is called or NCCL reports an asynchronous error, the
// communicator is aborted with ncclCommAbort and the call returns an error
// wrapping ErrAborted (and the context's error). A failed NCCL call returns
// an *Error carrying ncclGetErrorString and ncclGetLastError, which unwraps
// to a sentinel per ncclResult_t (ErrRemote, ErrInvalidUsage, ...). With
// Config.CheckShapes, mismatched lengths, types, roots or operations across
// ranks return ErrMismatch before any payload moves; the check is made once
// per shape, so it costs nothing once a shape has been agreed on.
//
// # Concurrency
//
// Calls on one Communicator, and on its DeviceBuffers, must not be
// concurrent, except Abort, which may be called from any goroutine. Each call locks its goroutine to an OS thread
// and sets the CUDA device on it first, since the CUDA current device is per
// thread. Communicators of different groups may be used from different
// goroutines at once.
package nccl
