package localproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/collectives/tcp"
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
	secret, err := StoreSecret()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, err := tcp.DialStore(ctx, os.Getenv("LOCALPROC_TEST_STORE"), secret)
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
	case mode == "linger" && rank == size-1:
		return 75
	case mode == "linger":
		// Still finishing its work when the last rank leaves: left alone,
		// it ends well and says so.
		time.Sleep(300 * time.Millisecond)
		os.WriteFile(filepath.Join(os.Getenv("LOCALPROC_TEST_DIR"), strconv.Itoa(rank)), nil, 0o644)
		return 0
	case mode == "term":
		// Stop cleanly on SIGTERM, saying so.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "ready")
		<-sig
		fmt.Fprintln(os.Stderr, "terminated cleanly")
		return 0
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
	return Config{Ranks: ranks, Stderr: func(int) io.Writer { return os.Stderr }, Command: func(ctx context.Context, rank int, store string) (*exec.Cmd, error) {
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

// TestRunLinger: a rank that exits with Config.Linger's code leaves the
// others running to their end; Run then reports it.
func TestRunLinger(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("LOCALPROC_TEST_DIR", dir)
	cfg := config(t, "linger", 3)
	cfg.Linger = 75
	err := Run(t.Context(), cfg, func(line) error { return nil })
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Rank != 2 || ee.Code() != 75 {
		t.Fatalf("err = %v, want rank 2's exit status 75", err)
	}
	for _, r := range []string{"0", "1"} {
		if _, err := os.Stat(filepath.Join(dir, r)); err != nil {
			t.Errorf("rank %s did not end on its own: %v", r, err)
		}
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

// TestRunStartFailureStopsStarted: when rank 2 cannot start, Run stops the
// ranks already running and returns only after they are gone.
func TestRunStartFailureStopsStarted(t *testing.T) {
	cfg := config(t, "hang", 3)
	var mu sync.Mutex
	var started []*exec.Cmd
	inner := cfg.Command
	cfg.Command = func(ctx context.Context, rank int, store string) (*exec.Cmd, error) {
		if rank == 2 {
			return exec.CommandContext(ctx, "/nonexistent/gpucoord-rank"), nil
		}
		cmd, err := inner(ctx, rank, store)
		mu.Lock()
		started = append(started, cmd)
		mu.Unlock()
		return cmd, err
	}
	cfg.Grace = 100 * time.Millisecond
	err := Run(t.Context(), cfg, func(line) error { return nil })
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Rank != 2 || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("err = %v, want rank 2's start failure", err)
	}
	if len(started) != 2 {
		t.Fatalf("%d ranks started, want 2", len(started))
	}
	for _, c := range started {
		if c.ProcessState == nil {
			t.Errorf("rank process %d was not waited for", c.Process.Pid)
		}
		if err := syscall.Kill(c.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("rank process %d still exists after Run returned (kill 0: %v)", c.Process.Pid, err)
		}
	}
}

// TestRunStopIsGraceful: a stopped world's ranks get SIGTERM first, and one
// that handles it exits on its own with its last words written.
func TestRunStopIsGraceful(t *testing.T) {
	cfg := config(t, "term", 2)
	ready := make(chan struct{}, 2)
	var mu sync.Mutex
	var stderr strings.Builder
	cfg.Stderr = func(int) io.Writer {
		return writerFunc(func(b []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			stderr.Write(b)
			if strings.Contains(string(b), "ready") {
				ready <- struct{}{}
			}
			return len(b), nil
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-ready; <-ready; cancel() }()
	err := Run(ctx, cfg, func(line) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want the cancellation", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(stderr.String(), "terminated cleanly"); n != 2 {
		t.Errorf("%d ranks stopped cleanly, want 2; stderr:\n%s", n, stderr.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestLineWriter(t *testing.T) {
	var out strings.Builder
	tagged := func(tag string) *LineWriter {
		return &LineWriter{Line: func(b []byte) error { out.WriteString(tag + string(b)); return nil }}
	}
	a, b := tagged("[a] "), tagged("[b] ")
	a.Write([]byte("one\ntw"))
	b.Write([]byte("x\n"))
	a.Write([]byte("o\nthree"))
	a.Flush()
	if want := "[a] one\n[b] x\n[a] two\n[a] three\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}
