package nccl

import (
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/nccl/nccltest"
)

// The fake CUDA runtime and NCCL (package nccltest) are built once per test
// binary with gcc. They run every call on the CPU and record the arguments,
// which is how these tests check the API mapping without a GPU.
var (
	fakeDir string // directory holding libcudart.so and libnccl.so.2; "" when gcc is missing
	fakeErr error
	fake    *nccltest.Fake
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakenccl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if fake, fakeErr = nccltest.Build(dir); fakeErr == nil {
		fakeDir = dir
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// needFake skips the test when the fakes could not be built, resets their
// log, error injections and device count, and fails the test if it leaks a
// device allocation or a stream.
func needFake(t *testing.T) {
	t.Helper()
	if fakeDir == "" {
		t.Skipf("fake NCCL not built: %v", fakeErr)
	}
	fake.Reset()
	fake.CheckLeaks(t)
}

// fakeConfig is a Config pointing at the fakes, with short timeouts.
func fakeConfig(t testing.TB, rank, size int, store Store, key string) *Config {
	cfg := DefaultConfig()
	cfg.NCCLLibrary = fake.NCCL
	cfg.CUDARTLibraries = []string{fake.CUDART}
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
