package tcp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"gpucoord/collectives"
	"gpucoord/collectives/collectivestest"
	"gpucoord/collectives/tcp"
)

// TestMain doubles as the helper process of TestKilledPeerProcess: with
// helperEnv set, the test binary joins a world as one rank instead of
// running tests.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	goleak.VerifyTestMain(m)
}

const helperEnv = "GPUCOORD_TCP_TEST_HELPER"

func helper() int {
	ctx := context.Background()
	rank, _ := strconv.Atoi(os.Getenv("HELPER_RANK"))
	size, _ := strconv.Atoi(os.Getenv("HELPER_SIZE"))
	st, err := tcp.DialStore(ctx, os.Getenv("HELPER_STORE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := tcp.DefaultConfig()
	cfg.Rank, cfg.Size, cfg.Store = rank, size, st
	t, err := tcp.New(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ccfg := collectives.DefaultConfig()
	ccfg.Timeout = 20 * time.Second
	c, err := collectives.New(t, ccfg)
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

func tcpWorld(t *testing.T, n int, cfg *collectives.Config) []*collectives.Comm {
	t.Helper()
	tc := tcp.DefaultConfig()
	tc.Logger = cfg.Logger
	ts, err := tcp.NewLocal(t.Context(), n, tc)
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

func TestTCPConformance(t *testing.T) { collectivestest.Run(t, tcpWorld) }

// TestKilledPeerProcess: rank 2 is a real process that joins, completes one
// all-reduce and is then SIGKILLed. The next all-reduce on the two surviving
// ranks must fail on both, well within the timeout, naming world rank 2.
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

	const n = 3
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "HELPER_RANK=2", "HELPER_SIZE=3", "HELPER_STORE="+ln.Addr().String())
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	cfg := collectives.DefaultConfig() // as the helper's
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
			tc := tcp.DefaultConfig()
			tc.Rank, tc.Size, tc.Store, tc.Logger = r, n, st, cfg.Logger
			tr, err := tcp.New(ctx, tc)
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
		if v[999] != 0+1+2 {
			return fmt.Errorf("sum %v, want 3", v[999])
		}
		return nil
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready 3\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errs := collectivestest.Each(ctx, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		return c.AllReduce(ctx, collectives.Float32s(make([]float32, 100000)), collectives.Sum)
	})
	el := time.Since(start)
	named := false
	for r, err := range errs {
		t.Logf("rank %d after %s: %v", r, el, err)
		var pe *collectives.PeerError
		switch {
		case err == nil:
			t.Errorf("rank %d: no error after the peer was killed", r)
		case errors.As(err, &pe) && pe.World == 2 && errors.Is(err, collectives.ErrPeerLost):
			named = true
		case !errors.Is(err, collectives.ErrAborted) && !errors.Is(err, collectives.ErrPeerLost):
			t.Errorf("rank %d: %v, want ErrPeerLost or ErrAborted", r, err)
		}
	}
	if !named {
		t.Error("no error names world rank 2 as lost")
	}
	if el > cfg.Timeout/2 {
		t.Errorf("took %s; a dead process must be noticed well within the %s timeout", el, cfg.Timeout)
	}
}

func TestAddrsRendezvous(t *testing.T) {
	// Reserve three free ports, then let the ranks listen on them.
	addrs := make([]string, 3)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = ln.Addr().String()
		ln.Close()
	}
	ts := make([]*tcp.Transport, 3)
	errs := make(chan error, 3)
	for r := range 3 {
		go func() {
			time.Sleep(time.Duration(r) * 30 * time.Millisecond) // ranks start at different times
			cfg := tcp.DefaultConfig()
			cfg.Rank, cfg.Size, cfg.Addrs = r, 3, addrs
			var err error
			ts[r], err = tcp.New(t.Context(), cfg)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	comms := make([]*collectives.Comm, 3)
	for r := range 3 {
		var err error
		if comms[r], err = collectives.New(ts[r], collectivestest.Config(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { comms[r].Close(); ts[r].Close() })
	}
	collectivestest.MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		return c.Barrier(ctx)
	})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*tcp.Config)
	}{
		{"no size", func(c *tcp.Config) { c.Size = 0 }},
		{"rank out of range", func(c *tcp.Config) { c.Rank = 4 }},
		{"short addrs", func(c *tcp.Config) { c.Addrs = []string{"a"} }},
		{"no rendezvous", func(c *tcp.Config) { c.Store = nil }},
		{"zero write timeout", func(c *tcp.Config) { c.WriteTimeout = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tcp.DefaultConfig()
			cfg.Rank, cfg.Size, cfg.Store = 1, 4, collectives.NewMemStore()
			tc.mod(cfg)
			if _, err := tcp.New(t.Context(), cfg); !errors.Is(err, collectives.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestStoreOverTCP: a Get issued before the Set waits for it; a cancelled
// Get returns the context's error.
func TestStoreOverTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- tcp.ServeStore(ctx, ln, collectives.NewMemStore()) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	a, err := tcp.DialStore(t.Context(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := tcp.DialStore(t.Context(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make(chan string, 1)
	go func() {
		v, err := a.Get(t.Context(), "k")
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(v)
	}()
	time.Sleep(20 * time.Millisecond)
	if err := b.Set(t.Context(), "k", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != "hello" {
		t.Fatalf("Get = %q, want hello", v)
	}
	cctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	if _, err := b.Get(cctx, "missing"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get of a missing key: %v, want DeadlineExceeded", err)
	}
}

func TestTCPZeroAllocs(t *testing.T) { collectivestest.TestZeroAllocs(t, tcpWorld) }
