// Package bench times collectives like nccl-tests: for each size, warm-up,
// a correctness check, then samples of back-to-back operations, each sample
// timed on every rank and the slowest rank kept, and the median reported
// with algbw (bytes / time) and busbw (algbw times the operation's bus
// factor, 2(n-1)/n for all-reduce). The timing protocol is the one of the
// peer baselines it is compared with (PyTorch gloo and OpenMPI, run side by
// side as docs/BENCHMARKS.md describes), so figures compare directly.
//
// # Usage
//
// Run starts Config.NP ranks, as goroutines (InProc, or the inmem backend)
// or as child processes joined over TCP on 127.0.0.1 or shared memory
// (Backend "shm") through a store it serves. A child is
// Config.WorkerCommand with the rank's settings in the environment variable
// WorkerEnv; the child calls RunWorker. `gpucoord bench` is the
// command-line front end.
//
// Backend "nccl" is the pre-flight check of a GPU machine: each rank times
// the operation with NCCL on device memory (collectives/nccl DeviceBuffers:
// no staging, no host copy inside the timed loop), and checks the result of
// one call per size on the host. Run first counts the GPUs (nccl.Devices)
// and returns nccl.ErrUnavailable, starting nothing, where NCCL, the CUDA
// runtime or a GPU is missing. Rank r runs on GPU r mod GPUs, in a process
// whose NCCL_HOSTID is its own where it shares a GPU (nccl.PlaceLocal), so
// several ranks can share one GPU.
//
// Every rank allocates its buffers for the size it times, so a sweep to
// large sizes on many ranks can take most of the machine's memory.
// Config.MemoryNeeded estimates the peak; before Run, the front end calls
// Config.CheckMemory with MemAvailable and refuses a run that needs more
// than MaxMemoryFraction of it.
//
// It lives under internal/ because it is an application, not an API: the
// collectives it times are in gpucoord/collectives.
package bench
