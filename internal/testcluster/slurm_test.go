package testcluster_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// slurmBox runs body on a cluster of hosts hosts running Slurm (h1 the
// login host), and checks once the cluster is removed that no process is
// left in any of its hosts' network namespaces: not a daemon, not a
// slurmstepd, not a task.
func slurmBox(t *testing.T, hosts int, cfg testcluster.SlurmConfig, body func(t *testing.T, c *testcluster.Cluster, s *testcluster.Slurm)) {
	t.Helper()
	var netns []string
	t.Run("box", func(t *testing.T) {
		c := testcluster.New(t, testcluster.Config{Hosts: hosts})
		start := time.Now()
		s := testcluster.StartSlurm(t, c, cfg)
		t.Logf("slurm up, every node idle, in %v", time.Since(start).Round(time.Millisecond))
		for _, h := range c.Hosts() {
			netns = append(netns, strings.TrimSpace(h.Run(t.Context(), "readlink", "/proc/self/ns/net")))
		}
		body(t, c, s)
	})
	if len(netns) == 0 {
		return // skipped or failed before it started
	}
	if left := inNetns(netns); len(left) > 0 {
		t.Errorf("processes left in the cluster's network namespaces: %v", left)
	}
}

// inNetns lists the processes of this machine (zombies aside) that are in
// one of the network namespaces netns (readlink's net:[inode]).
func inNetns(netns []string) []string {
	var left []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net"))
		if err == nil && slices.Contains(netns, ns) {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			left = append(left, e.Name()+" "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return left
}

// running lists the processes on h whose command line is argv, the
// program's path aside: srun resolves it, so a task's argv[0] is
// /usr/bin/sleep where the test said sleep.
func running(h *testcluster.Host, argv ...string) []int {
	var pids []int
	for _, pid := range h.Pids() {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			continue
		}
		got := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(got) > 0 {
			got[0] = filepath.Base(got[0])
		}
		if slices.Equal(got, argv) {
			pids = append(pids, pid)
		}
	}
	return pids
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

// sleepingOn says whether every host of hs runs `sleep 1000`.
func sleepingOn(hs ...*testcluster.Host) bool {
	for _, h := range hs {
		if len(running(h, "sleep", "1000")) == 0 {
			return false
		}
	}
	return true
}

// sleepLeft says whether any host of hs still runs `sleep 1000`.
func sleepLeft(hs ...*testcluster.Host) bool {
	for _, h := range hs {
		if len(running(h, "sleep", "1000")) > 0 {
			return true
		}
	}
	return false
}

// TestSlurmSrun: srun on the login host runs one task on each of the three
// compute nodes, named as the hosts are.
func TestSlurmSrun(t *testing.T) {
	t.Parallel()
	slurmBox(t, 4, testcluster.SlurmConfig{}, func(t *testing.T, c *testcluster.Cluster, s *testcluster.Slurm) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		out, err := s.Run(ctx, "srun", "-N3", "hostname")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		got := strings.Fields(out)
		slices.Sort(got)
		if want := []string{"h2", "h3", "h4"}; !slices.Equal(got, want) {
			t.Errorf("srun -N3 hostname printed %q, want %v", out, want)
		}
	})
}

// TestSlurmScancel: scancel ends a batch job's three-node step: SIGTERM
// ends every task at once, and none is left after KillWait (5 s), when
// SIGKILL would follow, plus 5 s.
func TestSlurmScancel(t *testing.T) {
	t.Parallel()
	slurmBox(t, 4, testcluster.SlurmConfig{ExtraConf: "KillWait=5"}, func(t *testing.T, c *testcluster.Cluster, s *testcluster.Slurm) {
		ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
		defer cancel()
		script := filepath.Join(s.Dir(), "job.sh")
		if err := os.WriteFile(script, []byte("#!/bin/sh\nsrun -N3 sleep 1000\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := s.Run(ctx, "sbatch", "--parsable", "-N3", "--chdir="+s.Dir(), "--output="+filepath.Join(s.Dir(), "slurm-%j.out"), script)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		id, _, _ := strings.Cut(strings.TrimSpace(out), ";")
		compute := c.Hosts()[1:]
		took := eventually(t, 20*time.Second, "the step's sleep 1000 on h2, h3 and h4", func() bool { return sleepingOn(compute...) })
		t.Logf("job %s: the step's tasks run %v after sbatch", id, took.Round(time.Millisecond))
		if out, err := s.Run(ctx, "scancel", id); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		took = eventually(t, 10*time.Second, "no sleep 1000 left on any host after scancel", func() bool { return !sleepLeft(c.Hosts()...) })
		t.Logf("no task left %v after scancel", took.Round(time.Millisecond))
		eventually(t, 10*time.Second, "the job out of the running", func() bool {
			out, err := s.Run(ctx, "squeue", "--noheader", "--jobs="+id, "--format=%T")
			return err == nil && !strings.Contains(out, "RUNNING") && !strings.Contains(out, "COMPLETING")
		})
	})
}

// lockedBuffer is a bytes.Buffer that a command writes while the test reads.
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

// TestSlurmNoKill: a node of an `srun --no-kill` job fails. slurmctld
// finds it not responding and, once SlurmdTimeout (5 s here) has passed
// since it last answered, sets it down. A job that asked for --no-kill is
// not killed then, as srun's man page says: slurmctld removes the node from
// the job, which runs on in the rest of its nodes, srun prints "Node
// failure" and waits on for the other tasks until scancel.
//
// What becomes of the failed node's task depends on the failure. When the
// host dies, the task dies with it. When only slurmd dies, slurmstepd and
// its task run on: slurmctld's kill of the step on the failed node goes to
// a slurmd that is not there, and scancel cannot reach it either, so the
// task outlives its job (until the box's teardown kills it).
func TestSlurmNoKill(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		fail      func(s *testcluster.Slurm, h *testcluster.Host)
		taskLives bool // h4's task outlives the failure and the job
	}{
		{name: "slurmd killed", fail: func(s *testcluster.Slurm, h *testcluster.Host) { s.KillSlurmd(h) }, taskLives: true},
		{name: "host killed", fail: func(s *testcluster.Slurm, h *testcluster.Host) { h.Kill() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A ping of a dead node fails only after MessageTimeout: 3 s
			// rather than 10 brings the node down in about 10 s, not 25.
			cfg := testcluster.SlurmConfig{ExtraConf: "KillWait=5\nSlurmdTimeout=5\nMessageTimeout=3"}
			slurmBox(t, 4, cfg, func(t *testing.T, c *testcluster.Cluster, s *testcluster.Slurm) {
				testNoKill(t, c, s, tc.fail, tc.taskLives)
			})
		})
	}
}

func testNoKill(t *testing.T, c *testcluster.Cluster, s *testcluster.Slurm, fail func(*testcluster.Slurm, *testcluster.Host), taskLives bool) {
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	var out lockedBuffer
	srun := s.Command(ctx, "srun", "--no-kill", "-N3", "sleep", "1000")
	srun.Stdout, srun.Stderr = &out, &out
	if err := srun.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srun.Wait() }()
	var state string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("h4 last seen %q; srun's output:\n%s", state, out.String())
		}
	})
	h2, h3, h4 := c.Host(2), c.Host(3), c.Host(4)
	eventually(t, 20*time.Second, "srun's sleep 1000 on h2, h3 and h4", func() bool { return sleepingOn(h2, h3, h4) })
	id, err := s.Run(ctx, "squeue", "--noheader", "--format=%i")
	if id = strings.TrimSpace(id); err != nil || strings.ContainsAny(id, " \n") {
		t.Fatalf("squeue: %v: %q", err, id)
	}
	fail(s, h4)
	took := eventually(t, 25*time.Second, "h4 down", func() bool {
		state, _ = s.Run(ctx, "sinfo", "--noheader", "--nodes=h4", "--format=%t %E")
		return strings.HasPrefix(state, "down")
	})
	t.Logf("h4 down %v after it failed", took.Round(time.Millisecond))
	eventually(t, 10*time.Second, "job "+id+" running on h[2-3] alone", func() bool {
		out, err := s.Run(ctx, "squeue", "--noheader", "--jobs="+id, "--format=%T %N")
		return err == nil && strings.TrimSpace(out) == "RUNNING h[2-3]"
	})
	if !sleepingOn(h2, h3) {
		t.Errorf("the tasks on h2 and h3 ended with h4")
	}
	if got := sleepingOn(h4); got != taskLives {
		t.Errorf("h4's task runs: %v, want %v", got, taskLives)
	}
	eventually(t, 10*time.Second, "srun's notice of the node failure", func() bool {
		return strings.Contains(out.String(), "Node failure on h4")
	})
	select {
	case err := <-exited:
		t.Fatalf("srun exited when h4 failed (%v):\n%s", err, out.String())
	default:
	}
	if out, err := s.Run(ctx, "scancel", id); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	select {
	case err := <-exited:
		t.Logf("srun after scancel: %v", err)
	case <-ctx.Done():
		t.Fatalf("srun still runs after scancel:\n%s", out.String())
	}
	eventually(t, 10*time.Second, "no sleep 1000 left on h2 and h3 after scancel", func() bool { return !sleepLeft(h2, h3) })
	if got := sleepingOn(h4); got != taskLives {
		t.Errorf("after scancel, h4's task runs: %v, want %v", got, taskLives)
	}
	t.Logf("srun's output:\n%s", out.String())
}
