// Package nccltest builds and drives the fake CUDA runtime and NCCL that the
// tests of collectives/nccl, and of the packages that use it, run against on
// machines without a GPU.
//
// The fakes (testdata/*.c, compiled with gcc into libcudart.so and
// libnccl.so.2) run every call on the CPU, for several ranks of one process:
//
//   - Device memory is host memory, but the fake runtime knows which blocks
//     cudaMalloc handed out. cudaMemcpyAsync, cudaFree and every NCCL call
//     refuse addresses outside them, as a GPU would fault on them, and
//     cudaFree refuses a second free.
//   - A stream is a queue of deferred host work that advances when it is
//     queried, so ordering mistakes still show.
//   - A collective completes once every rank's stream has reached it;
//     point-to-point operations match in order per pair. Ranks are the
//     goroutines of one process: the fakes cannot join ranks of different
//     processes.
//   - Every call is recorded with its arguments (Records), and errors can be
//     injected (Inject).
//
// # Usage
//
// Build once per test binary, then point the nccl package at the libraries,
// either through nccl.Config or through the environment variables that
// nccl.DefaultConfig reads:
//
//	f, err := nccltest.Build(dir)
//	if errors.Is(err, nccltest.ErrNoCompiler) {
//		t.Skip(err)
//	}
//	t.Setenv(nccl.EnvNCCLLibrary, f.NCCL)
//	t.Setenv(nccl.EnvCUDARTLibrary, f.CUDART)
//	f.Reset()
//	f.CheckLeaks(t)
//
// # Concurrency
//
// A Fake's methods may be called from any goroutine. The log and the
// injections are process-wide: tests that use them must not run in
// parallel.
package nccltest

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
)

//go:embed testdata/*.c testdata/*.h
var sources embed.FS

// ErrNoCompiler is returned by Build where gcc is not installed; tests skip.
var ErrNoCompiler = errors.New("nccltest: gcc not found; the fake NCCL cannot be built")

// Fake is the built and loaded pair of fake libraries.
type Fake struct {
	// NCCL is the path of the fake libnccl.so.2.
	NCCL string
	// CUDART is the path of the fake libcudart.so.
	CUDART string

	logLen      func() int32
	logGet      func(i int32, out *Rec) int32
	reset       func()
	injectSet   func(fn string, code, skip int32)
	setDevices  func(n int32)
	setVersion  func(v int32)
	liveAllocs  func() int64
	liveStreams func() int64
}

var (
	mu     sync.Mutex
	loaded *Fake
)

// Build compiles the fakes into dir and loads them. The libraries are loaded
// once per process and never unloaded: a later call returns the first Fake,
// whose files are in the first call's dir. The nccl package loads a library
// once per path, so tests in this process keep working once that dir is
// removed; a test that needs the files themselves (a command it starts
// loads them) needs the dir to live as long, e.g. made and removed by
// TestMain.
func Build(dir string) (*Fake, error) {
	mu.Lock()
	defer mu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCompiler, err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, err
	}
	for _, name := range []string{"fakecudart.c", "fakenccl.c", "fakegpu.h"} {
		b, err := sources.ReadFile("testdata/" + name)
		if err == nil {
			err = os.WriteFile(filepath.Join(src, name), b, 0o644)
		}
		if err != nil {
			return nil, err
		}
	}
	f := &Fake{NCCL: filepath.Join(dir, "libnccl.so.2"), CUDART: filepath.Join(dir, "libcudart.so")}
	steps := [][]string{
		{"-shared", "-fPIC", "-O1", "-o", f.CUDART, filepath.Join(src, "fakecudart.c"), "-lpthread"},
		{"-shared", "-fPIC", "-O1", "-o", f.NCCL, filepath.Join(src, "fakenccl.c"),
			"-L" + dir, "-l:libcudart.so", "-Wl,-rpath," + dir, "-lm", "-lpthread"},
	}
	for _, args := range steps {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("nccltest: gcc %v: %w\n%s", args, err, out)
		}
	}
	// The same path as the nccl package's loader uses, so that dlopen
	// returns the same object and the control functions see its state.
	h, err := purego.Dlopen(f.CUDART, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("nccltest: %w", err)
	}
	for _, fn := range []struct {
		dst  any
		name string
	}{
		{&f.logLen, "fake_log_len"}, {&f.logGet, "fake_log_get"}, {&f.reset, "fake_reset"},
		{&f.injectSet, "fake_inject_set"}, {&f.setDevices, "fake_set_devices"},
		{&f.setVersion, "fake_set_nccl_version"}, {&f.liveAllocs, "fake_live_allocs"},
		{&f.liveStreams, "fake_live_streams"},
	} {
		purego.RegisterLibFunc(fn.dst, h, fn.name)
	}
	loaded = f
	return f, nil
}

// Rec is one recorded call; it mirrors fake_rec in testdata/fakegpu.h.
// Fields a call does not set are -1. What each holds depends on the call:
// for NCCL collectives DType, Op, Count, Peer (the root), Stream, Comm,
// SendBuf and RecvBuf are its arguments; for ncclSend/ncclRecv Op is the
// group depth; for cudaMemcpyAsync Kind is the cudaMemcpyKind, Bytes the
// length, SendBuf the source and RecvBuf the destination; for cudaMalloc
// Bytes is the size and RecvBuf the address returned; for cudaFree SendBuf
// is the address. Dev is the thread's current device at the call.
type Rec struct {
	Fn                                      [32]byte
	Rank, DType, Op, Count, Peer, Dev, Kind int64
	Bytes, Stream, Comm, SendBuf, RecvBuf   int64
}

// Name is the function called.
func (r Rec) Name() string { return string(bytes.TrimRight(r.Fn[:], "\x00")) }

// Records returns the calls recorded since the last Reset, in order; with
// names, only the calls of those functions.
func (f *Fake) Records(names ...string) []Rec {
	n := f.logLen()
	var out []Rec
	for i := int32(0); i < n; i++ {
		var r Rec
		if f.logGet(i, &r) == 0 {
			break
		}
		if len(names) == 0 {
			out = append(out, r)
			continue
		}
		for _, want := range names {
			if r.Name() == want {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// Reset clears the log and the injected errors, and restores two devices
// and NCCL 2.21.5.
func (f *Fake) Reset() { f.reset() }

// Inject makes the (skip+1)-th next call of fn return code. fn is a CUDA or
// NCCL function name, or "asyncError" for the next ncclCommGetAsyncError
// result.
func (f *Fake) Inject(fn string, code, skip int32) { f.injectSet(fn, code, skip) }

// SetDevices sets what cudaGetDeviceCount reports.
func (f *Fake) SetDevices(n int32) { f.setDevices(n) }

// SetNCCLVersion sets what ncclGetVersion reports.
func (f *Fake) SetNCCLVersion(v int32) { f.setVersion(v) }

// LiveAllocs is the number of device allocations not yet freed.
func (f *Fake) LiveAllocs() int64 { return f.liveAllocs() }

// LiveStreams is the number of streams not yet destroyed.
func (f *Fake) LiveStreams() int64 { return f.liveStreams() }

// CheckLeaks makes t fail if, when it ends, more or fewer device allocations
// or streams are alive than now.
func (f *Fake) CheckLeaks(t testing.TB) {
	t.Helper()
	allocs, streams := f.LiveAllocs(), f.LiveStreams()
	t.Cleanup(func() {
		if a, s := f.LiveAllocs(), f.LiveStreams(); a != allocs || s != streams {
			t.Errorf("leak: %d device allocations and %d streams alive, want %d and %d", a, s, allocs, streams)
		}
	})
}
