package topology

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
)

// GiB is 2^30 bytes.
const GiB = 1 << 30

// Cluster describes the hardware a plan is laid out on. Bandwidths are per
// GPU and per direction, in GB/s (1e9 bytes per second).
type Cluster struct {
	// Name labels the cluster in output.
	Name string `yaml:"name" json:"name"`
	// Nodes is the number of hosts.
	Nodes int `yaml:"nodes" json:"nodes"`
	// GPUsPerNode is the number of GPUs on each host.
	GPUsPerNode int `yaml:"gpus_per_node" json:"gpus_per_node"`
	// NVLinkDomain is the number of GPUs in one NVLink domain (all-to-all at
	// NVLink bandwidth). Zero means one node; it may span nodes (GB200 NVL72
	// has 72 GPUs on 18 nodes in one domain).
	NVLinkDomain int `yaml:"nvlink_domain" json:"nvlink_domain"`
	// GPUMemoryGiB is the memory of one GPU in GiB that a program can use:
	// what the CUDA runtime reports as the device's total (PyTorch's
	// torch.cuda.get_device_properties(0).total_memory), a little less than
	// the marketed size.
	GPUMemoryGiB float64 `yaml:"gpu_memory_gib" json:"gpu_memory_gib"`
	// PeakTFLOPS is one GPU's dense bf16/fp16 tensor-core peak in TFLOP/s.
	PeakTFLOPS float64 `yaml:"peak_tflops" json:"peak_tflops"`
	// PeakFP8TFLOPS is one GPU's dense fp8 tensor-core peak in TFLOP/s;
	// zero where the GPU has no fp8 tensor cores.
	PeakFP8TFLOPS float64 `yaml:"peak_fp8_tflops" json:"peak_fp8_tflops,omitempty"`
	// NVLinkGBps is one GPU's NVLink bandwidth per direction in GB/s.
	NVLinkGBps float64 `yaml:"nvlink_gbps" json:"nvlink_gbps"`
	// InterNodeGBps is one GPU's network bandwidth per direction in GB/s
	// (its share of the node's NICs).
	InterNodeGBps float64 `yaml:"inter_node_gbps" json:"inter_node_gbps"`
	// HostMemoryGiB is one node's CPU memory in GiB, used for optimizer offload.
	HostMemoryGiB float64 `yaml:"host_memory_gib" json:"host_memory_gib"`
	// MemoryGBps is one GPU's memory bandwidth in GB/s (the optimizer
	// update is bound by it); zero leaves the optimizer out of the step.
	MemoryGBps float64 `yaml:"memory_gbps" json:"memory_gbps,omitempty"`
}

// World returns the number of GPUs.
func (c Cluster) World() int { return c.Nodes * c.GPUsPerNode }

// Domain returns the NVLink domain size in GPUs, resolving the default.
func (c Cluster) Domain() int {
	if c.NVLinkDomain == 0 {
		return c.GPUsPerNode
	}
	return c.NVLinkDomain
}

// CapacityBytes returns one GPU's memory in bytes.
func (c Cluster) CapacityBytes() float64 { return c.GPUMemoryGiB * GiB }

// Validate names the first field that cannot work.
func (c Cluster) Validate() error {
	switch {
	case c.Nodes < 1:
		return invalid("cluster nodes %d: must be at least 1", c.Nodes)
	case c.GPUsPerNode < 1:
		return invalid("cluster gpus_per_node %d: must be at least 1", c.GPUsPerNode)
	case c.NVLinkDomain < 0:
		return invalid("cluster nvlink_domain %d: must be positive (or 0 for one node)", c.NVLinkDomain)
	case c.GPUMemoryGiB <= 0:
		return invalid("cluster gpu_memory_gib %g: must be positive", c.GPUMemoryGiB)
	case c.PeakTFLOPS <= 0:
		return invalid("cluster peak_tflops %g: must be positive", c.PeakTFLOPS)
	case !(c.PeakFP8TFLOPS >= 0) || math.IsInf(c.PeakFP8TFLOPS, 0):
		return invalid("cluster peak_fp8_tflops %g: must be a rate in TFLOP/s, or 0 for a GPU without fp8", c.PeakFP8TFLOPS)
	case c.NVLinkGBps <= 0:
		return invalid("cluster nvlink_gbps %g: must be positive", c.NVLinkGBps)
	case c.InterNodeGBps <= 0 && c.Nodes > 1:
		return invalid("cluster inter_node_gbps %g: must be positive for a multi-node cluster", c.InterNodeGBps)
	case c.HostMemoryGiB < 0:
		return invalid("cluster host_memory_gib %g: must not be negative", c.HostMemoryGiB)
	case !(c.MemoryGBps >= 0) || math.IsInf(c.MemoryGBps, 0):
		return invalid("cluster memory_gbps %g: must be a bandwidth in GB/s, or 0 to leave the optimizer out of the step", c.MemoryGBps)
	}
	d := c.Domain()
	if d%c.GPUsPerNode != 0 && c.GPUsPerNode%d != 0 {
		return invalid("cluster nvlink_domain %d: must divide or be a multiple of gpus_per_node %d", d, c.GPUsPerNode)
	}
	if d > c.World() && d%c.World() != 0 {
		return invalid("cluster nvlink_domain %d: larger than the %s of the cluster", d, plural(c.World(), "GPU", "GPUs"))
	}
	return nil
}

// clusterPresets are the built-in clusters. Figures are vendor datasheet
// values (dense bf16 and fp8, per-GPU NVLink and NIC bandwidth per
// direction) except the memory, which is what a program can use (see
// GPUMemoryGiB); see docs/PLANNING.md for the sources.
var clusterPresets = map[string]Cluster{
	// DGX A100 80GB: 8x A100-SXM4-80GB, NVLink 3 (600 GB/s bidirectional),
	// 8x 200 Gb/s HDR InfiniBand, 312 TFLOP/s dense bf16 (no fp8),
	// 2,039 GB/s HBM2e; PyTorch reports 79.15 GiB per GPU.
	"dgx-a100": {Name: "dgx-a100", Nodes: 1, GPUsPerNode: 8, GPUMemoryGiB: 79.15, PeakTFLOPS: 312, NVLinkGBps: 300, InterNodeGBps: 25, HostMemoryGiB: 2048, MemoryGBps: 2039},
	// DGX H100: 8x H100-SXM5-80GB, NVLink 4 (900 GB/s bidirectional),
	// 8x 400 Gb/s NDR InfiniBand, 989 TFLOP/s dense bf16 and 1,979 fp8,
	// 3.35 TB/s HBM3; PyTorch reports 79.18 GiB per GPU (measured).
	"dgx-h100": {Name: "dgx-h100", Nodes: 1, GPUsPerNode: 8, GPUMemoryGiB: 79.18, PeakTFLOPS: 989, PeakFP8TFLOPS: 1979, NVLinkGBps: 450, InterNodeGBps: 50, HostMemoryGiB: 2048, MemoryGBps: 3350},
	// DGX H200: as DGX H100 with 141 GB HBM3e per GPU at 4.8 TB/s; 139.9
	// GiB usable is derived (nvidia-smi's 143,771 MiB less the 0.47 GiB an
	// H100 loses the same way), not measured.
	"dgx-h200": {Name: "dgx-h200", Nodes: 1, GPUsPerNode: 8, GPUMemoryGiB: 139.9, PeakTFLOPS: 989, PeakFP8TFLOPS: 1979, NVLinkGBps: 450, InterNodeGBps: 50, HostMemoryGiB: 2048, MemoryGBps: 4800},
	// GB200 NVL72: one rack of 18 compute trays with 4 B200 GPUs each, all 72
	// in one NVLink 5 domain (1.8 TB/s bidirectional per GPU), 186 GB HBM3e
	// per GPU at 8 TB/s (184.5 GiB usable, derived as for the H200, not
	// measured), 2.5 PFLOP/s dense bf16 and 5 fp8, one 400 Gb/s NIC per GPU.
	"gb200-nvl72": {Name: "gb200-nvl72", Nodes: 18, GPUsPerNode: 4, NVLinkDomain: 72, GPUMemoryGiB: 184.5, PeakTFLOPS: 2500, PeakFP8TFLOPS: 5000, NVLinkGBps: 900, InterNodeGBps: 50, HostMemoryGiB: 960, MemoryGBps: 8000},
}

// ClusterPresets returns the names of the built-in clusters, sorted.
func ClusterPresets() []string { return sortedKeys(clusterPresets) }

// ClusterPreset returns a built-in cluster by name.
func ClusterPreset(name string) (Cluster, error) {
	c, ok := clusterPresets[name]
	if !ok {
		return Cluster{}, fmt.Errorf("cluster %q: %w (known: %s)", name, ErrUnknownPreset, strings.Join(ClusterPresets(), ", "))
	}
	return c, nil
}

// ParseCluster decodes a YAML cluster spec. A spec may name a preset with
// `preset:` and override its fields. Unknown fields are an error.
func ParseCluster(data []byte) (Cluster, error) {
	c, err := parseWithPreset(data, "cluster", ClusterPreset)
	if err != nil {
		return Cluster{}, err
	}
	if err := c.Validate(); err != nil {
		return Cluster{}, err
	}
	return c, nil
}

// LoadCluster resolves a --cluster argument: a preset name, or a YAML file.
func LoadCluster(nameOrPath string) (Cluster, error) {
	if c, ok := clusterPresets[nameOrPath]; ok {
		return c, nil
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		if os.IsNotExist(err) && !strings.ContainsAny(nameOrPath, "/.") {
			return ClusterPreset(nameOrPath)
		}
		return Cluster{}, invalid("cluster %q: %v", nameOrPath, err)
	}
	c, err := ParseCluster(data)
	if err != nil {
		return Cluster{}, fmt.Errorf("%s: %w", nameOrPath, err)
	}
	return c, nil
}

// withPreset is a spec document: an optional preset name whose fields the
// rest of the document overrides.
type withPreset[T any] struct {
	Preset string `yaml:"preset"`
	Spec   T      `yaml:",inline"`
}

// parseWithPreset decodes a spec of kind what, starting from the named
// preset when the document has one.
func parseWithPreset[T any](data []byte, what string, preset func(string) (T, error)) (T, error) {
	var doc withPreset[T]
	if err := decodeStrict(data, &doc); err != nil {
		return doc.Spec, invalid("%s spec: %v", what, err)
	}
	if doc.Preset == "" {
		return doc.Spec, nil
	}
	base, err := preset(doc.Preset)
	if err != nil {
		return base, err
	}
	// Decode again over the preset: only fields present override it.
	over := withPreset[T]{Spec: base}
	if err := decodeStrict(data, &over); err != nil {
		return base, invalid("%s spec: %v", what, err)
	}
	return over.Spec, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
