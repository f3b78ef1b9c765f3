// Package testcluster makes a cluster of hosts on one machine for tests: a
// cluster in a box. Each host is a network namespace with its own IPv4 and
// IPv6 address on a bridge, and every process a test runs on a host gets a
// private mount namespace in which /tmp (and so HOME, which is under it) and
// /dev/shm are the host's own directories (/dev/shm a tmpfs of its own
// with Config.ShmBytes, which Host.FillShm can fill) and /etc/hosts names
// every host of the cluster: hosts share no file system unless the test
// asks for the shared directory.
//
// A test can kill a host (SIGKILL to every process in its namespace), cut
// it off (iptables drops all its traffic, or only what goes to some peers),
// delay its link and heal it.
//
// # Isolation
//
// The bridge lives in a namespace of its own, so nothing of the cluster is
// reachable from the machine's own network and no test traffic leaves the
// namespaces the harness made. Addresses are 198.18.0.0/24 (RFC 2544's
// benchmarking range) and 2001:db8::/64 (documentation), the same in every
// cluster, which never see each other. Every process is stopped, every
// namespace deleted and every directory removed when the test ends, on
// every path; namespaces left by a test binary that was killed are swept
// by the next New.
//
// # Requirements
//
// Root (CAP_NET_ADMIN and CAP_SYS_ADMIN), the ip, nsenter and unshare
// commands, and iptables (Debian's package; make deps installs it). Where
// one is missing New skips the test with one line saying why, except under
// CI (CI=true), where it fails: CI has them and must run these tests.
//
// # Slurm
//
// StartSlurm makes a cluster a real Slurm cluster (Debian's slurm-wlm and
// munge, scripts/deps.sh): h1 is the login host, running slurmctld and the
// one munged, which every host reaches through its socket in the run's
// directory (AuthInfo=socket=...); h2 .. hN run slurmd as nodes of those
// names, each declaring SlurmConfig.CPUsPerNode CPUs whatever the machine
// has. The run's directory (under the cluster's, which every host sees)
// holds slurm.conf (SLURM_CONF), a munge key of the run's own, the logs and
// Slurm.Dir for batch scripts; each host keeps its spool and state in its
// own /tmp. There are no cgroups (proctrack/linuxproc, task/none) and no
// accounting. Slurm.Run and Slurm.Command run srun, sbatch, scancel and the
// rest on the login host. When the test ends the daemons, their
// descendants and then every process left on the hosts are killed, before
// the cluster is removed: slurmstepd double-forks, and a task that puts
// itself beyond its parent escapes linuxproc, so only the namespace sweep
// finds it. Hosts are entered with nsenter, not ip netns exec, which
// remounts /sys and hides the cgroup mounts slurmd's cgroup plugin wants
// even with linuxproc. A host's own name resolving to 127.0.1.1 does not
// matter to Slurm: the daemons' addresses come from slurm.conf (NodeAddr,
// SlurmctldHost's) and srun's from its connections (SLURM_SRUN_COMM_HOST
// is the login host's address).
//
// # Delay
//
// This machine's kernel has no sch_netem, so a delayed host's link is not a
// veth pair but two TAP devices, one in the host's namespace and one on the
// bridge, with a relay in the test process that holds each frame for the
// delay before it passes it on.
package testcluster
