package testcluster

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SlurmConfig describes a Slurm cluster on a testcluster: slurmctld (and
// the one munged) on the first host, "the login host", and slurmd on each
// other host, named as the hosts are (h2 .. hN), each with CPUsPerNode CPUs
// and no generic resources (no GPUs as Gres).
type SlurmConfig struct {
	// CPUsPerNode is how many CPUs each compute node declares; 0 means 4.
	// slurmd takes it from slurm.conf rather than from the machine
	// (SlurmdParameters=config_overrides), so it may exceed the cores.
	CPUsPerNode int
	// ExtraConf is appended to slurm.conf, one setting a line, e.g.
	// "KillWait=5". A line that sets a key of the base configuration
	// (SlurmdTimeout, MinJobAge, ...) replaces that key's line, since Slurm
	// complains of a key set twice.
	ExtraConf string
}

// Slurm is a running Slurm cluster on a Cluster's hosts, made by
// StartSlurm. Its methods are safe for concurrent use.
type Slurm struct {
	t       testing.TB
	c       *Cluster
	run     string // the run's directory: every host sees it at this path
	conf    string // its slurm.conf
	shared  string // Dir
	daemons []*daemon
}

// daemon is one of the cluster's daemons, run in the foreground so that its
// PID is the one the test started.
type daemon struct {
	name string // munged, slurmctld, slurmd-h2, ...
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait returned
	err  error         // cmd.Wait's, set before done is closed
}

// Paths of the programs the Slurm cluster needs; Debian's slurm-wlm and
// munge packages install them (scripts/deps.sh).
var slurmPrograms = []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun", "/usr/bin/sbatch", "/usr/bin/sinfo", "/usr/bin/scontrol"}

// slurmctldPort and slurmdPort are the daemons' ports; every host has its own network
// namespace, so every cluster can use the defaults.
const (
	slurmctldPort = 6817
	slurmdPort    = 6818
)

// StartSlurm starts munged, slurmctld and the slurmds on c's hosts, waits
// until every node is idle (sinfo), and stops them all (and every process
// they started, slurmstepd's double forks included) when the test ends, on
// every path. c needs at least two hosts. It skips the test, with the
// reason, when slurm or munge is not installed, except under CI (env CI
// non-empty) where it fails, as New does for ip and iptables.
//
// Its cleanup runs before c's (cleanups run last registered first) and
// kills every process left on every host, the test's own included, as c's
// would.
func StartSlurm(t testing.TB, c *Cluster, cfg SlurmConfig) *Slurm {
	t.Helper()
	if err := slurmUsable(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("testcluster: slurm: %v (CI must run the Slurm tests: run scripts/deps.sh)", err)
		}
		t.Skipf("testcluster: slurm: %v", err)
	}
	if len(c.hosts) < 2 {
		t.Fatalf("testcluster: slurm: %d hosts: want a login host and at least one compute host", len(c.hosts))
	}
	if cfg.CPUsPerNode == 0 {
		cfg.CPUsPerNode = 4
	}
	if cfg.CPUsPerNode < 0 {
		t.Fatalf("testcluster: slurm: CPUsPerNode %d is negative", cfg.CPUsPerNode)
	}
	s := &Slurm{t: t, c: c, run: filepath.Join(c.dir, "slurm")}
	s.conf = filepath.Join(s.run, "etc", "slurm.conf")
	s.shared = filepath.Join(s.run, "shared")
	t.Cleanup(s.stop)
	if err := s.prepare(cfg); err != nil {
		t.Fatalf("testcluster: slurm: %v", err)
	}
	if err := s.start(t.Context()); err != nil {
		s.logTails()
		t.Fatalf("testcluster: slurm: %v", err)
	}
	return s
}

// slurmUsable says why this machine cannot run a Slurm cluster, or nil.
func slurmUsable() error {
	for _, p := range slurmPrograms {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is not installed (scripts/deps.sh installs slurm-wlm and munge)", p)
		}
	}
	return nil
}

// socket is munged's socket, which every host's Slurm reaches (AuthInfo).
func (s *Slurm) socket() string { return filepath.Join(s.run, "munge", "munge.socket.2") }

// prepare makes the run's directories, munge key and slurm.conf, and each
// host's spool and state directories, which the daemons do not make.
func (s *Slurm) prepare(cfg SlurmConfig) error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{s.run, 0o755},
		{filepath.Join(s.run, "etc"), 0o755},
		{filepath.Join(s.run, "logs"), 0o755},
		// munged wants every user to reach its socket through the directory
		// and nobody else to write there.
		{filepath.Join(s.run, "munge"), 0o711},
		{s.shared, 0o777},
	} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(d.path, d.mode); err != nil { // past the umask
			return err
		}
	}
	for _, h := range s.c.hosts {
		for _, d := range []string{"spool", "state"} {
			if err := os.MkdirAll(filepath.Join(h.tmp, "slurm", d), 0o755); err != nil {
				return err
			}
		}
	}
	// A key of the run's own, readable by root alone (munged runs as root
	// here and refuses a key others can read).
	key := make([]byte, 1024)
	rand.Read(key)
	if err := os.WriteFile(filepath.Join(s.run, "munge", "munge.key"), key, 0o400); err != nil {
		return err
	}
	return os.WriteFile(s.conf, []byte(s.slurmConf(cfg)), 0o644)
}

// slurmConf is the cluster's slurm.conf.
func (s *Slurm) slurmConf(cfg SlurmConfig) string {
	login := s.c.hosts[0]
	base := []string{
		"ClusterName=box",
		fmt.Sprintf("SlurmctldHost=%s(%s)", login.Name, login.Addr),
		"SlurmUser=root",
		"SlurmdUser=root",
		"AuthType=auth/munge",
		"CredType=cred/munge",
		// cred_expire: how long a requeued job waits before it starts
		// again (120 s by default), and how long its nodes refuse its old
		// credential; 15 s keeps the requeue tests short.
		"AuthInfo=socket=" + s.socket() + ",cred_expire=15",
		"SlurmctldPort=" + strconv.Itoa(slurmctldPort),
		"SlurmdPort=" + strconv.Itoa(slurmdPort),
		// /tmp is each host's own.
		"StateSaveLocation=/tmp/slurm/state",
		"SlurmdSpoolDir=/tmp/slurm/spool",
		"SlurmctldPidFile=/tmp/slurm/slurmctld.pid",
		"SlurmdPidFile=/tmp/slurm/slurmd.pid",
		"SlurmctldLogFile=" + filepath.Join(s.run, "logs", "slurmctld.log"),
		"SlurmdLogFile=" + filepath.Join(s.run, "logs", "slurmd-%n.log"),
		// No cgroups: processes are tracked by parentage, and tasks are
		// not bound.
		"ProctrackType=proctrack/linuxproc",
		"TaskPlugin=task/none",
		"JobAcctGatherType=jobacct_gather/none",
		"AccountingStorageType=accounting_storage/none",
		"JobCompType=jobcomp/none",
		"SwitchType=switch/none",
		"MpiDefault=none",
		"SelectType=select/cons_tres",
		"SelectTypeParameters=CR_CPU",
		"SchedulerType=sched/backfill",
		// The nodes' CPUs are slurm.conf's, not the machine's.
		"SlurmdParameters=config_overrides",
		// A slurmd that comes back makes its node idle again.
		"ReturnToService=2",
		"SlurmctldTimeout=30",
		"SlurmdTimeout=10",
		"InactiveLimit=0",
		"MinJobAge=30",
		"Waittime=0",
		"MessageTimeout=10",
		"MailProg=/bin/true",
		"JobRequeue=0",
	}
	extra := strings.Split(strings.TrimSpace(cfg.ExtraConf), "\n")
	replaced := map[string]bool{}
	for _, l := range extra {
		if k, _, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			replaced[strings.ToLower(k)] = true
		}
	}
	var b strings.Builder
	for _, l := range base {
		if k, _, _ := strings.Cut(l, "="); !replaced[strings.ToLower(k)] {
			b.WriteString(l + "\n")
		}
	}
	var names []string
	for _, h := range s.c.hosts[1:] {
		fmt.Fprintf(&b, "NodeName=%s NodeHostname=%s NodeAddr=%s CPUs=%d RealMemory=1000 State=UNKNOWN\n", h.Name, h.Name, h.Addr, cfg.CPUsPerNode)
		names = append(names, h.Name)
	}
	fmt.Fprintf(&b, "PartitionName=main Nodes=%s Default=YES MaxTime=INFINITE State=UP\n", strings.Join(names, ","))
	for _, l := range extra {
		if l = strings.TrimSpace(l); l != "" {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// start starts munged, then slurmctld, then the slurmds, each once the one
// before answers, and waits until every node is idle.
func (s *Slurm) start(ctx context.Context) error {
	login := s.c.hosts[0]
	munge := filepath.Join(s.run, "munge")
	if err := s.startDaemon(login, "munged", "/usr/sbin/munged", "--foreground", "--force",
		"--socket="+s.socket(), "--key-file="+filepath.Join(munge, "munge.key"),
		"--log-file="+filepath.Join(s.run, "logs", "munged.log"),
		"--pid-file="+filepath.Join(munge, "munged.pid"), "--seed-file="+filepath.Join(munge, "munged.seed")); err != nil {
		return err
	}
	if err := s.await(ctx, "munged's socket", func() (bool, string) {
		_, err := os.Stat(s.socket())
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		return err
	}
	if err := s.startDaemon(login, "slurmctld", "/usr/sbin/slurmctld", "-D", "-i"); err != nil {
		return err
	}
	if err := s.await(ctx, "slurmctld", func() (bool, string) {
		out, err := s.Run(ctx, "scontrol", "ping")
		return err == nil && strings.Contains(out, "is UP"), out
	}); err != nil {
		return err
	}
	for _, h := range s.c.hosts[1:] {
		if err := s.startDaemon(h, "slurmd-"+h.Name, "/usr/sbin/slurmd", "-D", "-N", h.Name); err != nil {
			return err
		}
	}
	return s.await(ctx, "every node idle", func() (bool, string) {
		out, err := s.Run(ctx, "sinfo", "--noheader", "--Node", "--format=%N %t")
		if err != nil {
			return false, out
		}
		idle := 0
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[1] == "idle" {
				idle++
			}
		}
		return idle == len(s.c.hosts)-1, out
	})
}

// await polls ready until it is true, a daemon exits or 30 s pass (a
// loaded 2-core machine starts the cluster in about 2 s).
func (s *Slurm) await(ctx context.Context, what string, ready func() (bool, string)) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, last := ready()
		if ok {
			return nil
		}
		for _, d := range s.daemons {
			select {
			case <-d.done:
				return fmt.Errorf("waiting for %s: %s on exited: %v", what, d.name, d.err)
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not after 30s: %s", what, strings.TrimSpace(last))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startDaemon starts a daemon in the foreground on h, its output in the
// run's logs directory. It is killed by stop, not by a context: stop first
// lists what it started.
func (s *Slurm) startDaemon(h *Host, name, path string, args ...string) error {
	out, err := os.Create(filepath.Join(s.run, "logs", name+".out"))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := s.command(context.WithoutCancel(s.t.Context()), h, path, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s on %s: %w", name, h.Name, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	s.daemons = append(s.daemons, d)
	return nil
}

// command is name args on h with the cluster's SLURM_CONF. Slurm variables
// of the test's own environment (a test run inside a Slurm job) are left
// out: they would point the client commands at that job.
func (s *Slurm) command(ctx context.Context, h *Host, name string, args ...string) *exec.Cmd {
	cmd := h.Command(ctx, name, args...)
	env := cmd.Env[:0]
	for _, kv := range cmd.Env {
		if !slurmVar(kv) {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "SLURM_CONF="+s.conf)
	return cmd
}

// slurmVar says whether kv is one of the variables that Slurm's commands
// read as their input.
func slurmVar(kv string) bool {
	for _, p := range []string{"SLURM", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCONTROL_", "SCANCEL_"} {
		if strings.HasPrefix(kv, p) {
			return true
		}
	}
	return false
}

// Command returns the Slurm client command name args (srun, sbatch,
// scancel, squeue, scontrol, sinfo, salloc) to run on the login host with
// the cluster's SLURM_CONF, for the caller to start (a long srun or
// sbatch). Every process still on a host when the test ends is killed.
func (s *Slurm) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return s.command(ctx, s.c.hosts[0], name, args...)
}

// Run runs the Slurm client command name args on the login host, as
// Command, and returns its combined output.
func (s *Slurm) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := s.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// KillSlurmd kills h's slurmd with SIGKILL and waits until it is gone, as a
// daemon that crashes on a host that stays up: the slurmstepds and tasks it
// started keep running, out of slurmctld's reach, until the test ends.
func (s *Slurm) KillSlurmd(h *Host) {
	s.t.Helper()
	for _, d := range s.daemons {
		if d.name == "slurmd-"+h.Name {
			d.cmd.Process.Kill() // an error only says it is already gone
			<-d.done
			return
		}
	}
	s.t.Fatalf("testcluster: slurm: %s runs no slurmd", h.Name)
}

// Dir is a directory every host sees at the same path, writable by all:
// for batch scripts and their output files.
func (s *Slurm) Dir() string { return s.shared }

// stop kills the daemons, everything they started and whatever else still
// runs on the hosts, and waits for the daemons. It is the test's cleanup
// and runs before the cluster's, which would kill them too but leave the
// daemons unwaited.
func (s *Slurm) stop() {
	var roots []int
	for _, d := range s.daemons {
		select {
		case <-d.done: // reaped: its PID may be another's now
		default:
			roots = append(roots, d.cmd.Process.Pid)
		}
	}
	killTrees(roots)
	// slurmstepd double-forks and proctrack/linuxproc loses what is
	// reparented to init: those are found by namespace.
	var errs []error
	for _, h := range s.c.hosts {
		if err := killAll(h.ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range s.daemons {
		<-d.done
	}
	if err := errors.Join(errs...); err != nil {
		s.t.Errorf("testcluster: slurm: stopping: %v", err)
	}
	if s.t.Failed() {
		s.logTails()
	}
}

// logTails logs the end of every daemon's log, for a test that failed. A
// daemon in the foreground copies its log file to its output, which also
// has what it said before it opened the file: the output is the one shown,
// but for munged, which logs to its file alone.
func (s *Slurm) logTails() {
	logs, _ := filepath.Glob(filepath.Join(s.run, "logs", "*.out"))
	logs = append(logs, filepath.Join(s.run, "logs", "munged.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		s.t.Logf("%s:\n%s", filepath.Base(l), b)
	}
}

// killTrees SIGKILLs the processes roots and all their descendants. Each is
// stopped as it is found, so that none forks a child past the listing, and
// the listing is repeated until it finds nothing new.
func killTrees(roots []int) {
	found := map[int]bool{}
	for range 50 {
		children := childrenOf()
		added := false
		stack := append([]int(nil), roots...)
		for pid := range found {
			stack = append(stack, pid)
		}
		for len(stack) > 0 {
			pid := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if !found[pid] {
				found[pid] = true
				added = true
				syscall.Kill(pid, syscall.SIGSTOP)
			}
			for _, c := range children[pid] {
				if !found[c] {
					stack = append(stack, c)
				}
			}
		}
		if !added {
			break
		}
	}
	for pid := range found {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// childrenOf maps each running process to its children, from /proc.
func childrenOf() map[int][]int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	return children
}
