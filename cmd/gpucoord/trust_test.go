package main

import (
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// userFiles puts a user's files in each of dirs (a file, and a directory
// with a file in it, named as a job or a node might be) and returns a
// check that they are all still there, unchanged.
func userFiles(t *testing.T, dirs ...string) (check func(when string)) {
	t.Helper()
	files := map[string]string{}
	for _, d := range dirs {
		for _, name := range []string{"KEEP.txt", "datasets/train.bin", "w0/notes.txt"} {
			p := filepath.Join(d, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("the user's "+p), 0o644); err != nil {
				t.Fatal(err)
			}
			files[p] = "the user's " + p
		}
	}
	return func(when string) {
		t.Helper()
		for p, want := range files {
			if b, err := os.ReadFile(p); err != nil || string(b) != want {
				t.Errorf("%s: the user's file %s: %q, %v", when, p, b, err)
			}
		}
	}
}

// TestLaunchBadJobID: a job id that is not one path element of safe
// characters, or that names a directory the agent keeps for itself, is a
// one-line usage error (exit 2) saying what a job id may be, against a
// coordinator and standalone, and nothing is submitted or removed: a
// user's files beside the agent's --state-dir (where STATE/../NODE was a
// job's directory of the id "..") and inside it survive, as they do a good
// job run after. A node name is held to the same rule.
func TestLaunchBadJobID(t *testing.T) {
	exe := e2e.Binary(t)
	_, addr := coordinatorProc(t, exe)
	base := t.TempDir()
	state := filepath.Join(base, "state")
	check := userFiles(t, base, state)
	w := start(t, exe, "worker", "--coordinator", addr, "--name", "w0", "--gpus-per-node", "1", "--state-dir", state, "--grace", "1s",
		"--checkpoint-local", filepath.Join(base, "held"))
	w.waitLine(t, "msg=registered ", 30*time.Second)
	for _, id := range []string{"..", ".", ".logs", "checkpoints", "logs", "jobs", "gpucoord", "../w0", "a/b", "-rf", strings.Repeat("x", 64)} {
		for _, mode := range [][]string{{"--coordinator", addr}, {"--standalone"}} {
			args := append(append([]string{"launch"}, mode...), "--nodes", "1", "--gpus-per-node", "1", "--job-id", id, "--", "true")
			p := start(t, exe, args...)
			code := p.wait(t, time.Minute)
			out := strings.TrimSpace(p.output())
			if code != exitUsage || strings.Contains(out, "\n") || !strings.Contains(out, "--job-id") || !strings.Contains(out, pb.JobIDRule) {
				t.Errorf("launch %s --job-id %q exited %d, want %d with one line saying what a job id may be:\n%s", mode[0], id, code, exitUsage, out)
			}
		}
	}
	check("after the bad job ids")
	for _, name := range []string{"..", ".logs", "checkpoints"} {
		p := start(t, exe, "worker", "--coordinator", addr, "--name", name, "--state-dir", state)
		code := p.wait(t, time.Minute)
		if out := strings.TrimSpace(p.output()); code != exitUsage || strings.Contains(out, "\n") || !strings.Contains(out, pb.NodeNameRule) {
			t.Errorf("worker --name %q exited %d, want %d with one line saying what a node name may be:\n%s", name, code, exitUsage, out)
		}
	}
	p := start(t, exe, "launch", "--coordinator", addr, "--nodes", "1", "--gpus-per-node", "1", "--job-id", "good", "--", "true")
	if code := p.wait(t, time.Minute); code != 0 {
		t.Fatalf("launch --job-id good exited %d:\n%s", code, p.output())
	}
	w.waitLine(t, `msg="job files removed"`, time.Minute)
	check("after a good job")
}

// TestRankEnvNoToken: an agent given its join token in GPUCOORD_TOKEN, as
// the docs allow, and other things of its own (an ssh agent, cloud keys)
// starts ranks that see none of them: a rank's environment is torchrun's
// and gpucoord's contract, the job's --env, and what programs need of the
// agent's (PATH, NCCL_*, ...), plus what --rank-env names. The same holds
// for launch --standalone, whose ranks otherwise inherit launch's
// environment.
func TestRankEnvNoToken(t *testing.T) {
	exe := e2e.Binary(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	_, addr := coordinatorProc(t, exe, "--token-file", tokenFile)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	own := []string{"GPUCOORD_TOKEN=" + token, "XDG_STATE_HOME=" + filepath.Join(dir, "creds"), "SSH_AUTH_SOCK=/tmp/agent.sock",
		"AWS_SECRET_ACCESS_KEY=not-for-ranks", "NCCL_DEBUG=WARN", "MY_DATA=/data/set"}
	w := startEnv(t, own, exe, "worker", "--coordinator", addr, "--name", "w0", "--gpus-per-node", "2", "--state-dir", filepath.Join(dir, "state"),
		"--checkpoint-local", filepath.Join(dir, "held"), "--grace", "1s", "--rank-env", "MY_DATA")
	w.waitLine(t, "msg=registered ", 30*time.Second)
	script := `env | sed "s/^/ENV$RANK /"`
	clientEnv := []string{"GPUCOORD_TOKEN=" + token, "XDG_STATE_HOME=" + filepath.Join(dir, "client")}
	p := startEnv(t, clientEnv, exe, "launch", "--coordinator", addr, "--nodes", "1", "--gpus-per-node", "2", "--job-id", "envs",
		"--env", "JOBVAR=mine", "--", "/bin/sh", "-c", script)
	if code := p.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, p.output())
	}
	sa := startEnv(t, append(own, "GPUCOORD_TOKEN=gct1.standalone.secret.x"), exe, "launch", "--standalone", "--nodes", "1", "--gpus-per-node", "2",
		"--env", "JOBVAR=mine", "--", "/bin/sh", "-c", script)
	if code := sa.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("launch --standalone exited %d:\n%s", code, sa.output())
	}
	for name, out := range map[string]string{"cluster": p.output(), "standalone": sa.output()} {
		for _, r := range []string{"0", "1"} {
			env := map[string]string{}
			for _, line := range strings.Split(out, "\n") {
				if _, kv, ok := strings.Cut(line, "ENV"+r+" "); ok {
					k, v, _ := strings.Cut(kv, "=")
					env[k] = v
				}
			}
			if len(env) == 0 {
				t.Fatalf("%s: rank %s printed no environment:\n%s", name, r, out)
			}
			for k, v := range env {
				if strings.Contains(v, "gct1.") || strings.HasPrefix(k, "GPUCOORD_TOKEN") {
					t.Errorf("%s: rank %s has %s=%s", name, r, k, v)
				}
			}
			want := map[string]string{"RANK": r, "JOBVAR": "mine", "NCCL_DEBUG": "WARN", "MY_DATA": "/data/set", "PATH": os.Getenv("PATH")}
			gone := []string{"GPUCOORD_TOKEN", "SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY", "XDG_STATE_HOME", "GPUCOORD_RANK_EXECUTABLE"}
			if name == "standalone" {
				// launch's own user's environment, but gpucoord's variables.
				want["SSH_AUTH_SOCK"], want["AWS_SECRET_ACCESS_KEY"] = "/tmp/agent.sock", "not-for-ranks"
				gone = []string{"GPUCOORD_TOKEN", "GPUCOORD_RANK_EXECUTABLE"}
			}
			for k, v := range want {
				if env[k] != v {
					t.Errorf("%s: rank %s has %s=%q, want %q", name, r, k, env[k], v)
				}
			}
			for _, k := range gone {
				if v, ok := env[k]; ok {
					t.Errorf("%s: rank %s has %s=%s", name, r, k, v)
				}
			}
		}
	}
	if strings.Contains(w.output(), "gct1.") {
		t.Errorf("the agent's output shows the token:\n%s", w.output())
	}
}

// entries lists the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestUserFilesSurvive: every directory a user names (worker --state-dir
// and --checkpoint-local, launch --checkpoint-dir, --checkpoint-backup
// and --workdir) already holds a user's files, among them directories
// named as a job or a node might be; jobs with held checkpoints and a
// backup tier, with a shared directory, a cancelled one, one whose node
// is killed (SIGKILL) and whose agent starts again, and a last one run on
// two agents. Every user's file is still there after them, and gpucoord
// wrote only in a directory "gpucoord" of each (none in --workdir). The
// old agent took every directory of --checkpoint-local for a job's and
// removed datasets/ when a job's held files were dropped.
func TestUserFilesSurvive(t *testing.T) {
	exe := e2e.Binary(t)
	_, addr := coordinatorProc(t, exe)
	base := t.TempDir()
	dir := func(name string) string { return filepath.Join(base, name) }
	named := []string{dir("state0"), dir("state1"), dir("local0"), dir("local1"), dir("shared"), dir("backup"), dir("workdir")}
	check := userFiles(t, named...)
	// A user's directory named as the shared directory's steps were.
	if err := os.MkdirAll(filepath.Join(dir("shared"), "tp0-of-1", "chunk0-of-1", "step-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	worker := func(n string) *proc {
		t.Helper()
		w := start(t, exe, "worker", "--coordinator", addr, "--name", "w"+n, "--gpus-per-node", "2", "--grace", "1s",
			"--state-dir", dir("state"+n), "--checkpoint-local", dir("local"+n))
		w.waitLine(t, "msg=registered ", 30*time.Second)
		return w
	}
	w0, w1 := worker("0"), worker("1")
	launch := func(want int, args ...string) *proc {
		t.Helper()
		p := start(t, exe, append([]string{"launch", "--coordinator", addr, "--nodes", "2", "--gpus-per-node", "2"}, args...)...)
		if want >= 0 {
			if code := p.wait(t, 2*time.Minute); code != want {
				t.Fatalf("launch %v exited %d, want %d:\n%s", args, code, want, p.output())
			}
		}
		return p
	}
	const job = "../../examples/jobs/mlp.yaml"
	launch(0, "--pp", "2", "--job-id", "held1", "--steps", "6", "--checkpoint-backup", dir("backup"), "--backup-every", "1", job)
	check("after a job with held checkpoints and a backup tier")
	launch(0, "--pp", "2", "--job-id", "shared1", "--steps", "6", "--checkpoint-dir", dir("shared"), "--checkpoint-every", "1", job)
	check("after a job with a shared checkpoint directory")

	p := launch(-1, "--job-id", "cancelled", "--workdir", dir("workdir"), "--", "/bin/sh", "-c", "echo started; exec sleep 600")
	p.waitLine(t, "started", time.Minute)
	p.cmd.Process.Signal(os.Interrupt)
	if code := p.wait(t, time.Minute); code != exitInterrupted {
		t.Fatalf("cancelled launch exited %d:\n%s", code, p.output())
	}
	check("after a cancelled job")

	p = launch(-1, "--pp", "2", "--job-id", "crashed", "--steps", "1000000", job)
	p.waitLine(t, "step       3/1000000 ", time.Minute)
	w1.cmd.Process.Signal(syscall.SIGKILL)
	if code := p.wait(t, time.Minute); code == 0 {
		t.Fatalf("launch succeeded with its node killed:\n%s", p.output())
	}
	w1 = worker("1")
	launch(0, "--job-id", "zzz", "--", "true")
	// Each agent drops the held files of zzz, the last in its directory's
	// order, once the job has ended: everything before is done.
	for _, w := range []*proc{w0, w1} {
		for !strings.Contains(w.waitLine(t, `msg="checkpoints of an ended job removed"`, time.Minute), "job=zzz") {
		}
	}
	check("after a killed agent started again, and a last job")

	// The killed run's plan files went when its agent started again.
	for _, n := range []string{"0", "1"} {
		if left := entries(t, filepath.Join(dir("state"+n), "gpucoord", "jobs")); len(left) != 0 {
			t.Errorf("w%s keeps the files of jobs %v", n, left)
		}
	}
	user := []string{"KEEP.txt", "datasets", "w0"}
	for _, d := range named {
		want := append(slices.Clone(user), "gpucoord")
		switch d {
		case dir("workdir"):
			want = user
		case dir("shared"):
			want = append(want, "tp0-of-1")
		}
		slices.Sort(want)
		if got := entries(t, d); !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v: gpucoord writes only in gpucoord/", d, got, want)
		}
	}
	// What a shared directory and a backup tier keep is the job's.
	for _, d := range []string{filepath.Join(dir("shared"), "gpucoord", "shared1"), filepath.Join(dir("backup"), "gpucoord", "held1")} {
		if len(entries(t, d)) == 0 {
			t.Errorf("%s is empty", d)
		}
	}
}

// TestRankUser: agents given --rank-user nobody (the test runs as root)
// run a native job's ranks as that user, with held checkpoints: they read
// their plan, speak the progress protocol, checkpoint, and the step is
// replicated and committed. Each agent also holds files of another job
// that waits for nodes (as a paused job's are held); a program's rank
// then runs as nobody, with nobody's HOME, writes its own checkpoint
// directory, and can read neither node's key, the agents' environments
// (their join token), the other job's held checkpoints (nor list its
// directory), nor list the ranks' logs.
func TestRankUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--rank-user needs the agent to run as root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody here")
	}
	exe := e2e.Binary(t)
	// The ranks' user runs the ranks' binary and reaches the agents'
	// directories, as it would those of an installed gpucoord.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(exe), filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := filepath.Join(dir, "token")
	_, addr := coordinatorProc(t, exe, "--token-file", tokenFile)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := "GPUCOORD_TOKEN=" + strings.TrimSpace(string(tok))
	client := []string{token, "XDG_STATE_HOME=" + filepath.Join(dir, "client")}
	launch := func(args ...string) *proc {
		return startEnv(t, client, exe, append([]string{"launch", "--coordinator", addr}, args...)...)
	}
	// A job no node can run yet: live, so its held files stay where the
	// agents keep them, as those of a paused job do.
	if code := launch("--nodes", "3", "--gpus-per-node", "1", "--job-id", "waiting", "--rendezvous-timeout", "10m", "--detach", "--", "true").wait(t, time.Minute); code != 0 {
		t.Fatalf("launch --detach exited %d", code)
	}
	var secrets []string
	for _, n := range []string{"0", "1"} {
		held := filepath.Join(dir, "local"+n, "gpucoord", "checkpoints", "w"+n, "waiting")
		if err := os.MkdirAll(filepath.Join(held, "own", "1"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(held, "own", "1", "shard.bin"), []byte("waiting's weights"), 0o644); err != nil {
			t.Fatal(err)
		}
		w := startEnv(t, []string{token, "XDG_STATE_HOME=" + filepath.Join(dir, "creds"+n)}, exe, "worker", "--coordinator", addr,
			"--name", "w"+n, "--gpus-per-node", "2", "--grace", "1s", "--rank-user", "nobody",
			"--state-dir", filepath.Join(dir, "state"+n), "--checkpoint-local", filepath.Join(dir, "local"+n))
		w.waitLine(t, "msg=registered ", 30*time.Second)
		keys, _ := filepath.Glob(filepath.Join(dir, "creds"+n, "gpucoord", "credentials", "*", "node-w"+n, "*key*"))
		if len(keys) == 0 {
			t.Fatalf("no key of w%s", n)
		}
		secrets = append(secrets, keys[0], "/proc/"+strconv.Itoa(w.cmd.Process.Pid)+"/environ", held, filepath.Join(held, "own", "1", "shard.bin"))
	}
	first := launch("--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--job-id", "first", "--steps", "5", "--json", "../../examples/jobs/mlp.yaml")
	if code := first.wait(t, 2*time.Minute); code != 0 || !strings.Contains(first.output(), `{"committed":5,`) {
		t.Fatalf("the native job as nobody exited %d:\n%s", code, first.output())
	}
	secrets = append(secrets, filepath.Join(dir, "state0", "gpucoord", "logs"), filepath.Join(dir, "state1", "gpucoord", "logs"))
	script := `echo "UID $(id -u) HOME $HOME"
for f in "$@"; do if { if [ -d "$f" ]; then ls "$f"; else cat "$f"; fi; } >/dev/null 2>&1; then echo "READ $f"; else echo "DENIED $f"; fi; done
mkdir -p "$GPUCOORD_CHECKPOINT_DIR/1" && echo x >"$GPUCOORD_CHECKPOINT_DIR/1/f" && echo "WROTE its checkpoint"`
	second := launch(append([]string{"--nodes", "1", "--gpus-per-node", "1", "--job-id", "second", "--workdir", "/",
		"--", "/bin/sh", "-c", script, "sh"}, secrets...)...)
	if code := second.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("second exited %d:\n%s", code, second.output())
	}
	out := second.output()
	for _, want := range append([]string{"UID " + nobody.Uid + " HOME " + nobody.HomeDir, "WROTE its checkpoint"}, prefixed("DENIED ", secrets)...) {
		if !strings.Contains(out, want) {
			t.Errorf("the rank as nobody did not print %q:\n%s", want, out)
		}
	}
}

// prefixed is each of ss behind p.
func prefixed(p string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = p + s
	}
	return out
}
