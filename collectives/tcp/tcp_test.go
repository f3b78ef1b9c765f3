package tcp_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/collectivestest"
	"github.com/gpucoord/gpucoord/collectives/tcp"
)

// TestMain doubles as the helper process of TestKilledPeerProcess: with
// helperEnv set, the test binary joins a world as one rank instead of
// running tests.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(collectivestest.HelperMain(join))
	}
	goleak.VerifyTestMain(m)
}

const helperEnv = "GPUCOORD_TCP_TEST_HELPER"

// join builds a rank that meets the others through st.
func join(ctx context.Context, rank, size int, st collectives.Store, log *slog.Logger) (collectivestest.Transport, error) {
	cfg := tcp.DefaultConfig()
	cfg.Rank, cfg.Size, cfg.Store, cfg.Logger = rank, size, st, log
	return tcp.New(ctx, cfg)
}

func tcpWorld(t *testing.T, n int, cfg *collectives.Config) []*collectives.Comm {
	t.Helper()
	tc := tcp.DefaultConfig()
	tc.Logger = cfg.Logger
	ts, err := tcp.NewLocal(t.Context(), n, tc)
	if err != nil {
		t.Fatal(err)
	}
	return collectivestest.Comms(t, ts, cfg)
}

func TestTCPConformance(t *testing.T) { collectivestest.Run(t, tcpWorld) }

// TestKilledPeerProcess: rank 2 is a real process that joins, completes one
// all-reduce and is then SIGKILLed. The next all-reduce on the two surviving
// ranks must fail on both, well within the timeout, naming world rank 2.
func TestKilledPeerProcess(t *testing.T) {
	collectivestest.KilledPeerProcess(t, collectivestest.KilledPeer{
		Size: 3, Join: join, HelperEnv: helperEnv, Elems: 100000, Within: 10 * time.Second,
	})
}

// TestAddrsRendezvous: ranks given each other's addresses start one after
// another, highest first (higher ranks dial lower ones), each only once the
// one before it has been refused by a peer that is not listening yet; the
// dials retry until the mesh is up.
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
	deadline := time.After(30 * time.Second)
	for r := 2; r >= 0; r-- {
		cfg := tcp.DefaultConfig()
		cfg.Rank, cfg.Size, cfg.Addrs = r, 3, addrs
		refused := make(chan struct{})
		var once sync.Once
		tcp.SetDialFailedHook(cfg, func(string, error) { once.Do(func() { close(refused) }) })
		go func() {
			var err error
			ts[r], err = tcp.New(t.Context(), cfg)
			errs <- err
		}()
		if r == 0 {
			break // rank 0 dials no one
		}
		select {
		case <-refused:
		case err := <-errs:
			t.Fatalf("a rank returned before rank %d's peers started: %v", r, err)
		case <-deadline:
			t.Fatalf("rank %d made no failed dial within 30s", r)
		}
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

// announcingStore is a MemStore that reports each Get on gets as the server
// starts to serve it.
type announcingStore struct {
	*collectives.MemStore
	gets chan string
}

// Get implements collectives.Store.
func (s *announcingStore) Get(ctx context.Context, key string) ([]byte, error) {
	select {
	case s.gets <- key:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.MemStore.Get(ctx, key)
}

// TestStoreOverTCP: a Get that reached the server before the Set was issued
// waits for it; a cancelled Get returns the context's error.
func TestStoreOverTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	st := &announcingStore{MemStore: collectives.NewMemStore(), gets: make(chan string, 4)}
	go func() { served <- tcp.ServeStore(ctx, ln, st, testSecret) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	a, err := tcp.DialStore(t.Context(), ln.Addr().String(), testSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := tcp.DialStore(t.Context(), ln.Addr().String(), testSecret)
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
	select {
	case k := <-st.gets:
		if k != "k" {
			t.Fatalf("the server got a Get of %q, want k", k)
		}
	case v := <-got:
		t.Fatalf("Get returned %q before the server saw it", v)
	case <-time.After(30 * time.Second):
		t.Fatal("the Get did not reach the server within 30s")
	}
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before the Set", v) // the key is not set: the reply must wait
	default:
	}
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
