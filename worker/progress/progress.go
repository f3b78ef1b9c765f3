// Package progress is the channel a rank tells its agent how it is doing
// on: a one-line text protocol over a Unix socket whose path the rank finds
// in GPUCOORD_PROGRESS. Any language can speak it:
//
//	step N [key=value ...]   the rank finished step N (counted from 1);
//	                         known keys: loss, seconds, samples_per_sec,
//	                         compute_seconds (numbers)
//	checkpoint N             the rank has written all its files of step N
//	                         under GPUCOORD_CHECKPOINT_DIR/N
//	heartbeat                the rank is alive and busy (a long step)
//
// A line is at most MaxLine bytes. A rank may connect any number of times
// (a forked helper, a reconnect after a crash of the agent's reader); a
// line that does not parse is dropped and logged, and never stops the
// rank. A program that does not care never connects.
//
// # Concurrency
//
// A Listener calls its handler from one goroutine per connection; the
// handler must be safe for concurrent use.
package progress

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EnvPath names the environment variable that holds a rank's socket path.
const EnvPath = "GPUCOORD_PROGRESS"

// MaxLine is the longest line the agent reads, newline included.
const MaxLine = 4096

// Kind is what a line says.
type Kind int

// The kinds of lines.
const (
	Step Kind = iota + 1
	Checkpoint
	Heartbeat
)

func (k Kind) String() string {
	switch k {
	case Step:
		return "step"
	case Checkpoint:
		return "checkpoint"
	case Heartbeat:
		return "heartbeat"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is one parsed line.
type Event struct {
	Kind Kind
	// Step is the step a step or checkpoint line names; 0 for a heartbeat.
	Step int64
	// Values are a step line's key=value pairs.
	Values map[string]string
}

// Float returns the value of key as a number; false when it is absent or
// not a finite number.
func (e Event) Float(key string) (float64, bool) {
	s, ok := e.Values[key]
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// ErrSyntax marks a line that is not in the protocol.
var ErrSyntax = errors.New("progress: not a protocol line")

// Parse reads one line (without its newline; a trailing \r is allowed).
func Parse(line string) (Event, error) {
	line = strings.TrimSuffix(line, "\r")
	f := strings.Fields(line)
	if len(f) == 0 {
		return Event{}, fmt.Errorf("%w: empty line", ErrSyntax)
	}
	switch f[0] {
	case "heartbeat":
		if len(f) > 1 {
			return Event{}, fmt.Errorf("%w: heartbeat takes nothing after it", ErrSyntax)
		}
		return Event{Kind: Heartbeat}, nil
	case "step", "checkpoint":
		if len(f) < 2 {
			return Event{}, fmt.Errorf("%w: %s needs a step number", ErrSyntax, f[0])
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || n < 0 {
			return Event{}, fmt.Errorf("%w: step %q is not a number of at least 0", ErrSyntax, f[1])
		}
		e := Event{Kind: Step, Step: n}
		if f[0] == "checkpoint" {
			if len(f) > 2 {
				return Event{}, fmt.Errorf("%w: checkpoint takes only a step number", ErrSyntax)
			}
			e.Kind = Checkpoint
			return e, nil
		}
		for _, kv := range f[2:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" || v == "" {
				return Event{}, fmt.Errorf("%w: %q is not key=value", ErrSyntax, kv)
			}
			if e.Values == nil {
				e.Values = map[string]string{}
			}
			e.Values[k] = v
		}
		return e, nil
	}
	return Event{}, fmt.Errorf("%w: unknown word %q (want step, checkpoint or heartbeat)", ErrSyntax, f[0])
}

// Handler receives each rank's events with the time they were read.
type Handler func(rank int, e Event, at time.Time)

// Listener serves one socket per local rank of a generation.
type Listener struct {
	dir    string
	paths  map[int]string
	lns    []net.Listener
	log    *slog.Logger
	handle Handler

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Listen makes a private directory under parent (the system's temporary
// directory when empty: a socket path must be short) with a socket for each
// rank, and serves them until Close.
func Listen(parent string, ranks []int, log *slog.Logger, handle Handler) (*Listener, error) {
	dir, err := os.MkdirTemp(parent, "gcp")
	if err != nil {
		return nil, fmt.Errorf("progress: %w", err)
	}
	l := &Listener{dir: dir, paths: map[int]string{}, log: log, handle: handle, conns: map[net.Conn]struct{}{}}
	for _, r := range ranks {
		path := filepath.Join(dir, strconv.Itoa(r))
		ln, err := net.Listen("unix", path)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("progress: %w", err)
		}
		l.paths[r] = path
		l.lns = append(l.lns, ln)
		l.wg.Add(1)
		go l.accept(r, ln)
	}
	return l, nil
}

// Path returns rank's socket path: its GPUCOORD_PROGRESS.
func (l *Listener) Path(rank int) string { return l.paths[rank] }

func (l *Listener) accept(rank int, ln net.Listener) {
	defer l.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.conns == nil {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(rank, c)
	}
}

func (l *Listener) serve(rank int, c net.Conn) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, MaxLine)
	bad := 0
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Too long: drop the rest of the line.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			l.warn(&bad, rank, fmt.Errorf("%w: a line longer than %d bytes", ErrSyntax, MaxLine))
			if err != nil {
				return
			}
			continue
		}
		if len(line) > 0 {
			if e, perr := Parse(strings.TrimSuffix(string(line), "\n")); perr != nil {
				l.warn(&bad, rank, perr)
			} else {
				l.handle(rank, e, time.Now())
			}
		}
		if err != nil {
			return
		}
	}
}

// warn logs the first few bad lines of a connection.
func (l *Listener) warn(bad *int, rank int, err error) {
	if *bad++; *bad <= 3 && l.log != nil {
		l.log.Warn("progress line dropped", "rank", rank, "err", err)
	}
}

// Close stops serving, closes every connection, waits for the handlers and
// removes the sockets.
func (l *Listener) Close() error {
	for _, ln := range l.lns {
		ln.Close()
	}
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.conns = nil
	l.mu.Unlock()
	l.wg.Wait()
	return os.RemoveAll(l.dir)
}

// Writer is the rank's side for Go programs: it sends lines to the agent.
// Its methods are safe for concurrent use; with no GPUCOORD_PROGRESS they
// do nothing.
type Writer struct {
	mu sync.Mutex
	c  net.Conn
}

// Dial connects to the socket GPUCOORD_PROGRESS names; a Writer that does
// nothing when it is unset.
func Dial() (*Writer, error) {
	path := os.Getenv(EnvPath)
	if path == "" {
		return &Writer{}, nil
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("progress: %s: %w", EnvPath, err)
	}
	return &Writer{c: c}, nil
}

// Step says the rank finished step n; values are written in the order
// given, as key=value with numbers in their shortest exact form.
func (w *Writer) Step(n int64, values ...KV) error {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d", n)
	for _, kv := range values {
		fmt.Fprintf(&b, " %s=%s", kv.Key, strconv.FormatFloat(kv.Value, 'g', -1, 64))
	}
	return w.line(b.String())
}

// Checkpoint says the rank has written its files of step n.
func (w *Writer) Checkpoint(n int64) error { return w.line(fmt.Sprintf("checkpoint %d", n)) }

// Heartbeat says the rank is alive.
func (w *Writer) Heartbeat() error { return w.line("heartbeat") }

// KV is a step line's number.
type KV struct {
	Key   string
	Value float64
}

func (w *Writer) line(s string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		return nil
	}
	_, err := w.c.Write([]byte(s + "\n"))
	return err
}

// Close closes the connection.
func (w *Writer) Close() error {
	if w.c == nil {
		return nil
	}
	return w.c.Close()
}
