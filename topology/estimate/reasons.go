package estimate

import (
	"fmt"
	"strings"

	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// gib formats bytes as GiB with one decimal.
func gib(b float64) string { return fmt.Sprintf("%.1f GiB", b/topology.GiB) }

// reasons explains, in plain language, each way the plan does not fit, and
// what would help. An empty list means it fits.
func reasons(p *topology.Plan, r Report) []string {
	out := []string{} // JSON [] rather than null when it fits
	for st, m := range r.Memory.Stages {
		if m.Total <= r.Memory.UsableBytes {
			continue
		}
		part, bytes := largestPart(m)
		of := gib(r.Memory.CapacityBytes)
		if r.Memory.UsableBytes < r.Memory.CapacityBytes {
			of = fmt.Sprintf("%s usable (%s less %s headroom)", gib(r.Memory.UsableBytes), gib(r.Memory.CapacityBytes), gib(r.Memory.CapacityBytes-r.Memory.UsableBytes))
		}
		msg := fmt.Sprintf("does not fit: stage %d needs %s of %s (%s %s", st, gib(m.Total), of, part, gib(bytes))
		if tips := remedies(p, part); len(tips) > 0 {
			msg += "; try " + strings.Join(tips, " or ")
		}
		out = append(out, msg+")")
		if len(out) == 3 && st < len(r.Memory.Stages)-1 {
			if n := countOver(r.Memory.Stages[st+1:], r.Memory.UsableBytes); n == 1 {
				out = append(out, "and 1 more stage does not fit")
			} else {
				out = append(out, fmt.Sprintf("and %d more stages do not fit", n))
			}
			break
		}
	}
	if host := p.Cluster.HostMemoryGiB * topology.GiB; r.Memory.HostOptimizerBytes > 0 && host > 0 && r.Memory.HostOptimizerBytes > host {
		var tips []string
		if !zeroStage(p).ShardsOptimizer() && p.Config.DP > 1 {
			tips = append(tips, fmt.Sprintf("--zero %d", sharding.Stage1))
		}
		if more := morePipelineOrTensor(p); more != "" {
			tips = append(tips, more)
		}
		tip := strings.Join(tips, " or ")
		if tip == "" {
			tip = "more nodes"
		}
		out = append(out, fmt.Sprintf("does not fit: offloaded optimizer state needs %s of host memory per node, the node has %s (try %s)",
			gib(r.Memory.HostOptimizerBytes), gib(host), tip))
	}
	return out
}

func countOver(ms []Memory, capacity float64) int {
	n := 0
	for _, m := range ms {
		if m.Total > capacity {
			n++
		}
	}
	return n
}

// largestPart names the biggest part of m.
func largestPart(m Memory) (string, float64) {
	name, v := "activations", m.Activations
	for _, c := range []struct {
		name string
		v    float64
	}{{"optimizer", m.Optimizer}, {"params", m.Params}, {"grads", m.Grads}, {"transient", m.Transient}} {
		if c.v > v {
			name, v = c.name, c.v
		}
	}
	return name, v
}

// remedies suggests flags that shrink part, skipping what is already set.
func remedies(p *topology.Plan, part string) []string {
	c, stage := p.Config, zeroStage(p)
	var tips []string
	switch part {
	case "activations":
		if c.Recompute != topology.RecomputeFull {
			tips = append(tips, "--recompute full")
		}
		if c.MicroBatch > 1 {
			tips = append(tips, "--micro-batch 1")
		}
		if c.TP > 1 && !c.SequenceParallel {
			tips = append(tips, "--sequence-parallel")
		}
		if !c.FlashAttention {
			tips = append(tips, "--flash-attention")
		}
	case "transient":
		if c.MicroBatch > 1 {
			tips = append(tips, "--micro-batch 1")
		}
		if c.Loss != topology.LossFused {
			tips = append(tips, "--loss fused")
		}
	case "optimizer":
		if !stage.ShardsOptimizer() && c.DP > 1 {
			tips = append(tips, fmt.Sprintf("--zero %d", sharding.Stage1))
		}
		if !c.OffloadOptimizer {
			tips = append(tips, "--offload-optimizer")
		}
	case "grads":
		if !stage.ShardsGradients() && c.DP > 1 {
			tips = append(tips, fmt.Sprintf("--zero %d", sharding.Stage2))
		}
	case "params":
		if !stage.ShardsParams() && c.DP > 1 {
			tips = append(tips, fmt.Sprintf("--zero %d", sharding.Stage3))
		}
	}
	if more := morePipelineOrTensor(p); more != "" {
		tips = append(tips, more)
	}
	if len(tips) > 3 {
		tips = tips[:3]
	}
	return tips
}

// morePipelineOrTensor suggests growing tp or pp only where the layout can:
// tp up to the NVLink domain and the heads, pp up to the layers; "" when
// neither can grow.
func morePipelineOrTensor(p *topology.Plan) string {
	c, m := p.Config, p.Model
	var more []string
	if c.TP*2 <= p.Cluster.Domain() && (m.Bare() || m.Heads%(c.TP*2) == 0) {
		more = append(more, "--tp")
	}
	if m.Bare() || m.Layers%(c.PP*2*c.VPP) == 0 {
		more = append(more, "--pp")
	}
	if len(more) == 0 {
		return ""
	}
	return "more " + strings.Join(more, " or ")
}
