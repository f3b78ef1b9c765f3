// Package kubernetes holds gpucoord's Kubernetes manifests (the
// kustomization in this directory: coordinators as a StatefulSet with
// embedded etcd, agents as an indexed Job, their Services, budgets and
// network policy) and reads them as the API server would, strictly: every
// object decodes into its k8s.io/api type, and a field the type does not
// have is an error.
//
// No API server runs in the tests. What they check instead: every object
// decodes strictly; the image the manifests name is the one make image
// builds, and its entrypoint the one the containers call; the arguments
// and environment of the coordinator's and the agent's containers parse
// with gpucoord's own commands and, run on a cluster in a box (one host
// per pod, internal/testcluster), run a job (cmd/gpucoord's
// TestKubernetesEntrypoints); and the image runs a job under podman
// (TestImageRunsJob). docs/KUBERNETES.md says what was and was not run.
package kubernetes
