package localproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"gpucoord/collectives/tcp"
)

// The test binary doubles as the worker: with LOCALPROC_TEST_MODE set it
// dials the store, announces itself, and does what the mode says.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LOCALPROC_TEST_MODE"); mode != "" {
		os.Exit(worker(mode))
	}
	os.Exit(m.Run())
}

type line struct {
	Rank, Peers int
}

func worker(mode string) int {
	ctx := context.Background()
	rank, _ := strconv.Atoi(os.Getenv("LOCALPROC_TEST_RANK"))
	size, _ := strconv.Atoi(os.Getenv("LOCALPROC_TEST_SIZE"))
	st, err := tcp.DialStore(ctx, os.Getenv("LOCALPROC_TEST_STORE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer st.Close()
	// Rendezvous: every rank publishes its key and reads every other's.
	if err := st.Set(ctx, "rank/"+strconv.Itoa(rank), []byte("up")); err != nil {
		return 1
	}
	for r := range size {
		if _, err := st.Get(ctx, "rank/"+strconv.Itoa(r)); err != nil {
			return 1
		}
	}
	switch {
	case mode == "die" && rank == size-1:
		return 7
	case mode == "die" || mode == "hang":
		time.Sleep(time.Minute) // killed by Run when the world fails
	case mode == "garbage" && rank == 0:
		fmt.Println("not json")
	case rank == 0:
		for i := range 3 {
			json.NewEncoder(os.Stdout).Encode(line{Rank: i, Peers: size})
		}
	}
	return 0
}

func config(t *testing.T, mode string, ranks int) Config {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Config{Ranks: ranks, Stderr: os.Stderr, Command: func(ctx context.Context, rank int, store string) (*exec.Cmd, error) {
		cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "LOCALPROC_TEST_MODE="+mode, "LOCALPROC_TEST_RANK="+strconv.Itoa(rank),
			"LOCALPROC_TEST_SIZE="+strconv.Itoa(ranks), "LOCALPROC_TEST_STORE="+store)
		return cmd, nil
	}}
}

func TestRunStreamsRankZero(t *testing.T) {
	var got []line
	err := Run(t.Context(), config(t, "ok", 4), func(l line) error { got = append(got, l); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[2].Rank != 2 || got[0].Peers != 4 {
		t.Errorf("lines = %+v", got)
	}
}

func TestRunRankFailureEndsWorld(t *testing.T) {
	start := time.Now()
	err := Run(t.Context(), config(t, "die", 3), func(line) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "rank 2: exit status 7") {
		t.Fatalf("err = %v, want rank 2's exit status", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("world took %s to end after a rank died", d)
	}
}

func TestRunBadOutput(t *testing.T) {
	err := Run(t.Context(), config(t, "garbage", 2), func(line) error { return nil })
	if err == nil || !strings.Contains(err.Error(), `rank 0 output "not json"`) {
		t.Fatalf("err = %v", err)
	}
}

func TestRunContextEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	err := Run(ctx, config(t, "hang", 2), func(line) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
}
