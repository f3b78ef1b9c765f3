package worker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// The fence: a node's ranks may run only while its lease holds, on the
// agent's clock (docs/ARCHITECTURE.md, "Fencing"). The agent stops them
// itself when its deadline passes (Agent.fence), and so does a watchdog
// process it starts beside itself, which an agent that is frozen (stopped,
// stalled in the kernel, starved) cannot hold back: the agent tells the
// watchdog its deadline and its ranks' process groups over a pipe, and the
// watchdog kills those groups once the last deadline it heard of has
// passed. The deadline travels as CLOCK_MONOTONIC, which every process of
// the host shares and no clock step moves.
//
// The pipe carries lines:
//
//	deadline <monotonic ns>   the lease runs out then
//	ranks <pgid> <pgid> ...   the ranks' process groups now (none: no ranks)

// monotonic is CLOCK_MONOTONIC now.
func monotonic() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err)) // Linux always has it
	}
	return time.Duration(ts.Nano())
}

// RunFenceWatchdog is the watchdog: it reads the agent's lines from in
// until it closes, and kills the ranks' process groups (SIGKILL) whenever
// the deadline passes with ranks named. It says what it killed on log.
func RunFenceWatchdog(ctx context.Context, in io.Reader, log io.Writer) error {
	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		readErr <- sc.Err()
	}()
	var deadline time.Duration // monotonic; 0: none yet
	var ranks []int
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		var expired <-chan time.Time
		if deadline != 0 && len(ranks) > 0 {
			left := deadline - monotonic()
			if left <= 0 {
				for _, pg := range ranks {
					syscall.Kill(-pg, syscall.SIGKILL)
				}
				fmt.Fprintf(log, "fence: the lease deadline passed %s ago with ranks running: killed process groups %v\n", (-left).Round(time.Millisecond), ranks)
				ranks = nil
				continue
			}
			timer.Reset(left)
			expired = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			return err // the agent is gone, or done
		case <-expired:
		case line := <-lines:
			verb, rest, _ := strings.Cut(line, " ")
			switch verb {
			case "deadline":
				n, err := strconv.ParseInt(rest, 10, 64)
				if err != nil {
					return fmt.Errorf("fence: bad line %q", line)
				}
				deadline = time.Duration(n)
			case "ranks":
				ranks = ranks[:0]
				for _, f := range strings.Fields(rest) {
					pg, err := strconv.Atoi(f)
					if err != nil || pg <= 1 {
						return fmt.Errorf("fence: bad line %q", line)
					}
					ranks = append(ranks, pg)
				}
			default:
				return fmt.Errorf("fence: bad line %q", line)
			}
		}
	}
}

// fenceDog is the agent's side of the pipe. A nil *fenceDog does nothing
// (no FenceCommand).
type fenceDog struct {
	mu    sync.Mutex
	w     io.WriteCloser
	cmd   *exec.Cmd
	ranks map[int]bool
}

// startFenceDog starts argv as the node's watchdog: it dies with the agent
// (parent-death signal) and ends when the agent closes its pipe.
func startFenceDog(argv []string, log io.Writer) (*fenceDog, error) {
	if len(argv) == 0 {
		return nil, nil
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a terminal's ^C to the agent's group does not
	// end it before the agent is done with its ranks.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fence watchdog %s: %w", argv[0], err)
	}
	return &fenceDog{w: w, cmd: cmd, ranks: map[int]bool{}}, nil
}

// deadline tells the watchdog the lease's deadline, d on the wall clock.
func (wd *fenceDog) deadline(d time.Time) {
	if wd == nil {
		return
	}
	wd.send(fmt.Sprintf("deadline %d\n", int64(monotonic()+time.Until(d))))
}

// clear says no rank runs.
func (wd *fenceDog) clear() {
	if wd == nil {
		return
	}
	wd.mu.Lock()
	clear(wd.ranks)
	wd.mu.Unlock()
	wd.send("ranks\n")
}

// started adds a rank's process group to the watchdog's list (clear
// empties it once the run's ranks have exited).
func (wd *fenceDog) started(pgid int) {
	if wd == nil {
		return
	}
	wd.mu.Lock()
	wd.ranks[pgid] = true
	var b strings.Builder
	b.WriteString("ranks")
	for _, pg := range slices.Sorted(maps.Keys(wd.ranks)) {
		fmt.Fprintf(&b, " %d", pg)
	}
	wd.mu.Unlock()
	wd.send(b.String() + "\n")
}

func (wd *fenceDog) send(line string) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.w != nil {
		if _, err := io.WriteString(wd.w, line); err != nil {
			wd.w = nil // it died: the agent's own fence remains
		}
	}
}

// stop closes the pipe and waits for the watchdog to exit.
func (wd *fenceDog) stop() error {
	if wd == nil {
		return nil
	}
	wd.mu.Lock()
	if wd.w != nil {
		wd.w.Close()
		wd.w = nil
	}
	wd.mu.Unlock()
	err := wd.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("fence watchdog: %w", err)
	}
	return err
}

// leaseClock maps one Watch stream's coordinator clock onto the agent's:
// a renewal sent at s (the coordinator's clock) and read at r (the
// agent's) says the offset between the clocks is at most r-s; the smallest
// such difference over the stream's last renewals is the offset plus the
// quickest delivery. A renewal read late (buffered while the agent was
// stopped or starved) then counts from when it was sent, not from when it
// was read. Renewals without a send time (an older coordinator) count
// from when they are read.
// Its renewals come on the stream and through the node's relay
// (relayRenewal): it may be used from any goroutine.
type leaseClock struct {
	mu   sync.Mutex
	seen [32]time.Duration // the last renewals' r-s, a ring
	n    int
}

// deadline is the agent's lease deadline, on its wall clock, after the
// renewal asg read at recv.
func (c *leaseClock) deadline(asg *pb.Assignment, recv time.Time) time.Time {
	ttl := time.Duration(asg.LeaseTtlMs) * time.Millisecond
	if asg.SentUnixNanos == 0 {
		return recv.Add(ttl)
	}
	sent := time.Unix(0, asg.SentUnixNanos)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[c.n%len(c.seen)] = recv.Round(0).Sub(sent)
	c.n++
	return sent.Add(c.offsetLocked() + ttl)
}

// relayed is the deadline a renewal of ttlMs sent at sentNanos on the
// stream's coordinator clock, forwarded by the node's relay, gives: on the
// offset the stream's own renewals measured (one through the relay, later
// by its hop, is not a sample of it); false before the stream brought one.
func (c *leaseClock) relayed(ttlMs, sentNanos int64) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 || sentNanos == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, sentNanos).Add(c.offsetLocked() + time.Duration(ttlMs)*time.Millisecond), true
}

func (c *leaseClock) offsetLocked() time.Duration {
	offset := c.seen[0]
	for _, d := range c.seen[:min(c.n, len(c.seen))] {
		offset = min(offset, d)
	}
	return offset
}
