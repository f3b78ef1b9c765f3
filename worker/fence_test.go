package worker

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// sleeper starts a process in its own process group, as a rank is.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// TestFenceWatchdog: the watchdog kills the ranks' process groups once the
// last deadline it heard of passes, whatever the agent does meanwhile (it
// writes nothing more, as a frozen agent), and kills nothing when the pipe
// closes before the deadline.
func TestFenceWatchdog(t *testing.T) {
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- RunFenceWatchdog(t.Context(), r, t.Output()) }()
	rank := sleeper(t)
	fmt.Fprintf(w, "ranks %d\n", rank.Process.Pid)
	fmt.Fprintf(w, "deadline %d\n", int64(monotonic()+50*time.Millisecond))
	err := rank.Wait()
	if ws, ok := rank.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("rank ended with %v, want killed by the watchdog (SIGKILL)", err)
	}

	// A deadline far off, then the agent closes the pipe: the watchdog
	// ends and the rank lives.
	other := sleeper(t)
	fmt.Fprintf(w, "ranks %d\n", other.Process.Pid)
	fmt.Fprintf(w, "deadline %d\n", int64(monotonic()+time.Hour))
	w.Close()
	if err := <-done; err != nil {
		t.Fatalf("watchdog: %v", err)
	}
	if err := syscall.Kill(other.Process.Pid, 0); err != nil {
		t.Fatalf("the rank did not outlive a watchdog whose deadline had not passed: %v", err)
	}
}

// TestFenceWatchdogBadLine: a line the agent cannot have written ends the
// watchdog with an error naming it.
func TestFenceWatchdogBadLine(t *testing.T) {
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- RunFenceWatchdog(context.Background(), r, io.Discard) }()
	fmt.Fprintf(w, "ranks 1\n")
	if err := <-done; err == nil {
		t.Fatal("ranks 1 (init's group) was taken")
	}
}

// TestLeaseClock: a renewal counts from when it was sent, mapped onto the
// agent's clock by the smallest difference seen on the stream, so that
// renewals read late (buffered while the agent was stopped) do not move
// the deadline past the lease's real end.
func TestLeaseClock(t *testing.T) {
	const ttl = 5 * time.Second
	coord := time.Unix(1_800_000_000, 0) // the coordinator's clock
	skew := 3 * time.Second              // the agent's clock is this far ahead
	renewal := func(sent time.Time) *pb.Assignment {
		return &pb.Assignment{Renewal: true, LeaseTtlMs: ttl.Milliseconds(), SentUnixNanos: sent.UnixNano()}
	}
	var c leaseClock
	tests := []struct {
		name      string
		sent      time.Duration // after coord
		delivered time.Duration // after sent
		want      time.Duration // the deadline after coord, on the coordinator's clock
	}{
		{name: "first renewal, 2ms on the wire", sent: 0, delivered: 2 * time.Millisecond, want: ttl + 2*time.Millisecond},
		{name: "a quicker one", sent: time.Second, delivered: time.Millisecond, want: time.Second + ttl + time.Millisecond},
		{name: "read 20s late, after a stop", sent: 2 * time.Second, delivered: 20 * time.Second, want: 2*time.Second + ttl + time.Millisecond},
	}
	for _, tc := range tests {
		sent := coord.Add(tc.sent)
		got := c.deadline(renewal(sent), sent.Add(tc.delivered).Add(skew))
		if want := coord.Add(tc.want).Add(skew); !got.Equal(want) {
			t.Errorf("%s: deadline %s after the start, want %s", tc.name, got.Sub(coord.Add(skew)), tc.want)
		}
	}
	// Without a send time (an older coordinator): from when it is read.
	read := time.Unix(1_900_000_000, 0)
	if got := c.deadline(&pb.Assignment{LeaseTtlMs: ttl.Milliseconds()}, read); !got.Equal(read.Add(ttl)) {
		t.Errorf("a renewal without a send time: deadline %s, want %s", got, read.Add(ttl))
	}
}
