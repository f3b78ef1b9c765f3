package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/worker/engine"
)

// tinyJob is small enough that eight processes train 20 steps in about a
// second on two cores.
const tinyJob = `name: tiny
model: {width: 6, hidden: 8, blocks: 4, outputs: 3}
batch: {global: 16, micro: 2}
optimizer: {lr: 0.01}
steps: 20
seed: 7
`

func TestMain(m *testing.M) {
	if os.Getenv(strangerEnv) != "" {
		os.Exit(strangerMain())
	}
	if os.Getenv(poolMemberEnv) != "" {
		os.Exit(poolMemberMain())
	}
	if len(os.Args) > 1 && (os.Args[1] == fenceCmd || os.Args[1] == rankCmd) {
		// An agent of a test's in-process cluster (launch --standalone run
		// by the test itself) starts this binary as its fence watchdog or
		// a native rank: be that, not a second run of every test.
		main()
		return
	}
	// The gpucoord binaries the tests start (e2e.Binary: under the race
	// detector, the control plane race-checked and the ranks not) and
	// their environment; the fake NCCL library's directory removed too.
	e2e.Main(m, &fakeNCCLDir)
}

// TestTrainOverTCPMatchesSingleProcess is the headline test over real TCP
// processes on 127.0.0.1: gpucoord train launches one process per rank, and
// the per-step losses (from --json) and final parameters (from
// --save-params) equal the single-process run's within 1e-5 relative and
// 1e-4, for the whole matrix: (tp, pp, dp) in {(1,1,1), (2,1,1), (1,2,1),
// (1,1,2), (2,2,2)} x every schedule x ZeRO 0-3 (68 runs; interleaved needs
// two stages, so it runs with pp = 2 only). The model is tiny, so each run,
// up to eight processes, takes a fraction of a second even on two cores.
func TestTrainOverTCPMatchesSingleProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	dir := t.TempDir()
	jobPath := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(jobPath, []byte(tinyJob), 0o644); err != nil {
		t.Fatal(err)
	}
	job, err := engine.LoadJob(jobPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref := engine.DefaultConfig(job)
	ref.Schedule = schedule.GPipe
	want, err := engine.RunInProc(t.Context(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	exe := e2e.Binary(t)
	type layout struct {
		tp, pp, dp, zero int
		sched            string
	}
	var tests []layout
	for _, l := range [][3]int{{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}} {
		for _, kind := range schedule.Kinds() {
			if kind == schedule.Interleaved && l[1] == 1 {
				continue
			}
			for zero := range 4 {
				tests = append(tests, layout{l[0], l[1], l[2], zero, string(kind)})
			}
		}
	}
	if len(tests) != 68 {
		t.Fatalf("%d layouts, want 68", len(tests))
	}
	for _, tc := range tests {
		name := fmt.Sprintf("tp%d-pp%d-dp%d-%s-zero%d", tc.tp, tc.pp, tc.dp, tc.sched, tc.zero)
		t.Run(name, func(t *testing.T) {
			params := filepath.Join(t.TempDir(), "params")
			cmd := exec.CommandContext(t.Context(), exe, "train", "--json",
				"--tp", fmt.Sprint(tc.tp), "--pp", fmt.Sprint(tc.pp), "--dp", fmt.Sprint(tc.dp),
				"--schedule", tc.sched, "--zero", fmt.Sprint(tc.zero), "--save-params", params, jobPath)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("train: %v\n%s", err, stderr.String())
			}
			var losses []float64
			sc := bufio.NewScanner(&stdout)
			for sc.Scan() {
				var s struct {
					Step int     `json:"step"`
					Loss float64 `json:"loss"`
				}
				if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				if s.Step != len(losses)+1 {
					t.Fatalf("step %d after %d lines", s.Step, len(losses))
				}
				losses = append(losses, s.Loss)
			}
			if len(losses) != len(want.Losses) {
				t.Fatalf("%d steps printed, want %d", len(losses), len(want.Losses))
			}
			for s := range losses {
				if d := math.Abs(losses[s]-want.Losses[s]) / math.Abs(want.Losses[s]); !(d <= 1e-5) {
					t.Errorf("step %d: loss %.9g, single process %.9g", s+1, losses[s], want.Losses[s])
				}
			}
			got, err := engine.ReadParams(params)
			if err != nil {
				t.Fatal(err)
			}
			if d, where := got.MaxRelDiff(want.Params, 1); !(d <= 1e-4) {
				t.Errorf("final parameters differ by %.3g in %s", d, where)
			}
		})
	}
}

// TestTrainBadInput checks that bad flags and job files exit with usage
// errors naming the problem, without starting anything.
func TestTrainBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte(tinyJob), 0o644)
	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte(tinyJob+"epochs: 2\n"), 0o644)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"train", "--np", "3", "--tp", "2", good}, "np 3 is not divisible"},
		{[]string{"train", "--tp", "3", good}, "not divisible by tp 3"},
		{[]string{"train", "--pp", "3", good}, "model.blocks 4 is not divisible"},
		{[]string{"train", "--schedule", "pipedream", good}, "pipedream"},
		{[]string{"train", "--zero", "4", good}, "ZeRO stage 4"},
		{[]string{"train", "--steps", "0", good}, "steps 0"},
		{[]string{"train", unknown}, `unknown field "epochs"`},
		{[]string{"train", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"train"}, "exactly one job file"},
		{[]string{"train", "--backend", "gloo", good}, `unknown backend "gloo"`},
		{[]string{"train", "--backend", "nccl", "--inproc", good}, "--backend nccl runs the ranks as processes"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(t.Context(), tc.args, &out, &errOut)
			var ee *exitError
			if err == nil || !errors.As(err, &ee) || ee.code != exitUsage || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want a usage error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestTrainStepsOverride: --steps completes a job file that has no steps.
func TestTrainStepsOverride(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nosteps.yaml")
	os.WriteFile(path, []byte(strings.Replace(tinyJob, "steps: 20\n", "", 1)), 0o644)
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"train", "--inproc", "--json", "--steps", "3", path}, &out, &errOut); err != nil {
		t.Fatalf("train --steps 3 on a job without steps: %v", err)
	}
	if n := strings.Count(out.String(), `"step"`); n != 3 {
		t.Errorf("%d step lines, want 3:\n%s", n, out.String())
	}
	err := run(t.Context(), []string{"train", "--inproc", path}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "steps 0") {
		t.Errorf("without --steps: err = %v, want the missing steps named", err)
	}
}

// TestTrainInProc runs the command in process and checks its progress
// output against the engine's own losses.
func TestTrainInProc(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	os.WriteFile(path, []byte(tinyJob), 0o644)
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"train", "--inproc", "--tp", "2", "--pp", "2", "--schedule", "interleaved", "--steps", "3", "--seed", "9", path}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	job, _ := engine.LoadJob(path, nil)
	job.Steps, job.Seed = 3, 9
	want, err := engine.RunInProc(t.Context(), engine.DefaultConfig(job), nil)
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if head := "training tiny: tp 2 pp 2 dp 1 (4 ranks), interleaved x2 chunks, ZeRO 0, 8 micro-batches of 2, 3 steps\n"; !strings.HasPrefix(text, head) {
		t.Errorf("header: want %q in:\n%s", head, text)
	}
	for s, l := range want.Losses {
		if line := fmt.Sprintf("step %d/3  loss %.6f", s+1, l); !strings.Contains(text, line) {
			t.Errorf("output lacks %q:\n%s", line, text)
		}
	}
	if !strings.Contains(text, "done: 3 steps") {
		t.Errorf("no summary line:\n%s", text)
	}
}

// TestTrainSaveParamsDir checks --save-params before any training: files
// another run left in the directory (here a valid parameter file of another
// seed, named as a pipeline stage of another layout would name it) are
// removed and others kept, so the saved model reads back as this run's
// exactly; a directory that cannot be written is a one-line usage error
// with nothing trained.
func TestTrainSaveParamsDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(path, []byte(tinyJob), 0o644); err != nil {
		t.Fatal(err)
	}
	train := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(t.Context(), append([]string{"train", "--inproc", "--steps", "3"}, append(args, path)...), &out, &errOut)
		return out.String(), err
	}
	other, params := filepath.Join(dir, "other"), filepath.Join(dir, "params")
	if _, err := train("--seed", "1", "--save-params", other); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(params, 0o755)
	if err := os.Rename(filepath.Join(other, "params-full.gob"), filepath.Join(params, "params-pp1-tp0.gob")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(params, "notes.txt"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := train("--save-params", params); err != nil {
		t.Fatal(err)
	}
	job, _ := engine.LoadJob(path, nil)
	job.Steps = 3
	want, err := engine.RunInProc(t.Context(), engine.DefaultConfig(job), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := engine.ReadParams(params)
	if err != nil {
		t.Fatal(err)
	}
	if d, where := got.MaxRelDiff(want.Params, 1); d != 0 {
		t.Errorf("saved parameters differ from this run's by %.3g in %s: another run's file was read with them", d, where)
	}
	if _, err := os.Stat(filepath.Join(params, "params-pp1-tp0.gob")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale params-pp1-tp0.gob: stat err = %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(params, "notes.txt")); err != nil {
		t.Errorf("notes.txt, not a parameter file, was touched: %v", err)
	}
	entries, _ := os.ReadDir(params)
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want params-full.gob and notes.txt: %v", len(entries), entries)
	}

	unwritable := []struct{ name, dir string }{
		{"below a file", filepath.Join(dir, "job.yaml", "params")},
	}
	if os.Geteuid() != 0 { // root writes through permissions
		ro := filepath.Join(dir, "read-only")
		os.Mkdir(ro, 0o555)
		unwritable = append(unwritable, struct{ name, dir string }{"read-only", ro})
	}
	for _, tc := range unwritable {
		t.Run(tc.name, func(t *testing.T) {
			out, err := train("--save-params", tc.dir)
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != exitUsage {
				t.Fatalf("err = %v, want a usage error", err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "--save-params "+tc.dir+": ") || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line naming --save-params %s", msg, tc.dir)
			}
			if out != "" {
				t.Errorf("trained before failing:\n%s", out)
			}
		})
	}
}

// TestTrainDivergedNamesStep: with a learning rate of 1e38 the first update
// leaves the weights overflowing, so step 2's loss is not finite: the error
// names step 2 and no line for step 2 is printed before it.
func TestTrainDivergedNamesStep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "diverge.yaml")
	job := strings.Replace(strings.Replace(tinyJob, "lr: 0.01", "lr: 1e38", 1), "outputs: 3}", "outputs: 3, loss: mse}", 1)
	os.WriteFile(path, []byte(job), 0o644)
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"train", "--inproc", "--steps", "3", path}, &out, &errOut)
	if !errors.Is(err, engine.ErrDiverged) || !strings.Contains(err.Error(), "step 2: engine: loss is not finite") {
		t.Fatalf("err = %v, want step 2 named as diverged", err)
	}
	if text := out.String(); !strings.Contains(text, "step 1/3") || strings.Contains(text, "step 2/3") {
		t.Errorf("want step 1's line and none for step 2:\n%s", text)
	}
}

// TestTrainSingular: a run of one rank, one micro-batch and one step says
// so in the singular.
func TestTrainSingular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.yaml")
	os.WriteFile(path, []byte(strings.Replace(tinyJob, "batch: {global: 16, micro: 2}", "batch: {global: 2, micro: 2}", 1)), 0o644)
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"train", "--inproc", "--steps", "1", path}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"(1 rank), 1f1b x1 chunk, ZeRO 0, 1 micro-batch of 2, 1 step\n", "done: 1 step in "} {
		if !strings.Contains(text, want) {
			t.Errorf("want %q in:\n%s", want, text)
		}
	}
}
