package nccl

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"golang.org/x/sync/errgroup"

	"gpucoord/collectives"
)

// The fake CUDA runtime and NCCL (testdata/*.c) are built once per test
// binary with gcc. They run every call on the CPU and record the arguments,
// which is how these tests check the API mapping without a GPU.
var (
	fakeDir string // directory holding libcudart.so and libnccl.so.2; "" when gcc is missing
	fakeErr error
	fake    *fakeLib
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakenccl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakeErr = buildFake(dir)
	if fakeErr == nil {
		fakeDir = dir
		fake, fakeErr = openFake(dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildFake(dir string) error {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return fmt.Errorf("gcc not found: %w", err)
	}
	steps := [][]string{
		{"-shared", "-fPIC", "-O1", "-o", filepath.Join(dir, "libcudart.so"), "testdata/fakecudart.c", "-lpthread"},
		{"-shared", "-fPIC", "-O1", "-o", filepath.Join(dir, "libnccl.so.2"), "testdata/fakenccl.c",
			"-L" + dir, "-l:libcudart.so", "-Wl,-rpath," + dir, "-lm", "-lpthread"},
	}
	for _, args := range steps {
		if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("gcc %v: %w\n%s", args, err, out)
		}
	}
	return nil
}

// fakeRec mirrors fake_rec in testdata/fakegpu.h.
type fakeRec struct {
	Fn                                      [32]byte
	Rank, DType, Op, Count, Peer, Dev, Kind int64
	Bytes, Stream, Comm, SendBuf, RecvBuf   int64
}

func (r fakeRec) name() string { return string(bytes.TrimRight(r.Fn[:], "\x00")) }

// fakeLib is the fakes' test-only control surface.
type fakeLib struct {
	logLen      func() int32
	logGet      func(i int32, out *fakeRec) int32
	reset       func()
	injectSet   func(fn string, code, skip int32)
	setDevices  func(n int32)
	setVersion  func(v int32)
	liveAllocs  func() int64
	liveStreams func() int64
}

func openFake(dir string) (*fakeLib, error) {
	// The same path as the loader's, so dlopen returns the same object.
	h, err := purego.Dlopen(filepath.Join(dir, "libcudart.so"), purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, err
	}
	f := &fakeLib{}
	purego.RegisterLibFunc(&f.logLen, h, "fake_log_len")
	purego.RegisterLibFunc(&f.logGet, h, "fake_log_get")
	purego.RegisterLibFunc(&f.reset, h, "fake_reset")
	purego.RegisterLibFunc(&f.injectSet, h, "fake_inject_set")
	purego.RegisterLibFunc(&f.setDevices, h, "fake_set_devices")
	purego.RegisterLibFunc(&f.setVersion, h, "fake_set_nccl_version")
	purego.RegisterLibFunc(&f.liveAllocs, h, "fake_live_allocs")
	purego.RegisterLibFunc(&f.liveStreams, h, "fake_live_streams")
	return f, nil
}

// records returns the calls recorded since the last reset, optionally only
// those named in names.
func (f *fakeLib) records(names ...string) []fakeRec {
	n := f.logLen()
	var out []fakeRec
	for i := int32(0); i < n; i++ {
		var r fakeRec
		if f.logGet(i, &r) == 0 {
			break
		}
		if len(names) == 0 {
			out = append(out, r)
			continue
		}
		for _, want := range names {
			if r.name() == want {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// needFake skips the test when the fakes could not be built, and resets
// their log, error injections and device count.
func needFake(t *testing.T) {
	t.Helper()
	if fakeDir == "" {
		t.Skipf("fake NCCL not built: %v", fakeErr)
	}
	fake.reset()
	allocs, streams := fake.liveAllocs(), fake.liveStreams()
	t.Cleanup(func() {
		if a, s := fake.liveAllocs(), fake.liveStreams(); a != allocs || s != streams {
			t.Errorf("leak: %d device allocations and %d streams alive, want %d and %d", a, s, allocs, streams)
		}
	})
}

// fakeConfig is a Config pointing at the fakes, with short timeouts.
func fakeConfig(t testing.TB, rank, size int, store Store, key string) *Config {
	cfg := DefaultConfig()
	cfg.NCCLLibrary = filepath.Join(fakeDir, "libnccl.so.2")
	cfg.CUDARTLibraries = []string{filepath.Join(fakeDir, "libcudart.so")}
	cfg.Rank, cfg.Size = rank, size
	cfg.Store, cfg.Key = store, key
	cfg.Timeout = 10 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	return cfg
}

// group builds size communicators over the fakes, one goroutine per rank,
// and closes them at the end of the test. tweak may adjust each Config.
func group(t testing.TB, size int, tweak func(*Config)) []*Communicator {
	t.Helper()
	store := collectives.NewMemStore()
	key := fmt.Sprintf("%s/nccl-id", t.Name())
	return newGroup(t, size, func(r int) *Config {
		cfg := fakeConfig(t, r, size, store, key)
		if tweak != nil {
			tweak(cfg)
		}
		return cfg
	})
}

// newGroup calls New for every rank concurrently with the Config mk returns
// and registers Close on t.
func newGroup(t testing.TB, size int, mk func(rank int) *Config) []*Communicator {
	t.Helper()
	comms := make([]*Communicator, size)
	g, ctx := errgroup.WithContext(t.Context())
	for r := range size {
		cfg := mk(r)
		g.Go(func() error {
			c, err := New(ctx, cfg)
			comms[r] = c
			return err
		})
	}
	if err := g.Wait(); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Abort()
			}
		}
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return comms
}

// each runs f for every rank concurrently and returns the errors by rank.
func each(comms []*Communicator, f func(r int, c *Communicator) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

// The Store the collectives package exports satisfies ours.
var _ Store = (*collectives.MemStore)(nil)
