package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// The planner's input of the re-planning tests: gpt-1.7b on DGX H100s,
// the native job's batch (testdata/mlp48.yaml: 48 samples, micro-batches
// of 4), as launch --plan-model gives it.
var replanArgs = []string{"--plan-model", "gpt-1.7b", "--plan-cluster", "dgx-h100"}

// plannerBest is the layout `gpucoord plan --auto` ranks first for the
// re-planning tests' native job on nodes nodes of 2 GPUs ("tp 2 pp 1 dp
// 2") and its estimated step. The search fixes what a re-plan keeps
// (micro-batch, recomputation, vpp, zero, schedule); mlp48's hidden (64)
// and blocks (8) allow every tp and pp up to 2 GPUs a node and 8 nodes.
func plannerBest(t *testing.T, exe string, nodes int) (string, float64) {
	return plannerBestOf(t, exe, nodes, 2, 48, 4)
}

// plannerBestOf is plan --auto's first layout for gpt-1.7b on nodes nodes
// of gpus DGX H100 GPUs at a global batch and micro-batch.
func plannerBestOf(t *testing.T, exe string, nodes, gpus, global, micro int) (string, float64) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), exe, "plan", "--auto", "--cluster", "dgx-h100", "--nodes", strconv.Itoa(nodes), "--gpus-per-node", strconv.Itoa(gpus),
		"--model", "gpt-1.7b", "--global-batch", strconv.Itoa(global), "--micro-batch", strconv.Itoa(micro), "--recompute", "none", "--zero", "0", "--vpp", "1",
		"--schedule", "1f1b", "--top", "1", "--json").Output()
	if err != nil {
		t.Fatalf("plan --auto on %d nodes: %v", nodes, err)
	}
	var doc struct {
		Plans []struct {
			Parallel struct{ TP, PP, DP int }
			Step     struct{ Seconds float64 } `json:"step"`
		} `json:"plans"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc.Plans) == 0 {
		t.Fatalf("plan --auto on %d nodes: %v\n%s", nodes, err, out)
	}
	p := doc.Plans[0]
	return fmt.Sprintf("tp %d pp %d dp %d", p.Parallel.TP, p.Parallel.PP, p.Parallel.DP), p.Step.Seconds
}

// replanned is a generation line's "re-planned A -> B" part.
var replanned = regexp.MustCompile(`re-planned [^:]*`)

var genLine = regexp.MustCompile(`generation (\d+): (\d+) nodes? \(([^)]*)\), \d+ ranks, (tp \d+ pp \d+ dp \d+)`)

// replanRun launches the native job at tp 2 pp 2 dp 2 on h2-h5 (2 GPUs
// each) with re-planning, kills victims once launch has printed step at,
// checks the next generation runs the planner's layout for the hosts left
// (and logs how long after the kill its line came), then, with back,
// restarts the victims' agents and checks the job grows back into the
// planner's layout for four. Every loss is train --np 1's.
func replanRun(t *testing.T, victims []int, at int, back bool) {
	steps := max(100, at+80) // room to grow back before the end
	b := newBoxCluster(t, testcluster.Config{Hosts: 5})
	want := e2e.Reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
	left := 4 - len(victims)
	shrunk, shrunkStep := plannerBest(t, b.exe, left)
	full, fullStep := plannerBest(t, b.exe, 4)
	if back && shrunkStep < fullStep*1.1 {
		t.Fatalf("the planner estimates %s on 4 nodes at %.3g s, %s on %d at %.3g s: less than the 10%% a job grows for", full, fullStep, shrunk, left, shrunkStep)
	}
	b.pool(t)
	p := b.run(t, b.Host(1), append(append([]string{"launch", "--coordinator", b.local, "--nodes", "4", "--gpus-per-node", "2", "--tp", "2", "--pp", "2",
		"--max-restarts", "10", "--checkpoint-replicas", "3", "--steps", strconv.Itoa(steps), "--json"}, replanArgs...), b.job)...)
	p.waitLine(t, "generation 1: 4 nodes (h2, h3, h4, h5), 8 ranks, tp 2 pp 2 dp 2", time.Minute)
	p.waitLine(t, fmt.Sprintf(`{"step":%d,`, at), 2*time.Minute)
	killed := time.Now()
	var names []string
	for _, v := range victims {
		b.Host(v).Kill()
		names = append(names, b.Host(v).Name)
	}
	// The victims die one after the other: the leader may see one lost
	// first and re-plan for the three hosts left, then for two.
	var m []string
	var last string
	for gens := 0; ; {
		line := p.waitLine(t, "node lost:", time.Minute)
		if strings.HasPrefix(line, "{") {
			continue // the JSON event of the generation's line
		}
		if gens++; gens == 1 {
			t.Logf("%s after the kill of %s: %s", time.Since(killed).Round(time.Millisecond), strings.Join(names, ", "), line)
		} else {
			t.Logf("%s", line)
		}
		if m = genLine.FindStringSubmatch(line); m == nil || !strings.Contains(line, "re-planned tp ") {
			t.Fatalf("a generation after the loss that was not re-planned:\n%s", p.output())
		}
		if last = line; m[2] == strconv.Itoa(left) {
			break
		}
	}
	if m[4] != shrunk || !strings.HasSuffix(replanned.FindString(last), "-> "+shrunk) {
		t.Fatalf("the generation on the %d hosts left is not %s (plan --auto's):\n%s", left, shrunk, p.output())
	}
	// Its ranks start once the lost hosts' leases have ended (and the
	// fence margin): no two generations at once.
	p.waitLine(t, fmt.Sprintf(`"generation":%s,"dp":`, m[1]), time.Minute)
	t.Logf("its first step %s after the kill", time.Since(killed).Round(time.Millisecond))
	for _, n := range names {
		if strings.Contains(m[3], n) {
			t.Errorf("the generation on the hosts left runs on %s, killed", n)
		}
	}
	if back {
		for _, v := range victims {
			b.worker(t, b.Host(v), 2)
		}
		// The agents come back one by one: the job may grow into one
		// before the other (a layout of three hosts, when the planner
		// gains 10% by it), then into four.
		for {
			line := p.waitLine(t, "nodes joined:", time.Minute)
			if strings.HasPrefix(line, "{") {
				continue // the JSON event of the generation's line
			}
			t.Logf("%s", line)
			m := genLine.FindStringSubmatch(line)
			if m == nil || !strings.Contains(line, "re-planned ") {
				t.Fatalf("a generation that grew without re-planning:\n%s", p.output())
			}
			if m[2] == "4" {
				if m[4] != full || !strings.HasSuffix(replanned.FindString(line), "-> "+full) {
					t.Fatalf("the generation on 4 hosts is not %s (plan --auto's):\n%s", full, p.output())
				}
				break
			}
		}
	}
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	e2e.SameLosses(t, e2e.Losses(t, p.output()), want)
}

// TestClusterReplan: the native job at tp 2, pp 2, dp 2 on four hosts
// loses two with no spare: the next generation runs, on the two left, the
// layout plan --auto ranks first for two hosts, from the last commit (its
// files cut for tp 2 pp 2, restored under the new layout); the two come
// back and the job grows into plan --auto's layout for four. Every loss
// is on train --np 1's curve.
func TestClusterReplan(t *testing.T) {
	t.Parallel() // a cluster of its own: runs beside the others (make test's -parallel)
	replanRun(t, []int{4, 5}, 20, true)
}

// TestClusterReplanDP1: a job at dp 1 (tp 2, pp 2 on two hosts of 2 GPUs)
// loses a host: it goes on at the layout plan --auto ranks first for one
// host instead of pausing, on train --np 1's curve.
func TestClusterReplanDP1(t *testing.T) {
	t.Parallel()
	const steps = 60
	b := newBoxCluster(t, testcluster.Config{Hosts: 3})
	want := e2e.Reference(t, b.exe, "--steps", strconv.Itoa(steps), "testdata/mlp48.yaml")
	one, _ := plannerBest(t, b.exe, 1)
	b.pool(t)
	p := b.run(t, b.Host(1), append(append([]string{"launch", "--coordinator", b.local, "--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--pp", "2",
		"--max-restarts", "3", "--steps", strconv.Itoa(steps), "--json"}, replanArgs...), b.job)...)
	p.waitLine(t, "generation 1: 2 nodes (h2, h3), 4 ranks, tp 2 pp 2 dp 1", time.Minute)
	p.waitLine(t, `{"step":20,`, 2*time.Minute)
	killH3ReplannedOnH2(t, b, p, one)
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	e2e.SameLosses(t, e2e.Losses(t, p.output()), want)
}

// killH3ReplannedOnH2 kills h3 of a job at tp 2 pp 2 dp 1 on h2 and h3
// and checks its next generation runs want (plan --auto's layout for one
// host) on h2, re-planned.
func killH3ReplannedOnH2(t *testing.T, b *boxCluster, p *proc, want string) {
	t.Helper()
	b.Host(3).Kill()
	line := p.waitLine(t, "generation 2:", time.Minute)
	t.Logf("%s", line)
	if m := genLine.FindStringSubmatch(line); m == nil || m[3] != "h2" || m[4] != want || !strings.Contains(line, "re-planned tp 2 pp 2 dp 1 -> "+want) {
		t.Fatalf("generation 2 is not %s on h2 (plan --auto's for one host):\n%s", want, p.output())
	}
}

// TestClusterReplanStress is TestClusterReplan at 20 random losses (one or
// two hosts of four, at a random step; the hosts come back in every other
// run): make stress.
func TestClusterReplanStress(t *testing.T) {
	if os.Getenv("GPUCOORD_STRESS") == "" {
		t.Skip("set GPUCOORD_STRESS=1 (make stress) to run the 20 losses")
	}
	rng := rand.New(rand.NewPCG(27, 1))
	for i := range 20 {
		victims := []int{2 + rng.IntN(4)}
		if rng.IntN(2) == 0 {
			v := 2 + rng.IntN(3)
			if v >= victims[0] {
				v++
			}
			victims = append(victims, v)
			slices.Sort(victims)
		}
		at, back := 5+rng.IntN(60), i%2 == 0
		t.Run(fmt.Sprintf("kill-%v-at-%d-back-%v", victims, at, back), func(t *testing.T) { replanRun(t, victims, at, back) })
	}
}

// gptSteps reads gpt3d.py's "step N loss L" lines (a restarted
// generation's repeat overwrites the step).
func gptSteps(out string) map[int]float64 {
	m := map[int]float64{}
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, "] step "); i >= 0 {
			line = line[i+2:]
		}
		var n int
		var l float64
		if k, _ := fmt.Sscanf(line, "step %d loss %g", &n, &l); k == 2 {
			m[n] = l
		}
	}
	return m
}

// TestClusterTorchGPT3DReplan: examples/pytorch/gpt3d.py at tp 2, pp 2 on
// two hosts of 2 ranks (gloo, float64) checkpoints every step,
// layout-independent, without a shared directory. One host is killed:
// gpucoord re-plans the job onto the host left (the layout plan --auto
// ranks first there, within what gpt3d splits into) and restarts it from
// the last commit; gpt3d assembles the whole tensors from the slices the
// old layout wrote and cuts its new ones, and every step's loss equals
// the one-process run's within 1e-5.
func TestClusterTorchGPT3DReplan(t *testing.T) {
	t.Parallel()
	py := e2e.TorchPython(t)
	const steps = 30
	one := exec.CommandContext(t.Context(), py, "../../examples/pytorch/gpt3d.py")
	one.Env = append(os.Environ(), "GPT3D_DTYPE=float64", "GPT3D_STEPS="+strconv.Itoa(steps))
	ref, err := one.Output()
	if err != nil {
		t.Fatalf("one process: %v", err)
	}
	want := gptSteps(string(ref))
	b := newBoxCluster(t, testcluster.Config{Hosts: 3})
	for _, f := range []string{"gpucoord_progress.py", "gpucoord_groups.py"} {
		b.Install("../../examples/pytorch/" + f) // beside the program, which imports them
	}
	prog := b.Install("../../examples/pytorch/gpt3d.py")
	// The planner's global batch for a program is its default on the
	// submitted nodes: 4 GPUs x micro-batch 1.
	onOne, _ := plannerBestOf(t, b.exe, 1, 2, 4, 1)
	b.coordinator(t, b.Host(1), b.local)
	b.worker(t, b.Host(2), 2)
	b.worker(t, b.Host(3), 2)
	p := b.run(t, b.Host(1), append(append([]string{"launch", "--coordinator", b.local, "--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--pp", "2",
		"--max-restarts", "3", "--replan-tp", "1,2,4", "--replan-pp", "1,2,4", "--replan-dp", "1,2,4"}, replanArgs...),
		"--env", "GPT3D_DTYPE=float64", "--env", "GPT3D_STEPS="+strconv.Itoa(steps), "--", py, prog)...)
	p.waitLine(t, "generation 1: 2 nodes (h2, h3), 4 ranks, tp 2 pp 2 dp 1", time.Minute)
	p.waitLine(t, "] step 10 loss", 2*time.Minute)
	killH3ReplannedOnH2(t, b, p, onOne)
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	out := p.output()
	if r := regexp.MustCompile(`resumed after step (\d+) at (tp \d+ pp \d+ dp \d+)`).FindStringSubmatch(out); r == nil || r[2] != onOne {
		t.Errorf("gpt3d did not say it resumed at %s:\n%s", onOne, out)
	} else {
		t.Logf("gpt3d resumed after step %s at %s", r[1], r[2])
	}
	got := gptSteps(out)
	if len(want) != steps || len(got) != steps {
		t.Fatalf("%d steps in one process, %d in the job:\n%s", len(want), len(got), out)
	}
	for n := 1; n <= steps; n++ {
		if math.Abs(got[n]-want[n]) > 1e-5*math.Abs(want[n]) {
			t.Errorf("step %d: loss %.9g, %.9g in one process", n, got[n], want[n])
		}
	}
}
