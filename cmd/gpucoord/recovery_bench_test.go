package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// TestRecoveryTimes measures how long a job takes to notice a lost node
// and to train again, across hosts (each agent on its own host, in its own
// network namespace) and on one host (every agent in one namespace), for
// a node killed (SIGKILL of its agent and ranks), gone silent (every
// packet dropped; on one host: the agent and its ranks frozen with
// SIGSTOP) and, across hosts, a partition (cut off, healed later). It is a
// benchmark, not a test: it runs only with GPUCOORD_BENCH_RECOVERY=RUNS
// (make bench-recovery) and prints the medians; docs/BENCHMARKS.md has
// the figures.
func TestRecoveryTimes(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("GPUCOORD_BENCH_RECOVERY"))
	if runs < 1 {
		t.Skip("a benchmark: set GPUCOORD_BENCH_RECOVERY=RUNS (make bench-recovery)")
	}
	type row struct{ detect, resume []time.Duration }
	rows := map[string]*row{}
	order := []string{}
	for range runs {
		for _, sc := range []struct {
			fault   string
			oneHost bool
		}{{"killed", false}, {"killed", true}, {"silent", false}, {"silent", true}, {"partition", false}} {
			name := sc.fault + map[bool]string{false: ", across hosts", true: ", one host"}[sc.oneHost]
			var d, r time.Duration
			t.Run(name, func(t *testing.T) { d, r = recoveryRun(t, sc.fault, sc.oneHost) })
			if rows[name] == nil {
				rows[name] = &row{}
				order = append(order, name)
			}
			rows[name].detect = append(rows[name].detect, d)
			rows[name].resume = append(rows[name].resume, r)
		}
	}
	mid := func(ds []time.Duration) string { return median(ds).Round(10 * time.Millisecond).String() }
	var out strings.Builder
	fmt.Fprintf(&out, "| fault | detection | first step of the new generation | runs |\n|---|---|---|---|\n")
	for _, name := range order {
		fmt.Fprintf(&out, "| %s | %s | %s | %d |\n", name, mid(rows[name].detect), mid(rows[name].resume), len(rows[name].detect))
	}
	t.Logf("medians, from the fault:\n%s", out.String())
}

// recoveryRun runs the native job (tp 2, 3 nodes x 2 ranks, a checkpoint
// every step in a shared directory, a spare node standing by), applies
// the fault to the second node after step 10, and returns the times from
// the fault to the coordinator's log of the loss and to the first step of
// generation 2.
func recoveryRun(t *testing.T, fault string, oneHost bool) (detect, resume time.Duration) {
	b := newBoxCluster(t, testcluster.Config{Hosts: 5, Shared: true})
	var co *proc
	var workers []*proc
	if oneHost {
		co = b.coordinator(t, b.Host(1), b.local)
		for i := range 4 {
			name := "n" + strconv.Itoa(i+1)
			workers = append(workers, b.worker(t, b.Host(2), 2, "--name", name, "--state-dir", filepath.Join("/tmp", name)))
		}
	} else {
		co, workers = b.pool(t)
	}
	p := b.elasticJob(t, 1, 400)
	p.waitLine(t, `{"step":10,`, time.Minute)
	victim := workers[1]
	at := time.Now()
	switch {
	case fault == "killed" && oneHost:
		victim.cmd.Process.Kill()
	case fault == "killed":
		b.Host(3).Kill()
	case fault == "silent" && oneHost:
		freeze(victim.cmd.Process.Pid)
		defer syscall.Kill(victim.cmd.Process.Pid, syscall.SIGKILL)
	default: // silent or partition across hosts
		b.Host(3).Cut()
	}
	lost := "node disconnected"
	if fault != "killed" {
		lost = "node failed its gossip probes"
	}
	co.waitLine(t, lost, time.Minute)
	detect = time.Since(at)
	p.waitLine(t, `"generation":2,"dp":`, time.Minute)
	resume = time.Since(at)
	if fault == "partition" {
		b.Host(3).Heal()
	}
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	return detect, resume
}

// median is the middle of xs (the upper one of an even count).
func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// freeze stops pid and every process under it with SIGSTOP.
func freeze(pid int) {
	syscall.Kill(pid, syscall.SIGSTOP)
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(c); err == nil {
				freeze(n)
			}
		}
	}
}
