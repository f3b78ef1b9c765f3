package progress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		line string
		want Event
		err  bool
	}{
		{line: "step 5", want: Event{Kind: Step, Step: 5}},
		{line: "step 12 loss=2.5 seconds=0.25\r", want: Event{Kind: Step, Step: 12, Values: map[string]string{"loss": "2.5", "seconds": "0.25"}}},
		{line: "  checkpoint   7 ", want: Event{Kind: Checkpoint, Step: 7}},
		{line: "heartbeat", want: Event{Kind: Heartbeat}},
		{line: "acks", want: Event{Kind: Acks}},
		{line: "acks 3", err: true},
		{line: "", err: true},
		{line: "step", err: true},
		{line: "step -1", err: true},
		{line: "step x", err: true},
		{line: "step 3 loss", err: true},
		{line: "step 3 =1", err: true},
		{line: "checkpoint 3 loss=1", err: true},
		{line: "heartbeat 3", err: true},
		{line: "epoch 3", err: true},
		{line: "STEP 3", err: true},
	}
	for _, tc := range tests {
		got, err := Parse(tc.line)
		if tc.err {
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("Parse(%q) = %+v, %v; want ErrSyntax", tc.line, got, err)
			}
			continue
		}
		if err != nil || got.Kind != tc.want.Kind || got.Step != tc.want.Step || fmt.Sprint(got.Values) != fmt.Sprint(tc.want.Values) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
	e, _ := Parse("step 1 loss=0.1 bad=nan big=1e999 name=x")
	if f, ok := e.Float("loss"); !ok || f != 0.1 {
		t.Errorf("loss = %v %v", f, ok)
	}
	for _, k := range []string{"bad", "big", "name", "absent"} {
		if _, ok := e.Float(k); ok {
			t.Errorf("Float(%q) is a number", k)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"step 1 loss=2", "checkpoint 9", "heartbeat", "step 1 a=b=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		e, err := Parse(line)
		if err != nil {
			return
		}
		if e.Step < 0 || (e.Kind != Step && len(e.Values) > 0) {
			t.Fatalf("Parse(%q) = %+v", line, e)
		}
	})
}

// TestListener sends lines as a rank would (through Writer, and raw, with a
// line too long and a bad one between) and checks what the handler got.
func TestListener(t *testing.T) {
	type got struct {
		rank int
		e    Event
	}
	var mu sync.Mutex
	var events []got
	seen := make(chan struct{}, 16)
	l, err := Listen(t.TempDir(), []int{3, 4}, nil, func(rank int, e Event, _ time.Time) {
		mu.Lock()
		events = append(events, got{rank, e})
		mu.Unlock()
		seen <- struct{}{}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvPath, l.Path(3))
	w, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Step(1, KV{"loss", 0.1}, KV{"seconds", 1.0 / 3}); err != nil {
		t.Fatal(err)
	}
	w.Checkpoint(1)
	raw, err := net.Dial("unix", l.Path(4))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(raw, "%s\nnonsense\nheartbeat\nstep 2", strings.Repeat("x", 2*MaxLine))
	raw.Close()
	for range 4 {
		select {
		case <-seen:
		case <-time.After(time.Minute):
			t.Fatal("events did not arrive")
		}
	}
	w.Close()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.dir); !os.IsNotExist(err) {
		t.Errorf("socket directory left: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var s []string
	for _, g := range events {
		loss, _ := g.e.Float("loss")
		secs, _ := g.e.Float("seconds")
		s = append(s, fmt.Sprintf("%d %s %d %v %v", g.rank, g.e.Kind, g.e.Step, loss, secs == 1.0/3))
	}
	// Rank 3's lines arrive in order, rank 4's in order; the two interleave.
	var r3, r4 []string
	for _, x := range s {
		if x[0] == '3' {
			r3 = append(r3, x)
		} else {
			r4 = append(r4, x)
		}
	}
	if want := []string{"3 step 1 0.1 true", "3 checkpoint 1 0 false"}; fmt.Sprint(r3) != fmt.Sprint(want) {
		t.Errorf("rank 3: %q, want %q", r3, want)
	}
	if want := []string{"4 heartbeat 0 0 false", "4 step 2 0 false"}; fmt.Sprint(r4) != fmt.Sprint(want) {
		t.Errorf("rank 4: %q, want %q", r4, want)
	}
}

// TestAcks: a connection that said "acks" gets its rank's answers, in
// order; WaitStored returns once the step (or a later one) is answered, or
// the connection ends; another rank's answers do not reach it.
func TestAcks(t *testing.T) {
	checkpoints := make(chan int64, 4)
	l, err := Listen(t.TempDir(), []int{0, 1}, nil, func(rank int, e Event, _ time.Time) {
		if e.Kind == Checkpoint {
			checkpoints <- e.Step
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv(EnvPath, l.Path(0))
	w, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Acks(); err != nil {
		t.Fatal(err)
	}
	// The checkpoint line comes after "acks" on the same connection: once
	// it is handled, the connection is marked.
	w.Checkpoint(1)
	if n := <-checkpoints; n != 1 {
		t.Fatalf("checkpoint %d", n)
	}
	l.Stored(1, 1, true) // rank 1's: not this connection's
	l.Stored(0, 1, true)
	if err := w.WaitStored(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	// Not yet answered: WaitStored waits until its context ends.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := w.WaitStored(ctx, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitStored(2) before an answer = %v, want context.Canceled", err)
	}
	// "failed" answers too; a later step answers the ones before it.
	l.Stored(0, 3, false)
	if err := w.WaitStored(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	// An ended connection answers every wait: the rank goes on.
	l.Close()
	if err := w.WaitStored(t.Context(), 9); err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// TestWriterWithoutAgent: a program run outside gpucoord writes nothing
// and fails nothing.
func TestWriterWithoutAgent(t *testing.T) {
	t.Setenv(EnvPath, "")
	w, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Step(1); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestWaitStoredHeartbeats: a rank waiting for its agent's answer says
// "heartbeat" when it starts waiting and every HeartbeatEvery after: here
// the agent answers only after three, so WaitStored returns only if they
// came.
func TestWaitStoredHeartbeats(t *testing.T) {
	beats := make(chan struct{}, 16)
	checkpoints := make(chan int64, 1)
	l, err := Listen(t.TempDir(), []int{0}, nil, func(rank int, e Event, _ time.Time) {
		switch e.Kind {
		case Heartbeat:
			select {
			case beats <- struct{}{}:
			default:
			}
		case Checkpoint:
			checkpoints <- e.Step
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	w := dialRank0(t, l)
	w.HeartbeatEvery = time.Millisecond
	if err := w.Acks(); err != nil {
		t.Fatal(err)
	}
	w.Checkpoint(1)
	<-checkpoints
	go func() {
		for range 3 {
			<-beats
		}
		l.Stored(0, 1, true)
	}()
	if err := w.WaitStored(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
}

// TestCommitted: a connection that asked for answers hears of every newer
// commit; an older one, or the generation's own start, never lowers it.
func TestCommitted(t *testing.T) {
	checkpoints := make(chan int64, 1)
	l, err := Listen(t.TempDir(), []int{0}, nil, func(rank int, e Event, _ time.Time) {
		if e.Kind == Checkpoint {
			checkpoints <- e.Step
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	w := dialRank0(t, l)
	if err := w.Acks(); err != nil {
		t.Fatal(err)
	}
	w.SetCommitted(4) // the generation resumed after step 4
	// The agent reads "acks" before the checkpoint line on the same
	// connection: once it has the checkpoint, it answers this connection.
	w.Checkpoint(5)
	<-checkpoints
	l.Committed(7)
	l.Committed(6)
	l.Stored(0, 5, true)
	if err := w.WaitStored(t.Context(), 5); err != nil {
		t.Fatal(err)
	}
	if got := w.Committed(); got != 7 {
		t.Errorf("committed = %d, want 7 (the newest heard of)", got)
	}
	w.SetCommitted(5)
	if got := w.Committed(); got != 7 {
		t.Errorf("committed = %d after SetCommitted(5), want 7", got)
	}
}

// dialRank0 connects a Writer to l's rank 0, as a rank does through
// GPUCOORD_PROGRESS; both are closed when the test ends.
func dialRank0(t *testing.T, l *Listener) *Writer {
	t.Helper()
	t.Cleanup(func() { l.Close() })
	t.Setenv(EnvPath, l.Path(0))
	w, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestDrainReadsToTheEnd: a rank writes a step, the handler takes its time
// with it (a report tried again while a coordinator fails over), the rank
// writes three more and exits. Drained, then closed, the listener has
// handled all four: closing at once dropped the lines not yet read (the
// chaos test, seed 7: a job's last 4 steps never reported).
func TestDrainReadsToTheEnd(t *testing.T) {
	var mu sync.Mutex
	var steps []int64
	busy, release := make(chan struct{}), make(chan struct{})
	l, err := Listen(t.TempDir(), []int{0}, nil, func(_ int, e Event, _ time.Time) {
		if e.Step == 1 {
			close(busy)
			<-release
		}
		mu.Lock()
		steps = append(steps, e.Step)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", l.Path(0))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "step 1\n")
	<-busy // step 1 read and in the handler: the next lines stay in the socket
	fmt.Fprintf(c, "step 2\nstep 3\nstep 4\n")
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		l.Drain(ctx)
		l.Close()
	}()
	// Drain closes the rank's socket for new connections first: once it
	// refuses one, the handler may go on.
	for {
		d, err := net.Dial("unix", l.Path(0))
		if err != nil {
			break
		}
		d.Close()
		runtime.Gosched()
	}
	// The listener keeps the rank's connection (closing it would lose
	// steps 2-4): the rank reads nothing, not an end.
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the rank's connection while its lines wait: %v, want it open", err)
	}
	c.Close() // the rank exits
	close(release)
	<-drained
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(steps, []int64{1, 2, 3, 4}) {
		t.Errorf("handled steps %v, want 1 2 3 4", steps)
	}
}
