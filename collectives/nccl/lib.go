package nccl

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// minVersion is the oldest NCCL this package drives: 2.14 brought
// ncclCommInitRankConfig with non-blocking communicators (what lets a
// cancelled context abort a hung init) and ncclCommFinalize.
const minVersion = 21400

// uniqueID is ncclUniqueId: a struct of 128 chars, passed by value to
// ncclCommInitRankConfig (on amd64 it goes on the stack, 16 eightbytes).
type uniqueID struct {
	internal [UniqueIDBytes]byte
}

// commConfig is the prefix of ncclConfig_t that NCCL 2.14 defined. NCCL reads
// size first and copies only that many bytes, so a newer library treats this
// as a config from a 2.14 header and leaves the later fields at their
// defaults.
type commConfig struct {
	size           uintptr
	magic          uint32
	version        uint32
	blocking       int32
	cgaClusterSize int32
	minCTAs        int32
	maxCTAs        int32
	_              uintptr // netName: unused, kept for the C layout
}

const (
	configMagic   = 0xcafebeef // NCCL_API_MAGIC
	configVersion = 21400      // NCCL_VERSION(2,14,0): the layout of commConfig
	configUndef   = -2147483648
)

// library holds the loaded NCCL and CUDA runtime and the addresses of the
// functions this package calls. A library is never unloaded: NCCL keeps
// threads and the CUDA context alive for the life of the process.
type library struct {
	ncclPath, cudartPath string
	version              int

	// NCCL.
	getUniqueID, getErrorString, getLastError      uintptr
	commDestroy, commAbort, commGetAsyncError      uintptr
	allReduce, reduceScatter, allGather, broadcast uintptr
	send, recv, groupStart, groupEnd               uintptr
	commInitRankConfig                             func(comm *uintptr, nranks int32, id uniqueID, rank int32, cfg *commConfig) int32

	// CUDA runtime.
	cudaSetDevice, cudaGetDeviceCount, cudaGetErrorString       uintptr
	cudaStreamCreateWithFlags, cudaStreamDestroy, cudaStreamQry uintptr
	cudaMalloc, cudaFree, cudaMemcpyAsync                       uintptr
}

// symbol is one function to resolve with dlsym.
type symbol struct {
	handle uintptr
	lib    string
	name   string
	dst    *uintptr
}

var (
	libMu    sync.Mutex
	libCache = map[string]*library{}
)

// loadLibrary dlopens NCCL and the CUDA runtime named by cfg once per
// process and resolves every symbol. Every failure wraps ErrUnavailable and
// names the library; nothing panics.
func loadLibrary(ncclPath string, cudartPaths []string) (*library, error) {
	key := ncclPath + "\x00" + strings.Join(cudartPaths, "\x00")
	libMu.Lock()
	defer libMu.Unlock()
	if l, ok := libCache[key]; ok {
		return l, nil
	}
	l := &library{ncclPath: ncclPath}

	// The CUDA runtime first: libnccl.so.2 needs a CUDA driver but links its
	// runtime statically, so a machine may have one without the other.
	var cudart uintptr
	var tried []string
	for _, p := range cudartPaths {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			cudart, l.cudartPath = h, p
			break
		}
		tried = append(tried, err.Error())
	}
	if cudart == 0 {
		return nil, fmt.Errorf("%w: cannot load the CUDA runtime (tried %s): %s",
			ErrUnavailable, strings.Join(cudartPaths, ", "), strings.Join(tried, "; "))
	}
	h, err := purego.Dlopen(ncclPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load %s: %v", ErrUnavailable, ncclPath, err)
	}

	var getVersion, initRankConfig uintptr
	syms := []symbol{
		{cudart, l.cudartPath, "cudaSetDevice", &l.cudaSetDevice},
		{cudart, l.cudartPath, "cudaGetDeviceCount", &l.cudaGetDeviceCount},
		{cudart, l.cudartPath, "cudaGetErrorString", &l.cudaGetErrorString},
		{cudart, l.cudartPath, "cudaStreamCreateWithFlags", &l.cudaStreamCreateWithFlags},
		{cudart, l.cudartPath, "cudaStreamDestroy", &l.cudaStreamDestroy},
		{cudart, l.cudartPath, "cudaStreamQuery", &l.cudaStreamQry},
		{cudart, l.cudartPath, "cudaMalloc", &l.cudaMalloc},
		{cudart, l.cudartPath, "cudaFree", &l.cudaFree},
		{cudart, l.cudartPath, "cudaMemcpyAsync", &l.cudaMemcpyAsync},
		{h, ncclPath, "ncclGetVersion", &getVersion},
		{h, ncclPath, "ncclCommInitRankConfig", &initRankConfig},
		{h, ncclPath, "ncclGetUniqueId", &l.getUniqueID},
		{h, ncclPath, "ncclGetErrorString", &l.getErrorString},
		{h, ncclPath, "ncclGetLastError", &l.getLastError},
		{h, ncclPath, "ncclCommDestroy", &l.commDestroy},
		{h, ncclPath, "ncclCommAbort", &l.commAbort},
		{h, ncclPath, "ncclCommGetAsyncError", &l.commGetAsyncError},
		{h, ncclPath, "ncclAllReduce", &l.allReduce},
		{h, ncclPath, "ncclReduceScatter", &l.reduceScatter},
		{h, ncclPath, "ncclAllGather", &l.allGather},
		{h, ncclPath, "ncclBroadcast", &l.broadcast},
		{h, ncclPath, "ncclSend", &l.send},
		{h, ncclPath, "ncclRecv", &l.recv},
		{h, ncclPath, "ncclGroupStart", &l.groupStart},
		{h, ncclPath, "ncclGroupEnd", &l.groupEnd},
	}
	for _, s := range syms {
		p, err := purego.Dlsym(s.handle, s.name)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("%w: %s has no symbol %s (NCCL >= 2.14 and a CUDA runtime are required)",
				ErrUnavailable, s.lib, s.name)
		}
		*s.dst = p
	}

	var v int32
	if r, _, _ := purego.SyscallN(getVersion, uintptr(unsafe.Pointer(&v))); int32(r) != resSuccess {
		return nil, fmt.Errorf("%w: %s: ncclGetVersion returned %d", ErrUnavailable, ncclPath, int32(r))
	}
	l.version = int(v)
	if l.version < minVersion {
		return nil, fmt.Errorf("%w: %s is NCCL %s; 2.14.0 or later is required",
			ErrUnavailable, ncclPath, versionString(l.version))
	}
	purego.RegisterFunc(&l.commInitRankConfig, initRankConfig)
	libCache[key] = l
	return l, nil
}

// versionString decodes NCCL_VERSION_CODE: X*1000+Y*100+Z up to 2.8, and
// X*10000+Y*100+Z from 2.9 on.
func versionString(code int) string {
	if code < 10000 {
		return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
}

// call invokes a C function returning an enum (ncclResult_t or cudaError_t);
// only the low 32 bits of the return register are defined.
//
// Callers pass out-parameters as uintptr(unsafe.Pointer(&local)). Without
// the uintptrescapes directive (which purego.SyscallN has, but only for conversions
// written in its own call) such a local could stay on the goroutine's
// stack, which may move while the call is set up: the C function would
// then write into the old copy (seen as cudaGetDeviceCount "finding" 0
// devices under load). The directive moves every such pointee to the heap.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// goString copies a NUL-terminated C string.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := cptr(p)
	n := 0
	for *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(base), n))
}

// cptr turns an address returned by C into a pointer. It reinterprets the
// word instead of converting it, which is what C memory (outside the Go
// heap, never moved) allows and what go vet's unsafeptr check accepts.
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// ncclError builds the *Error for a failed NCCL call.
func (l *library) ncclError(fn string, code int32, comm uintptr) error {
	r, _, _ := purego.SyscallN(l.getErrorString, uintptr(code))
	e := &Error{Func: fn, Code: code, Text: goString(r)}
	d, _, _ := purego.SyscallN(l.getLastError, comm)
	e.Detail = goString(d)
	return e
}

// devices returns the number of visible CUDA devices; none, or a failing
// cudaGetDeviceCount (no driver, say), is ErrUnavailable.
func (l *library) devices() (int, error) {
	var n int32
	if r := call(l.cudaGetDeviceCount, uintptr(unsafe.Pointer(&n))); r != cudaSuccess {
		return 0, fmt.Errorf("%w: no usable CUDA device: %w", ErrUnavailable, l.cudaError("cudaGetDeviceCount", r))
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: cudaGetDeviceCount found no CUDA device", ErrUnavailable)
	}
	return int(n), nil
}

// cudaError builds the error for a failed CUDA runtime call.
func (l *library) cudaError(fn string, code int32) error {
	r, _, _ := purego.SyscallN(l.cudaGetErrorString, uintptr(code))
	return fmt.Errorf("%w: %s: %s (cudaError_t %d)", ErrCUDA, fn, goString(r), code)
}
