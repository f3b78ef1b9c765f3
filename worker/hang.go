package worker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/progress"
)

// Hang detection: a rank that has spoken the progress protocol and then
// says nothing (no step, checkpoint or heartbeat line) for the hang
// timeout is hung. Its agent asks it for its stacks, reports it failed
// with them (code HangCode), and the generation ends like any failure.
const (
	// HangCode is the exit code of a hung rank's report (timeout(1)'s).
	HangCode = 124
	// minHangTimeout is the shortest derived timeout, and the timeout
	// before any step has been timed.
	minHangTimeout = 30 * time.Second
	// hangFactor times the median step interval is the derived timeout.
	hangFactor = 10
	// stepWindow is how many recent step intervals the median is of.
	stepWindow = 32
	// stackWait is how long a rank has to print its stacks once asked.
	stackWait = 5 * time.Second
	// hangTick is how often the watchdog looks.
	hangTick = 200 * time.Millisecond
	// maxStack is how much of a hung rank's stacks its report carries
	// (its agent's output has all of them).
	maxStack = 16 << 10
	// StacksEnd is the line a native rank prints after its stacks, when
	// asked for them with SIGQUIT (it then goes on waiting).
	StacksEnd = "gpucoord: end of stacks"
)

// rankProgress is one rank's progress as the watchdog sees it.
type rankProgress struct {
	rank int
	step int64     // the last step it finished, 0 before any
	last time.Time // when it last said anything; zero before its first line
}

// hangTimeout is a job's hang timeout: the spec's when it gives one, else
// hangFactor times the median of recent step intervals, and never less
// than minHangTimeout.
func hangTimeout(spec time.Duration, intervals []time.Duration) time.Duration {
	if spec > 0 {
		return spec
	}
	if len(intervals) == 0 {
		return minHangTimeout
	}
	s := slices.Clone(intervals)
	slices.Sort(s)
	median := s[len(s)/2]
	if len(s)%2 == 0 {
		median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return max(minHangTimeout, hangFactor*median)
}

// stalled returns the ranks silent for longer than timeout at now, by rank.
// A rank that has never spoken is not watched: a program that does not
// speak the protocol is never hung.
func stalled(ranks []rankProgress, now time.Time, timeout time.Duration) []rankProgress {
	var out []rankProgress
	for _, r := range ranks {
		if !r.last.IsZero() && now.Sub(r.last) > timeout {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b rankProgress) int { return a.rank - b.rank })
	return out
}

// watchdog follows a run's ranks' progress lines and finds hangs.
type watchdog struct {
	spec time.Duration // the job's hang timeout, 0 to derive it

	mu        sync.Mutex
	ranks     map[int]*rankProgress
	intervals []time.Duration // recent step intervals, of any rank
	hung      bool            // a hang was found (and is being reported)
}

func newWatchdog(spec time.Duration, local []int) *watchdog {
	w := &watchdog{spec: spec, ranks: map[int]*rankProgress{}}
	for _, r := range local {
		w.ranks[r] = &rankProgress{rank: r}
	}
	return w
}

// saw takes one rank's progress line (a progress.Handler).
func (w *watchdog) saw(rank int, e progress.Event, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.ranks[rank]
	if r == nil {
		return
	}
	if e.Kind == progress.Step {
		if !r.last.IsZero() && e.Step > r.step {
			w.intervals = append(w.intervals, at.Sub(r.last))
			if len(w.intervals) > stepWindow {
				w.intervals = w.intervals[len(w.intervals)-stepWindow:]
			}
		}
		r.step = max(r.step, e.Step)
	}
	r.last = at
}

// check returns the stalled ranks at now, once: after a hang is found the
// watchdog looks no more.
func (w *watchdog) check(now time.Time) ([]rankProgress, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hung {
		return nil, 0
	}
	all := make([]rankProgress, 0, len(w.ranks))
	for _, r := range w.ranks {
		all = append(all, *r)
	}
	timeout := hangTimeout(w.spec, w.intervals)
	s := stalled(all, now, timeout)
	w.hung = len(s) > 0
	return s, timeout
}

// found says whether the watchdog found a hang.
func (w *watchdog) found() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hung
}

// run looks every hangTick until the ranks are done or ctx ends; on a
// hang it has the agent capture the stalled ranks' stacks and report them
// hung, and returns.
func (w *watchdog) run(ctx context.Context, done <-chan struct{}, onHang func([]rankProgress, time.Duration)) {
	t := time.NewTicker(hangTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case now := <-t.C:
			if s, timeout := w.check(now); len(s) > 0 {
				onHang(s, timeout)
				return
			}
		}
	}
}

// hungRank is a stalled rank being asked for its stacks.
type hungRank struct {
	rankProgress
	pid     int
	stopped bool
	stack   *stackCapture
}

// reportHang asks each stalled rank for its stacks, waits for them all (at
// most stackWait, or until the ranks are gone), then kills them (a stopped
// rank continued to answer must not go on), and reports each rank hung.
// None is killed before every one has answered: a rank's end would end
// the node's others (localproc stops them) before their stacks are out.
func (a *Agent) reportHang(ctx context.Context, asg *pb.Assignment, ranks []rankProgress, timeout time.Duration,
	pid func(rank int) int, tails map[int]*outputTail, exited <-chan struct{}) {
	native := len(asg.Spec.GetCommand()) == 0
	now := time.Now()
	hung := make([]*hungRank, len(ranks))
	for i, r := range ranks {
		h := &hungRank{rankProgress: r, pid: pid(r.rank), stack: tails[r.rank].capture(r.last)}
		h.stopped = h.pid > 0 && processStopped(h.pid)
		hung[i] = h
	}
	a.log.Warn("ranks hung: capturing their stacks", "job", asg.Job, "generation", asg.Generation.GetNumber(),
		"ranks", len(hung), "timeout", timeout)
	pySpy, _ := exec.LookPath("py-spy")
	var wg sync.WaitGroup
	for _, h := range hung {
		if h.pid <= 0 {
			h.stack.finish()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			askStacks(ctx, h, native, pySpy, exited)
		}()
	}
	wg.Wait()
	for _, h := range hung {
		if h.pid > 0 {
			syscall.Kill(-h.pid, syscall.SIGKILL)
		}
	}
	for _, h := range hung {
		idle := now.Sub(h.last)
		why := fmt.Sprintf("hung: no progress for %s after step %d (hang timeout %s)", idle.Round(100*time.Millisecond), h.step, timeout)
		if h.stopped {
			why += "; its process was stopped (state T)"
		}
		a.reportExit(ctx, asg, &pb.RankExit{Rank: int32(h.rank), Code: HangCode, Error: why, FailedAtUnixMs: h.last.UnixMilli(),
			Output: h.stack.String(), Hang: &pb.Hang{LastStep: h.step, IdleMs: idle.Milliseconds(), Stopped: h.stopped, FoundUnixMs: now.UnixMilli()}})
	}
}

// askStacks gets one hung rank's stacks into its capture: py-spy's dump
// of a program when py-spy is installed; else a signal the rank answers
// by printing them: SIGQUIT for a native rank (which prints StacksEnd
// after them), SIGABRT for a program (Python's faulthandler, enabled
// through PYTHONFAULTHANDLER, prints them and the rank ends). A stopped
// rank is continued to answer. reportHang kills it after.
func askStacks(ctx context.Context, h *hungRank, native bool, pySpy string, exited <-chan struct{}) {
	defer h.stack.finish()
	if !native && pySpy != "" {
		cctx, cancel := context.WithTimeout(ctx, stackWait)
		out, err := exec.CommandContext(cctx, pySpy, "dump", "--pid", strconv.Itoa(h.pid)).CombinedOutput()
		cancel()
		if err == nil {
			h.stack.add(out)
			return
		}
	}
	if native {
		syscall.Kill(h.pid, syscall.SIGQUIT)
	} else {
		syscall.Kill(-h.pid, syscall.SIGABRT)
	}
	if h.stopped {
		syscall.Kill(-h.pid, syscall.SIGCONT)
	}
	t := time.NewTimer(stackWait)
	defer t.Stop()
	select {
	case <-h.stack.done:
	case <-exited:
	case <-t.C:
	case <-ctx.Done():
	}
}

// processStopped says whether process pid is stopped (state T or t in
// /proc/PID/stat).
func processStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'T' || b[i+2] == 't'
}

// stackCapture collects what a rank prints once asked for its stacks, up
// to maxStack bytes, until StacksEnd or finish.
type stackCapture struct {
	mu   sync.Mutex
	buf  []byte
	over bool
	done chan struct{} // closed at StacksEnd or finish
	once sync.Once
}

// line takes one line the rank printed.
func (c *stackCapture) line(l []byte) {
	if bytes.Equal(bytes.TrimRight(l, "\r\n"), []byte(StacksEnd)) {
		c.finish()
		return
	}
	c.append(string(l))
}

// append keeps one line, unless the capture is done or full.
func (c *stackCapture) append(l string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isDone() {
		return
	}
	if len(c.buf)+len(l)+1 > maxStack {
		c.over = true
		return
	}
	c.buf = append(c.buf, strings.TrimRight(l, "\r\n")...)
	c.buf = append(c.buf, '\n')
}

// add keeps the lines of b (py-spy's dump), as far as they fit.
func (c *stackCapture) add(b []byte) {
	for l := range strings.Lines(string(b)) {
		c.append(l)
	}
}

func (c *stackCapture) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *stackCapture) finish() { c.once.Do(func() { close(c.done) }) }

// String returns the stacks captured, marked when cut short.
func (c *stackCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := string(bytes.TrimRight(c.buf, "\n"))
	if c.over {
		s += "\n... (the rest is in the agent's output)"
	}
	return s
}
