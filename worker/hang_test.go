package worker

import (
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/worker/progress"
)

func TestHangTimeout(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name      string
		spec      time.Duration
		intervals []time.Duration
		want      time.Duration
	}{
		{"the job's own", 3 * time.Second, []time.Duration{time.Hour}, 3 * time.Second},
		{"no step yet: the floor", 0, nil, 30 * time.Second},
		{"fast steps: the floor", 0, []time.Duration{ms(40), ms(50), ms(45)}, 30 * time.Second},
		// Odd count: the middle one, 5 s; 10 x 5 s = 50 s.
		{"slow steps: 10 x the median", 0, []time.Duration{ms(4000), ms(9000), ms(5000)}, 50 * time.Second},
		// Even count: (4 s + 6 s) / 2 = 5 s; one outlier does not move it.
		{"even count: the mean of the middle two", 0, []time.Duration{ms(4000), ms(6000), ms(3000), ms(600000)}, 50 * time.Second},
	}
	for _, tc := range tests {
		if got := hangTimeout(tc.spec, tc.intervals); got != tc.want {
			t.Errorf("%s: hangTimeout = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestStalled(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	ranks := []rankProgress{
		{rank: 3, step: 7, last: ago(4 * time.Second)},
		{rank: 1, step: 8, last: ago(500 * time.Millisecond)},
		{rank: 2, step: 0}, // never spoke: not watched
		{rank: 0, step: 7, last: ago(3*time.Second + 1)}, // just past
		{rank: 4, step: 7, last: ago(3 * time.Second)},   // exactly the timeout: not yet
		{rank: 5, step: 0, last: ago(time.Minute)},       // a heartbeat, no step yet
	}
	var got []int
	for _, r := range stalled(ranks, now, 3*time.Second) {
		got = append(got, r.rank)
	}
	if want := []int{0, 3, 5}; !equalInts(got, want) {
		t.Errorf("stalled = %v, want %v", got, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestWatchdog: lines move a rank's progress, step intervals make the
// derived timeout, a hang is found once.
func TestWatchdog(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	w := newWatchdog(0, []int{0, 1})
	// Rank 0 takes 10 s a step: the derived timeout is 100 s.
	for i := range 4 {
		w.saw(0, progress.Event{Kind: progress.Step, Step: int64(i + 1)}, t0.Add(time.Duration(i)*10*time.Second))
	}
	w.saw(1, progress.Event{Kind: progress.Heartbeat}, t0.Add(30*time.Second))
	w.saw(7, progress.Event{Kind: progress.Heartbeat}, t0) // not this run's: ignored
	if s, timeout := w.check(t0.Add(100 * time.Second)); len(s) != 0 || timeout != 100*time.Second {
		t.Fatalf("at 100 s: stalled %v timeout %s, want none and 100s", s, timeout)
	}
	// A heartbeat keeps rank 1 alive without a step.
	w.saw(1, progress.Event{Kind: progress.Heartbeat}, t0.Add(90*time.Second))
	s, _ := w.check(t0.Add(131 * time.Second))
	if len(s) != 1 || s[0].rank != 0 || s[0].step != 4 {
		t.Fatalf("at 131 s: stalled %+v, want rank 0 after step 4", s)
	}
	if !w.found() {
		t.Error("found() = false after a hang")
	}
	if s, _ := w.check(t0.Add(time.Hour)); len(s) != 0 {
		t.Errorf("a second hang reported: %+v", s)
	}
}

// TestProcessStopped reads a real process's state.
func TestProcessStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if processStopped(cmd.Process.Pid) {
		t.Error("a sleeping process reads as stopped")
	}
	pid := cmd.Process.Pid
	var ws syscall.WaitStatus
	syscall.Kill(pid, syscall.SIGSTOP)
	// Wait4 with WUNTRACED returns once the child has stopped.
	if _, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil); err != nil || !ws.Stopped() {
		t.Fatalf("wait for the stop: %v, status %v", err, ws)
	}
	if !processStopped(pid) {
		t.Error("a stopped process does not read as stopped")
	}
	syscall.Kill(pid, syscall.SIGCONT)
	if _, err := syscall.Wait4(pid, &ws, syscall.WCONTINUED, nil); err != nil || !ws.Continued() {
		t.Fatalf("wait for the continue: %v, status %v", err, ws)
	}
	if processStopped(pid) {
		t.Error("a continued process reads as stopped")
	}
	if processStopped(1 << 30) {
		t.Error("no such process reads as stopped")
	}
}

// TestStackCapture keeps what the rank printed since its last progress
// and what comes after the request, up to StacksEnd, and marks a capture
// cut at maxStack.
func TestStackCapture(t *testing.T) {
	var tail outputTail
	t0 := time.Unix(1000, 0)
	tail.add([]byte("before\n"), t0)
	tail.add([]byte("Traceback (most recent call last):\n"), t0.Add(3*time.Second))
	tail.add([]byte("RuntimeError: Connection closed by peer\n"), t0.Add(3*time.Second))
	c := tail.capture(t0.Add(time.Second)) // its last progress
	tail.add([]byte("goroutine 1 [IO wait]:\n"), t0.Add(4*time.Second))
	tail.add([]byte("main.main()\n"), t0.Add(4*time.Second))
	tail.add([]byte(StacksEnd+"\n"), t0.Add(4*time.Second))
	tail.add([]byte("after\n"), t0.Add(5*time.Second))
	select {
	case <-c.done:
	default:
		t.Fatal("capture not done at StacksEnd")
	}
	if got, want := c.String(), "Traceback (most recent call last):\nRuntimeError: Connection closed by peer\ngoroutine 1 [IO wait]:\nmain.main()"; got != want {
		t.Errorf("stacks = %q, want %q", got, want)
	}
	dump := tail.capture(t0.Add(time.Hour)) // nothing printed since
	dump.add([]byte("Thread 1 (idle)\n    recv (checkpointed.py:146)\n"))
	dump.finish()
	if got, want := dump.String(), "Thread 1 (idle)\n    recv (checkpointed.py:146)"; got != want {
		t.Errorf("py-spy's dump = %q, want %q", got, want)
	}
	big := tail.capture(t0.Add(time.Hour))
	line := []byte(strings.Repeat("x", 1000) + "\n")
	for range 20 {
		tail.add(line, t0.Add(time.Hour))
	}
	big.finish()
	if s := big.String(); len(s) > maxStack+100 || !strings.HasSuffix(s, "(the rest is in the agent's output)") {
		t.Errorf("a long capture: %d bytes ending %q", len(s), s[max(0, len(s)-50):])
	}
}

// TestAnswerStacks: a SIGQUIT the process took before the rank ends is
// answered (every goroutine's stack, then StacksEnd) before answerStacks'
// stop returns, however soon after the signal it is called.
func TestAnswerStacks(t *testing.T) {
	// The test's own channel says when the runtime took the signal, and
	// keeps a SIGQUIT after stop from ending the test binary.
	seen := make(chan os.Signal, 1)
	signal.Notify(seen, syscall.SIGQUIT)
	defer signal.Stop(seen)
	for i := range 20 {
		var w bytes.Buffer
		stop := answerStacks(&w)
		if err := syscall.Kill(os.Getpid(), syscall.SIGQUIT); err != nil {
			t.Fatal(err)
		}
		select {
		case <-seen:
		case <-time.After(time.Minute):
			t.Fatal("SIGQUIT not taken in a minute")
		}
		stop()
		if out := w.String(); !strings.Contains(out, "TestAnswerStacks") || !strings.HasSuffix(out, StacksEnd+"\n") {
			t.Fatalf("try %d: no stacks and StacksEnd before stop returned: %q", i, out)
		}
	}
}
