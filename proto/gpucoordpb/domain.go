package gpucoordpb

import "cmp"

// FailureDomain is what fails with n: its failure_domain, else its NVLink
// domain; "" when it names neither. For its checkpoints' replicas "" is
// the node alone; for failure detection it names one more pool, that of
// every node that names no domain.
func FailureDomain(n *Node) string { return cmp.Or(n.GetFailureDomain(), n.GetNvlinkDomain()) }
