package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
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

// The chaos test, as etcd's robustness tests and Jepsen run theirs: a
// control plane of three etcd members and two coordinators, six agents and
// two jobs (one checkpointing to a shared directory, one to the agents),
// a seeded schedule of faults (an agent's host killed, a rank killed, a
// host cut off, a partition, an agent frozen, a coordinator killed, an
// etcd member killed, an agent restarted, a host's link delayed, a host's
// /dev/shm filled), everything recorded, and a checker that proves
// afterwards what must hold whatever the faults:
//
//	(a) no two generations' ranks of a job were alive at once;
//	(b) no host ran ranks of two jobs at once;
//	(c) every resume was from a step the job had committed, and restored
//	    (no rank failed restoring it);
//	(d) every step's loss equals train --np 1's;
//	(e) every job succeeded (they have restarts enough for any schedule),
//	    or failed for what the schedule explains: every holder of a kept
//	    step gone for good (killed or restarted, not cut off: a job waits
//	    for cut-off holders), or too few nodes for the rendezvous timeout.
//
// make chaos SEED=... DURATION=... runs it for as long as asked; make test
// runs 60 seconds of seed 1.

// chaosHistory is what the sampler saw: every 20 ms, the live rank
// processes of the machine, by job, generation and host (their
// environment), and the longest spans that broke (a) and (b).
type chaosHistory struct {
	stop, done chan struct{}

	mu          sync.Mutex
	samples     int
	gens        map[string]map[int64]bool // job -> generations seen
	twoGens     map[string]time.Duration  // job -> longest span with two generations alive
	twoJobs     map[string]time.Duration  // host -> longest span with two jobs' ranks
	genSince    map[string]time.Time
	jobSince    map[string]time.Time
	violationAt []string
}

func (h *chaosHistory) run() {
	defer close(h.done)
	tick := time.NewTicker(overlapPeriod)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
		ranks := liveRanks(chaosJob)
		now := time.Now()
		gens, jobs := map[string]map[int64]bool{}, map[string]map[string]bool{}
		for _, r := range ranks {
			if gens[r.job] == nil {
				gens[r.job] = map[int64]bool{}
			}
			gens[r.job][r.gen] = true
			if jobs[r.host] == nil {
				jobs[r.host] = map[string]bool{}
			}
			jobs[r.host][r.job] = true
		}
		h.mu.Lock()
		h.samples++
		for job, g := range gens {
			if h.gens[job] == nil {
				h.gens[job] = map[int64]bool{}
			}
			maps.Copy(h.gens[job], g)
		}
		span := func(since map[string]time.Time, worst map[string]time.Duration, key string, bad bool, what string) {
			if !bad {
				delete(since, key)
				return
			}
			if _, ok := since[key]; !ok {
				since[key] = now
				h.violationAt = append(h.violationAt, fmt.Sprintf("%s %s: %s", now.Format("15:04:05.000"), key, what))
			}
			worst[key] = max(worst[key], now.Sub(since[key])+overlapPeriod)
		}
		for job := range h.gens {
			span(h.genSince, h.twoGens, job, len(gens[job]) > 1, fmt.Sprint("generations ", slices.Sorted(maps.Keys(gens[job]))))
		}
		for host, j := range jobs {
			span(h.jobSince, h.twoJobs, host, len(j) > 1, fmt.Sprint("jobs ", slices.Sorted(maps.Keys(j))))
		}
		for host := range h.jobSince {
			if len(jobs[host]) < 2 {
				delete(h.jobSince, host)
			}
		}
		h.mu.Unlock()
	}
}

// liveRank is a live rank process, as its environment says.
type liveRank struct {
	pid       int
	job, host string
	gen       int64
}

// liveRanks reads every process's environment: the ranks gpucoord started
// (TORCHELASTIC_RUN_ID, GPUCOORD_GENERATION, GPUCOORD_HOST) of the jobs
// keep accepts (not another test's, running beside this one).
func liveRanks(keep func(job string) bool) []liveRank {
	var out []liveRank
	eachEnviron(func(pid int, env []byte) {
		if !bytes.Contains(env, []byte("GPUCOORD_GENERATION=")) {
			return
		}
		r := liveRank{pid: pid}
		for _, kv := range bytes.Split(env, []byte{0}) {
			k, v, _ := strings.Cut(string(kv), "=")
			switch k {
			case "TORCHELASTIC_RUN_ID":
				r.job = v
			case "GPUCOORD_HOST":
				r.host = v
			case "GPUCOORD_GENERATION":
				r.gen, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if r.job != "" && keep(r.job) {
			out = append(out, r)
		}
	})
	return out
}

// chaosJob says whether a job is the chaos test's.
func chaosJob(job string) bool { return strings.HasPrefix(job, "chaos-") }

// chaosCluster is the pool the faults hit.
type chaosCluster struct {
	b      *boxCluster
	t      *testing.T
	etcd   []*exec.Cmd // h1, h2, h3's members
	coords []*proc     // h1's and h2's; nil while killed
	agents map[*testcluster.Host]*proc
	log    []string // the faults, in order
	counts map[string]int
	ends   map[bool]int // jobs that failed, by whether the schedule explains it
	filled bool         // the schedule filled a host's /dev/shm
}

func (c *chaosCluster) note(format string, args ...any) {
	line := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...)
	c.log = append(c.log, line)
	c.t.Log(line)
}

// etcdMember starts member i (1-based) on host i.
func (c *chaosCluster) etcdMember(i int) *exec.Cmd {
	h := c.b.Host(i)
	var initial []string
	for j := 1; j <= 3; j++ {
		initial = append(initial, fmt.Sprintf("m%d=http://%s:2380", j, c.b.Host(j).Addr))
	}
	cmd := h.Command(c.t.Context(), "/usr/bin/etcd", "--name", fmt.Sprintf("m%d", i), "--data-dir", "/tmp/etcd-member",
		"--listen-client-urls", "http://"+h.Addr+":2379", "--advertise-client-urls", "http://"+h.Addr+":2379",
		"--listen-peer-urls", "http://"+h.Addr+":2380", "--initial-advertise-peer-urls", "http://"+h.Addr+":2380",
		"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--initial-cluster-token", "chaos")
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func (c *chaosCluster) endpoints() string {
	var eps []string
	for i := 1; i <= 3; i++ {
		eps = append(eps, "http://"+c.b.Host(i).Addr+":2379")
	}
	return strings.Join(eps, ",")
}

func (c *chaosCluster) coordinator(i int) *proc {
	h := c.b.Host(i)
	return c.b.coordinator(c.t, h, net.JoinHostPort(h.Addr, "7070"), "--etcd", c.endpoints(), "--etcd-dial-timeout", "30s")
}

func TestChaos(t *testing.T) {
	t.Parallel() // a cluster of its own: runs beside the others (make test's -parallel)
	seed := uint64(1)
	if s := os.Getenv("GPUCOORD_CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GPUCOORD_CHAOS_SEED %q: %v", s, err)
		}
		seed = n
	}
	duration := time.Minute
	if s := os.Getenv("GPUCOORD_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("GPUCOORD_CHAOS_DURATION %q: %v", s, err)
		}
		duration = d
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t.Logf("chaos: seed %d, %s of faults", seed, duration)

	// h1-h3: etcd members; h1, h2: coordinators; h4-h9: agents of 2 slots;
	// h10: where launch runs (never faulted).
	// Every link through a relay (delays) and every /dev/shm a tmpfs just
	// large enough for an agent to keep its checkpoints there (a fill).
	b := newBoxCluster(t, testcluster.Config{Hosts: 10, Shared: true, Relay: true, ShmBytes: 2<<30 + 256<<20})
	c := &chaosCluster{b: b, t: t, agents: map[*testcluster.Host]*proc{}, counts: map[string]int{}, ends: map[bool]int{}}
	for i := 1; i <= 3; i++ {
		c.etcd = append(c.etcd, c.etcdMember(i))
	}
	c.coords = []*proc{c.coordinator(1), c.coordinator(2)}
	b.coord = "h1:7070,h2:7070"
	agentHosts := b.Hosts()[3:9]
	for _, h := range agentHosts {
		c.agents[h] = b.worker(t, h, 2)
	}
	const steps = 200
	want := e2e.Reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
	client := b.Host(10)
	launch := func(job string, extra ...string) *proc {
		args := append([]string{"launch", "--coordinator", "h1:7070,h2:7070", "--job-id", job, "--nodes", "2", "--gpus-per-node", "2", "--tp", "2",
			"--min-nodes", "1", "--max-restarts", "1000", "--checkpoint-every", "1", "--steps", strconv.Itoa(steps), "--json"}, extra...)
		return b.run(t, client, append(args, b.job)...)
	}
	hist := &chaosHistory{stop: make(chan struct{}), done: make(chan struct{}), gens: map[string]map[int64]bool{},
		twoGens: map[string]time.Duration{}, twoJobs: map[string]time.Duration{}, genSince: map[string]time.Time{}, jobSince: map[string]time.Time{}}
	go hist.run()
	stopHist := sync.OnceFunc(func() { close(hist.stop); <-hist.done })
	t.Cleanup(stopHist)
	// Two jobs at a time, one of each kind, in rounds for as long as the
	// faults last: a job that ends is checked, and the next of its kind
	// starts.
	kinds := map[string][]string{"shared": {"--checkpoint-dir", b.Shared()}, "held": nil}
	rounds := map[string]int{}
	running, jobs := map[string]*proc{}, map[string]*proc{}
	next := func(kind string) {
		rounds[kind]++
		id := fmt.Sprintf("chaos-%s-%d", kind, rounds[kind])
		running[kind] = launch(id, kinds[kind]...)
		jobs[id] = running[kind]
	}
	for kind := range kinds {
		next(kind)
	}
	for _, p := range running {
		p.waitLine(t, `{"step":3,`, 2*time.Minute)
	}
	// The schedule: a fault every 9 to 13 s, each undone (healed, thawed,
	// restarted) before the next.
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		c.fault(rng)
		time.Sleep(time.Duration(3000+rng.IntN(4000)) * time.Millisecond)
		for kind, p := range running {
			select {
			case <-p.done:
				if time.Now().Before(end) {
					next(kind)
				}
			default:
			}
		}
	}
	c.note("faults over: %v; jobs %d", c.counts, len(jobs))
	codes := map[string]int{}
	for name, p := range jobs {
		codes[name] = p.wait(t, 10*time.Minute)
	}
	stopHist()
	c.check(hist, jobs, codes, want)
}

// fault injects one fault, waits the time it lasts, and undoes it.
func (c *chaosCluster) fault(rng *rand.Rand) {
	b, t := c.b, c.t
	kinds := []string{"kill-agent", "kill-rank", "cut-host", "partition", "freeze-agent", "kill-coordinator", "kill-etcd", "restart-agent",
		"delay-host", "fill-shm"}
	kind := kinds[rng.IntN(len(kinds))]
	hosts := slices.SortedFunc(maps.Keys(c.agents), func(x, y *testcluster.Host) int { return strings.Compare(x.Name, y.Name) })
	h := hosts[rng.IntN(len(hosts))]
	hold := time.Duration(5000+rng.IntN(4000)) * time.Millisecond
	c.counts[kind]++
	switch kind {
	case "kill-agent": // the host loses power, and comes back
		c.note("kill-agent %s", h.Name)
		h.Kill()
		<-c.agents[h].done
		time.Sleep(hold)
		c.agents[h] = b.worker(t, h, 2)
		c.note("agent %s back", h.Name)
	case "kill-rank":
		ranks := liveRanks(chaosJob)
		if len(ranks) == 0 {
			c.note("kill-rank: no rank alive")
			return
		}
		pid := ranks[rng.IntN(len(ranks))].pid
		c.note("kill-rank pid %d", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	case "cut-host":
		c.note("cut-host %s for %s", h.Name, hold)
		h.Cut()
		time.Sleep(hold)
		h.Heal()
		c.note("healed %s", h.Name)
	case "partition": // h1 (an etcd member, a coordinator) and half the agents against the rest
		side := append([]*testcluster.Host{b.Host(1)}, hosts[:len(hosts)/2]...)
		var other []*testcluster.Host
		for _, x := range b.Hosts()[:9] {
			if !slices.Contains(side, x) {
				other = append(other, x)
			}
		}
		c.note("partition %s | %s for %s", names(side), names(other), hold)
		for _, x := range side {
			x.Cut(other...)
		}
		time.Sleep(hold)
		for _, x := range side {
			x.Heal()
		}
		c.note("partition healed")
	case "freeze-agent":
		p := c.agents[h]
		c.note("freeze-agent %s for %s", h.Name, hold)
		agentPids(h, p, syscall.SIGSTOP)
		time.Sleep(hold)
		agentPids(h, p, syscall.SIGCONT)
		c.note("thawed %s", h.Name)
	case "kill-coordinator":
		i := rng.IntN(2)
		c.note("kill-coordinator h%d", i+1)
		c.coords[i].cmd.Process.Kill()
		<-c.coords[i].done
		time.Sleep(hold / 2)
		c.coords[i] = c.coordinator(i + 1)
		c.note("coordinator h%d back", i+1)
	case "kill-etcd":
		i := rng.IntN(3)
		c.note("kill-etcd m%d", i+1)
		c.etcd[i].Process.Kill()
		c.etcd[i].Wait()
		time.Sleep(hold / 2)
		c.etcd[i] = c.etcdMember(i + 1)
		c.note("etcd m%d back", i+1)
	case "delay-host": // every frame to and from h held up: a congested or distant link
		d := time.Duration(20+rng.IntN(280)) * time.Millisecond
		c.note("delay-host %s by %s each way for %s", h.Name, d, hold)
		h.Delay(d)
		time.Sleep(hold)
		h.Heal()
		c.note("undelayed %s", h.Name)
	case "fill-shm": // another program takes all of h's /dev/shm, where its agent holds checkpoints
		c.note("fill-shm %s for %s", h.Name, hold)
		c.filled = true
		undo := h.FillShm()
		time.Sleep(hold)
		undo()
		c.note("emptied %s's /dev/shm", h.Name)
	case "restart-agent": // SIGTERM: the agent leaves, then starts again
		c.note("restart-agent %s", h.Name)
		c.agents[h].cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.agents[h].done:
		case <-time.After(time.Minute):
			t.Errorf("agent %s did not exit within a minute of SIGTERM", h.Name)
			c.agents[h].cmd.Process.Kill()
			<-c.agents[h].done
		}
		c.agents[h] = b.worker(t, h, 2)
		c.note("agent %s back", h.Name)
	}
}

func names(hs []*testcluster.Host) string {
	var s []string
	for _, h := range hs {
		s = append(s, h.Name)
	}
	return strings.Join(s, ",")
}

// agentPids signals the agent of p on h: the gpucoord worker process (not
// its ranks, not its fence watchdog, not the nsenter/sh wrappers).
func agentPids(h *testcluster.Host, p *proc, sig syscall.Signal) {
	for _, pid := range h.Pids() {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "gpucoord" && args[1] == "worker" {
			syscall.Kill(pid, sig)
		}
	}
}

// check is the history checker.
func (c *chaosCluster) check(h *chaosHistory, jobs map[string]*proc, codes map[string]int, want []float64) {
	t := c.t
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("chaos: %d samples; faults %v", h.samples, c.counts)
	for _, v := range h.violationAt {
		t.Logf("violation began at %s", v)
	}
	for job := range jobs {
		t.Logf("(a) %s: generations %v; longest overlap of two %s", job, slices.Sorted(maps.Keys(h.gens[job])), h.twoGens[job])
		if h.twoGens[job] > 0 {
			t.Errorf("(a) ranks of two generations of %s alive at once for %s", job, h.twoGens[job])
		}
	}
	for host, d := range h.twoJobs {
		t.Errorf("(b) host %s ran ranks of two jobs at once for %s", host, d)
	}
	for job, p := range jobs {
		out := p.output()
		committed := map[int64]bool{0: true}
		for _, line := range strings.Split(out, "\n") {
			var cm launchCommit
			if strings.HasPrefix(line, `{"committed"`) && json.Unmarshal([]byte(line), &cm) == nil {
				committed[cm.Committed] = true
			}
			var ev struct {
				Event      string `json:"event"`
				Generation struct {
					Number int64 `json:"number"`
					Resume int64 `json:"resume_step"`
				} `json:"generation"`
			}
			if strings.HasPrefix(line, `{"event":"generation"`) && json.Unmarshal([]byte(line), &ev) == nil && !committed[ev.Generation.Resume] {
				t.Errorf("(c) %s: generation %d resumed after step %d, which the job never committed", job, ev.Generation.Number, ev.Generation.Resume)
			}
			// A committed step whose files were there but could not be
			// read (not one whose every holder was lost: (e) says so; nor
			// one a rank could not write where the schedule had filled
			// /dev/shm, which nothing else fills here, nor one whose
			// restore its generation's end interrupted).
			explained := c.filled && strings.Contains(line, "no space left on device") || strings.HasSuffix(strings.TrimSpace(line), "context canceled")
			if strings.Contains(line, "engine: restore step") && !explained {
				t.Errorf("(c) %s: a restore failed: %s", job, line)
			}
		}
		if code := codes[job]; code != 0 {
			// (e): a job may fail only for what the schedule explains:
			// every holder of its kept steps lost at once (both sides of
			// a replica cut from the quorum), or too few nodes for the
			// rendezvous timeout (nodes struck and cooling down).
			end := ""
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "gpucoord: job ") {
					end = line
				}
			}
			explained := strings.Contains(end, "no live node holds") && !strings.Contains(end, "could not restore") ||
				strings.Contains(end, "without enough nodes")
			c.ends[explained]++
			if !explained {
				t.Errorf("(e) job %s exited %d, not for what the schedule explains: %s", job, code, end)
			} else {
				t.Logf("(e) job %s exited %d, as the schedule explains: %s", job, code, end)
			}
			continue
		}
		// Not sameLosses, which stops the test: every job is checked.
		got := e2e.Losses(t, out)
		t.Logf("(d) %s: %d steps", job, len(got))
		if len(got) != len(want) {
			t.Errorf("(d) %s: %d steps printed, want %d", job, len(got), len(want))
			continue
		}
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-5*math.Abs(want[i]) {
				t.Errorf("(d) %s: step %d: loss %.9g, want %.9g (train --np 1)", job, i+1, got[i], want[i])
			}
		}
	}
	t.Logf("(e) %d jobs: %d succeeded, %d failed as the schedule explains, %d not", len(jobs), len(jobs)-c.ends[true]-c.ends[false], c.ends[true], c.ends[false])
}
