package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	k8s "github.com/gpucoord/gpucoord/deploy/kubernetes"
	"github.com/gpucoord/gpucoord/internal/e2e"
	"github.com/gpucoord/gpucoord/internal/rankexe"
	"github.com/gpucoord/gpucoord/internal/testcluster"
)

// The tests in this file hold deploy/kubernetes's manifests to what
// gpucoord runs: the containers' arguments parse with gpucoord's own
// commands, and their entrypoints, with the environment the downward API
// gives them, run a job on a cluster in a box, one host per pod. No API
// server or kubelet runs: the test plays the kubelet's part (the
// environment, $(VAR) in arguments, volumes, /etc/hosts and the pod's
// host name) as docs/KUBERNETES.md says.

// podSpecs returns the coordinators' StatefulSet and the agents' Job.
func podSpecs(t *testing.T) (*appsv1.StatefulSet, *batchv1.Job, string) {
	t.Helper()
	objs, err := k8s.Objects()
	if err != nil {
		t.Fatal(err)
	}
	kz, err := k8s.ReadKustomization()
	if err != nil {
		t.Fatal(err)
	}
	var sts *appsv1.StatefulSet
	var job *batchv1.Job
	for _, o := range objs {
		switch v := o.Value.(type) {
		case *appsv1.StatefulSet:
			sts = v
		case *batchv1.Job:
			job = v
		}
	}
	if sts == nil || job == nil {
		t.Fatal("the manifests have no StatefulSet or no Job")
	}
	return sts, job, kz.Namespace
}

// pod is one pod as the kubelet would run it: its container's environment
// resolved from the downward API.
type pod struct {
	name, hostname, subdomain string
	c                         corev1.Container
	env                       []string // KEY=VALUE, in the container's order
}

// fieldValues are the downward API's fields for a pod.
type fieldValues map[string]string

// newPod resolves c's environment from fields; a field the test does not
// provide fails it, so the manifests cannot lean on one it does not play.
func newPod(t *testing.T, name string, spec corev1.PodSpec, fields fieldValues) *pod {
	t.Helper()
	p := &pod{name: name, hostname: name, subdomain: spec.Subdomain, c: spec.Containers[0]}
	p.c.Args = slices.Clone(p.c.Args)
	if spec.Hostname != "" {
		p.hostname = spec.Hostname
	}
	vars := map[string]string{}
	for _, e := range p.c.Env {
		v := expand(e.Value, vars)
		if e.ValueFrom != nil {
			f := e.ValueFrom.FieldRef
			if f == nil {
				t.Fatalf("%s: variable %s comes from something other than a field", name, e.Name)
			}
			var ok bool
			if v, ok = fields[f.FieldPath]; !ok {
				t.Fatalf("%s: variable %s comes from %s, which this test does not give", name, e.Name, f.FieldPath)
			}
		}
		vars[e.Name] = v
		p.env = append(p.env, e.Name+"="+v)
	}
	for i, a := range p.c.Args {
		p.c.Args[i] = expand(a, vars)
	}
	return p
}

// k8sVar is a $(VAR) reference, or $$ (a literal $).
var k8sVar = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand does what the kubelet does to a container's arguments and
// variables: $(VAR) becomes VAR's value when VAR is defined, and stays as
// written when not; $$ is a $.
func expand(s string, vars map[string]string) string {
	return k8sVar.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := vars[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

func TestExpandLikeKubelet(t *testing.T) {
	vars := map[string]string{"A": "x", "B": "y"}
	for in, want := range map[string]string{
		"$(A)":          "x",
		"--n=$(A).$(B)": "--n=x.y",
		"$(C)":          "$(C)",
		"$$(A)":         "$(A)",
		"a$b":           "a$b",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestKubernetesArgs: the coordinator's and the agent's arguments, as the
// kubelet expands them, parse with gpucoord's own commands, and the
// agent's downward-API variables are the ones the worker reads as its
// --name, --advertise-addr and --failure-domain.
func TestKubernetesArgs(t *testing.T) {
	sts, job, ns := podSpecs(t)
	fields := fieldValues{"metadata.name": "p-0", "metadata.namespace": ns, "status.podIP": "10.1.2.3", "spec.nodeName": "gpu-7",
		"metadata.labels['topology.kubernetes.io/zone']": "zone-b"}
	for _, c := range []struct {
		spec corev1.PodSpec
		cmd  func() *cobra.Command
	}{{sts.Spec.Template.Spec, newCoordinatorCmd}, {job.Spec.Template.Spec, newWorkerCmd}} {
		p := newPod(t, "p-0", c.spec, fields)
		cmd := c.cmd()
		if len(p.c.Args) == 0 || p.c.Args[0] != cmd.Name() {
			t.Fatalf("container %s runs %q, want gpucoord %s", p.c.Name, p.c.Args, cmd.Name())
		}
		if err := cmd.ParseFlags(p.c.Args[1:]); err != nil {
			t.Errorf("gpucoord %s %q: %v", cmd.Name(), p.c.Args[1:], err)
		}
		for _, a := range p.c.Args {
			if strings.Contains(a, "$(") {
				t.Errorf("argument %q refers to a variable the container does not have", a)
			}
		}
		if cmd.Name() != "worker" {
			continue
		}
		want := map[string]string{envNodeName: "gpu-7", envAdvertiseAddr: "10.1.2.3", envFailureDomain: "zone-b"}
		for k, v := range want {
			if !slices.Contains(p.env, k+"="+v) {
				t.Errorf("the agent's environment %q lacks %s=%s", p.env, k, v)
			}
		}
	}
}

// boxPod runs p's container on h as the kubelet would: its arguments and
// environment (and the image's: HOME, TMPDIR), as uid 65532, on its host
// name, with /etc/hosts naming every pod of the headless Service (what
// cluster DNS answers), and each volume (the host's own /tmp and /dev/shm
// stand for emptyDirs there) a directory of the host's /tmp holding what
// the test put in vols. It returns the process.
func (b *boxCluster) boxPod(t *testing.T, h *testcluster.Host, p *pod, hosts string, vols map[string]map[string]string) *proc {
	t.Helper()
	script := []string{"set -e", `f=/tmp/pod-hosts-$$`, `cat /etc/hosts > $f`, `printf '%s' "$POD_HOSTS" >> $f`, `mount --bind $f /etc/hosts`, `hostname "$POD_HOSTNAME"`}
	for _, m := range p.c.VolumeMounts {
		if m.MountPath == "/tmp" || m.MountPath == "/dev/shm" {
			continue
		}
		src := "/tmp/volumes/" + m.Name
		dir := h.Path(src)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range vols[m.Name] {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o440); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(dir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
		for name := range vols[m.Name] {
			if err := os.Chown(filepath.Join(dir, name), 0, 65532); err != nil {
				t.Fatal(err)
			}
		}
		mountPoint(t, m.MountPath)
		script = append(script, fmt.Sprintf("mount --bind %s %s", src, m.MountPath))
	}
	script = append(script, `exec setpriv --reuid=65532 --regid=65532 --clear-groups -- "$@"`)
	cmd := h.Command(t.Context(), "/bin/sh", append([]string{"-c", strings.Join(script, "\n"), "sh", b.exe}, p.c.Args...)...)
	cmd.Env = append(cmd.Env, p.env...)
	cmd.Env = append(cmd.Env, "HOME=/var/lib/gpucoord", "TMPDIR=/tmp", "POD_HOSTNAME="+p.hostname, "POD_HOSTS="+hosts)
	if b.ranks != "" {
		cmd.Env = append(cmd.Env, rankexe.Env+"="+b.ranks)
	}
	return startCmd(t, cmd)
}

// mountPoint makes dir on this machine, for a pod's volume to be mounted
// on in a host's own mount namespace, and removes it when the test ends
// if it made it.
func mountPoint(t *testing.T, dir string) {
	t.Helper()
	var made []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		made = append(made, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range made {
			os.Remove(d) // only while empty
		}
	})
}

// TestKubernetesEntrypoints runs the manifests' own coordinator and agent
// containers on a cluster in a box, one host per pod: the StatefulSet's
// three members on h1-h3 (one etcd cluster over mutual TLS under a CA made
// as docs/KUBERNETES.md makes it), a node-role join token made with the
// documented token create and handed to the agents as its Secret would be,
// and two of the Job's agents on h4 and h5 with the downward API's
// variables filled from their hosts. The agents register under their node
// names, addresses and zones, and a native job launched from a
// coordinator's pod (as kubectl exec would) trains to train --np 1's
// losses.
func TestKubernetesEntrypoints(t *testing.T) {
	sts, job, ns := podSpecs(t)
	b := newBoxCluster(t, testcluster.Config{Hosts: 5})
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is not installed (scripts/deps.sh installs it)")
	}
	want := e2e.Reference(t, b.exe, "testdata/mlp48.yaml")

	// The CA Secret, made as docs/KUBERNETES.md says.
	dir := t.TempDir()
	if out, err := exec.CommandContext(t.Context(), "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
		"-keyout", filepath.Join(dir, "ca.key"), "-out", filepath.Join(dir, "ca.pem"), "-days", "3650", "-subj", "/CN=gpucoord-ca").CombinedOutput(); err != nil {
		t.Fatalf("openssl: %v\n%s", err, out)
	}
	ca := map[string]string{}
	for _, f := range []string{"ca.pem", "ca.key"} {
		bs, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		ca[f] = string(bs)
	}

	// The headless Service's names, as cluster DNS answers them.
	replicas := int(*sts.Spec.Replicas)
	var hosts string
	for i := range replicas {
		name := fmt.Sprintf("%s-%d", sts.Name, i)
		hosts += fmt.Sprintf("%s %s.%s %s.%s.%s.svc %s.%s.%s.svc.cluster.local\n", b.Host(i+1).Addr, name, sts.Spec.ServiceName,
			name, sts.Spec.ServiceName, ns, name, sts.Spec.ServiceName, ns)
	}
	var coords []*proc
	for i := range replicas {
		h := b.Host(i + 1)
		name := fmt.Sprintf("%s-%d", sts.Name, i)
		spec := sts.Spec.Template.Spec
		spec.Subdomain = sts.Spec.ServiceName
		p := newPod(t, name, spec, fieldValues{"metadata.name": name, "metadata.namespace": ns, "status.podIP": h.Addr})
		coords = append(coords, b.boxPod(t, h, p, hosts, map[string]map[string]string{"ca": ca}))
	}
	for _, co := range coords {
		co.waitLine(t, "coordinator listening on ", time.Minute)
	}

	// kubectl exec gpucoord-coordinator-0 -- gpucoord token create ...
	exec0 := func(args ...string) *proc {
		p := newPod(t, sts.Name+"-0", sts.Spec.Template.Spec, fieldValues{"metadata.name": sts.Name + "-0", "metadata.namespace": ns, "status.podIP": b.Host(1).Addr})
		p.c.Args = args
		return b.boxPod(t, b.Host(1), p, hosts, map[string]map[string]string{"ca": ca})
	}
	tp := exec0("token", "create", "--coordinator", "127.0.0.1:7070", "--token-file", "/var/lib/gpucoord/admin.token", "--roles", "node", "--ttl", "24h")
	if code := tp.wait(t, time.Minute); code != 0 {
		t.Fatalf("token create exited %d:\n%s", code, tp.output())
	}
	token := regexp.MustCompile(`gct1\.[^\s]+`).FindString(tp.output())
	if token == "" {
		t.Fatalf("token create printed no token:\n%s", tp.output())
	}

	// Two of the Job's agents, each on its node, in two zones.
	zones := map[string]string{"h4": "zone-a", "h5": "zone-b"}
	for i, h := range []*testcluster.Host{b.Host(4), b.Host(5)} {
		name := fmt.Sprintf("%s-%d-x%d", job.Name, i, i)
		p := newPod(t, name, job.Spec.Template.Spec, fieldValues{"metadata.name": name, "metadata.namespace": ns, "status.podIP": h.Addr,
			"spec.nodeName": "node-" + h.Name, "metadata.labels['topology.kubernetes.io/zone']": zones[h.Name]})
		a := b.boxPod(t, h, p, hosts, map[string]map[string]string{"join-token": {"token": token + "\n"}})
		a.waitLine(t, `"msg":"registered"`, time.Minute) // --log-format=json
	}

	st := exec0("status", "--coordinator", "127.0.0.1:7070", "--token-file", "/var/lib/gpucoord/admin.token", "--json")
	if code := st.wait(t, time.Minute); code != 0 {
		t.Fatalf("status exited %d:\n%s", code, st.output())
	}
	var status struct {
		Nodes []struct {
			Name, Host    string
			FailureDomain string `json:"failure_domain"`
		}
	}
	if err := json.Unmarshal([]byte(st.output()[strings.Index(st.output(), "{"):]), &status); err != nil {
		t.Fatalf("status --json: %v\n%s", err, st.output())
	}
	var got []string
	for _, n := range status.Nodes {
		got = append(got, n.Name+" "+n.Host+" "+n.FailureDomain)
	}
	slices.Sort(got)
	if w := []string{"node-h4 " + b.Host(4).Addr + " zone-a", "node-h5 " + b.Host(5).Addr + " zone-b"}; !slices.Equal(got, w) {
		t.Errorf("nodes (name, host, failure domain) %q, want %q", got, w)
	}

	// A job, from a coordinator's pod.
	l := exec0("launch", "--coordinator", "127.0.0.1:7070", "--token-file", "/var/lib/gpucoord/admin.token",
		"--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--job-id", "k8s", "--json", b.job)
	if code := l.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("launch exited %d:\n%s", code, l.output())
	}
	e2e.SameLosses(t, e2e.Losses(t, l.output()), want)
}
