package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
)

// TestLaunchDetachFollowCancel: launch --detach submits and prints the
// job's id; follow shows the job from where it stands; cancel ends it and
// follow exits 130 saying so; a second cancel reports the end; an unknown
// job is named.
func TestLaunchDetachFollowCancel(t *testing.T) {
	exe := e2e.Binary(t)
	_, addr := coordinatorProc(t, exe)
	workerProc(t, exe, addr, "w0", 2)
	d := start(t, exe, "launch", "--coordinator", addr, "--nodes", "1", "--gpus-per-node", "2", "--job-id", "long", "--detach",
		"--steps", "100000", "../../examples/jobs/mlp.yaml")
	if code := d.wait(t, time.Minute); code != 0 {
		t.Fatalf("launch --detach exited %d:\n%s", code, d.output())
	}
	if !slices.Contains(strings.Split(d.output(), "\n"), "long") {
		t.Errorf("launch --detach did not print the job's id on a line of its own:\n%s", d.output())
	}
	f := start(t, exe, "follow", "long", "--coordinator", addr)
	f.waitLine(t, "generation 1: 1 node (w0)", time.Minute)
	f.waitLine(t, "step ", time.Minute)
	// status --json while it runs: numbers are JSON numbers, the phase is
	// spelled as the text output spells it, the layout is the one running
	// (spec.dp is 0: derived), and no opaque blob.
	st := start(t, exe, "status", "--coordinator", addr, "--json")
	if code := st.wait(t, time.Minute); code != 0 {
		t.Fatalf("status --json exited %d:\n%s", code, st.output())
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(st.output()), &doc); err != nil {
		t.Fatalf("status --json: %v\n%s", err, st.output())
	}
	job := doc["jobs"].([]any)[0].(map[string]any)
	gen := job["generation"].(map[string]any)
	layout := job["layout"].(map[string]any)
	if doc["schema"] != statusSchema || job["phase"] != "running" || gen["number"] != 1.0 || layout["dp"] != 2.0 || layout["world"] != 2.0 {
		t.Errorf("status --json: schema %v, phase %v, generation %#v, layout %v", doc["schema"], job["phase"], gen["number"], layout)
	}
	if step, ok := job["step"].(map[string]any); !ok || step["step"].(float64) < 1 {
		t.Errorf("status --json: step %v, want a number", job["step"])
	}
	if strings.Contains(st.output(), "native_job") || strings.Contains(st.output(), "nativeJob") {
		t.Errorf("status --json holds the job file's blob:\n%s", st.output())
	}
	c := start(t, exe, "cancel", "long", "--coordinator", addr)
	if code := c.wait(t, time.Minute); code != 0 || !strings.Contains(c.output(), "job long cancelled") {
		t.Fatalf("cancel exited %d:\n%s", code, c.output())
	}
	if code := f.wait(t, time.Minute); code != exitInterrupted || !strings.Contains(f.output(), "job long cancelled: cancelled by gpucoord cancel") {
		t.Errorf("follow exited %d, want %d naming the cancel:\n%s", code, exitInterrupted, f.output())
	}
	c = start(t, exe, "cancel", "long", "--coordinator", addr)
	if code := c.wait(t, time.Minute); code != 0 || !strings.Contains(c.output(), "job long") {
		t.Errorf("a second cancel exited %d:\n%s", code, c.output())
	}
	for _, cmd := range []string{"cancel", "follow"} {
		p := start(t, exe, cmd, "nosuch", "--coordinator", addr)
		if code := p.wait(t, time.Minute); code != 1 || !strings.Contains(p.output(), "no job nosuch: gpucoord status lists the jobs") {
			t.Errorf("%s of an unknown job exited %d:\n%s", cmd, code, p.output())
		}
	}
}

// TestLaunchHangupCancels: SIGHUP (a dropped ssh session) and SIGINT to a
// standalone launch of a native job cancel the job: launch exits 130 with
// one line, no log line, and leaves nothing in its temporary directory or
// in /dev/shm.
func TestLaunchHangupCancels(t *testing.T) {
	exe := e2e.Binary(t)
	shm := func() []string {
		m, _ := filepath.Glob("/dev/shm/gpucoord/checkpoints/gpucoord-standalone-*")
		return m
	}
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			before := shm()
			tmp := t.TempDir()
			p := startEnv(t, []string{"TMPDIR=" + tmp}, exe, "launch", "--standalone", "--nodes", "2", "--gpus-per-node", "2", "--tp", "2",
				"--steps", "100000", "../../examples/jobs/mlp.yaml")
			p.waitLine(t, " 10/100000", time.Minute)
			at := time.Now()
			p.cmd.Process.Signal(sig)
			code := p.wait(t, time.Minute)
			t.Logf("%s: launch exited %d %s after the signal", sig, code, time.Since(at).Round(10*time.Millisecond))
			out := p.output()
			after := out[strings.LastIndex(out, "step "):]
			if code != exitInterrupted || strings.Count(after, "\n") != 2 || !strings.Contains(after, "cancelled: launch interrupted") {
				t.Errorf("exit %d, want %d and one line after the last step:\n%s", code, exitInterrupted, after)
			}
			if strings.Contains(out, "level=") {
				t.Errorf("log lines in launch's output:\n%s", out)
			}
			if left, _ := os.ReadDir(tmp); len(left) > 0 {
				t.Errorf("left in the temporary directory: %v", left)
			}
			for _, d := range shm() {
				if !slices.Contains(before, d) {
					t.Errorf("left in /dev/shm: %s", d)
				}
			}
		})
	}
}

// startEnv is start with env added to the process's environment.
func startEnv(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return startCmd(t, cmd)
}

// TestLaunchPythonFailureCause: a Python rank that raises is reported by
// its exception, not "exit status 1": with PyTorch's @record (the error
// file torchrun's TORCHELASTIC_ERROR_FILE names) and without it (the
// traceback's last line).
func TestLaunchPythonFailureCause(t *testing.T) {
	py := e2e.TorchPython(t)
	exe := e2e.Binary(t)
	for name, prog := range map[string]string{
		"record": `import os
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("bad value 42")
main()`,
		"plain": `import os
if os.environ["RANK"] == "1":
    raise ValueError("bad value 42")`,
	} {
		t.Run(name, func(t *testing.T) {
			p := start(t, exe, "launch", "--standalone", "--nodes", "1", "--gpus-per-node", "2", "--", py, "-c", prog)
			code := p.wait(t, 2*time.Minute)
			if code != 1 || !strings.Contains(p.output(), "failed: rank 1 on node0 exited with code 1: ValueError: bad value 42") {
				t.Errorf("exit %d, want 1 naming the exception:\n%s", code, p.output())
			}
			if !strings.Contains(p.output(), "Traceback (most recent call last):") {
				t.Errorf("no traceback shown:\n%s", p.output())
			}
		})
	}
}

// TestLaunchOutput: in coordinator mode every rank's lines reach launch
// behind their tags, after the generation's line (--output all), rank 0's
// alone (rank0), or only a failed rank's last lines (failed); gpucoord logs
// reads a rank's lines back from its agent.
func TestLaunchOutput(t *testing.T) {
	exe := e2e.Binary(t)
	_, addr := coordinatorProc(t, exe)
	workerProc(t, exe, addr, "w0", 2)
	launch := func(id, output, script string) (int, string) {
		p := start(t, exe, "launch", "--coordinator", addr, "--nodes", "1", "--gpus-per-node", "2", "--job-id", id, "--output", output,
			"--", "/bin/sh", "-c", script)
		code := p.wait(t, time.Minute)
		return code, p.output()
	}
	code, out := launch("out", "all", `echo hello $RANK; echo oops $RANK >&2`)
	gen := strings.Index(out, "generation 1: 1 node (w0)")
	for _, want := range []string{"[w0 r0 tp0 pp0 dp0] hello 0\n", "[w0 r0 tp0 pp0 dp0] oops 0\n", "[w0 r1 tp0 pp0 dp1] hello 1\n", "[w0 r1 tp0 pp0 dp1] oops 1\n"} {
		if i := strings.Index(out, want); code != 0 || gen < 0 || i < gen {
			t.Errorf("launch --output all exited %d; %q is not after the generation's line:\n%s", code, want, out)
		}
	}
	// status fails over past a coordinator that refuses.
	st := start(t, exe, "status", "--coordinator", "127.0.0.1:1,"+addr)
	if code := st.wait(t, time.Minute); code != 0 || !strings.Contains(st.output(), "w0") {
		t.Errorf("status past a refusing coordinator exited %d:\n%s", code, st.output())
	}
	code, out = launch("out0", "rank0", `echo hello $RANK`)
	if code != 0 || !strings.Contains(out, "[w0 r0 tp0 pp0 dp0] hello 0\n") || strings.Contains(out, "hello 1") {
		t.Errorf("launch --output rank0 exited %d, want rank 0's line alone:\n%s", code, out)
	}
	code, out = launch("outf", "failed", `echo before $RANK; if [ $RANK = 1 ]; then exit 3; fi`)
	if code != 3 || strings.Contains(out, "] before") || !strings.Contains(out, "last output of rank 1 on w0:\n  before 1") {
		t.Errorf("launch --output failed exited %d, want 3 with rank 1's last line alone:\n%s", code, out)
	}
	logs := func(args ...string) (int, string) {
		p := start(t, exe, append([]string{"logs", "--coordinator", addr}, args...)...)
		code := p.wait(t, time.Minute)
		return code, p.output()
	}
	if code, out := logs("out", "--rank", "1"); code != 0 || out != "[w0 r1 tp0 pp0 dp1] hello 1\n[w0 r1 tp0 pp0 dp1] oops 1\n" &&
		out != "[w0 r1 tp0 pp0 dp1] oops 1\n[w0 r1 tp0 pp0 dp1] hello 1\n" {
		t.Errorf("logs --rank 1 exited %d:\n%s", code, out)
	}
	if code, out := logs("out"); code != 0 || strings.Count(out, "\n") != 4 || !strings.HasPrefix(out, "[w0 r0 ") || !strings.HasSuffix(out, "1\n") {
		t.Errorf("logs exited %d, want rank 0's lines then rank 1's:\n%s", code, out)
	}
	if code, out := logs("nosuch"); code != 1 || !strings.Contains(out, "no job nosuch: gpucoord status lists the jobs") {
		t.Errorf("logs of an unknown job exited %d:\n%s", code, out)
	}
	if code, out := logs("out", "--rank", "5"); code != 1 || !strings.Contains(out, "no node holds a log of rank 5 of job out") {
		t.Errorf("logs of a rank without lines exited %d:\n%s", code, out)
	}
	if code, out := launch("bad", "some", "true"); code != 2 || !strings.Contains(out, `--output "some": want all, rank0 or failed`) {
		t.Errorf("launch --output some exited %d:\n%s", code, out)
	}
}

// TestUnreachableCoordinators: every command that reaches coordinators
// says in one line which did not answer and why (a port that takes
// connections and never answers, within --connect-timeout; a refused
// connection); worker tries again with growing pauses.
func TestUnreachableCoordinators(t *testing.T) {
	exe := e2e.Binary(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, unread, until the test ends
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := refused.Addr().String()
	refused.Close()
	both := silent.Addr().String() + "," + dead
	want := fmt.Sprintf("gpucoord: no coordinator answered at %s (no answer within 500ms), %s (connection refused)", silent.Addr(), dead)
	for _, args := range [][]string{
		{"status", "--coordinator", both},
		{"cancel", "j", "--coordinator", both},
		{"follow", "j", "--coordinator", both},
		{"logs", "j", "--coordinator", both},
		{"launch", "--coordinator", both, "--nodes", "1", "--gpus-per-node", "1", "--", "true"},
	} {
		p := start(t, exe, append([]string{args[0], "--connect-timeout", "500ms"}, args[1:]...)...)
		code := p.wait(t, time.Minute)
		out := strings.TrimSpace(p.output())
		if code != 1 || strings.Count(out, "\n") != 0 || !strings.HasPrefix(out, want) {
			t.Errorf("%s exited %d, want 1 and one line %q:\n%s", args[0], code, want, out)
		}
	}
	w := start(t, exe, "worker", "--coordinator", dead, "--name", "w", "--gpus-per-node", "1", "--state-dir", t.TempDir())
	var waits []time.Duration
	for range 3 {
		line := w.waitLine(t, "no coordinator answered at "+dead+" (connection refused)", time.Minute)
		d, err := time.ParseDuration(line[strings.Index(line, "retry_in=")+len("retry_in="):])
		if err != nil {
			t.Fatalf("no retry_in in %q", line)
		}
		waits = append(waits, d)
	}
	// From 0.5s, doubling, with 20% jitter: each pause is longer than the
	// one before.
	if !slices.IsSorted(waits) || waits[0] < 400*time.Millisecond || waits[2] > 2400*time.Millisecond {
		t.Errorf("worker's pauses %v, want growing from 0.5s", waits)
	}
}
