package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Config describes a cluster.
type Config struct {
	// Hosts is the number of hosts, named h1 .. hN.
	Hosts int
	// Shared makes a directory every host sees at the same path
	// (Cluster.Shared), for the cases that need a shared file system.
	Shared bool
	// Relay links every host through a relay in the test process instead of
	// a veth pair, so that Host.Delay can slow its link.
	Relay bool
	// ShmBytes, when not 0, makes every host's /dev/shm a tmpfs of that
	// size, so that Host.FillShm can fill it as memory fills on a real
	// host. Otherwise /dev/shm is a directory on disk.
	ShmBytes int64
}

// Cluster is a set of hosts on a bridge. Its methods are safe for
// concurrent use.
type Cluster struct {
	t      testing.TB
	id     string // prefix of every namespace name: gct<pid>-<n>
	dir    string // /var/tmp/gpucoord-testcluster/<id>: every host's files
	bridge string // the bridge's namespace
	hosts  []*Host
	relays []*relay
	shared string
}

// Host is one host of a cluster.
type Host struct {
	// Name is the host's name (h1 .. hN), which every host's /etc/hosts
	// resolves.
	Name string
	// Addr is its IPv4 address; Addr6 its IPv6 address.
	Addr, Addr6 string
	c           *Cluster
	ns          string
	tmp         string // what the host's processes see as /tmp
	shm         string // and as /dev/shm
	shmMounted  bool   // shm is a tmpfs of its own (Config.ShmBytes)
	hosts       string // its /etc/hosts
	relay       *relay // nil for a veth link
}

// Base is where clusters keep their files: outside /tmp, which every host
// replaces with its own.
const Base = "/var/tmp/gpucoord-testcluster"

// netIPv4 and netIPv6 are every cluster's networks; host i (from 1) has
// .10+i.
const (
	netIPv4 = "198.18.0."
	netIPv6 = "2001:db8::"
)

var seq atomic.Int64

// New makes a cluster of cfg.Hosts hosts and removes it when the test ends.
// It skips the test, with the reason, where the machine cannot make one
// (not root, no ip or iptables), and fails it instead under CI.
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.Hosts < 1 || cfg.Hosts > 200 {
		t.Fatalf("testcluster: %d hosts: want 1 to 200", cfg.Hosts)
	}
	if err := usable(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("testcluster: %v (CI must run the cluster tests: run as root with scripts/deps.sh done)", err)
		}
		t.Skipf("testcluster: %v", err)
	}
	sweep()
	c := &Cluster{t: t, id: fmt.Sprintf("gct%d-%d", os.Getpid(), seq.Add(1))}
	c.dir = filepath.Join(Base, c.id)
	c.bridge = c.id + "-br"
	t.Cleanup(c.remove)
	if err := c.make(cfg); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	return c
}

// usable says why this machine cannot make a cluster, or nil.
func usable() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root and CAP_NET_ADMIN (running as uid %d)", os.Geteuid())
	}
	for _, tool := range []string{"ip", "nsenter", "unshare", "iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (scripts/deps.sh installs iptables)", tool)
		}
	}
	return nil
}

func (c *Cluster) make(cfg Config) error {
	if err := os.MkdirAll(filepath.Join(c.dir, "files"), 0o755); err != nil {
		return err
	}
	if err := run("ip", "netns", "add", c.bridge); err != nil {
		return err
	}
	if err := runAll(
		[]string{"ip", "-n", c.bridge, "link", "set", "lo", "up"},
		[]string{"ip", "-n", c.bridge, "link", "add", "br0", "type", "bridge"},
		[]string{"ip", "-n", c.bridge, "link", "set", "br0", "up"},
	); err != nil {
		return err
	}
	for i := 1; i <= cfg.Hosts; i++ {
		h := &Host{Name: "h" + strconv.Itoa(i), Addr: netIPv4 + strconv.Itoa(10+i), Addr6: netIPv6 + strconv.Itoa(10+i), c: c}
		h.ns = c.id + "-" + h.Name
		c.hosts = append(c.hosts, h)
	}
	for _, h := range c.hosts {
		// As on Debian, a host's own name resolves to 127.0.1.1: programs
		// that bind "their hostname" end up on loopback unless told
		// otherwise. The others' names resolve to their addresses.
		hosts := "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 " + h.Name + "\n"
		for _, o := range c.hosts {
			if o != h {
				hosts += o.Addr + " " + o.Name + "\n"
			}
		}
		if err := c.makeHost(h, cfg, hosts); err != nil {
			return fmt.Errorf("host %s: %w", h.Name, err)
		}
	}
	if cfg.Shared {
		c.shared = filepath.Join(c.dir, "shared")
		if err := os.Mkdir(c.shared, 0o777); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) makeHost(h *Host, cfg Config, hosts string) error {
	h.tmp = filepath.Join(c.dir, h.Name, "tmp")
	if err := os.MkdirAll(filepath.Join(h.tmp, "home"), 0o755); err != nil {
		return err
	}
	if err := os.Chmod(h.tmp, 0o1777); err != nil {
		return err
	}
	// Its own /dev/shm, kept across its processes as a host's is: a
	// directory on disk (what matters is that no other host sees it), or a
	// tmpfs of its own that can fill up (Config.ShmBytes).
	h.shm = filepath.Join(c.dir, h.Name, "shm")
	if err := os.Mkdir(h.shm, 0o1777); err != nil {
		return err
	}
	if err := os.Chmod(h.shm, 0o1777); err != nil {
		return err
	}
	if cfg.ShmBytes > 0 {
		if err := run("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=1777", cfg.ShmBytes), "gct-shm", h.shm); err != nil {
			return err
		}
		h.shmMounted = true
	}
	h.hosts = filepath.Join(c.dir, h.Name, "hosts")
	if err := os.WriteFile(h.hosts, []byte(hosts), 0o644); err != nil {
		return err
	}
	if err := run("ip", "netns", "add", h.ns); err != nil {
		return err
	}
	if cfg.Relay {
		r, err := newRelay(c, h)
		if err != nil {
			return err
		}
		h.relay = r
		c.relays = append(c.relays, r)
	} else if err := run("ip", "-n", c.bridge, "link", "add", h.Name, "type", "veth", "peer", "name", "eth0", "netns", h.ns); err != nil {
		return err
	}
	return runAll(
		[]string{"ip", "-n", c.bridge, "link", "set", h.Name, "master", "br0", "up"},
		[]string{"ip", "-n", h.ns, "link", "set", "lo", "up"},
		[]string{"ip", "-n", h.ns, "addr", "add", h.Addr + "/24", "dev", "eth0"},
		[]string{"ip", "-n", h.ns, "addr", "add", h.Addr6 + "/64", "dev", "eth0", "nodad"},
		[]string{"ip", "-n", h.ns, "link", "set", "eth0", "up"},
	)
}

// Hosts returns the hosts, h1 first.
func (c *Cluster) Hosts() []*Host { return c.hosts }

// Host returns host hI (from 1).
func (c *Cluster) Host(i int) *Host { return c.hosts[i-1] }

// Shared is the directory every host sees at this same path; empty unless
// Config.Shared.
func (c *Cluster) Shared() string { return c.shared }

// Install copies the file at path (a binary the test built, a file a
// program reads) to the directory every host sees, where the hosts'
// processes start, and returns its path there. The test's own files may be
// under /tmp, which every host replaces with its own.
func (c *Cluster) Install(path string) string {
	c.t.Helper()
	dst := filepath.Join(c.dir, "files", filepath.Base(path))
	if err := copyFile(path, dst); err != nil {
		c.t.Fatalf("testcluster: install %s: %v", path, err)
	}
	return dst
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Command returns the command name args run on h: in its network
// namespace, with its own /tmp, /dev/shm, /etc/hosts and host name, HOME=/tmp/home
// and TMPDIR=/tmp, started in the directory of Install's files. Paths name
// files as the host sees them (Install's, the shared directory's, or the
// host's own /tmp). The process dies with the
// test process (SIGKILL on parent death); append to Env, do not replace it.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	const script = `mount --bind "$1" /tmp && mount --bind "$2" /dev/shm && mount --bind "$3" /etc/hosts && hostname "$4" && shift 4 && exec "$@"`
	argv := append([]string{"--net=/run/netns/" + h.ns, "--", "unshare", "--mount", "--uts", "--propagation", "private", "--",
		"/bin/sh", "-c", script, "sh", h.tmp, h.shm, h.hosts, h.Name, name}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.Dir = filepath.Join(h.c.dir, "files")
	cmd.Env = append(os.Environ(), "HOME=/tmp/home", "TMPDIR=/tmp")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Run runs name args on h and returns its combined output, failing the test
// when it fails.
func (h *Host) Run(ctx context.Context, name string, args ...string) string {
	h.c.t.Helper()
	out, err := h.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		h.c.t.Fatalf("%s: %s %s: %v\n%s", h.Name, name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Path is where a file at path in h's /tmp or /dev/shm lies on this
// machine: a test reads what a host wrote there.
func (h *Host) Path(path string) string {
	if rel, err := filepath.Rel("/dev/shm", path); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.Join(h.shm, rel)
	}
	rel, err := filepath.Rel("/tmp", path)
	if err != nil || strings.HasPrefix(rel, "..") {
		h.c.t.Fatalf("testcluster: %s is under neither the host's /tmp nor its /dev/shm", path)
	}
	return filepath.Join(h.tmp, rel)
}

// Pids lists the processes running on h.
func (h *Host) Pids() []int { return nsPids(h.ns) }

// Kill kills every process on h with SIGKILL, as a host that loses power,
// and waits until none is left.
func (h *Host) Kill() {
	h.c.t.Helper()
	if err := killAll(h.ns); err != nil {
		h.c.t.Fatalf("testcluster: kill %s: %v", h.Name, err)
	}
}

// Cut drops every packet between h and the peers named, or between h and
// every other host when none is; the processes see silence, not errors.
// Loopback on h keeps working.
func (h *Host) Cut(peers ...*Host) {
	h.c.t.Helper()
	var cmds [][]string
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if len(peers) == 0 {
			cmds = append(cmds,
				[]string{"ip", "netns", "exec", h.ns, ipt, "-A", "INPUT", "!", "-i", "lo", "-j", "DROP"},
				[]string{"ip", "netns", "exec", h.ns, ipt, "-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP"})
		}
		for _, p := range peers {
			addr := p.Addr
			if ipt == "ip6tables" {
				addr = p.Addr6
			}
			cmds = append(cmds,
				[]string{"ip", "netns", "exec", h.ns, ipt, "-A", "INPUT", "-s", addr, "-j", "DROP"},
				[]string{"ip", "netns", "exec", h.ns, ipt, "-A", "OUTPUT", "-d", addr, "-j", "DROP"})
		}
	}
	if err := runAll(cmds...); err != nil {
		h.c.t.Fatalf("testcluster: cut %s: %v", h.Name, err)
	}
}

// Heal undoes every Cut of h and its Delay.
func (h *Host) Heal() {
	h.c.t.Helper()
	if err := runAll(
		[]string{"ip", "netns", "exec", h.ns, "iptables", "-F"},
		[]string{"ip", "netns", "exec", h.ns, "ip6tables", "-F"},
	); err != nil {
		h.c.t.Fatalf("testcluster: heal %s: %v", h.Name, err)
	}
	if h.relay != nil {
		h.relay.setDelay(0)
	}
}

// Delay holds every frame through h's link for d in each direction: two
// delayed hosts see a round trip of 4d between them. The cluster must have
// been made with Config.Relay.
func (h *Host) Delay(d time.Duration) {
	h.c.t.Helper()
	if h.relay == nil {
		h.c.t.Fatalf("testcluster: delay %s: the cluster was made without Config.Relay", h.Name)
	}
	h.relay.setDelay(d)
}

// FillShm fills h's /dev/shm (a tmpfs: Config.ShmBytes) with a file of
// the test's, as other programs on a host can, until nothing is left; the
// function it returns removes the file.
func (h *Host) FillShm() (undo func()) {
	h.c.t.Helper()
	if !h.shmMounted {
		h.c.t.Fatalf("testcluster: fill %s's /dev/shm: the cluster was made without Config.ShmBytes", h.Name)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(h.shm, &st); err != nil {
		h.c.t.Fatalf("testcluster: fill %s's /dev/shm: %v", h.Name, err)
	}
	path := filepath.Join(h.shm, "testcluster-fill")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		h.c.t.Fatalf("testcluster: fill %s's /dev/shm: %v", h.Name, err)
	}
	defer f.Close()
	// What others freed meanwhile is taken too: a tmpfs allocates what
	// fallocate asks for, and refuses the part it cannot.
	for n := int64(st.Bavail) * st.Bsize; n > 0; n /= 2 {
		if syscall.Fallocate(int(f.Fd()), 0, 0, n) == nil {
			break
		}
	}
	return func() { os.Remove(path) }
}

// remove stops every process, deletes every namespace and removes every
// file of the cluster. It is the test's cleanup and runs on every path.
func (c *Cluster) remove() {
	var errs []error
	for _, h := range c.hosts {
		if err := killAll(h.ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range c.hosts {
		if h.shmMounted {
			if err := run("umount", "-l", h.shm); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, r := range c.relays {
		r.close()
	}
	for _, h := range c.hosts {
		if err := deleteNS(h.ns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteNS(c.bridge); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		c.t.Errorf("testcluster: removing the cluster: %v", err)
	}
}

// sweep removes what a killed test binary left: the namespaces and
// directories of clusters whose process is gone.
func sweep() {
	sweepMu.Lock()
	defer sweepMu.Unlock()
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if pid, ok := ownerPid(name); ok && !alive(pid) {
			killAll(name)
			deleteNS(name)
		}
	}
	entries, _ := os.ReadDir(Base)
	for _, e := range entries {
		if pid, ok := ownerPid(e.Name()); ok && !alive(pid) {
			dir := filepath.Join(Base, e.Name())
			unmountUnder(dir)
			os.RemoveAll(dir)
		}
	}
}

var sweepMu sync.Mutex

// unmountUnder unmounts what is mounted under dir (a killed test's
// tmpfs /dev/shm), so that its files can be removed.
func unmountUnder(dir string) {
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			exec.Command("umount", "-l", f[1]).Run()
		}
	}
}

// ownerPid returns the pid in a name made by New (gct<pid>-...).
func ownerPid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "gct")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil
}

func alive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func nsPids(ns string) []int {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killAll SIGKILLs every process in namespace ns until none is left (a
// process may be forking while it dies).
func killAll(ns string) error {
	for range 100 {
		pids := nsPids(ns)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond) // SIGKILL is asynchronous; poll until the kernel has reaped them
	}
	return fmt.Errorf("processes still in %s after 2s: %v", ns, nsPids(ns))
}

func deleteNS(ns string) error {
	if _, err := os.Stat("/run/netns/" + ns); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return run("ip", "netns", "delete", ns)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func runAll(cmds ...[]string) error {
	for _, c := range cmds {
		if err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}
