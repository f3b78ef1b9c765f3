package slurmtest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/rankexe"
	"github.com/gpucoord/gpucoord/internal/testcluster"
	"github.com/gpucoord/gpucoord/worker/ckpt"
)

// slurmBox is a Slurm cluster in a box for launch: h1 the login host
// (slurmctld), h2.. the compute nodes, gpucoord and the test's job
// installed where every host reads them.
type slurmBox struct {
	*testcluster.Cluster
	slurm      *testcluster.Slurm
	exe, ranks string
	job        string
}

// slurmBoxes bounds the Slurm boxes that run at once.
var slurmBoxes = make(chan struct{}, 1)

// newSlurmBox starts a box of hosts hosts (h1 the login host) whose
// slurm.conf ends with extraConf.
//
// Under the race detector the tasks (each a coordinator with its etcd
// member, an agent and launch) run the race build when race is set, and
// the plain one otherwise: race-checked tasks (three etcd members, an
// agent and launch each) of several boxes at once on two cores (make
// test) lost their majority and their leases again and again, and the
// jobs thrashed. TestSlurmLaunch runs checked; the others run the build
// the ranks run (the packages they share are race-checked in their own
// tests and the other clusters').
func newSlurmBox(t *testing.T, hosts int, extraConf string, race bool) *slurmBox {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Slurm cluster on hosts in network namespaces")
	}
	exe := e2e.Binary(t)
	// One box at a time: each is three etcd members, an agent per node
	// and the ranks, beside make test's other clusters on two cores.
	select {
	case slurmBoxes <- struct{}{}:
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
	t.Cleanup(func() { <-slurmBoxes })
	c := testcluster.New(t, testcluster.Config{Hosts: hosts})
	s := testcluster.StartSlurm(t, c, testcluster.SlurmConfig{ExtraConf: extraConf})
	b := &slurmBox{Cluster: c, slurm: s, job: c.Install("../testdata/mlp48.yaml")}
	if e2e.Ranks() != "" {
		b.ranks = c.Install(e2e.Ranks())
		if !race {
			exe = e2e.Ranks()
		}
	}
	b.exe = c.Install(exe)
	return b
}

// script writes a batch script whose only gpucoord line is line (EXE and
// JOB in it stand for the installed binary and job file) and returns its
// path.
func (b *slurmBox) script(t *testing.T, name, line string) string {
	t.Helper()
	line = strings.NewReplacer("EXE", b.exe, "JOB", b.job).Replace(line)
	path := filepath.Join(b.slurm.Dir(), name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+line+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// sbatch submits script with args and waits for the job's end (sbatch
// --wait); it returns the job's id, its output and sbatch's error.
func (b *slurmBox) sbatch(ctx context.Context, t *testing.T, script string, args ...string) (string, string, error) {
	t.Helper()
	id, err := b.submit(ctx, t, script, append([]string{"--wait"}, args...)...)
	return id, b.output(id), err
}

// submit runs sbatch script with args and returns the job's id.
func (b *slurmBox) submit(ctx context.Context, t *testing.T, script string, args ...string) (string, error) {
	t.Helper()
	out := filepath.Join(b.slurm.Dir(), "slurm-%j.out")
	cmd := b.slurm.Command(ctx, "sbatch", append([]string{"--parsable", "--chdir=" + b.slurm.Dir(), "--output=" + out}, append(args, script)...)...)
	if b.ranks != "" {
		cmd.Env = append(cmd.Env, rankexe.Env+"="+b.ranks)
	}
	got, err := cmd.Output()
	id, _, _ := strings.Cut(strings.TrimSpace(string(got)), ";")
	if err != nil {
		return id, fmt.Errorf("sbatch: %w: %s", err, got)
	}
	return id, nil
}

// output is the Slurm job's output so far.
func (b *slurmBox) output(id string) string {
	log, _ := os.ReadFile(filepath.Join(b.slurm.Dir(), "slurm-"+id+".out"))
	return string(log)
}

// gone says whether the Slurm job has left the queue's running states.
func (b *slurmBox) gone(ctx context.Context, id string) bool {
	out, err := b.slurm.Run(ctx, "squeue", "--noheader", "--jobs="+id, "--format=%T")
	return err == nil && !strings.Contains(out, "RUNNING") && !strings.Contains(out, "COMPLETING") && !strings.Contains(out, "PENDING")
}

// gpucoordLeft lists what of gpucoord is left on the compute hosts: its
// processes and its directories in each host's /tmp and /dev/shm.
func (b *slurmBox) gpucoordLeft() []string {
	var left []string
	for _, h := range b.Hosts()[1:] {
		for _, pid := range h.Pids() {
			cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			if err == nil && strings.Contains(string(cmdline), "gpucoord") {
				left = append(left, fmt.Sprintf("%s: pid %d %s", h.Name, pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
			}
		}
		for _, dir := range []string{"/tmp", "/dev/shm"} {
			entries, _ := os.ReadDir(h.Path(dir))
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), "gpucoord") {
					left = append(left, fmt.Sprintf("%s: %s/%s", h.Name, dir, e.Name()))
				}
			}
		}
	}
	return left
}

// TestSlurmLaunch: `srun --ntasks-per-node=1 gpucoord launch JOB`, the
// batch script's only gpucoord line, runs a native job on a 3-node
// allocation: no address, no token, no shared file. It succeeds, its
// output comes once (from the first node's task), and 10 s after the
// Slurm job ends nothing of gpucoord is left on any node.
func TestSlurmLaunch(t *testing.T) {
	t.Parallel()
	b := newSlurmBox(t, 4, "KillWait=5", true)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	script := b.script(t, "native.sh", "srun --ntasks-per-node=1 EXE launch --gossip-profile wan --gpus-per-node 2 --tp 2 JOB")
	id, out, err := b.sbatch(ctx, t, script, "-N3")
	t.Logf("job %s:\n%s", id, out)
	if err != nil {
		t.Fatalf("sbatch: %v", err)
	}
	if n := strings.Count(out, "job slurm-"+id+" succeeded"); n != 1 {
		t.Errorf("%d lines say the job succeeded, want 1", n)
	}
	if n := strings.Count(out, "step 20/20"); n != 1 {
		t.Errorf("%d lines of step 20/20, want 1", n)
	}
	var left []string
	defer func() {
		if t.Failed() {
			t.Logf("left: %v", left)
		}
	}()
	eventually(t, 10*time.Second, "nothing of gpucoord left on the nodes", func() bool {
		left = b.gpucoordLeft()
		return len(left) == 0
	})
}

// eventually polls cond every 100 ms until it holds, and fails the test
// with what when d passes first. It returns how long it took.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("not within %v: %s", d, what)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v", what, t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return time.Since(start)
}

// TestSlurmScancel: scancel at a random step of a native job. Slurm sends
// SIGTERM to every process of the step at once (proctrack/linuxproc: the
// tasks and their ranks); each task cancels the job through the
// coordinators, its agent stops what is left of its ranks, and the tasks
// exit before KillWait (10 s: the tasks of several boxes at once on two
// cores take more than 5 s to stop) ends in SIGKILL. The Slurm job is gone
// within KillWait + 5 s, nothing of gpucoord is left, and the output says
// the job was cancelled, not that a rank failed.
func TestSlurmScancel(t *testing.T) {
	t.Parallel()
	b := newSlurmBox(t, 4, "KillWait=10", false)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	script := b.script(t, "long.sh", "srun --ntasks-per-node=1 EXE launch --gossip-profile wan --gpus-per-node 2 --tp 2 --steps 100000 JOB")
	id, err := b.submit(ctx, t, script, "-N3")
	if err != nil {
		t.Fatal(err)
	}
	at := 3 + rand.IntN(20)
	eventually(t, time.Minute, fmt.Sprintf("step %d in the job's output", at), func() bool {
		return strings.Contains(b.output(id), fmt.Sprintf(" %d/100000 ", at))
	})
	if out, err := b.slurm.Run(ctx, "scancel", id); err != nil {
		t.Fatalf("scancel: %v\n%s", err, out)
	}
	start := time.Now()
	took := eventually(t, 15*time.Second, "the Slurm job gone after scancel", func() bool { return b.gone(ctx, id) })
	t.Logf("scancel at step %d: the Slurm job was gone %v later", at, took.Round(time.Millisecond))
	var left []string
	defer func() {
		if t.Failed() {
			t.Logf("left: %v", left)
		}
	}()
	eventually(t, 15*time.Second-time.Since(start), "nothing of gpucoord left on the nodes", func() bool {
		left = b.gpucoordLeft()
		return len(left) == 0
	})
	out := b.output(id)
	t.Logf("output:\n%s", out)
	// The first task says it once; the others say nothing. The ranks'
	// own lines (SIGTERM reached them) may say what they were doing.
	if n := strings.Count(out, "gpucoord: interrupted: job slurm-"+id+" cancelled: launch interrupted"); n != 1 {
		t.Errorf("%d tasks said the job was cancelled, want 1", n)
	}
	if strings.Contains(out, "generation 2") || strings.Contains(out, "node lost") {
		t.Errorf("the job went on to another generation, or lost a node")
	}
}

// noKillConf makes slurmctld find a dead node in about 10 s (as in
// testcluster's TestSlurmNoKill).
const noKillConf = "KillWait=5\nSlurmdTimeout=5\nMessageTimeout=3"

// killMidJob submits script (a --json job of steps steps) with args, kills
// the host victim picks once the job's output shows step at, and waits for
// the Slurm job to end. It returns the job's output, and when the
// generation after the kill showed, counted from the kill.
func (b *slurmBox) killMidJob(t *testing.T, script string, steps, at int, victim func(out string) *testcluster.Host, args ...string) (string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	id, err := b.submit(ctx, t, script, args...)
	if err != nil {
		t.Fatal(err)
	}
	mark := fmt.Sprintf(`{"step":%d,`, at)
	eventually(t, 2*time.Minute, "step "+strconv.Itoa(at), func() bool { return strings.Contains(b.output(id), mark) })
	h := victim(b.output(id))
	h.Kill()
	killed := time.Now()
	t.Logf("killed %s at step %d", h.Name, at)
	var next time.Duration
	eventually(t, 3*time.Minute, "the Slurm job's end", func() bool {
		if next == 0 && strings.Contains(b.output(id), `"event":"generation","generation":{"number":2`) {
			next = time.Since(killed)
		}
		return b.gone(ctx, id)
	})
	out := b.output(id)
	if next == 0 && strings.Contains(out, `"event":"generation","generation":{"number":2`) {
		next = time.Since(killed)
	}
	return out, next
}

// succeeded checks that out's end line says the job succeeded, with every
// loss on train --np 1's curve.
func (b *slurmBox) succeeded(t *testing.T, exe, out string, steps int) {
	t.Helper()
	if !strings.Contains(out, `"event":"end","job":"slurm-`) || !strings.Contains(out, `"phase":"succeeded"`) {
		t.Fatalf("the job did not succeed:\n%s", out)
	}
	e2e.SameLosses(t, e2e.Losses(t, out), e2e.Reference(t, exe, "--steps", strconv.Itoa(steps), "../testdata/mlp48.yaml"))
}

// TestSlurmCoordinatorNodeLost: under sbatch --no-kill, every process of
// a node that runs a coordinator and an etcd member (h3, not the batch
// host) is killed mid-job: the control plane keeps its majority, the job
// goes on on the two nodes left, and succeeds on train --np 1's curve.
func TestSlurmCoordinatorNodeLost(t *testing.T) {
	t.Parallel()
	b := newSlurmBox(t, 4, noKillConf, false)
	script := b.script(t, "native.sh", "srun --no-kill --ntasks-per-node=1 EXE launch --gpus-per-node 2 --tp 2 --steps 150 --json JOB")
	out, next := b.killMidJob(t, script, 150, 20+rand.IntN(40), func(string) *testcluster.Host { return b.Host(3) }, "--no-kill", "-N3")
	t.Logf("output:\n%s", out)
	b.succeeded(t, e2e.Binary(t), out, 150)
	t.Logf("generation 2 showed %v after the kill", next.Round(time.Millisecond))
}

// TestSlurmSpare: an allocation of five nodes, four for the job and one
// hot spare (--spares 1); a node of the job that runs no coordinator (h5
// or h6, whichever the job took) is killed, and the spare takes its place
// in the next generation.
func TestSlurmSpare(t *testing.T) {
	t.Parallel()
	b := newSlurmBox(t, 6, noKillConf, false)
	script := b.script(t, "spare.sh", "srun --no-kill --ntasks-per-node=1 EXE launch --gpus-per-node 2 --tp 2 --spares 1 --steps 150 --json JOB")
	var victim *testcluster.Host
	out, next := b.killMidJob(t, script, 150, 20+rand.IntN(40), func(out string) *testcluster.Host {
		victim = b.Host(6)
		if strings.Contains(out, `"h5"`) {
			victim = b.Host(5)
		}
		return victim
	}, "--no-kill", "-N5")
	t.Logf("output:\n%s", out)
	b.succeeded(t, e2e.Binary(t), out, 150)
	if !strings.Contains(out, "spare nodes joined") || next == 0 {
		t.Fatal("no spare joined a second generation")
	}
	// How soon is a benchmark's (docs/BENCHMARKS.md), not a bound on make
	// test's two shared cores.
	t.Logf("the spare took %s's place: generation 2 showed %v after the kill", victim.Name, next.Round(time.Millisecond))
}

// TestSlurmSallocFirstNodeLost: from salloc on the login host no node is
// special. The first node's task (its coordinator and etcd member, and
// the task that prints the job) is killed with every process of its host
// mid-job: the job goes on on the other two, the next coordinator's task
// prints it from there, and it succeeds on train --np 1's curve.
func TestSlurmSallocFirstNodeLost(t *testing.T) {
	t.Parallel()
	b := newSlurmBox(t, 4, noKillConf, false)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := b.slurm.Command(ctx, "salloc", "-N3", "--no-kill", "srun", "--no-kill", "--ntasks-per-node=1",
		b.exe, "launch", "--gpus-per-node", "2", "--tp", "2", "--steps", "150", "--json", b.job)
	if b.ranks != "" {
		cmd.Env = append(cmd.Env, rankexe.Env+"="+b.ranks)
	}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	at := 20 + rand.IntN(40)
	mark := fmt.Sprintf(`{"step":%d,`, at)
	eventually(t, 2*time.Minute, "step "+strconv.Itoa(at), func() bool { return strings.Contains(out.String(), mark) })
	b.Host(2).Kill()
	t.Logf("killed h2 at step %d", at)
	select {
	case err := <-exited:
		t.Logf("salloc: %v", err)
	case <-ctx.Done():
		t.Fatalf("salloc did not end:\n%s", out.String())
	}
	got := out.String()
	t.Logf("output:\n%s", got)
	if !strings.Contains(got, "gpucoord: the tasks of h2 are gone; h3's task follows the job") {
		t.Error("h3's task did not take over")
	}
	b.succeeded(t, e2e.Binary(t), got, 150)
}

// lockedBuffer is a bytes.Buffer a command writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestSlurmRequeue: SIGUSR1 (what sbatch --signal=USR1@T sends every
// process of the job's steps before its time limit; scancel --signal=USR1
// here) makes the job stop once its next step is in the backup tier, and
// launch exits 75. scontrol requeue then runs the batch script again with
// the same job id on a fresh control plane: launch resumes after that
// step, from the backup tier, and every loss is on train --np 1's curve.
func TestSlurmRequeue(t *testing.T) {
	t.Parallel()
	b := newSlurmBox(t, 4, "KillWait=5", false)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	backup := filepath.Join(b.slurm.Dir(), "backup")
	if err := os.Mkdir(backup, 0o755); err != nil {
		t.Fatal(err)
	}
	script := b.script(t, "requeue.sh", "srun --ntasks-per-node=1 EXE launch --gossip-profile wan --gpus-per-node 2 --tp 2 --steps 150 --checkpoint-backup "+backup+" --backup-every 10 --json JOB")
	id, err := b.submit(ctx, t, script, "-N3", "--requeue", "--open-mode=append")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			state, _ := b.slurm.Run(context.WithoutCancel(ctx), "scontrol", "show", "job", id)
			t.Logf("output:\n%s\n%s", b.output(id), state)
		}
	}()
	at := 25 + rand.IntN(30)
	eventually(t, 2*time.Minute, "step "+strconv.Itoa(at), func() bool { return strings.Contains(b.output(id), fmt.Sprintf(`{"step":%d,`, at)) })
	if out, err := b.slurm.Run(ctx, "scancel", "--signal=USR1", id); err != nil {
		t.Fatalf("scancel --signal=USR1: %v\n%s", err, out)
	}
	eventually(t, time.Minute, "the first run's end", func() bool { return b.gone(ctx, id) })
	first := b.output(id)
	if !strings.Contains(first, "stopped for a requeue after step") || !strings.Contains(first, "exit code 75") {
		t.Fatalf("the first run did not stop for a requeue with 75:\n%s", first)
	}
	if out, err := b.slurm.Run(ctx, "scontrol", "requeue", id); err != nil {
		t.Fatalf("scontrol requeue: %v\n%s", err, out)
	}
	// slurmctld holds a requeued job back for cred_expire (15 s in the
	// box; Reason=BeginTime), during which its nodes refuse the job's
	// old credential: started sooner it is killed ("Job credential
	// revoked", as make test once saw after a nudge at once). Under make
	// test's load it once sat pending past the test's time with its nodes
	// idle: nudge it only well after cred_expire.
	requeued := time.Now()
	var nudged time.Time
	eventually(t, 3*time.Minute, "the second run's end", func() bool {
		if strings.Count(b.output(id), `"event":"end"`) == 2 {
			return b.gone(ctx, id)
		}
		if time.Since(requeued) > 45*time.Second && time.Since(nudged) > 10*time.Second {
			if st, err := b.slurm.Run(ctx, "squeue", "--noheader", "--jobs="+id, "--format=%T"); err == nil && strings.Contains(st, "PENDING") {
				b.slurm.Run(ctx, "scontrol", "update", "JobId="+id, "StartTime=now")
				nudged = time.Now()
			}
		}
		return false
	})
	out := b.output(id)
	t.Logf("output:\n%s", out)
	second := out[len(first):]
	if !strings.Contains(second, "requeued (restart 1): resuming after step ") || !strings.Contains(second, `"from_backup"`) && !strings.Contains(second, "from the backup tier") {
		t.Errorf("the second run did not resume from the backup tier")
	}
	b.succeeded(t, e2e.Binary(t), out, 150)
}

// TestSlurmTorchCheckpointed: examples/pytorch/checkpointed.py, a
// torchrun program that checkpoints every step under
// GPUCOORD_CHECKPOINT_DIR, under the same one srun line on three nodes:
// every rank ends with the same parameters, shown once, by the first
// task (read from the agents of the other nodes over mutual TLS).
//
// The tests that kill no node run with --gossip-profile wan: under make
// test's load a starved node missed its probes and was found dead, and
// the job went round generations until its time ran out.
func TestSlurmTorchCheckpointed(t *testing.T) {
	t.Parallel()
	py := e2e.TorchPython(t)
	b := newSlurmBox(t, 4, "KillWait=5", false)
	b.Install("../../../examples/pytorch/gpucoord_progress.py") // beside the program, which imports it
	prog := b.Install("../../../examples/pytorch/checkpointed.py")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	script := b.script(t, "torch.sh", "srun --ntasks-per-node=1 EXE launch --gossip-profile wan --gpus-per-node 2 --env CKPT_STEPS=30 -- "+py+" "+prog)
	id, out, err := b.sbatch(ctx, t, script, "-N3")
	t.Logf("job %s:\n%s", id, out)
	if err != nil {
		t.Fatalf("sbatch: %v", err)
	}
	if n := strings.Count(out, "job slurm-"+id+" succeeded"); n != 1 {
		t.Errorf("%d lines say the job succeeded, want 1", n)
	}
	// Under make test's load a node's lease has lapsed now and then, and
	// the job ended on fewer nodes: every rank of its last generation
	// reports, once.
	world := 6
	if m := regexp.MustCompile(`generation \d+: \d+ nodes? \([^)]*\), (\d+) ranks`).FindAllStringSubmatch(out, -1); len(m) > 0 {
		world, _ = strconv.Atoi(m[len(m)-1][1])
	}
	if n := strings.Count(out, "final-params"); n != world {
		t.Errorf("%d final-params lines, want one of each of the last generation's %d ranks", n, world)
	}
	e2e.SameParams(t, out, world)
}

// TestSlurmExamples: the batch scripts of examples/slurm run as written,
// submitted from a copy of the repository's examples on the shared file
// system with gpucoord on PATH: a native job on four nodes, a torchrun
// program on three, and a job on two of three nodes with a spare and a
// backup tier.
func TestSlurmExamples(t *testing.T) {
	t.Parallel()
	e2e.TorchPython(t)
	b := newSlurmBox(t, 5, "KillWait=5", false)
	root := filepath.Join(b.slurm.Dir(), "repo")
	for _, f := range []string{"examples/jobs/mlp.yaml", "examples/pytorch/checkpointed.py", "examples/pytorch/gpucoord_progress.py",
		"examples/slurm/native.sbatch", "examples/slurm/torchrun.sbatch", "examples/slurm/spares-backup.sbatch"} {
		b, err := os.ReadFile(filepath.Join("../../..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(b.slurm.Dir(), "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(b.exe, filepath.Join(bin, "gpucoord")); err != nil {
		t.Fatal(err)
	}
	for _, ex := range []struct{ script, out, want string }{
		{"native.sbatch", "gpucoord-native-%s.out", "generation 1: 4 nodes (h2, h3, h4, h5), 8 ranks, tp 2 pp 1 dp 4"},
		{"torchrun.sbatch", "gpucoord-torch-%s.out", "final-params"},
		{"spares-backup.sbatch", "gpucoord-spares-%s.out", "generation 1: 2 nodes"},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		cmd := b.slurm.Command(ctx, "sbatch", "--parsable", "--wait", "--chdir="+root, filepath.Join("examples/slurm", ex.script))
		cmd.Dir = root
		cmd.Env = append(cmd.Env, "PATH="+bin+":/usr/bin:/bin")
		if b.ranks != "" {
			cmd.Env = append(cmd.Env, rankexe.Env+"="+b.ranks)
		}
		got, err := cmd.Output()
		cancel()
		id, _, _ := strings.Cut(strings.TrimSpace(string(got)), ";")
		out, _ := os.ReadFile(filepath.Join(root, fmt.Sprintf(ex.out, id)))
		t.Logf("%s: job %s:\n%s", ex.script, id, out)
		if err != nil {
			t.Errorf("%s: sbatch: %v", ex.script, err)
		}
		if !strings.Contains(string(out), "job slurm-"+id+" succeeded") || !strings.Contains(string(out), ex.want) {
			t.Errorf("%s: the job did not succeed as it should (%q)", ex.script, ex.want)
		}
	}
	if _, ok, err := ckpt.ReadBackupMark(filepath.Join(root, "backup", "gpucoord", "slurm-3")); !ok || err != nil {
		t.Errorf("spares-backup.sbatch left no step marked in its backup tier: %v", err)
	}
}
