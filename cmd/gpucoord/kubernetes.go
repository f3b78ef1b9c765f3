package main

import (
	"os"

	"github.com/spf13/cobra"
)

// The worker reads where it runs from its environment when no flag says
// it: Kubernetes' downward API sets these variables in an agent's pod
// (deploy/kubernetes, docs/KUBERNETES.md), and any other launcher may.
const (
	// envNodeName is the node's name (--name): the pod's spec.nodeName.
	envNodeName = "GPUCOORD_NODE_NAME"
	// envAdvertiseAddr is the address other nodes reach this one at
	// (--advertise-addr): the pod's status.podIP.
	envAdvertiseAddr = "GPUCOORD_ADVERTISE_ADDR"
	// envFailureDomain is what fails with the node (--failure-domain): the
	// pod's topology.kubernetes.io/zone label, which Kubernetes copies from
	// its node (PodTopologyLabelsAdmission), or a rack label.
	envFailureDomain = "GPUCOORD_FAILURE_DOMAIN"
)

// flagFromEnv sets *v from the environment variable env when it is set
// and not empty and none of the flags named was given.
func flagFromEnv(c *cobra.Command, v *string, env string, flags ...string) {
	for _, f := range flags {
		if c.Flags().Changed(f) {
			return
		}
	}
	if s := os.Getenv(env); s != "" {
		*v = s
	}
}
