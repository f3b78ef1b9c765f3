package main

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// Fencing: a node lost by silence (cut off, or its agent frozen) may run
// its ranks until its lease ends on its own clock; no generation of the
// job opens before, so no two generations' ranks of a job are ever alive
// at once. These tests watch every rank process of the machine (the hosts
// of the cluster in a box share its process table) and measure how long
// ranks of two generations of the job were alive together: zero.

// overlapWatch samples, every period, the generation of every live rank
// process of one job (its environment's TORCHELASTIC_RUN_ID and
// GPUCOORD_GENERATION), and keeps the longest run of samples that saw
// two generations alive at once.
type overlapWatch struct {
	job  string
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples int
	gens    map[int64]bool // every generation seen alive
	worst   time.Duration  // longest span with two generations alive
	since   time.Time      // start of the current span; zero outside one
	seen    string         // the generations of the worst span's first sample
}

const overlapPeriod = 20 * time.Millisecond

func watchOverlap(t *testing.T, job string) *overlapWatch {
	t.Helper()
	o := &overlapWatch{job: job, stop: make(chan struct{}), done: make(chan struct{}), gens: map[int64]bool{}}
	go o.run()
	t.Cleanup(o.end)
	return o
}

func (o *overlapWatch) run() {
	defer close(o.done)
	tick := time.NewTicker(overlapPeriod)
	defer tick.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-tick.C:
		}
		alive := rankGenerations(o.job)
		now := time.Now()
		o.mu.Lock()
		o.samples++
		for g := range alive {
			o.gens[g] = true
		}
		if len(alive) > 1 {
			if o.since.IsZero() {
				o.since = now
			}
			if d := now.Sub(o.since) + overlapPeriod; d > o.worst {
				o.worst, o.seen = d, fmt.Sprint(slices.Sorted(maps.Keys(alive)))
			}
		} else {
			o.since = time.Time{}
		}
		o.mu.Unlock()
	}
}

func (o *overlapWatch) end() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	<-o.done
}

// result stops the watch and returns the longest overlap, the generations
// seen alive and the number of samples.
func (o *overlapWatch) result() (time.Duration, []int64, int, string) {
	o.end()
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.worst, slices.Sorted(maps.Keys(o.gens)), o.samples, o.seen
}

// rankGenerations is the generations of job's live rank processes.
func rankGenerations(job string) map[int64]bool {
	out := map[int64]bool{}
	for _, r := range liveRanks(func(j string) bool { return j == job }) {
		out[r.gen] = true
	}
	return out
}

// checkNoOverlap fails the test when ranks of two generations were seen
// alive at once, and when fewer than two generations ran at all.
func checkNoOverlap(t *testing.T, o *overlapWatch) {
	t.Helper()
	worst, gens, samples, seen := o.result()
	t.Logf("overlap of two generations' ranks: %s (%d samples every %s; generations alive: %v)", worst, samples, overlapPeriod, gens)
	if worst > 0 {
		t.Errorf("ranks of generations %s were alive at once for %s", seen, worst)
	}
	if len(gens) < 2 {
		t.Errorf("generations %v ran: want the job's first and the one after the fault", gens)
	}
}

// TestClusterPartitionFenced: a job's host is cut off (iptables DROP) at a
// random step; the job goes on on a spare; the cut-off host's ranks stop
// before the next generation's start, with the checkpoints in a shared
// directory (a 1-node job, as the issue that found two generations at once
// ran it) and held by the agents (2 nodes, a spare). Once the cut heals,
// the agent registers again at once, though its pause between attempts
// grew during the cut.
func TestClusterPartitionFenced(t *testing.T) {
	t.Parallel() // a cluster of its own: runs beside the others (make test's -parallel)
	t.Run("shared checkpoints", func(t *testing.T) { partitionFenced(t, false, 5+rand.IntN(30)) })
	t.Run("held checkpoints", func(t *testing.T) { partitionFenced(t, true, 5+rand.IntN(30)) })
}

// TestClusterPartitionStress is TestClusterPartitionFenced at 20 random
// steps each (make stress).
func TestClusterPartitionStress(t *testing.T) {
	if os.Getenv("GPUCOORD_STRESS") == "" {
		t.Skip("set GPUCOORD_STRESS=1 (make stress) to run the 20 cuts of each kind")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 40 {
		held, at := i%2 == 1, 2+rng.IntN(50)
		t.Run(fmt.Sprintf("held-%v-at-%d", held, at), func(t *testing.T) { partitionFenced(t, held, at) })
	}
}

func partitionFenced(t *testing.T, held bool, at int) {
	const steps = 60
	hosts, nodes := 3, 1
	if held {
		hosts, nodes = 4, 2
	}
	b := newBoxCluster(t, testcluster.Config{Hosts: hosts, Shared: !held})
	want := e2e.Reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
	b.coordinator(t, b.Host(1), b.local)
	var workers []*proc
	for _, h := range b.Hosts()[1:] {
		workers = append(workers, b.worker(t, h, 2))
	}
	job := fmt.Sprintf("fence-%v-%d", held, at)
	args := []string{"launch", "--coordinator", b.local, "--job-id", job, "--nodes", strconv.Itoa(nodes), "--gpus-per-node", "2", "--tp", "2",
		"--min-nodes", "1", "--max-nodes", strconv.Itoa(nodes), "--max-restarts", "3", "--checkpoint-every", "1", "--steps", strconv.Itoa(steps), "--json"}
	if !held {
		args = append(args, "--checkpoint-dir", b.Shared())
	}
	o := watchOverlap(t, job)
	p := b.run(t, b.Host(1), append(args, b.job)...)
	m := genNodes.FindStringSubmatch(p.waitLine(t, "generation 1:", time.Minute))
	if m == nil {
		t.Fatalf("no nodes in the generation line:\n%s", p.output())
	}
	victim := strings.Split(m[1], ", ")[0]
	p.waitLine(t, fmt.Sprintf(`{"step":%d,`, at), time.Minute)
	h := b.hostNamed(t, victim)
	h.Cut()
	cut := time.Now()
	p.waitLine(t, `"generation":2,"dp":`, time.Minute)
	t.Logf("%s cut off at step %d: generation 2's first step %s later", victim, at, time.Since(cut).Round(time.Millisecond))
	// The cut lasts four passes in which no coordinator answered: the
	// agent's pause between passes has grown to about 4 s (from 0.5 s,
	// doubling), and the heal comes at the start of the fourth.
	var w *proc
	for i, x := range b.Hosts()[1:] {
		if x == h {
			w = workers[i]
		}
	}
	w.waitLine(t, "no coordinator answered", time.Minute)
	for range 3 {
		w.waitLine(t, "no coordinator answered", time.Minute)
	}
	// What the agent printed from here on: nothing in the cut says a
	// coordinator takes connections again.
	before := len(w.output())
	h.Heal()
	healed := time.Now()
	w.waitLine(t, "msg=registered ", time.Minute)
	t.Logf("%s registered again %s after the heal", victim, time.Since(healed).Round(time.Millisecond))
	// The pause in progress at the heal ends when the coordinator takes a
	// connection again, not when it runs out.
	after := w.output()[before:]
	if i, j := strings.Index(after, "a coordinator takes connections again: trying now"), strings.Index(after, "msg=registered "); i < 0 || i > j {
		t.Errorf("%s registered again without its pause ending at the heal: its pause outlasted the cut:\n%s", victim, after)
	}
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	e2e.SameLosses(t, e2e.Losses(t, p.output()), want)
	checkNoOverlap(t, o)
}

// TestWorkerFrozenFenced: an agent stopped with SIGSTOP for longer than
// its lease cannot stop its ranks; its fence watchdog does, before the job
// goes on without the node, and no two generations' ranks are alive at
// once.
func TestWorkerFrozenFenced(t *testing.T) { frozenFenced(t) }

// TestWorkerFrozenStress is TestWorkerFrozenFenced 20 times (make stress).
func TestWorkerFrozenStress(t *testing.T) {
	if os.Getenv("GPUCOORD_STRESS") == "" {
		t.Skip("set GPUCOORD_STRESS=1 (make stress) to freeze an agent 20 times")
	}
	for i := range 20 {
		t.Run(strconv.Itoa(i), frozenFenced)
	}
}

func frozenFenced(t *testing.T) { frozenFencedBy(t) }

// TestWorkerFrozenWindow is TestWorkerFrozenFenced with 10 s leases and a
// fence window of 1 s: the coordinator that serves the frozen agent's
// stream fences its run by the last deadline the stream gave it (at most
// the window ahead, whatever the lease's time left), the frozen agent's
// watchdog kills its ranks at that deadline, and generation 2 opens
// without waiting for the lease: still no two generations at once.
func TestWorkerFrozenWindow(t *testing.T) {
	const window = time.Second
	co := frozenFencedBy(t, "--lease-ttl", "10s", "--fence-window", window.String())
	line := co.waitLine(t, "fenced by its stream's last deadline", time.Second)
	logged, until := logTime(t, line, "time"), logTime(t, line, "until")
	if !strings.Contains(line, "node=w1 ") || until.After(logged.Add(window)) {
		t.Errorf("the frozen node's fence, written at %s: want w1's, until at most the window (%s) after: %s", logged.Format(time.RFC3339Nano), window, line)
	}
}

// logTime is the time a log line's field holds (RFC 3339).
func logTime(t *testing.T, line, field string) time.Time {
	t.Helper()
	i := strings.Index(line, field+"=")
	if i < 0 {
		t.Fatalf("no %s in %q", field, line)
	}
	v, _, _ := strings.Cut(line[i+len(field)+1:], " ")
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("%s in %q: %v", field, line, err)
	}
	return at
}

// frozenFencedBy freezes an agent in the middle of a job on a coordinator
// started with args, and checks that generation 2 runs without the frozen
// agent's ranks and never beside them; it returns the coordinator.
func frozenFencedBy(t *testing.T, args ...string) *proc {
	exe := e2e.Binary(t)
	co, addr := coordinatorProc(t, exe, args...)
	workerProc(t, exe, addr, "w0", 2)
	w1, dir1 := workerProc(t, exe, addr, "w1", 2)
	o := watchOverlap(t, "frozen")
	p := start(t, exe, "launch", "--coordinator", addr, "--job-id", "frozen", "--nodes", "2", "--gpus-per-node", "2", "--pp", "2",
		"--min-nodes", "1", "--max-restarts", "2", "--steps", "1000000", "../../examples/jobs/mlp.yaml")
	p.waitLine(t, "step       2/1000000 ", time.Minute)
	if n := len(processesWith("GPUCOORD_PLAN=" + dir1 + "/")); n != 2 {
		t.Fatalf("%d ranks of w1 running, want 2", n)
	}
	frozen := time.Now()
	w1.cmd.Process.Signal(syscall.SIGSTOP)
	defer w1.cmd.Process.Signal(syscall.SIGCONT)
	p.waitLine(t, "generation 2:", time.Minute)
	p.waitLine(t, "step ", time.Minute) // generation 2 trains
	t.Logf("generation 2 trains %s after SIGSTOP", time.Since(frozen).Round(time.Millisecond))
	if left := processesWith("GPUCOORD_PLAN=" + dir1 + "/"); len(left) != 0 {
		t.Errorf("ranks %v of the frozen agent outlived its lease", left)
	}
	checkNoOverlap(t, o)
	w1.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(syscall.SIGINT)
	p.wait(t, time.Minute)
	return co
}

// TestRestoreFallback: the step a generation resumes from turns out to be
// unrestorable (its manifests are gone from the shared directory, as a
// half-written or damaged step would be): the ranks say so (exit 76), and
// the next generation resumes from the newest earlier kept step, saying
// which step it passed over and why; the job ends on train's curve. The
// broken step is never tried twice.
func TestRestoreFallback(t *testing.T) {
	const steps = 40
	exe := e2e.Binary(t)
	want := e2e.Reference(t, exe, "--steps", strconv.Itoa(steps), "../../examples/jobs/mlp.yaml")
	// A long fence margin: the test breaks the step while generation 2
	// waits to open.
	_, addr := coordinatorProc(t, exe, "--fence-margin", "20s")
	w0, _ := workerProc(t, exe, addr, "w0", 2)
	w1, _ := workerProc(t, exe, addr, "w1", 2)
	shared := t.TempDir()
	p := start(t, exe, "launch", "--coordinator", addr, "--job-id", "fallback", "--nodes", "1", "--gpus-per-node", "2", "--tp", "2",
		"--min-nodes", "1", "--max-restarts", "3", "--checkpoint-every", "1", "--checkpoint-dir", shared, "--steps", strconv.Itoa(steps),
		"--json", "../../examples/jobs/mlp.yaml")
	m := genNodes.FindStringSubmatch(p.waitLine(t, "generation 1:", time.Minute))
	if m == nil {
		t.Fatalf("no nodes in the generation line:\n%s", p.output())
	}
	// The job runs on whichever node the coordinator chose: kill that one.
	victim := map[string]*proc{"w0": w0, "w1": w1}[m[1]]
	if victim == nil {
		t.Fatalf("generation 1 ran on %q, not on w0 or w1", m[1])
	}
	p.waitLine(t, `{"step":10,`, time.Minute)
	victim.cmd.Process.Kill() // its ranks die with it
	p.waitLine(t, "generation 2:", time.Minute)
	cs := commits(p.output())
	if len(cs) == 0 {
		t.Fatalf("no commit before the kill:\n%s", p.output())
	}
	broken := cs[len(cs)-1].Committed
	manifests, _ := filepath.Glob(filepath.Join(shared, "gpucoord", "fallback", "*", "*", fmt.Sprintf("step-%d", broken), "manifest.json"))
	if len(manifests) == 0 {
		t.Fatalf("no manifest of step %d under %s", broken, shared)
	}
	for _, m := range manifests {
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	out := p.output()
	if !strings.Contains(out, fmt.Sprintf("passed over (step %d: rank ", broken)) || !strings.Contains(out, fmt.Sprintf("so from step %d", broken-1)) {
		t.Errorf("no generation says it passed over step %d for step %d:\n%s", broken, broken-1, out)
	}
	if n := strings.Count(out, fmt.Sprintf("resuming after step %d)", broken)); n != 1 {
		t.Errorf("%d generations resumed after the broken step %d, want 1 (generation 2 alone):\n%s", n, broken, out)
	}
	e2e.SameLosses(t, e2e.Losses(t, out), want)
}
