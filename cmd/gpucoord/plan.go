package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/topology/estimate"
)

func init() { subcommands = append(subcommands, newPlanCmd) }

// planFlags holds the raw flags of `gpucoord plan`.
type planFlags struct {
	cluster, model, order, schedule, recompute, precision, svg string
	nodes, gpusPerNode                                         int
	layers, hidden, heads, ffn, vocab, seq, kvHeads            int
	gated, untied                                              bool
	positions                                                  string
	params                                                     float64
	cfg                                                        topology.Config
	auto, json                                                 bool
	failures                                                   int
	top                                                        int
	headroom, optimizer, loss                                  string
}

func newPlanCmd() *cobra.Command {
	f := &planFlags{cfg: topology.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "plan [flags]",
		Short: "Dry-run a parallel layout: rank map, groups, memory, bubble, traffic, step time",
		Long: `plan lays a model out on a cluster with tensor (tp), pipeline (pp) and data (dp)
parallelism and ZeRO sharding, without touching a GPU. It prints the rank map and
every process group (Megatron-LM's tp-cp-dp-pp order by default), per-GPU memory by
part and stage, the pipeline bubble, traffic per group, FLOPs and an estimated step
time, and whether it fits; --auto searches every valid layout and ranks those that fit.

Clusters: a preset (` + strings.Join(topology.ClusterPresets(), ", ") + `) or a YAML file.
Models:   a preset (` + strings.Join(topology.ModelPresets(), ", ") + `),
          a YAML file, an architecture (--layers --hidden --heads --vocab --seq, with
          --kv-heads and --gated-mlp for Llama-style models), or --params N.
          Megatron-LM's names work too: --num-layers, --hidden-size,
          --num-attention-heads, --ffn-hidden-size, --seq-length, --num-query-groups,
          --swiglu, --untie-embeddings-and-output-weights, --position-embedding-type,
          --tensor-model-parallel-size, --pipeline-model-parallel-size,
          --micro-batch-size, --global-batch-size.
Formulas and sources: docs/PLANNING.md.

Exit status: 0 the plan fits, 3 it does not fit (printed in full with the reasons),
2 invalid input (the message names the value and the rule).`,
		Example: `  gpucoord plan --cluster examples/clusters/dgx-h100-32.yaml --model gpt-13b --tp 8 --pp 4 --zero 1
  gpucoord plan --cluster dgx-a100 --nodes 16 --model gpt-39b --tp 8 --pp 2 --recompute full --json
  gpucoord plan --params 7.5e9 --nodes 8 --zero 3
  gpucoord plan --cluster gb200-nvl72 --model llama-70b --auto
  gpucoord plan --cluster examples/clusters/dgx-h100-32.yaml --model gpt-13b --global-batch 16 --failures 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runPlan(cmd, f) },
	}
	fl := cmd.Flags()
	// Megatron-LM's names are aliases of ours.
	fl.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if ours := megatronNames[name]; ours != "" {
			return pflag.NormalizedName(ours)
		}
		return pflag.NormalizedName(name)
	})
	fl.StringVar(&f.cluster, "cluster", "dgx-h100", "cluster preset or YAML file")
	fl.IntVar(&f.nodes, "nodes", 0, "override the cluster's node count")
	fl.IntVar(&f.gpusPerNode, "gpus-per-node", 0, "override the cluster's GPUs per node")
	fl.StringVar(&f.model, "model", "", "model preset or YAML file")
	fl.Float64Var(&f.params, "params", 0, "bare parameter count (model states only), e.g. 7.5e9")
	fl.IntVar(&f.layers, "layers", 0, "transformer layers (overrides the model)")
	fl.IntVar(&f.hidden, "hidden", 0, "hidden size (overrides the model)")
	fl.IntVar(&f.heads, "heads", 0, "attention heads (overrides the model)")
	fl.IntVar(&f.ffn, "ffn", 0, "MLP inner size, default 4*hidden (overrides the model)")
	fl.IntVar(&f.vocab, "vocab", 0, "vocabulary size (overrides the model)")
	fl.IntVar(&f.seq, "seq", 0, "sequence length (overrides the model)")
	fl.IntVar(&f.cfg.TP, "tp", 1, "tensor-parallel degree (inside an NVLink domain)")
	fl.IntVar(&f.cfg.PP, "pp", 1, "pipeline-parallel degree")
	fl.IntVar(&f.cfg.DP, "dp", 0, "data-parallel degree (default: world / (tp*pp))")
	fl.IntVar(&f.cfg.VPP, "vpp", 0, "virtual pipeline stages per rank, above 1 only with --schedule interleaved (default 2 with interleaved, else 1)")
	fl.IntVar(&f.cfg.Zero, "zero", 0, "ZeRO stage 0-3")
	fl.IntVar(&f.cfg.MicroBatch, "micro-batch", 1, "micro-batch size in sequences")
	fl.IntVar(&f.cfg.GlobalBatch, "global-batch", 0, "global batch in sequences (default: a --micro-batch per GPU, world size x --micro-batch, with --auto too)")
	fl.StringVar(&f.schedule, "schedule", string(schedule.OneFOneB), "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1")
	fl.StringVar(&f.recompute, "recompute", string(topology.RecomputeNone), "activation recomputation: none, selective, full")
	fl.BoolVar(&f.cfg.SequenceParallel, "sequence-parallel", false, "split layer-norm and dropout activations across the TP group")
	fl.BoolVar(&f.cfg.FlashAttention, "flash-attention", true, "flash attention (--flash-attention=false materialises attention scores)")
	fl.BoolVar(&f.cfg.OffloadOptimizer, "offload-optimizer", false, "keep optimizer state in host memory")
	fl.BoolVar(&f.cfg.MainGradsFP32, "fp32-grads", false, "keep and reduce gradients in fp32 in mixed precision, as Megatron-LM does (4 bytes a parameter instead of 2)")
	fl.StringVar(&f.precision, "precision", string(topology.PrecisionBF16), "bf16 or fp16 (mixed, with fp32 Adam), fp32, or fp8 (Transformer Engine: fp8 layer matrix multiplies, bf16 elsewhere; needs a GPU with peak_fp8_tflops)")
	fl.StringVar(&f.order, "order", topology.DefaultOrder, "rank order, fastest axis first, or pipe-data-model (DeepSpeed)")
	fl.StringVar(&f.optimizer, "optimizer", string(topology.OptimizerFused), "Adam implementation the step time assumes: fused (Megatron-LM, DeepSpeed) or multi-tensor (PyTorch's default)")
	fl.StringVar(&f.loss, "loss", string(topology.LossUnfused), "cross-entropy implementation, for its memory peak: unfused (PyTorch's cross_entropy over fp32 logits, 12 bytes a logit) or fused (Megatron-LM's, 6)")
	fl.StringVar(&f.headroom, "headroom", "", "GPU memory a plan must leave free to fit: GiB (8, 8GiB) or a share of the GPU (10%)")
	fl.IntVar(&f.kvHeads, "kv-heads", 0, "key/value heads for grouped-query attention (overrides the model)")
	fl.BoolVar(&f.gated, "gated-mlp", false, "gated MLP, SwiGLU's three matrices (overrides the model)")
	fl.BoolVar(&f.untied, "untied-embeddings", false, "the output layer has its own vocab x hidden matrix (overrides the model)")
	fl.StringVar(&f.positions, "position-embedding", "", "learned (GPT) or rope (no parameters; default for --kv-heads/--gated-mlp models) (overrides the model)")
	fl.BoolVar(&f.auto, "auto", false, "search every valid layout and rank the ones that fit")
	fl.IntVar(&f.failures, "failures", 0, "for 0 to K lost nodes, the layout a re-plan would choose on the nodes left (searched as --auto, the same global batch), its memory and step time, or that the job would pause")
	fl.IntVar(&f.top, "top", 5, "with --auto, how many plans to print")
	fl.BoolVar(&f.json, "json", false, "print JSON for scripts")
	fl.StringVar(&f.svg, "svg", "", "write a picture of the rank grid and the pipeline timeline to FILE")
	return cmd
}

// resolve turns the flags into a cluster, a model and a config.
func (f *planFlags) resolve(cmd *cobra.Command) (topology.Cluster, topology.Model, topology.Config, error) {
	var m topology.Model
	var cl topology.Cluster
	cfg := f.cfg
	changed := cmd.Flags().Changed
	if changed("order") && strings.TrimSpace(f.order) == "" {
		// The library reads "" as the default; a flag given empty is a mistake.
		return cl, m, cfg, usageError(fmt.Errorf("--order %q: give an order, fastest axis first, such as %s or pipe-data-model", f.order, topology.DefaultOrder))
	}
	cl, err := topology.LoadCluster(f.cluster)
	if err != nil {
		return cl, m, cfg, err
	}
	if changed("nodes") {
		cl.Nodes = f.nodes
	}
	if changed("gpus-per-node") {
		cl.GPUsPerNode = f.gpusPerNode
	}
	arch := changed("layers") || changed("hidden") || changed("heads") || changed("ffn") || changed("vocab") || changed("seq") ||
		changed("kv-heads") || changed("gated-mlp") || changed("untied-embeddings") || changed("position-embedding")
	switch {
	case f.model != "":
		if m, err = topology.LoadModel(f.model); err != nil {
			return cl, m, cfg, err
		}
	case arch:
		m = topology.Model{Name: "custom", LearnedPositions: true}
	case changed("params"):
		if err := topology.CheckParams(f.params); err != nil {
			return cl, m, cfg, usageError(err)
		}
		m = topology.Model{Name: fmt.Sprintf("%.3g params", f.params)}
	default:
		return cl, m, cfg, usageError(errors.New("no model: give --model PRESET|FILE, an architecture (--layers --hidden --heads --vocab --seq) or --params N"))
	}
	for _, o := range []struct {
		flag string
		dst  *int
		val  int
	}{{"layers", &m.Layers, f.layers}, {"hidden", &m.Hidden, f.hidden}, {"heads", &m.Heads, f.heads},
		{"ffn", &m.FFN, f.ffn}, {"vocab", &m.Vocab, f.vocab}, {"seq", &m.Seq, f.seq}, {"kv-heads", &m.KVHeads, f.kvHeads}} {
		if changed(o.flag) {
			*o.dst = o.val
		}
	}
	if changed("gated-mlp") {
		m.GatedMLP = f.gated
	}
	if changed("untied-embeddings") {
		m.UntiedEmbeddings = f.untied
	}
	switch f.positions {
	case "":
	case "learned":
		m.LearnedPositions = true
	case "rope":
		m.LearnedPositions = false
	default:
		return cl, m, cfg, usageError(fmt.Errorf("--position-embedding %q: want learned or rope", f.positions))
	}
	if f.headroom != "" {
		h, err := parseHeadroom(f.headroom, cl.GPUMemoryGiB)
		if err != nil {
			return cl, m, cfg, usageError(err)
		}
		cfg.HeadroomGiB = h
	}
	if changed("params") {
		if m.Layers != 0 {
			return cl, m, cfg, usageError(fmt.Errorf("--params %g: give either a parameter count or an architecture, not both", f.params))
		}
		m.Params = f.params
	}
	cfg.Schedule = schedule.Kind(f.schedule)
	cfg.Recompute = topology.Recompute(f.recompute)
	cfg.Precision = topology.Precision(f.precision)
	cfg.Order = f.order
	cfg.Optimizer = topology.Optimizer(f.optimizer)
	cfg.Loss = topology.Loss(f.loss)
	return cl, m, cfg, nil
}

// parseHeadroom reads --headroom: GiB ("8", "8GiB", "8G") or a share of a
// GPU of gpuGiB ("10%").
func parseHeadroom(s string, gpuGiB float64) (float64, error) {
	v := strings.TrimSpace(s)
	pct := strings.HasSuffix(v, "%")
	v = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(v, "%"), "GiB"), "G"), " ")
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || !(x >= 0) || math.IsInf(x, 0) || (pct && x >= 100) {
		return 0, fmt.Errorf("--headroom %q: want GiB (8, 8GiB) or a share of the GPU below 100%% (10%%)", s)
	}
	if pct {
		return x / 100 * gpuGiB, nil
	}
	return x, nil
}

// megatronNames maps Megatron-LM's argument names onto plan's flags, so a
// Megatron command line's sizes can be pasted as they are.
var megatronNames = map[string]string{
	"num-layers":                          "layers",
	"hidden-size":                         "hidden",
	"num-attention-heads":                 "heads",
	"ffn-hidden-size":                     "ffn",
	"seq-length":                          "seq",
	"num-query-groups":                    "kv-heads",
	"swiglu":                              "gated-mlp",
	"untie-embeddings-and-output-weights": "untied-embeddings",
	"position-embedding-type":             "position-embedding",
	"tensor-model-parallel-size":          "tp",
	"pipeline-model-parallel-size":        "pp",
	"micro-batch-size":                    "micro-batch",
	"global-batch-size":                   "global-batch",
}

// isInput reports whether err is the user's input being wrong.
func isInput(err error) bool {
	return errors.Is(err, topology.ErrInvalid) || errors.Is(err, topology.ErrUnknownPreset)
}

func runPlan(cmd *cobra.Command, f *planFlags) error {
	out := cmd.OutOrStdout()
	cl, m, cfg, err := f.resolve(cmd)
	if err != nil {
		return classify(err)
	}
	if f.failures != 0 {
		return runFailures(cmd, f, cl, m, cfg)
	}
	if f.auto {
		return runAuto(cmd, f, cl, m, cfg)
	}
	p, err := topology.New(cl, m, cfg)
	if err != nil {
		return classify(err)
	}
	r, err := estimate.Evaluate(p)
	if err != nil {
		return classify(err)
	}
	if err := writePlan(out, f, p, r); err != nil {
		return err
	}
	if !r.Fits {
		return &exitError{code: exitNoFit}
	}
	return nil
}

func classify(err error) error {
	if isInput(err) {
		return usageError(err)
	}
	return err
}

func writePlan(out io.Writer, f *planFlags, p *topology.Plan, r estimate.Report) error {
	if f.svg != "" {
		if err := writeFile(f.svg, func(w io.Writer) error { return estimate.WriteSVG(w, p, r) }); err != nil {
			return err
		}
	}
	if f.json {
		return writePlanJSON(out, planJSON{Schema: planSchema, Layout: planLayout(p), Document: estimate.NewDocument(p, r)})
	}
	return estimate.WriteText(out, p, r)
}

func runAuto(cmd *cobra.Command, f *planFlags, cl topology.Cluster, m topology.Model, base topology.Config) error {
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := cl.Validate(); err != nil {
		return usageError(err)
	}
	if err := m.Validate(); err != nil {
		return usageError(err)
	}
	if f.top < 1 {
		return usageError(fmt.Errorf("--top %d: must be at least 1", f.top))
	}
	space := searchSpace(cmd, base)
	start, last := time.Now(), time.Now()
	res, err := estimate.Search(cl, m, base, space, f.top, func(n int) {
		if time.Since(last) >= time.Second { // progress only on long searches
			last = time.Now()
			fmt.Fprintf(errw, "searched %d layouts in %.0f s...\n", n, time.Since(start).Seconds())
		}
	})
	if err != nil {
		return classify(err)
	}
	for i := range res.Top {
		res.Top[i].Command = planCommand(cmd, res.Top[i].Plan.Config)
	}
	if f.json {
		err = writeIndented(out, planSearchJSON{Schema: planSearchSchema, SearchDocument: estimate.NewSearchDocument(res)})
	} else {
		err = estimate.WriteSearchText(out, cl, m, res)
	}
	if err != nil {
		return err
	}
	if len(res.Top) == 0 {
		return &exitError{code: exitNoFit}
	}
	if f.svg != "" {
		best := res.Top[0]
		return writeFile(f.svg, func(w io.Writer) error { return estimate.WriteSVG(w, best.Plan, best.Report) })
	}
	return nil
}

// searchSpace is the space plan searches: what the user gave of the
// layout (--tp, --pp, ...) is a constraint, the rest is free.
func searchSpace(cmd *cobra.Command, base topology.Config) topology.SearchSpace {
	space := topology.DefaultSearchSpace()
	changed := cmd.Flags().Changed
	for _, x := range []struct {
		flag string
		dst  **int
		v    int
	}{{"tp", &space.Fixed.TP, base.TP}, {"pp", &space.Fixed.PP, base.PP}, {"dp", &space.Fixed.DP, base.DP},
		{"vpp", &space.Fixed.VPP, base.VPP}, {"zero", &space.Fixed.Zero, base.Zero}, {"micro-batch", &space.Fixed.MicroBatch, base.MicroBatch}} {
		if changed(x.flag) {
			*x.dst = &x.v
		}
	}
	if changed("schedule") {
		space.Fixed.Schedule = &base.Schedule
	}
	if changed("recompute") {
		space.Fixed.Recompute = &base.Recompute
	}
	return space
}

// runFailures is plan --failures K: for 0 to K lost nodes, the layout a
// re-plan would choose on the nodes left (searched as --auto searches,
// keeping the whole cluster's global batch), its memory and step time, or
// that the job would pause. It exits 3 when nothing fits even on every
// node.
func runFailures(cmd *cobra.Command, f *planFlags, cl topology.Cluster, m topology.Model, base topology.Config) error {
	if err := cl.Validate(); err != nil {
		return usageError(err)
	}
	if err := m.Validate(); err != nil {
		return usageError(err)
	}
	if cmd.Flags().Changed("dp") {
		return usageError(errors.New("--failures re-plans the data-parallel degree on the nodes left: leave out --dp"))
	}
	fs, err := estimate.Failures(cl, m, base, searchSpace(cmd, base), f.failures)
	if err != nil {
		return classify(err)
	}
	if f.json {
		err = writeIndented(cmd.OutOrStdout(), planFailuresJSON{Schema: planFailuresSchema, Failures: estimate.NewFailuresJSON(fs)})
	} else {
		err = estimate.WriteFailuresText(cmd.OutOrStdout(), cl, m, fs)
	}
	if err != nil {
		return err
	}
	if fs[0].Best == nil {
		return &exitError{code: exitNoFit}
	}
	return nil
}

// planFailuresSchema names plan --failures --json's document.
const planFailuresSchema = "gpucoord.plan-failures/1"

// planFailuresJSON is plan --failures --json.
type planFailuresJSON struct {
	Schema   string                 `json:"schema"`
	Failures []estimate.FailureJSON `json:"failures"`
}

// layoutFlags are the flags of a plan's layout and training setup, which
// a searched plan's command states from the plan itself.
var layoutFlags = []string{"tp", "pp", "dp", "vpp", "zero", "micro-batch", "global-batch", "schedule", "recompute", "sequence-parallel"}

// planCommand is the command line that plans c alone: the flags the user
// gave (model, cluster and the rest) but the search's own, then every
// setting of c's layout, those the search chose without showing them
// (sequence parallelism, the global batch) included.
func planCommand(cmd *cobra.Command, c topology.Config) string {
	args := []string{"gpucoord", "plan"}
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		switch {
		case slices.Contains(layoutFlags, fl.Name) || slices.Contains([]string{"auto", "top", "json", "svg"}, fl.Name):
		case fl.Value.Type() == "bool" && fl.Value.String() == "true":
			args = append(args, "--"+fl.Name)
		case fl.Value.Type() == "bool":
			args = append(args, "--"+fl.Name+"=false")
		default:
			args = append(args, "--"+fl.Name, shellQuote(fl.Value.String()))
		}
	})
	args = append(args, "--tp", strconv.Itoa(c.TP), "--pp", strconv.Itoa(c.PP))
	if c.VPP > 1 {
		args = append(args, "--vpp", strconv.Itoa(c.VPP))
	}
	args = append(args, "--zero", strconv.Itoa(c.Zero), "--micro-batch", strconv.Itoa(c.MicroBatch),
		"--global-batch", strconv.Itoa(c.GlobalBatch), "--schedule", string(c.Schedule), "--recompute", string(c.Recompute))
	if c.SequenceParallel {
		args = append(args, "--sequence-parallel")
	}
	return strings.Join(args, " ")
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=%+,@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// planJSON is plan --json: estimate's document of the plan, with the
// schema and the layout every gpucoord JSON shares.
type planJSON struct {
	Schema string     `json:"schema"`
	Layout layoutJSON `json:"layout"`
	estimate.Document
}

// planSearchJSON is plan --auto --json.
type planSearchJSON struct {
	Schema string `json:"schema"`
	estimate.SearchDocument
}

// writeIndented writes v as indented JSON.
func writeIndented(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// rankGroupsHole is where a planJSON with no rank map and no groups has
// them, indented as writeIndented indents: only the document's own fields
// stand at the first level of indentation, so it is found once.
const rankGroupsHole = "\n  \"ranks\": null,\n  \"groups\": {\n    \"tp\": null,\n    \"pp\": null,\n    \"dp\": null\n  },\n"

// writePlanJSON writes doc as writeIndented does, byte for byte, but for
// the rank map and the process groups, which it writes itself: a row per
// GPU and every rank three times (5.5 MB for 32,768 GPUs), where
// encoding/json's indenting pass over them was most of plan --json's time.
// The rest of the document is marshalled with those two empty and split
// where they stand.
func writePlanJSON(w io.Writer, doc planJSON) error {
	ranks, groups := doc.Ranks, doc.Groups
	doc.Ranks, doc.Groups = nil, topology.Groups{}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	head, tail, ok := bytes.Cut(b, []byte(rankGroupsHole))
	if !ok {
		return errors.New("plan --json: the document has no ranks and groups where writePlanJSON expects them")
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.Write(head)
	bw.WriteString("\n  \"ranks\": ")
	switch {
	case ranks == nil:
		bw.WriteString("null")
	case len(ranks) == 0:
		bw.WriteString("[]")
	default:
		bw.WriteByte('[')
		for i, ri := range ranks {
			row := bw.AvailableBuffer()
			if i > 0 {
				row = append(row, ',')
			}
			row = append(row, "\n    {\n      \"rank\": "...)
			row = strconv.AppendInt(row, int64(ri.Rank), 10)
			row = append(row, ",\n      \"node\": "...)
			row = strconv.AppendInt(row, int64(ri.Node), 10)
			row = append(row, ",\n      \"local_gpu\": "...)
			row = strconv.AppendInt(row, int64(ri.LocalGPU), 10)
			row = append(row, ",\n      \"tp\": "...)
			row = strconv.AppendInt(row, int64(ri.TP), 10)
			row = append(row, ",\n      \"pp\": "...)
			row = strconv.AppendInt(row, int64(ri.PP), 10)
			row = append(row, ",\n      \"dp\": "...)
			row = strconv.AppendInt(row, int64(ri.DP), 10)
			bw.Write(append(row, "\n    }"...))
		}
		bw.WriteString("\n  ]")
	}
	bw.WriteString(",\n  \"groups\": {")
	for i, ax := range []struct {
		name string
		gs   [][]topology.Rank
	}{{"tp", groups.TP}, {"pp", groups.PP}, {"dp", groups.DP}} {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.WriteString("\n    \"" + ax.name + "\": ")
		writeRankLists(bw, ax.gs)
	}
	bw.WriteString("\n  },\n")
	bw.Write(tail)
	bw.WriteByte('\n')
	return bw.Flush()
}

// writeRankLists writes an axis's groups as writePlanJSON indents them.
func writeRankLists(bw *bufio.Writer, gs [][]topology.Rank) {
	switch {
	case gs == nil:
		bw.WriteString("null")
		return
	case len(gs) == 0:
		bw.WriteString("[]")
		return
	}
	bw.WriteByte('[')
	for i, g := range gs {
		b := bw.AvailableBuffer()
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "\n      "...)
		switch {
		case g == nil:
			b = append(b, "null"...)
		case len(g) == 0:
			b = append(b, "[]"...)
		default:
			b = append(b, '[')
			for k, r := range g {
				if k > 0 {
					b = append(b, ',')
				}
				b = append(b, "\n        "...)
				b = strconv.AppendInt(b, int64(r), 10)
			}
			b = append(b, "\n      ]"...)
		}
		bw.Write(b)
	}
	bw.WriteString("\n    ]")
}

// writeFile creates path and fills it with write, reporting either error.
func writeFile(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}
