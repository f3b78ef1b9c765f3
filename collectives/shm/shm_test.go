package shm_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"gpucoord/collectives"
	"gpucoord/collectives/collectivestest"
	"gpucoord/collectives/shm"
	"gpucoord/collectives/tcp"
)

// TestMain doubles as the helper process of TestKilledPeerProcess.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	goleak.VerifyTestMain(m)
}

const helperEnv = "GPUCOORD_SHM_TEST_HELPER"

func helper() int {
	ctx := context.Background()
	rank, _ := strconv.Atoi(os.Getenv("HELPER_RANK"))
	size, _ := strconv.Atoi(os.Getenv("HELPER_SIZE"))
	st, err := tcp.DialStore(ctx, os.Getenv("HELPER_STORE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := shm.DefaultConfig()
	cfg.Rank, cfg.Size, cfg.Store, cfg.RingBytes, cfg.Dir = rank, size, st, 64<<10, os.Getenv("HELPER_DIR")
	t, err := shm.New(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := collectives.New(t, collectives.DefaultConfig())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	v := make([]float32, 1000)
	for i := range v {
		v[i] = float32(rank)
	}
	if err := c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready", v[0])
	select {} // wait to be killed
}

// smallRings makes frames wrap around and fill the rings at test sizes.
func smallRings() *shm.Config {
	cfg := shm.DefaultConfig()
	cfg.RingBytes = 4096
	return cfg
}

func shmWorld(t *testing.T, n int, cfg *collectives.Config) []*collectives.Comm {
	t.Helper()
	sc := smallRings()
	sc.Logger = cfg.Logger
	ts, err := shm.NewLocal(t.Context(), n, sc)
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*collectives.Comm, n)
	for r := range n {
		if comms[r], err = collectives.New(ts[r], cfg); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for r := range n {
			comms[r].Close()
			ts[r].Close()
		}
	})
	return comms
}

func TestShmConformance(t *testing.T) { collectivestest.Run(t, shmWorld) }

func TestShmZeroAllocs(t *testing.T) { collectivestest.TestZeroAllocs(t, shmWorld) }

// TestClosedPeer: a rank that closes its transport is seen by the others
// at once.
func TestClosedPeer(t *testing.T) {
	ts, err := shm.NewLocal(t.Context(), 2, smallRings())
	if err != nil {
		t.Fatal(err)
	}
	defer ts[0].Close()
	c, err := collectives.New(ts[0], collectivestest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts[1].Close()
	start := time.Now()
	err = c.Recv(t.Context(), collectives.Float32s(make([]float32, 10)), 1)
	if !errors.Is(err, collectives.ErrPeerLost) {
		t.Fatalf("err = %v, want ErrPeerLost", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("took %s", el)
	}
}

// TestKilledPeerProcess: rank 1 is a real process that joins, completes one
// all-reduce and is SIGKILLed; rank 0's next all-reduce (large enough to
// fill the rings) fails, naming world rank 1, within a fraction of the
// timeout.
func TestKilledPeerProcess(t *testing.T) {
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- tcp.ServeStore(sctx, ln, collectives.NewMemStore()) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("store: %v", err)
		}
	})
	// One rank here and one helper: two ranks of this process would share
	// mapped memory whose atomics the race detector cannot see.
	const n = 2
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	dir := t.TempDir() // a tmpfs is faster, but any directory maps
	cmd.Env = append(os.Environ(), helperEnv+"=1", "HELPER_RANK=1", "HELPER_SIZE=2", "HELPER_STORE="+ln.Addr().String(), "HELPER_DIR="+dir)
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	cfg := collectives.DefaultConfig()
	cfg.Logger = collectivestest.Config(t).Logger
	cfg.Timeout = 20 * time.Second
	comms := make([]*collectives.Comm, n-1)
	ready := make(chan error, n-1)
	for r := range n - 1 {
		go func() {
			st, err := tcp.DialStore(ctx, ln.Addr().String())
			if err != nil {
				ready <- err
				return
			}
			t.Cleanup(func() { st.Close() })
			sc := shm.DefaultConfig()
			sc.Rank, sc.Size, sc.Store, sc.RingBytes, sc.Logger, sc.Dir = r, n, st, 64<<10, cfg.Logger, dir
			tr, err := shm.New(ctx, sc)
			if err != nil {
				ready <- err
				return
			}
			t.Cleanup(func() { tr.Close() })
			comms[r], err = collectives.New(tr, cfg)
			ready <- err
		}()
	}
	for range n - 1 {
		if err := <-ready; err != nil {
			t.Fatal(err)
		}
	}
	collectivestest.MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		v := make([]float32, 1000)
		for i := range v {
			v[i] = float32(r)
		}
		if err := c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum); err != nil {
			return err
		}
		if v[999] != 1 {
			return fmt.Errorf("sum %v, want 1", v[999])
		}
		return nil
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready 1\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}
	// The ring files are unlinked once every rank mapped them.
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("files left in %s: %v", dir, left)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() // reap it, so that kill(pid, 0) sees it gone
	start := time.Now()
	errs := collectivestest.Each(ctx, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		return c.AllReduce(ctx, collectives.Float32s(make([]float32, 1<<20)), collectives.Sum)
	})
	el := time.Since(start)
	named := false
	for r, err := range errs {
		t.Logf("rank %d after %s: %v", r, el, err)
		var pe *collectives.PeerError
		switch {
		case err == nil:
			t.Errorf("rank %d: no error after the peer was killed", r)
		case errors.As(err, &pe) && pe.World == 1 && errors.Is(err, collectives.ErrPeerLost):
			named = true
		case !errors.Is(err, collectives.ErrAborted) && !errors.Is(err, collectives.ErrPeerLost):
			t.Errorf("rank %d: %v, want ErrPeerLost or ErrAborted", r, err)
		}
	}
	if !named {
		t.Error("no error names world rank 1 as lost")
	}
	if el > cfg.Timeout/4 {
		t.Errorf("took %s; a dead process must be noticed well within the %s timeout", el, cfg.Timeout)
	}
}
