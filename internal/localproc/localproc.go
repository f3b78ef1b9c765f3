package localproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sync/errgroup"

	"gpucoord/collectives"
	"gpucoord/collectives/tcp"
)

// Config describes the world to run.
type Config struct {
	// Ranks is the number of processes.
	Ranks int
	// Command returns the command of one rank, given the address of the
	// rendezvous store (a collectives/tcp store: tcp.DialStore). It must be
	// built with exec.CommandContext(ctx, ...) so that a failing world
	// stops it; Run sets its stdout (rank 0), its stderr and SysProcAttr,
	// and, unless this process's environment sets GOMAXPROCS, gives each
	// rank GOMAXPROCS = cores / Ranks (at least 1), so that ranks sharing
	// few cores do not each run as many schedulers as there are cores (the
	// OMP_NUM_THREADS=1 of a torch launcher).
	Command func(ctx context.Context, rank int, store string) (*exec.Cmd, error)
	// Stderr receives every rank's standard error; nil discards it.
	Stderr io.Writer
}

// Run starts the world and waits for every rank. Each line rank 0 writes to
// its stdout is decoded as JSON into a T and handed to emit, in order. The
// first failure (a rank exiting non-zero, a line that does not decode, emit
// returning an error, ctx ending) kills the other ranks and is returned,
// naming the rank.
func Run[T any](ctx context.Context, cfg Config, emit func(T) error) error {
	if cfg.Ranks < 1 {
		return fmt.Errorf("localproc: %d ranks: need at least 1", cfg.Ranks)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	storeCtx, stopStore := context.WithCancel(ctx)
	storeDone := make(chan error, 1)
	go func() { storeDone <- tcp.ServeStore(storeCtx, ln, collectives.NewMemStore()) }()
	defer func() { stopStore(); <-storeDone }()

	g, gctx := errgroup.WithContext(ctx)
	for rank := range cfg.Ranks {
		cmd, err := cfg.Command(gctx, rank, ln.Addr().String())
		if err != nil {
			return err
		}
		cmd.Stderr = cfg.Stderr
		if os.Getenv("GOMAXPROCS") == "" {
			if cmd.Env == nil {
				cmd.Env = os.Environ()
			}
			cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU()/cfg.Ranks)))
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var out io.ReadCloser
		if rank == 0 {
			if out, err = cmd.StdoutPipe(); err != nil {
				return err
			}
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start rank %d: %w", rank, err)
		}
		g.Go(func() error {
			var readErr error
			if out != nil {
				readErr = readLines(out, emit)
				io.Copy(io.Discard, out) // let the rank finish writing
			}
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("rank %d: %w", rank, err)
			}
			return readErr
		})
	}
	err = g.Wait()
	if err != nil && ctx.Err() != nil {
		// Killed ranks report "signal: killed"; the reason is ctx's.
		return context.Cause(ctx)
	}
	return err
}

// readLines decodes JSON lines from r into emit until r ends or fails.
func readLines[T any](r io.Reader, emit func(T) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return fmt.Errorf("rank 0 output %q: %w", sc.Text(), err)
		}
		if err := emit(v); err != nil {
			return err
		}
	}
	return sc.Err()
}
