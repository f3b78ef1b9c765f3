package localproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/tcp"
)

// EnvStoreSecret is the environment variable that hands a rank its
// store's secret, hex-encoded.
const EnvStoreSecret = "GPUCOORD_STORE_SECRET"

// StoreSecret reads this process's store secret from its environment.
func StoreSecret() ([]byte, error) {
	b, err := hex.DecodeString(os.Getenv(EnvStoreSecret))
	if err != nil || len(b) < tcp.MinSecret {
		return nil, fmt.Errorf("%s: want the hex of at least %d bytes (a rank started by gpucoord has it)", EnvStoreSecret, tcp.MinSecret)
	}
	return b, nil
}

// DefaultGrace is how long a rank has to exit after SIGTERM before it and
// its process group are killed.
const DefaultGrace = 5 * time.Second

// Config describes the world, or the part of it that runs on this machine.
type Config struct {
	// Ranks is the number of processes in the whole world.
	Ranks int
	// Local lists the global ranks to start here; nil means 0..Ranks-1.
	Local []int
	// Store is the address of the world's rendezvous store (a
	// collectives/tcp store). Empty means Run serves one on 127.0.0.1 for
	// the duration of the world.
	Store string
	// StoreSecret is the secret of the store at Store (tcp.ServeStore);
	// Run makes one for a store it serves. Each rank gets it in its
	// environment (EnvStoreSecret), never in its arguments.
	StoreSecret []byte
	// Command returns the command of one rank, given the address of the
	// rendezvous store (tcp.DialStore). It must be built with
	// exec.CommandContext(ctx, ...) on the context it is given, which ends
	// when the world fails. Run sets its stdout, its stderr,
	// SysProcAttr, Cancel and WaitDelay, and, unless this process's
	// environment sets GOMAXPROCS, gives each rank GOMAXPROCS = cores /
	// local ranks (at least 1), so that ranks sharing few cores do not each
	// run as many schedulers as there are cores (the OMP_NUM_THREADS=1 of a
	// torch launcher).
	Command func(ctx context.Context, rank int, store string) (*exec.Cmd, error)
	// Stdout returns where rank r's standard output goes; nil, or a nil
	// writer, discards it. Rank 0's output goes to emit instead when Run is
	// given one.
	Stdout func(rank int) io.Writer
	// Stderr returns where rank r's standard error goes; nil discards it.
	Stderr func(rank int) io.Writer
	// Grace is how long a rank has between SIGTERM and SIGKILL when the
	// world stops; 0 means DefaultGrace.
	Grace time.Duration
	// Started, if set, is called with each rank's process once it runs
	// (for signals of the caller's own); it must not block.
	Started func(rank int, p *os.Process)
	// Linger is an exit code with which a rank leaves without stopping
	// the others (0: none): a preempted native rank, whose node's other
	// ranks may still be finishing the collective after the checkpoint
	// they all wrote. Run then returns that rank's ExitError once every
	// rank has ended, unless another failed.
	Linger int
}

// ExitError is the failure of one rank: its global rank and how it ended.
type ExitError struct {
	// Rank is the global rank.
	Rank int
	// Err is the exec error (an *exec.ExitError for a non-zero exit).
	Err error
	// At is when the rank was seen to end (or fail to start).
	At time.Time
}

func (e *ExitError) Error() string { return fmt.Sprintf("rank %d: %v", e.Rank, e.Err) }
func (e *ExitError) Unwrap() error { return e.Err }

// Code returns the rank's exit status, 128+signal for a signalled rank, or
// 1 when it did not run.
func (e *ExitError) Code() int {
	var ee *exec.ExitError
	if errors.As(e.Err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}

// Run starts the world and waits for every local rank. When emit is not nil
// and rank 0 runs here, each line rank 0 writes to its stdout is decoded as
// JSON into a T and handed to emit, in order. The first failure (a rank
// exiting non-zero, a line that does not decode, emit returning an error,
// a rank that cannot start, ctx ending) stops the other ranks (SIGTERM to
// each rank's process group, SIGKILL after Grace) and is returned; a rank's
// failure is an *ExitError. Run returns only after every rank it started
// has exited, and leaves no process of its own behind.
func Run[T any](ctx context.Context, cfg Config, emit func(T) error) error {
	if cfg.Ranks < 1 {
		return fmt.Errorf("localproc: %d ranks: need at least 1", cfg.Ranks)
	}
	local := cfg.Local
	if local == nil {
		local = make([]int, cfg.Ranks)
		for i := range local {
			local[i] = i
		}
	}
	for _, r := range local {
		if r < 0 || r >= cfg.Ranks {
			return fmt.Errorf("localproc: rank %d outside a world of %d", r, cfg.Ranks)
		}
	}
	store, secret := cfg.Store, cfg.StoreSecret
	if store == "" {
		var err error
		if secret, err = tcp.NewSecret(); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		storeCtx, stopStore := context.WithCancel(ctx)
		storeDone := make(chan error, 1)
		go func() { storeDone <- tcp.ServeStore(storeCtx, ln, collectives.NewMemStore(), secret) }()
		defer func() { stopStore(); <-storeDone }()
		store = ln.Addr().String()
	}
	grace := cfg.Grace
	if grace == 0 {
		grace = DefaultGrace
	}
	writer := func(f func(int) io.Writer, rank int) io.Writer {
		if f == nil {
			return nil
		}
		return f(rank)
	}

	g, gctx := errgroup.WithContext(ctx)
	var lingered atomic.Pointer[ExitError] // the first rank that left with cfg.Linger
	for _, rank := range local {
		cmd, err := cfg.Command(gctx, rank, store)
		if err == nil {
			err = prepare(cmd, grace, len(local), secret)
		}
		var out io.ReadCloser
		if err == nil {
			cmd.Stderr = writer(cfg.Stderr, rank)
			if rank == 0 && emit != nil {
				out, err = cmd.StdoutPipe()
			} else {
				cmd.Stdout = writer(cfg.Stdout, rank)
			}
		}
		if err == nil {
			err = cmd.Start()
		}
		if err == nil && cfg.Started != nil {
			cfg.Started(rank, cmd.Process)
		}
		if err != nil {
			// Stop the ranks already started and wait for them.
			at := time.Now()
			g.Go(func() error { return &ExitError{Rank: rank, Err: fmt.Errorf("start: %w", err), At: at} })
			break
		}
		g.Go(func() error {
			var readErr error
			if out != nil {
				readErr = readLines(out, emit)
				io.Copy(io.Discard, out) // let the rank finish writing
			}
			err := cmd.Wait()
			at := time.Now()
			// The rank is gone; take any process it left in its group with it.
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			var ee *exec.ExitError
			if cfg.Linger != 0 && errors.As(err, &ee) && ee.ExitCode() == cfg.Linger {
				lingered.CompareAndSwap(nil, &ExitError{Rank: rank, Err: err, At: at})
				return readErr
			}
			if err != nil {
				return &ExitError{Rank: rank, Err: err, At: at}
			}
			return readErr
		})
	}
	err := g.Wait()
	if l := lingered.Load(); err == nil && l != nil {
		return l
	}
	if err != nil && ctx.Err() != nil {
		// Stopped ranks report "signal: terminated"; the reason is ctx's.
		return context.Cause(ctx)
	}
	return err
}

// Hostname names this machine to the ranks it starts (their NCCL host ids)
// and in their results: os.Hostname, or "localhost" when that fails.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}

// prepare sets how a rank is started and stopped: its own process group,
// SIGKILL when this process dies, SIGTERM to the group when its context
// ends and SIGKILL after grace; and GOMAXPROCS. A Credential the command
// has (another user to run it as) is kept.
func prepare(cmd *exec.Cmd, grace time.Duration, local int, secret []byte) error {
	if cmd == nil {
		return errors.New("localproc: no command")
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, EnvStoreSecret+"="+hex.EncodeToString(secret))
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if cmd.SysProcAttr != nil {
		attr.Credential = cmd.SysProcAttr.Credential // the user the command runs as
	}
	cmd.SysProcAttr = attr
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = grace
	if os.Getenv("GOMAXPROCS") == "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU()/local)))
	}
	return nil
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

// LineWriter hands each complete line written to it, newline included, to
// Line; an unterminated rest waits for the next write, or for Flush.
type LineWriter struct {
	Line func(line []byte) error
	buf  []byte
}

// Write implements io.Writer.
func (w *LineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		if err := w.Line(w.buf[:i+1]); err != nil {
			return len(b), err
		}
		w.buf = w.buf[i+1:]
	}
}

// Flush hands on what is left of an unterminated last line, with a
// newline added.
func (w *LineWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.Line(append(w.buf, '\n'))
	w.buf = nil
	return err
}
