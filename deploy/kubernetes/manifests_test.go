package kubernetes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpucoord/gpucoord/coordinator"
)

// manifests decodes every object, failing the test on any error, and
// returns them by kind and name.
func manifests(t *testing.T) map[string]Object {
	t.Helper()
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Object{}
	for _, o := range objs {
		key := o.Kind + "/" + o.Name
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = o
	}
	return out
}

// get returns the object key, of type T.
func get[T any](t *testing.T, objs map[string]Object, key string) T {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("no %s in the manifests", key)
	}
	v, ok := o.Value.(T)
	if !ok {
		t.Fatalf("%s decoded as %T", key, o.Value)
	}
	return v
}

// TestManifestsDecode: every object of every manifest the kustomization
// lists decodes strictly, and they are the objects docs/KUBERNETES.md
// describes.
func TestManifestsDecode(t *testing.T) {
	objs := manifests(t)
	want := []string{
		"Namespace/gpucoord",
		"Service/gpucoord-coordinator", "StatefulSet/gpucoord-coordinator", "PodDisruptionBudget/gpucoord-coordinator",
		"Job/gpucoord-agents", "PodDisruptionBudget/gpucoord-agents",
		"NetworkPolicy/gpucoord-coordinator",
	}
	var got []string
	for k := range objs {
		got = append(got, k)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("objects %v, want %v", got, want)
	}
	k, err := ReadKustomization()
	if err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(Image, ":")
	if k.Namespace != "gpucoord" || len(k.Images) != 1 || k.Images[0].Name != repo || k.Images[0].NewTag != tag {
		t.Errorf("kustomization: namespace %q, images %+v; want gpucoord and %s with tag %s", k.Namespace, k.Images, repo, tag)
	}
}

// TestDecodeIsStrict: what the API server would refuse (or, worse,
// silently drop) fails Decode: an unknown field, a repeated field, a value
// of the wrong type, an unknown kind.
func TestDecodeIsStrict(t *testing.T) {
	const head = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: s\nspec:\n"
	tests := []struct {
		name, doc, want string
	}{
		{"valid", head + "  replicas: 3\n", ""},
		{"unknown field", head + "  replica: 3\n", `unknown field "spec.replica"`},
		{"unknown nested field", head + "  template:\n    spec:\n      containers:\n        - name: c\n          imagePullPolicy: IfNotPresent\n          args: [a]\n          arg: [b]\n", `unknown field "spec.template.spec.containers[0].arg"`},
		{"repeated field", head + "  replicas: 3\n  replicas: 4\n", "already set"},
		{"wrong type", head + "  replicas: three\n", "cannot unmarshal string"},
		{"field of another case", head + "  Replicas: 3\n", `unknown field "spec.Replicas"`},
		{"unknown kind", "apiVersion: apps/v1\nkind: StatefullSet\nmetadata:\n  name: s\n", "not a kind these manifests use"},
		{"comments only", "# nothing\n---\n" + head + "  replicas: 1\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode("test.yaml", []byte(tc.doc))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Decode: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Decode: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// arg returns the value of --name=VALUE in args, failing when absent.
func arg(t *testing.T, args []string, name string) string {
	t.Helper()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	t.Fatalf("no --%s= in %q", name, args)
	return ""
}

// port returns the port of HOST:PORT.
func port(t *testing.T, hostPort string) int32 {
	t.Helper()
	i := strings.LastIndexByte(hostPort, ':')
	p, err := strconv.Atoi(hostPort[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("%q is not HOST:PORT", hostPort)
	}
	return int32(p)
}

// TestManifestsAgree: what the objects say of each other holds: the
// image and command are the image's; the StatefulSet's members are the
// static etcd cluster its arguments name, under the headless Service's
// names, and the agents dial those; probes ask the health port the
// coordinator serves, for the services it answers; budgets and the
// network policy select the pods they are for; the agents ask for as
// many GPUs as they offer ranks and have the time to stop that --grace
// gives them.
func TestManifestsAgree(t *testing.T) {
	objs := manifests(t)
	svc := get[*corev1.Service](t, objs, "Service/gpucoord-coordinator")
	sts := get[*appsv1.StatefulSet](t, objs, "StatefulSet/gpucoord-coordinator")
	job := get[*batchv1.Job](t, objs, "Job/gpucoord-agents")

	for _, pod := range []corev1.PodSpec{sts.Spec.Template.Spec, job.Spec.Template.Spec} {
		for _, c := range pod.Containers {
			if c.Image != Image || !slices.Equal(c.Command, []string{Entrypoint}) {
				t.Errorf("container %s runs %q from %s, want [%s] from %s", c.Name, c.Command, c.Image, Entrypoint, Image)
			}
		}
	}

	// The coordinators.
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || sts.Spec.ServiceName != svc.Name {
		t.Errorf("the StatefulSet's Service %q must be headless and publish members before they are ready (etcd's must find each other)", sts.Spec.ServiceName)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("the Service does not select the coordinators")
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: the members must start together (OrderedReady waits for a member that waits for its quorum)", sts.Spec.PodManagementPolicy)
	}
	replicas := int(*sts.Spec.Replicas)
	if replicas != 3 {
		t.Errorf("%d coordinators, want 3", replicas)
	}
	co := sts.Spec.Template.Spec.Containers[0]
	var members, dial []string
	for i := range replicas {
		host := fmt.Sprintf("%s-%d.%s", sts.Name, i, svc.Name)
		members = append(members, fmt.Sprintf("%s-%d=https://%s:2380", sts.Name, i, host))
		dial = append(dial, host+":7070")
	}
	if got := arg(t, co.Args, "etcd-initial-cluster"); got != strings.Join(members, ",") {
		t.Errorf("--etcd-initial-cluster=%s, want the StatefulSet's pods %s", got, strings.Join(members, ","))
	}
	if got := arg(t, co.Args, "name"); got != "$(POD_NAME)" {
		t.Errorf("--name=%s: the member's name must be its pod's", got)
	}
	health := port(t, arg(t, co.Args, "health-listen"))
	probes := map[string]*corev1.Probe{"startup": co.StartupProbe, "liveness": co.LivenessProbe, "readiness": co.ReadinessProbe}
	for name, p := range probes {
		if p == nil || p.GRPC == nil || p.GRPC.Port != health {
			t.Errorf("%s probe %+v: want gRPC on the health port %d", name, p, health)
			continue
		}
		want := ""
		if name == "readiness" {
			want = coordinator.ServingService
		}
		if got := ptrString(p.GRPC.Service); got != want {
			t.Errorf("%s probe asks for service %q, want %q", name, got, want)
		}
	}
	mounts := map[string]string{}
	for _, m := range co.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if ca := mounts["ca"]; arg(t, co.Args, "tls-ca") != ca+"/ca.pem" || arg(t, co.Args, "tls-ca-key") != ca+"/ca.key" {
		t.Errorf("--tls-ca and --tls-ca-key are not in the CA Secret's volume at %s", ca)
	}
	if !strings.HasPrefix(arg(t, co.Args, "data-dir"), mounts["data"]+"/") || len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
		t.Errorf("--data-dir is not on the member's own volume")
	}

	// The agents.
	ag := job.Spec.Template.Spec.Containers[0]
	if got := arg(t, ag.Args, "coordinator"); got != strings.Join(dial, ",") {
		t.Errorf("agents dial %s, want every coordinator: %s", got, strings.Join(dial, ","))
	}
	if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion || *job.Spec.Completions != *job.Spec.Parallelism {
		t.Errorf("the agents' Job must be indexed, all its pods at once")
	}
	gpus := ag.Resources.Limits["nvidia.com/gpu"]
	if strconv.FormatInt(gpus.Value(), 10) != arg(t, ag.Args, "gpus-per-node") {
		t.Errorf("agents ask for %s nvidia.com/gpu and offer --gpus-per-node=%s", gpus.String(), arg(t, ag.Args, "gpus-per-node"))
	}
	env := map[string]string{}
	for _, e := range ag.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.ValueFrom.FieldRef.FieldPath] = e.Name
		}
	}
	for _, f := range []string{"spec.nodeName", "status.podIP", "metadata.labels['topology.kubernetes.io/zone']"} {
		if env[f] == "" {
			t.Errorf("no variable of the agent's comes from %s (downward API)", f)
		}
	}
	grace := arg(t, ag.Args, "grace")
	if g, err := strconv.Atoi(strings.TrimSuffix(grace, "s")); err != nil || int64(2*g) >= *job.Spec.Template.Spec.TerminationGracePeriodSeconds {
		t.Errorf("terminationGracePeriodSeconds %d does not leave an agent its --grace=%s twice (checkpoint, then stop)", *job.Spec.Template.Spec.TerminationGracePeriodSeconds, grace)
	}

	// Budgets and policy select their pods.
	for _, c := range []struct {
		pdb  string
		pods map[string]string
	}{{"gpucoord-coordinator", sts.Spec.Template.Labels}, {"gpucoord-agents", job.Spec.Template.Labels}} {
		pdb := get[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget/"+c.pdb)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(c.pods)) {
			t.Errorf("PodDisruptionBudget %s: want maxUnavailable 1 over its pods", c.pdb)
		}
	}
	np := get[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy/gpucoord-coordinator")
	if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("the NetworkPolicy does not select the coordinators")
	}
	agentIn := false
	for _, r := range np.Spec.Ingress {
		for _, p := range r.From {
			if p.PodSelector != nil && labels.SelectorFromSet(p.PodSelector.MatchLabels).Matches(labels.Set(job.Spec.Template.Labels)) {
				agentIn = slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntValue() == 7070 })
			}
		}
	}
	if !agentIn {
		t.Errorf("the NetworkPolicy does not let the agents reach the coordinators' gRPC port")
	}
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
