package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// TestCheckpointCosts measures what checkpoints cost and save, against the
// behaviour before the agents held them (a shared directory, every N
// steps). It is a benchmark, not a test: it runs only with
// GPUCOORD_BENCH_CKPT=RUNS (make bench-checkpoint) and prints tables;
// docs/BENCHMARKS.md has the figures.
//
//   - overhead: examples/jobs/mlp-bench.yaml under launch --standalone (2
//     nodes x 2 ranks, tp 2), the median step time of steps 6-40 with no
//     checkpoint but the last, with a checkpoint every step in a shared
//     directory, and held by the agents every step (the default); runs
//     interleaved.
//   - recovery: on the cluster in a box, the last rank's host killed at
//     step 35 of testdata/mlp48.yaml on 2 hosts and a spare: the time from
//     the kill to the first step of the next generation, and the steps
//     trained again, held against a shared directory every step and every
//     10 steps.
//
// GPUCOORD_BENCH_CKPT_BASE=<gpucoord binaries, comma-separated> (make
// bench-checkpoint BASE=...) makes it a before and after on the same noisy
// machine at the same time: only the first and third rows, each run with
// this build and with each binary (built from an earlier commit, say),
// interleaved, the order reversed every other run.
//
// Besides the rows over all runs, each row's median of each run is
// printed, and its overhead in each run against the reference row of the
// same run and build: on a shared machine the load drifts between runs,
// and a row compared with its neighbour in time drifts least.
func TestCheckpointCosts(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("GPUCOORD_BENCH_CKPT"))
	if runs < 1 {
		t.Skip("a benchmark: set GPUCOORD_BENCH_CKPT=RUNS (make bench-checkpoint)")
	}
	exe := e2e.Binary(t)
	type config struct {
		name string
		args func(dir string) []string
		exe  string // "": this build
	}
	configs := []config{
		{"last step only, shared directory", func(dir string) []string { return []string{"--checkpoint-dir", dir} }, ""},
		{"every step, shared directory", func(dir string) []string { return []string{"--checkpoint-dir", dir, "--checkpoint-every", "1"} }, ""},
		{"every step, held by the agents", func(string) []string { return nil }, ""},
		{"every step, held, one copy (no replication)", func(string) []string { return []string{"--checkpoint-replicas", "1"} }, ""},
		{"every 10 steps, held by the agents", func(string) []string { return []string{"--checkpoint-every", "10"} }, ""},
		{"held, --checkpoint-overhead 5%", func(string) []string { return []string{"--checkpoint-overhead", "5%"} }, ""},
	}
	held := configs[2].name // the row whose /dev/shm peak is printed
	ref := func(c config) string { return configs[0].name }
	if base := os.Getenv("GPUCOORD_BENCH_CKPT_BASE"); base != "" {
		refs := map[string]string{}
		ab := []config{configs[0], configs[2]}
		for _, exe := range strings.Split(base, ",") {
			r := config{name: fmt.Sprintf("%s (%s)", configs[0].name, exe), args: configs[0].args, exe: exe}
			h := config{name: fmt.Sprintf("%s (%s)", configs[2].name, exe), args: configs[2].args, exe: exe}
			refs[h.name] = r.name
			ab = append(ab, r, h)
		}
		configs = ab
		ref = func(c config) string {
			if r, ok := refs[c.name]; ok {
				return r
			}
			if c.exe != "" {
				return c.name
			}
			return configs[0].name
		}
	}
	steps := map[string][]float64{}
	perRun := map[string][]float64{}     // each run's median
	cpuPerStep := map[string][]float64{} // each run's CPU time over its 80 steps
	var stateBytes, heldPeak int64
	for i := range runs {
		order := slices.Clone(configs)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			dir := t.TempDir()
			args := append([]string{"launch", "--standalone", "--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--steps", "80", "--json"},
				c.args(dir)...)
			// What the agents hold in /dev/shm, at its largest (sampled).
			stop := make(chan struct{})
			sampled := make(chan int64)
			go func() {
				var peak int64
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						sampled <- peak
						return
					case <-tick.C:
						// launch --standalone's agents hold theirs in a
						// directory of their own there.
						var held int64
						dirs, _ := filepath.Glob("/dev/shm/gpucoord-standalone-*")
						for _, d := range dirs {
							held += dirBytes(d)
						}
						peak = max(peak, held)
					}
				}
			}()
			run := exe
			if c.exe != "" {
				run = c.exe
			}
			out, cpu, err := runOut(t, run, append(args, "../../examples/jobs/mlp-bench.yaml")...)
			close(stop)
			if p := <-sampled; c.name == held {
				heldPeak = max(heldPeak, p)
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", c.name, err, out)
			}
			var got []float64
			for _, line := range strings.Split(out, "\n") {
				var s launchStep
				if strings.HasPrefix(line, `{"step"`) && json.Unmarshal([]byte(line), &s) == nil && s.Step > 5 {
					got = append(got, s.Seconds)
				}
			}
			if len(got) == 0 {
				t.Fatalf("%s: no steps after the fifth in its output:\n%s", c.name, out)
			}
			steps[c.name] = append(steps[c.name], got...)
			perRun[c.name] = append(perRun[c.name], median(got))
			cpuPerStep[c.name] = append(cpuPerStep[c.name], cpu.Seconds()/80)
			if c.name == configs[0].name {
				stateBytes = dirBytes(dir)
			}
		}
	}
	// The median step says what most steps cost; the mean, what the run
	// took (a checkpoint every 10 steps costs 1 step in 10).
	mean := func(xs []float64) float64 {
		sum := 0.0
		for _, x := range xs {
			sum += x
		}
		return sum / float64(max(len(xs), 1))
	}
	base, baseMean := median(steps[configs[0].name]), mean(steps[configs[0].name])
	var tab strings.Builder
	fmt.Fprintf(&tab, "| checkpoints | median step | against the last step only | mean step | against the last step only |\n|---|---|---|---|---|\n")
	for _, c := range configs {
		m, a := median(steps[c.name]), mean(steps[c.name])
		fmt.Fprintf(&tab, "| %s | %.1f ms | %+.1f%% | %.1f ms | %+.1f%% |\n", c.name, 1e3*m, 100*(m/base-1), 1e3*a, 100*(a/baseMean-1))
	}
	t.Logf("step times over %d runs of 75 steps each (state of one step, every rank's files: %.1f MB; held in /dev/shm at most, both nodes: %.1f MB):\n%s",
		runs, float64(stateBytes)/1e6, float64(heldPeak)/1e6, tab.String())
	// Run by run, against the reference of the same run: the step time,
	// and the CPU time per step of the whole run (startup included, the
	// same in every row), which other work on the machine disturbs far
	// less than it does the step time.
	byRun := func(xs map[string][]float64, unit string, scale float64) string {
		var tab strings.Builder
		fmt.Fprintf(&tab, "| checkpoints | run by run | against the reference of the same run | their median |\n|---|---|---|---|\n")
		for _, c := range configs {
			var vs, over []string
			var overs []float64
			for i, v := range xs[c.name] {
				vs = append(vs, fmt.Sprintf("%.1f", scale*v))
				o := 100 * (v/xs[ref(c)][i] - 1)
				overs = append(overs, o)
				over = append(over, fmt.Sprintf("%+.1f%%", o))
			}
			fmt.Fprintf(&tab, "| %s | %s %s | %s | %+.1f%% |\n", c.name, strings.Join(vs, ", "), unit, strings.Join(over, ", "), median(overs))
		}
		return tab.String()
	}
	t.Logf("median step, run by run:\n%s", byRun(perRun, "ms", 1e3))
	t.Logf("CPU time per step (the whole run's, every process, over its 80 steps), run by run:\n%s", byRun(cpuPerStep, "ms", 1e3))

	type rec struct {
		resume []time.Duration
		redone []int
	}
	recs := map[string]*rec{}
	kinds := []string{"held by the agents, every step", "shared directory, every step", "shared directory, every 10 steps"}
	for range runs {
		for _, k := range kinds {
			var args []string
			switch k {
			case kinds[1]:
				args = []string{"--checkpoint-every", "1"}
			case kinds[2]:
				args = []string{"--checkpoint-every", "10"}
			}
			var r time.Duration
			var redone int
			t.Run(k, func(t *testing.T) { r, redone = killLastHost(t, args) })
			if recs[k] == nil {
				recs[k] = &rec{}
			}
			recs[k].resume = append(recs[k].resume, r)
			recs[k].redone = append(recs[k].redone, redone)
		}
	}
	tab.Reset()
	fmt.Fprintf(&tab, "| checkpoints | kill to the first step of generation 2 (median) | steps trained again (each run) |\n|---|---|---|\n")
	for _, k := range kinds {
		fmt.Fprintf(&tab, "| %s | %s | %v |\n", k, median(recs[k].resume).Round(time.Millisecond), recs[k].redone)
	}
	t.Logf("the last rank's host killed at step 35, %d runs:\n%s", runs, tab.String())
}

// killLastHost runs testdata/mlp48.yaml for 60 steps on h2 and h3 with
// h4 a spare, with args for its checkpoints (a shared directory when
// given), kills h3 at step 35, and returns the time from the kill to the
// first step of generation 2 and the steps trained again.
func killLastHost(t *testing.T, args []string) (time.Duration, int) {
	shared := len(args) > 0
	b := newBoxCluster(t, testcluster.Config{Hosts: 4, Shared: shared})
	b.coordinator(t, b.Host(1), b.local)
	b.worker(t, b.Host(2), 2)
	b.worker(t, b.Host(3), 2)
	if shared {
		args = append(args, "--checkpoint-dir", b.Shared())
	}
	p := b.heldJob(t, 2, 60, args...)
	p.waitLine(t, "generation 1: 2 nodes (h2, h3)", time.Minute)
	b.worker(t, b.Host(4), 2)
	p.waitLine(t, `{"step":35,`, time.Minute)
	killed := time.Now()
	b.Host(3).Kill()
	p.waitLine(t, `"generation":2,"dp":`, time.Minute)
	resume := time.Since(killed)
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	last, from := redone(p.output())
	return resume, last - from
}

// runOut runs exe args and returns its combined output and the CPU time
// (user and system) of it and the descendants it waited for: with launch
// --standalone, the coordinator, the agents and every rank.
func runOut(t *testing.T, exe string, args ...string) (string, time.Duration, error) {
	t.Helper()
	p := start(t, exe, args...)
	code := p.wait(t, 5*time.Minute)
	var cpu time.Duration
	if ps := p.cmd.ProcessState; ps != nil {
		cpu = ps.UserTime() + ps.SystemTime()
	}
	if code != 0 {
		return p.output(), cpu, fmt.Errorf("exit %d", code)
	}
	return p.output(), cpu, nil
}

// dirBytes is the size of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
