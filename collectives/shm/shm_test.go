package shm_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/collectivestest"
	"github.com/gpucoord/gpucoord/collectives/shm"
)

// TestMain doubles as the helper process of TestKilledPeerProcess.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(collectivestest.HelperMain(join(os.Getenv("HELPER_DIR"))))
	}
	goleak.VerifyTestMain(m)
}

const helperEnv = "GPUCOORD_SHM_TEST_HELPER"

// join builds ranks that map their rings in dir and meet through a store.
func join(dir string) collectivestest.Join {
	return func(ctx context.Context, rank, size int, st collectives.Store, log *slog.Logger) (collectivestest.Transport, error) {
		cfg := shm.DefaultConfig()
		cfg.Rank, cfg.Size, cfg.Store, cfg.RingBytes, cfg.Logger, cfg.Dir = rank, size, st, 64<<10, log, dir
		return shm.New(ctx, cfg)
	}
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
	return collectivestest.Comms(t, ts, cfg)
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
	dir := t.TempDir() // a tmpfs is faster, but any directory maps
	collectivestest.KilledPeerProcess(t, collectivestest.KilledPeer{
		// One rank here and one helper: two ranks of this process would
		// share mapped memory whose atomics the race detector cannot see.
		Size: 2, Join: join(dir), HelperEnv: helperEnv, Env: []string{"HELPER_DIR=" + dir},
		Elems: 1 << 20, Within: 5 * time.Second,
		BeforeKill: func() {
			// The ring files are unlinked once every rank mapped them.
			if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
				t.Errorf("files left in %s: %v", dir, left)
			}
		},
	})
}
