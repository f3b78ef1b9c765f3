package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The image test runs what make image builds under Debian's podman, as
// root: a coordinator, two agents and launch, each in a container of its
// own on podman's bridge network (so every call between them is mutual
// TLS, off loopback), run a native job to the loss of train --np 1.
//
// Two things of this machine's are worked around, and would be on any
// like it: podman's default rlimits for root (nofile 1048576, nproc
// 4194304) are above what a root without CAP_SYS_RESOURCE may set, so the
// containers get this process's own limits (nproc no more than the
// kernel's pid_max); and crun refuses a cgroup v1
// machine whose v2 hierarchy holds a controller ("cgroups in hybrid mode
// not supported"), so the runtime is runc (scripts/deps.sh installs it).

// testLabel marks the containers this test starts, with the test
// process's pid, so that a later run removes what a killed one left.
const testLabel = "io.gpucoord.test"

// podman runs the podman command args and returns its combined output.
func podman(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "podman", args...).CombinedOutput()
	return string(out), err
}

// sweepContainers removes containers of earlier runs whose process is
// gone.
func sweepContainers(t *testing.T) {
	out, err := podman(t.Context(), "ps", "-a", "--filter", "label="+testLabel, "--format", `{{.ID}} {{index .Labels "`+testLabel+`"}}`)
	if err != nil {
		return
	}
	for line := range strings.Lines(out) {
		id, pid, _ := strings.Cut(strings.TrimSpace(line), " ")
		if n, err := strconv.Atoi(pid); err == nil && syscall.Kill(n, 0) != nil {
			podman(t.Context(), "rm", "-f", "--time", "0", id)
		}
	}
}

// runFlags are what every container of the test is started with.
func runFlags(t *testing.T) []string {
	t.Helper()
	var nofile, nproc unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &nproc); err != nil {
		t.Fatal(err)
	}
	// Here runc could set nproc up to the kernel's pid_max (32768) and
	// not one above, whatever this process's own limit (96551).
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			nproc.Cur, nproc.Max = min(nproc.Cur, n), min(nproc.Max, n)
		}
	}
	lim := func(r unix.Rlimit) string {
		return fmt.Sprintf("%d:%d", min(r.Cur, math.MaxInt32), min(r.Max, math.MaxInt32))
	}
	return []string{"--runtime", "runc", "--ulimit", "nofile=" + lim(nofile), "--ulimit", "nproc=" + lim(nproc),
		"--label", testLabel + "=" + strconv.Itoa(os.Getpid())}
}

// container is a container run in the foreground, its output collected.
type container struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	line chan struct{} // signalled at every line
	done chan struct{}
	err  error
}

// start runs image with args in a container named name (with podman run
// flags before the image) and removes it when the test ends.
func start(t *testing.T, name string, flags []string, image string, args ...string) *container {
	t.Helper()
	c := &container{name: name, line: make(chan struct{}, 1), done: make(chan struct{})}
	argv := append(append([]string{"run", "--rm", "--name", name}, flags...), image)
	c.cmd = exec.Command("podman", append(argv, args...)...)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stdout, c.cmd.Stderr = w, w
	if err := c.cmd.Start(); err != nil {
		r.Close()
		w.Close()
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		podman(context.Background(), "rm", "-f", "--time", "0", name)
		<-c.done
		if t.Failed() {
			t.Logf("%s:\n%s", name, c.output())
		}
	})
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.mu.Lock()
			c.out.Write(sc.Bytes())
			c.out.WriteByte('\n')
			c.mu.Unlock()
			select {
			case c.line <- struct{}{}:
			default:
			}
		}
		r.Close()
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c
}

func (c *container) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// waitFor waits until the container has printed a line matching re and
// returns the match, failing the test if it exits first or after a
// minute.
func (c *container) waitFor(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		if m := re.FindStringSubmatch(c.output()); m != nil {
			return m
		}
		select {
		case <-c.line:
		case <-c.done:
			if m := re.FindStringSubmatch(c.output()); m != nil {
				return m
			}
			t.Fatalf("%s exited (%v) before printing %q:\n%s", c.name, c.err, re, c.output())
		case <-deadline:
			t.Fatalf("%s did not print %q within a minute:\n%s", c.name, re, c.output())
		}
	}
}

// wait waits for the container to exit and returns its exit code.
func (c *container) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("%s did not exit within 3 minutes:\n%s", c.name, c.output())
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		t.Fatalf("%s: %v", c.name, c.err)
	}
	return 0
}

// usablePodman skips the test, saying why, where this machine cannot run
// it: not root, or podman or buildah missing (under CI=true, which has
// them, that fails instead).
func usablePodman(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the image and runs it under podman (runs without -short)")
	}
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = fmt.Sprintf("needs root: the image is built into root's containers-storage and run by root's podman (running as uid %d)", os.Geteuid())
	default:
		for _, tool := range []string{"podman", "buildah", "runc"} {
			if _, err := exec.LookPath(tool); err != nil {
				why = tool + " is not installed (scripts/deps.sh installs it)"
				break
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI must run the image test)", why)
	}
	t.Skip(why)
}

var finalLoss = regexp.MustCompile(`final loss ([0-9.]+)`)

// TestImageRunsJob: make image's image (built here by scripts/image.sh
// under a name of the test's own) runs as its entrypoint the command
// every manifest's container runs; under podman, a coordinator serving
// mutual TLS, two agents and launch, each in its own container, run the
// native job (tp 2 over two agents of two ranks) to train --np 1's final
// loss.
func TestImageRunsJob(t *testing.T) {
	usablePodman(t)
	sweepContainers(t)
	ctx := t.Context()
	image := fmt.Sprintf("localhost/gpucoord:test-%d", os.Getpid())
	build := exec.CommandContext(ctx, "scripts/image.sh")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "IMAGE="+image)
	out, err := build.CombinedOutput()
	t.Cleanup(func() { podman(context.Background(), "rmi", "-f", image) })
	if err != nil {
		t.Fatalf("scripts/image.sh: %v\n%s", err, out)
	}
	t.Logf("scripts/image.sh: %s", bytes.TrimSpace(out))
	entry, err := podman(ctx, "image", "inspect", "--format", "{{json .Config.Entrypoint}} {{.Config.User}}", image)
	if err != nil {
		t.Fatalf("podman image inspect: %v\n%s", err, entry)
	}
	if want := fmt.Sprintf("[%q] 65532:65532", Entrypoint); strings.TrimSpace(entry) != want {
		t.Errorf("the image's entrypoint and user are %s, want %s (what the manifests run)", strings.TrimSpace(entry), want)
	}

	flags := runFlags(t)
	// Whether podman can start a container at all on this machine: when
	// podman or its runtime cannot (exit status 125 or 126, podman's own
	// or the runtime's failure), the test skips with podman's words.
	if out, err := podman(ctx, append(append([]string{"run", "--rm"}, flags...), image, "version")...); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && (ee.ExitCode() == 125 || ee.ExitCode() == 126) {
			t.Skipf("podman cannot start a container here: %s", strings.TrimSpace(out))
		}
		t.Fatalf("the image's version command: %v\n%s", err, out)
	} else if !strings.HasPrefix(out, "gpucoord ") {
		t.Fatalf("the image's version command printed %q", out)
	}

	// The coordinator's volume, where it keeps etcd's data and writes the
	// join token; the join directory is where the token is handed on, as a
	// Secret would be; jobs holds the job file.
	dir := t.TempDir()
	data, join, jobs := filepath.Join(dir, "data"), filepath.Join(dir, "join"), filepath.Join(dir, "jobs")
	for _, d := range []string{data, join, jobs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(data, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	job, err := os.ReadFile(filepath.Join("..", "..", "examples", "jobs", "mlp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(jobs, "mlp.yaml"), job, 0o644); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("gct-image-%d-", os.Getpid())

	ref := start(t, prefix+"train", append(flags, "-v", jobs+":/jobs:ro"), image, "train", "--np", "1", "/jobs/mlp.yaml")
	co := start(t, prefix+"coordinator", append(flags, "-v", data+":/var/lib/gpucoord"), image,
		"coordinator", "--listen", "0.0.0.0:7070", "--name", "coordinator", "--data-dir", "/var/lib/gpucoord/etcd",
		"--token-file", "/var/lib/gpucoord/token", "--lease-ttl", "2s", "--stable-for", "500ms")
	co.waitFor(t, regexp.MustCompile(`coordinator listening on `))
	ip, err := podman(ctx, "inspect", "--format", "{{.NetworkSettings.IPAddress}}", prefix+"coordinator")
	if ip = strings.TrimSpace(ip); err != nil || ip == "" {
		t.Fatalf("the coordinator's address: %v %q", err, ip)
	}
	addr := ip + ":7070"
	tok, err := os.ReadFile(filepath.Join(data, "token"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(join, "token"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	mount := []string{"-v", join + ":/etc/gpucoord/join:ro"}
	for _, name := range []string{"a1", "a2"} {
		a := start(t, prefix+name, append(append([]string{}, flags...), mount...), image,
			"worker", "--coordinator", addr, "--name", name, "--gpus-per-node", "2", "--grace", "1s",
			"--token-file", "/etc/gpucoord/join/token")
		// Registered with its container's own address, found by the
		// route to the coordinator.
		m := a.waitFor(t, regexp.MustCompile(`msg=registered .*host=([0-9.]+)`))
		if m[1] == ip || strings.HasPrefix(m[1], "127.") {
			t.Errorf("agent %s registered with address %s, not its container's own", name, m[1])
		}
	}
	launch := start(t, prefix+"launch", append(append(append([]string{}, flags...), mount...), "-v", jobs+":/jobs:ro"), image,
		"launch", "--coordinator", addr, "--token-file", "/etc/gpucoord/join/token",
		"--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--job-id", "image", "/jobs/mlp.yaml")
	if code := launch.wait(t); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, launch.output())
	}
	if code := ref.wait(t); code != 0 {
		t.Fatalf("train --np 1 exited %d:\n%s", code, ref.output())
	}
	got, want := launch.waitFor(t, finalLoss)[1], ref.waitFor(t, finalLoss)[1]
	g, _ := strconv.ParseFloat(got, 64)
	w, _ := strconv.ParseFloat(want, 64)
	if math.Abs(g-w) > 1e-5*math.Abs(w) || !strings.Contains(launch.output(), "job image succeeded") {
		t.Errorf("the job in the containers: final loss %s, want train --np 1's %s:\n%s", got, want, launch.output())
	}
}
