// Package testcluster makes a cluster of hosts on one machine for tests: a
// cluster in a box. Each host is a network namespace with its own IPv4 and
// IPv6 address on a bridge, and every process a test runs on a host gets a
// private mount namespace in which /tmp (and so HOME, which is under it) and
// /dev/shm are the host's own directories and /etc/hosts names every host of the cluster:
// hosts share no file system unless the test asks for the shared directory.
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
// # Delay
//
// This machine's kernel has no sch_netem, so a delayed host's link is not a
// veth pair but two TAP devices, one in the host's namespace and one on the
// bridge, with a relay in the test process that holds each frame for the
// delay before it passes it on.
package testcluster
