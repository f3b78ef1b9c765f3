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
//	acks                     answer my checkpoint lines (below)
//
// A connection that said "acks" gets one line back for each of its rank's
// checkpoint lines once the agent is done with that step: "stored N" when
// its copies are in place and reported, "failed N" when they could not be
// (the agent gave up on that step; a later one may still be stored). The
// native engine waits for "stored N" before it trains past step N+1, so
// that a failure loses at most the step in flight; while it waits it
// says "heartbeat" (Writer.WaitStored), so that a slow replication is not
// taken for a hung rank. The agent gives each replica a deadline, so the
// answer comes. Such a connection also gets "committed N" whenever the
// agent hears of a newer commit of the job: a rank that prunes its own
// checkpoints keeps step N and every later one (a rank cut off from its
// coordinators hears of none, so it never removes what a generation that
// replaces it may restore).
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
	"cmp"
	"context"
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
	"sync/atomic"
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
	Acks
)

func (k Kind) String() string {
	switch k {
	case Step:
		return "step"
	case Checkpoint:
		return "checkpoint"
	case Heartbeat:
		return "heartbeat"
	case Acks:
		return "acks"
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
	case "heartbeat", "acks":
		if len(f) > 1 {
			return Event{}, fmt.Errorf("%w: %s takes nothing after it", ErrSyntax, f[0])
		}
		if f[0] == "acks" {
			return Event{Kind: Acks}, nil
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
	return Event{}, fmt.Errorf("%w: unknown word %q (want step, checkpoint, heartbeat or acks)", ErrSyntax, f[0])
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
	conns map[net.Conn]int // each connection's rank, -1 until it says "acks"
	wg    sync.WaitGroup
}

// ackTimeout bounds a write of an answer: a rank that asked for answers and
// stopped reading them loses them, it never stalls the agent.
const ackTimeout = time.Second

// Stored answers rank's connections that asked for answers: its
// checkpoint of step is stored (ok) or failed.
func (l *Listener) Stored(rank int, step int64, ok bool) {
	word := "stored"
	if !ok {
		word = "failed"
	}
	line := []byte(fmt.Sprintf("%s %d\n", word, step))
	l.mu.Lock()
	var cs []net.Conn
	for c, r := range l.conns {
		if r == rank {
			cs = append(cs, c)
		}
	}
	l.mu.Unlock()
	for _, c := range cs {
		c.SetWriteDeadline(time.Now().Add(ackTimeout))
		c.Write(line)
	}
}

// Committed tells every connection that asked for answers that step is the
// job's last commit.
func (l *Listener) Committed(step int64) {
	line := []byte(fmt.Sprintf("committed %d\n", step))
	l.mu.Lock()
	var cs []net.Conn
	for c, r := range l.conns {
		if r >= 0 {
			cs = append(cs, c)
		}
	}
	l.mu.Unlock()
	for _, c := range cs {
		c.SetWriteDeadline(time.Now().Add(ackTimeout))
		c.Write(line)
	}
}

// Listen makes a private directory under parent (the system's temporary
// directory when empty: a socket path must be short) with a socket for each
// rank, and serves them until Close.
func Listen(parent string, ranks []int, log *slog.Logger, handle Handler) (*Listener, error) {
	dir, err := os.MkdirTemp(parent, "gcp")
	if err != nil {
		return nil, fmt.Errorf("progress: %w", err)
	}
	l := &Listener{dir: dir, paths: map[int]string{}, log: log, handle: handle, conns: map[net.Conn]int{}}
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
		l.conns[c] = -1
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
			switch e, perr := Parse(strings.TrimSuffix(string(line), "\n")); {
			case perr != nil:
				l.warn(&bad, rank, perr)
			case e.Kind == Acks:
				l.mu.Lock()
				if _, ok := l.conns[c]; ok {
					l.conns[c] = rank
				}
				l.mu.Unlock()
			default:
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
// Drain stops taking connections and waits, until ctx is done, for the
// ranks' connections to end by themselves (a rank that exited closed its
// own): what they wrote before they exited is read and handled, however
// long a handler took with the lines before (a report tried again while a
// coordinator fails over). Close then ends what is left.
func (l *Listener) Drain(ctx context.Context) {
	for _, ln := range l.lns {
		ln.Close()
	}
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

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

// Writer is the rank's side for Go programs: it sends lines to the agent
// and, after Acks, reads its answers. Its methods are safe for concurrent
// use; with no GPUCOORD_PROGRESS they do nothing.
type Writer struct {
	// HeartbeatEvery is how often WaitStored says "heartbeat" while it
	// waits (it says one when it starts waiting); 0 means
	// DefaultHeartbeatEvery. Set it before the first WaitStored.
	HeartbeatEvery time.Duration

	mu sync.Mutex
	c  net.Conn

	// The answers read, once Acks has started reading them.
	amu       sync.Mutex
	acked     int64         // the newest step answered
	committed atomic.Int64  // the job's newest commit heard of
	answer    chan struct{} // closed and replaced at each answer
	gone      bool          // the connection ended
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
	return &Writer{c: c, answer: make(chan struct{})}, nil
}

// Acks asks the agent to answer each checkpoint line, and reads the
// answers until the connection ends (WaitStored waits for them).
func (w *Writer) Acks() error {
	if w.c == nil {
		return nil
	}
	if err := w.line("acks"); err != nil {
		return err
	}
	go w.readAnswers()
	return nil
}

func (w *Writer) readAnswers() {
	r := bufio.NewScanner(w.c)
	for r.Scan() {
		f := strings.Fields(r.Text())
		if len(f) != 2 || f[0] != "stored" && f[0] != "failed" && f[0] != "committed" {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		if f[0] == "committed" {
			for old := w.committed.Load(); n > old && !w.committed.CompareAndSwap(old, n); old = w.committed.Load() {
			}
			continue
		}
		w.amu.Lock()
		if n > w.acked {
			w.acked = n
			close(w.answer)
			w.answer = make(chan struct{})
		}
		w.amu.Unlock()
	}
	w.amu.Lock()
	w.gone = true
	close(w.answer)
	w.amu.Unlock()
}

// DefaultHeartbeatEvery is how often a rank waiting for its agent says
// it is alive: well within the shortest derived hang timeout (30 s).
const DefaultHeartbeatEvery = time.Second

// WaitStored waits until the agent has answered the checkpoint of step
// (stored or failed), the connection has ended, or ctx ends (its error).
// While it waits it says "heartbeat" at once and every HeartbeatEvery: the
// rank is alive, its agent is busy. Without a connection it returns at
// once.
func (w *Writer) WaitStored(ctx context.Context, step int64) error {
	if w.c == nil {
		return nil
	}
	var tick <-chan time.Time
	for {
		w.amu.Lock()
		done, answer := w.acked >= step || w.gone, w.answer
		w.amu.Unlock()
		if done {
			return nil
		}
		if tick == nil {
			t := time.NewTicker(cmp.Or(w.HeartbeatEvery, DefaultHeartbeatEvery))
			defer t.Stop()
			tick = t.C
			w.Heartbeat()
		}
		select {
		case <-answer:
		case <-tick:
			w.Heartbeat()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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

// Committed is the job's newest commit the agent has told of (after
// Acks), or since when the rank's generation resumed (SetCommitted).
func (w *Writer) Committed() int64 { return w.committed.Load() }

// SetCommitted sets what Committed says before the agent has told of a
// commit: the step the rank's generation resumed after.
func (w *Writer) SetCommitted(step int64) {
	for old := w.committed.Load(); step > old && !w.committed.CompareAndSwap(old, step); old = w.committed.Load() {
	}
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
