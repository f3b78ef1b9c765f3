package testcluster_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// The test binary doubles as the programs the hosts run: with
// TESTCLUSTER_HELPER set it serves or dials instead of testing.
func TestMain(m *testing.M) {
	switch os.Getenv("TESTCLUSTER_HELPER") {
	case "echo":
		echoServer(os.Args[1])
		return
	case "dial":
		if err := dial(os.Args[1], os.Args[2]); err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// echoServer listens on addr, prints "listening", and answers each line
// with the same line.
func echoServer(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				fmt.Fprintln(c, sc.Text())
			}
		}()
	}
}

// dial sends one line to addr and wants it back within timeout; it prints
// the round trip.
func dial(addr, timeout string) error {
	d, err := time.ParseDuration(timeout)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	start := time.Now()
	fmt.Fprintln(c, "ping")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echo %q", line)
	}
	fmt.Println("rtt", time.Since(start))
	return nil
}

type helper struct {
	c   *testcluster.Cluster
	exe string
}

func newHelper(t *testing.T, cfg testcluster.Config) *helper {
	c := testcluster.New(t, cfg)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return &helper{c: c, exe: c.Install(exe)}
}

// serve starts the echo server on h at addr and waits until it listens.
func (hp *helper) serve(t *testing.T, h *testcluster.Host, addr string) {
	t.Helper()
	cmd := h.Command(t.Context(), hp.exe, addr)
	cmd.Env = append(cmd.Env, "TESTCLUSTER_HELPER=echo")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "listening\n" {
		t.Fatalf("echo server on %s at %s: %q %v", h.Name, addr, line, err)
	}
}

// dial runs the dialer on h; it returns its output and error.
func (hp *helper) dial(t *testing.T, h *testcluster.Host, addr string, timeout time.Duration) (string, error) {
	t.Helper()
	cmd := h.Command(t.Context(), hp.exe, addr, timeout.String())
	cmd.Env = append(cmd.Env, "TESTCLUSTER_HELPER=dial")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestHostsReachEachOther(t *testing.T) {
	hp := newHelper(t, testcluster.Config{Hosts: 3})
	h1, h2, h3 := hp.c.Host(1), hp.c.Host(2), hp.c.Host(3)
	hp.serve(t, h2, net.JoinHostPort(h2.Addr, "7000"))
	hp.serve(t, h2, net.JoinHostPort(h2.Addr6, "7000"))
	for _, addr := range []string{"198.18.0.12:7000", "h2:7000", "[2001:db8::12]:7000"} {
		if out, err := hp.dial(t, h1, addr, 10*time.Second); err != nil {
			t.Errorf("h1 -> %s: %v\n%s", addr, err, out)
		}
	}
	if out, err := hp.dial(t, h3, "h2:7000", 10*time.Second); err != nil {
		t.Errorf("h3 -> h2: %v\n%s", err, out)
	}
	// Each host has its own name, and resolves it to loopback as Debian
	// does; the machine's own network is not reachable.
	if got := strings.TrimSpace(h1.Run(t.Context(), "hostname")); got != "h1" {
		t.Errorf("hostname on h1 = %q", got)
	}
	if got := h3.Run(t.Context(), "getent", "hosts", "h3"); !strings.HasPrefix(got, "127.0.1.1") {
		t.Errorf("h3 resolves itself to %q, want 127.0.1.1", got)
	}
	if out, err := h1.Command(t.Context(), "ip", "-o", "route").Output(); err != nil || strings.Contains(string(out), "default") {
		t.Errorf("h1 has a default route (%v):\n%s", err, out)
	}
}

func TestPrivateTmpShmAndShared(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Hosts: 2, Shared: true})
	h1, h2 := c.Host(1), c.Host(2)
	h1.Run(t.Context(), "sh", "-c", `echo one > /tmp/probe && echo one > "$HOME/probe" && echo one > /dev/shm/gpucoord-probe && echo shared > "$0/probe"`, c.Shared())
	if b, err := os.ReadFile(h1.Path("/tmp/probe")); err != nil || string(b) != "one\n" {
		t.Errorf("h1's /tmp/probe seen from the test: %q %v", b, err)
	}
	// A later process on h1 sees its /dev/shm, as on a real host.
	if got := h1.Run(t.Context(), "cat", "/dev/shm/gpucoord-probe"); got != "one\n" {
		t.Errorf("h1's next process reads its /dev/shm file as %q", got)
	}
	for _, f := range []string{"/tmp/probe", "/tmp/home/probe", "/dev/shm/gpucoord-probe"} {
		if out, err := h2.Command(t.Context(), "cat", f).CombinedOutput(); err == nil {
			t.Errorf("h2 reads h1's %s: %q", f, out)
		}
	}
	if got := h2.Run(t.Context(), "cat", filepath.Join(c.Shared(), "probe")); got != "shared\n" {
		t.Errorf("h2 reads the shared file as %q", got)
	}
	if _, err := os.Stat("/tmp/probe"); err == nil {
		t.Errorf("h1's /tmp/probe is in this machine's /tmp")
	}
	if _, err := os.Stat("/dev/shm/gpucoord-probe"); err == nil {
		os.Remove("/dev/shm/gpucoord-probe")
		t.Errorf("h1's /dev/shm/gpucoord-probe is in this machine's /dev/shm")
	}
}

func TestCutAndHeal(t *testing.T) {
	hp := newHelper(t, testcluster.Config{Hosts: 3})
	h1, h2, h3 := hp.c.Host(1), hp.c.Host(2), hp.c.Host(3)
	hp.serve(t, h2, "0.0.0.0:7000")
	if out, err := hp.dial(t, h1, "h2:7000", 10*time.Second); err != nil {
		t.Fatalf("before the cut: %v\n%s", err, out)
	}
	// A cut is silence: the dial times out rather than being refused.
	h2.Cut()
	out, err := hp.dial(t, h1, "h2:7000", 500*time.Millisecond)
	if err == nil || !strings.Contains(out, "timeout") {
		t.Errorf("h1 -> h2 while h2 is cut off: %v %q, want a timeout", err, out)
	}
	if out, err := hp.dial(t, h2, "127.0.0.1:7000", 10*time.Second); err != nil {
		t.Errorf("h2 -> its own loopback while cut off: %v\n%s", err, out)
	}
	h2.Heal()
	if out, err := hp.dial(t, h1, "h2:7000", 10*time.Second); err != nil {
		t.Errorf("after the heal: %v\n%s", err, out)
	}
	// A cut between two hosts leaves the third alone.
	h2.Cut(h1)
	if _, err := hp.dial(t, h1, "h2:7000", 500*time.Millisecond); err == nil {
		t.Errorf("h1 reaches h2 through a cut between them")
	}
	if out, err := hp.dial(t, h3, "h2:7000", 10*time.Second); err != nil {
		t.Errorf("h3 -> h2 with only h1 cut: %v\n%s", err, out)
	}
}

func TestKill(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Hosts: 2})
	cmd := c.Host(1).Command(t.Context(), "sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	other := c.Host(2).Command(t.Context(), "sleep", "1000")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	// A command starts in this machine's namespace and enters the host's
	// as it execs: Kill finds it only once it is there.
	for _, p := range []struct {
		h   *testcluster.Host
		pid int
	}{{c.Host(1), cmd.Process.Pid}, {c.Host(2), other.Process.Pid}} {
		for deadline := time.Now().Add(10 * time.Second); !slices.Contains(p.h.Pids(), p.pid); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("sleep (pid %d) not in %s's namespace after 10s", p.pid, p.h.Name)
			}
		}
	}
	c.Host(1).Kill()
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ProcessState.String() != "signal: killed" {
		t.Errorf("sleep on h1 ended with %v, want killed", err)
	}
	if pids := c.Host(1).Pids(); len(pids) != 0 {
		t.Errorf("processes left on h1: %v", pids)
	}
	if pids := c.Host(2).Pids(); len(pids) != 1 {
		t.Errorf("h2 runs %v, want its one sleep untouched", pids)
	}
}

func TestDelay(t *testing.T) {
	hp := newHelper(t, testcluster.Config{Hosts: 2, Relay: true})
	h1, h2 := hp.c.Host(1), hp.c.Host(2)
	hp.serve(t, h2, "0.0.0.0:7000")
	h1.Delay(25 * time.Millisecond)
	h2.Delay(25 * time.Millisecond)
	out, err := hp.dial(t, h1, "h2:7000", 10*time.Second)
	if err != nil {
		t.Fatalf("delayed dial: %v\n%s", err, out)
	}
	// One line there and back crosses both relays twice: at least 100 ms.
	rtt, err := time.ParseDuration(strings.TrimPrefix(strings.TrimSpace(out), "rtt "))
	if err != nil || rtt < 100*time.Millisecond {
		t.Errorf("round trip %v through two hosts delayed 25ms each way, want at least 100ms (%q)", rtt, out)
	}
	h1.Heal()
	h2.Heal()
	if out, err := hp.dial(t, h1, "h2:7000", 10*time.Second); err != nil {
		t.Errorf("after the heal: %v\n%s", err, out)
	}
}

func TestRemovedOnCleanup(t *testing.T) {
	var names []string
	t.Run("cluster", func(t *testing.T) {
		c := testcluster.New(t, testcluster.Config{Hosts: 2, Relay: true})
		cmd := c.Host(2).Command(t.Context(), "sleep", "1000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		out, _ := exec.Command("ip", "netns", "list").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, fmt.Sprintf("gct%d-", os.Getpid())) {
				names = append(names, strings.Fields(l)[0])
			}
		}
	})
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, n := range names {
		if strings.Contains(string(out), n) {
			t.Errorf("namespace %s is left after the test", n)
		}
	}
	if len(names) < 3 {
		t.Errorf("saw %v while the cluster ran, want a bridge and two hosts", names)
	}
}

// TestFillShm: a host's /dev/shm is a tmpfs of its own (no other host sees
// its files); filled, a write there fails with "No space left on device";
// once the fill is removed, the same write succeeds; the tmpfs goes with
// the cluster.
func TestFillShm(t *testing.T) {
	var shm string
	t.Run("cluster", func(t *testing.T) {
		c := testcluster.New(t, testcluster.Config{Hosts: 2, ShmBytes: 16 << 20})
		h1, h2 := c.Host(1), c.Host(2)
		write := "head -c 1048576 /dev/zero > /dev/shm/x && ls /dev/shm"
		if out := h1.Run(t.Context(), "sh", "-c", write); !strings.Contains(out, "x") {
			t.Fatalf("h1 wrote to /dev/shm, then saw %q", out)
		}
		if out := h2.Run(t.Context(), "ls", "/dev/shm"); strings.Contains(out, "x") {
			t.Errorf("h2 sees h1's /dev/shm: %q", out)
		}
		h1.Run(t.Context(), "rm", "/dev/shm/x")
		undo := h1.FillShm()
		out, err := h1.Command(t.Context(), "sh", "-c", write).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "No space left on device") {
			t.Errorf("a write to the full /dev/shm: %v %q, want No space left on device", err, out)
		}
		undo()
		h1.Run(t.Context(), "sh", "-c", write)
		mounts, _ := os.ReadFile("/proc/self/mounts")
		for _, l := range strings.Split(string(mounts), "\n") {
			if strings.HasPrefix(l, "gct-shm ") && strings.Contains(l, "/h1/shm ") {
				shm = strings.Fields(l)[1]
			}
		}
		if shm == "" {
			t.Fatalf("no tmpfs mounted for h1's /dev/shm:\n%s", mounts)
		}
	})
	if mounts, _ := os.ReadFile("/proc/self/mounts"); shm != "" && strings.Contains(string(mounts), shm) {
		t.Errorf("%s still mounted after the cluster was removed", shm)
	}
}
