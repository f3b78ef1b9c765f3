package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/topology/estimate"
)

// runCLI runs gpucoord with args and returns stdout and the exit code main
// would use.
func runCLI(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(t.Context(), args, &out, &errb)
	code := 0
	if err != nil {
		code = exitFailure
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
	}
	return out.String(), code, err
}

func TestPlanExitCodes(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantMsg  string // in the error (exit 2) or the output (exit 0, 3)
	}{
		{"fits", []string{"plan", "--cluster", "../../examples/clusters/dgx-h100-32.yaml", "--model", "gpt-13b", "--tp", "8", "--pp", "4", "--zero", "1"}, 0, "fits     yes"},
		{"does not fit", []string{"plan", "--model", "gpt-175b", "--tp", "8", "--flash-attention=false"}, 3, "does not fit: stage 0 needs"},
		{"world not divisible", []string{"plan", "--model", "gpt-13b", "--nodes", "3", "--gpus-per-node", "2", "--tp", "4"}, 2, "world size 6 (3 nodes x 2 GPUs) is not divisible by tp*pp = 4"},
		{"tp beyond nvlink", []string{"plan", "--model", "gpt-13b", "--nodes", "2", "--tp", "16"}, 2, "tp 16 is larger than the NVLink domain of 8 GPUs"},
		{"heads", []string{"plan", "--model", "gpt-1.7b", "--nodes", "2", "--gpus-per-node", "16", "--tp", "16"}, 2, "heads 24 is not divisible by tp 16"},
		{"layers", []string{"plan", "--model", "gpt-13b", "--nodes", "3", "--pp", "3"}, 2, "layers 40 is not divisible by pp*vpp = 3"},
		{"interleaved microbatches", []string{"plan", "--model", "gpt-13b", "--pp", "4", "--vpp", "2", "--schedule", "interleaved", "--global-batch", "6"}, 2, "not a multiple of pp 4"},
		{"global batch", []string{"plan", "--model", "gpt-13b", "--global-batch", "12"}, 2, "global batch 12 is not divisible by micro-batch*dp = 8"},
		{"unknown cluster preset", []string{"plan", "--model", "gpt-13b", "--cluster", "dgx-z900"}, 2, `cluster "dgx-z900": unknown preset`},
		{"unknown model preset", []string{"plan", "--model", "gpt-9000b"}, 2, `model "gpt-9000b": unknown preset`},
		{"no model", []string{"plan"}, 2, "no model"},
		{"bad flag value", []string{"plan", "--tp", "two"}, 2, "invalid argument"},
		{"bad recompute", []string{"plan", "--model", "gpt-13b", "--recompute", "some"}, 2, `recompute "some"`},
		{"bare params", []string{"plan", "--params", "7.5e9", "--nodes", "8", "--zero", "3"}, 0, "no time estimate for a bare parameter count"},
		{"empty order", []string{"plan", "--model", "gpt-13b", "--order", ""}, 2, `--order "": give an order`},
		{"empty order with auto", []string{"plan", "--model", "gpt-13b", "--auto", "--order="}, 2, `--order "": give an order`},
		{"params NaN", []string{"plan", "--params", "NaN"}, 2, "params NaN: want a parameter count between 1 and 1e+15"},
		{"params Inf", []string{"plan", "--params", "Inf"}, 2, "params +Inf: want a parameter count between 1 and 1e+15"},
		{"params absurd", []string{"plan", "--params", "1e30"}, 2, "params 1e+30: want a parameter count between 1 and 1e+15"},
		{"params zero", []string{"plan", "--params", "0"}, 2, "params 0: want a parameter count between 1 and 1e+15"},
		{"params negative", []string{"plan", "--params", "-5"}, 2, "params -5: want a parameter count between 1 and 1e+15"},
		{"fp8 without fp8 tensor cores", []string{"plan", "--cluster", "dgx-a100", "--model", "gpt-13b", "--tp", "8", "--precision", "fp8"}, 2, "precision fp8 needs fp8 tensor cores: cluster dgx-a100 has no peak_fp8_tflops"},
		{"unknown loss", []string{"plan", "--model", "gpt-13b", "--loss", "sparse"}, 2, `loss "sparse": want unfused or fused`},
		{"fused loss named", []string{"plan", "--model", "gpt-13b", "--tp", "8", "--loss", "fused"}, 0, "capacity 79.2; fused loss)"},
		{"one GPU reads singular", []string{"plan", "--model", "gpt-1.7b", "--gpus-per-node", "1", "--global-batch", "1"}, 0, "1 node x 1 GPU, 79.18 GiB each, NVLink domain 1 GPU"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, code, err := runCLI(t, tc.args...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d (err %v)\n%s", code, tc.wantCode, err, out)
			}
			text := out
			if code == exitUsage {
				text = err.Error()
				if strings.Contains(text, "\n") {
					t.Errorf("error %q: want one line", text)
				}
			}
			if !strings.Contains(text, tc.wantMsg) {
				t.Errorf("want %q in:\n%s", tc.wantMsg, text)
			}
		})
	}
}

// TestPlanMalformedYAML checks that a bad cluster or model file is a usage
// error (exit 2) of one line naming the file, the line and the field in the
// file's terms, without Go type names.
func TestPlanMalformedYAML(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, flag, body, want string
	}{
		{"unknown-field.yaml", "--cluster", "nodes: 2\ngpus_per_node: 8\ngpu_memory_gib: 80\npeak_tflops: 1\nnvlink_gbps: 1\ninter_node_gbps: 1\ncolour: red\n",
			`unknown-field.yaml: cluster spec: line 7: unknown field "colour" (known: `},
		{"broken.yaml", "--cluster", "nodes: [2\n", "broken.yaml: cluster spec: line 1: did not find expected ',' or ']'"},
		{"wrong-type.yaml", "--cluster", "nodes: many\n", `wrong-type.yaml: cluster spec: line 1: nodes: want a whole number, got "many"`},
		{"gpus.yaml", "--cluster", "preset: dgx-h100\ngpus_per_node: many\n", `gpus.yaml: cluster spec: line 2: gpus_per_node: want a whole number, got "many"`},
		{"empty.yaml", "--cluster", "", "empty.yaml: cluster spec: empty document"},
		{"model.yaml", "--model", "preset: gpt-13b\nlayers: forty\n", `model.yaml: model spec: line 2: layers: want a whole number, got "forty"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"plan", "--cluster", path, "--model", "gpt-1.7b"}
			if tc.flag == "--model" {
				args = []string{"plan", "--model", path}
			}
			_, code, err := runCLI(t, args...)
			if code != exitUsage {
				t.Fatalf("exit %d (err %v), want 2", code, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q\nwant it to contain %q", msg, tc.want)
			}
			if strings.Contains(msg, "\n") || strings.Contains(msg, "topology.") || strings.Contains(msg, "cannot unmarshal") {
				t.Errorf("error %q: want one line without Go type names", msg)
			}
		})
	}
}

func TestPlanJSON(t *testing.T) {
	out, code, err := runCLI(t, "plan", "--nodes", "2", "--model", "gpt-1.7b", "--tp", "2", "--pp", "4", "--zero", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %v", code, err)
	}
	var doc struct {
		WorldSize int    `json:"world_size"`
		Order     string `json:"order"`
		Parallel  struct{ TP, PP, DP, VPP, Zero int }
		Ranks     []struct {
			Rank, Node, TP, PP, DP int
			LocalGPU               int `json:"local_gpu"`
		}
		Groups struct{ TP, PP, DP [][]int }
		Memory struct {
			PerGPU struct {
				Params, Grads, Optimizer, Activations, Transient, Other, Total float64
			} `json:"per_gpu_bytes"`
			CapacityBytes float64 `json:"capacity_bytes"`
		}
		Pipeline struct {
			Schedule       string
			Microbatches   int
			BubbleFraction float64 `json:"bubble_fraction"`
		}
		Step struct {
			FLOPs, Seconds float64
			TFLOPSPerGPU   float64 `json:"tflops_per_gpu"`
		}
		Fits    *bool
		Reasons []string
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, out)
	}
	if doc.WorldSize != 16 || doc.Parallel.TP != 2 || doc.Parallel.PP != 4 || doc.Parallel.DP != 2 || doc.Parallel.Zero != 2 || doc.Parallel.VPP != 1 {
		t.Errorf("world/parallel = %d %+v", doc.WorldSize, doc.Parallel)
	}
	if doc.Order != "tp-cp-dp-pp" {
		t.Errorf("order = %q", doc.Order)
	}
	if len(doc.Ranks) != 16 || doc.Ranks[13].Node != 1 || doc.Ranks[13].LocalGPU != 5 || doc.Ranks[13].TP != 1 || doc.Ranks[13].DP != 0 || doc.Ranks[13].PP != 3 {
		t.Errorf("rank 13 = %+v", doc.Ranks[13])
	}
	if len(doc.Groups.PP) != 4 || len(doc.Groups.PP[0]) != 4 || doc.Groups.PP[1][3] != 13 {
		t.Errorf("pp groups = %v", doc.Groups.PP)
	}
	m := doc.Memory.PerGPU
	if m.Total <= 0 || m.Total != m.Params+m.Grads+m.Optimizer+m.Activations+m.Transient+m.Other || doc.Memory.CapacityBytes != 79.18*(1<<30) {
		t.Errorf("memory = %+v cap %g", m, doc.Memory.CapacityBytes)
	}
	// The default global batch is the world size: 16 sequences over dp 2,
	// 8 micro-batches of 1 per replica.
	if doc.Pipeline.Schedule != "1f1b" || doc.Pipeline.Microbatches != 8 || doc.Pipeline.BubbleFraction <= 0 {
		t.Errorf("pipeline = %+v", doc.Pipeline)
	}
	if doc.Step.FLOPs <= 0 || doc.Step.Seconds <= 0 || doc.Step.TFLOPSPerGPU <= 0 {
		t.Errorf("step = %+v", doc.Step)
	}
	if doc.Fits == nil || !*doc.Fits || len(doc.Reasons) != 0 {
		t.Errorf("fits = %v", doc.Fits)
	}
}

// TestPlanJSONMatchesEncoder checks that writePlanJSON, which writes the
// rank map and the groups itself, prints what encoding/json prints for the
// whole document: across orders, a plan that does not fit, a bare
// parameter count, and empty and missing ranks and groups.
func TestPlanJSONMatchesEncoder(t *testing.T) {
	var docs []planJSON
	for _, tc := range []struct {
		model   string
		nodes   int
		mod     func(*topology.Config)
		wantFit bool
	}{
		{"gpt-1.7b", 2, func(c *topology.Config) { c.TP, c.PP, c.Zero = 2, 4, 2 }, true},
		{"gpt-13b", 4, func(c *topology.Config) { c.TP, c.PP, c.Order = 4, 2, "pp-tp-dp" }, true},
		{"gpt-13b", 4, func(c *topology.Config) { c.TP, c.PP, c.Order = 8, 2, "pipe-data-model" }, true},
		{"gpt-175b", 1, func(c *topology.Config) { c.TP = 8 }, false},
		{"", 2, func(c *topology.Config) { c.PP = 2 }, true},
	} {
		cl, err := topology.ClusterPreset("dgx-h100")
		if err != nil {
			t.Fatal(err)
		}
		cl.Nodes = tc.nodes
		m := topology.Model{Name: "7.5e+09 params", Params: 7.5e9}
		if tc.model != "" {
			if m, err = topology.LoadModel(tc.model); err != nil {
				t.Fatal(err)
			}
		}
		cfg := topology.DefaultConfig()
		tc.mod(&cfg)
		p, err := topology.New(cl, m, cfg)
		if err != nil {
			t.Fatalf("%s on %d nodes: %v", tc.model, tc.nodes, err)
		}
		r, err := estimate.Evaluate(p)
		if err != nil {
			t.Fatalf("%s on %d nodes: %v", tc.model, tc.nodes, err)
		}
		if r.Fits != tc.wantFit {
			t.Fatalf("%s on %d nodes: fits %v, want %v", tc.model, tc.nodes, r.Fits, tc.wantFit)
		}
		docs = append(docs, planJSON{Schema: planSchema, Layout: planLayout(p), Document: estimate.NewDocument(p, r)})
	}
	empty := docs[0]
	empty.Ranks, empty.Groups = []topology.RankInfo{}, topology.Groups{TP: [][]topology.Rank{}, PP: [][]topology.Rank{{}, nil}}
	missing := docs[0]
	missing.Ranks, missing.Groups = nil, topology.Groups{}
	docs = append(docs, empty, missing)
	for i, doc := range docs {
		var want, got bytes.Buffer
		if err := writeIndented(&want, doc); err != nil {
			t.Fatal(err)
		}
		if err := writePlanJSON(&got, doc); err != nil {
			t.Fatalf("doc %d: %v", i, err)
		}
		if got.String() != want.String() {
			t.Errorf("doc %d: writePlanJSON differs from encoding/json:\n%s\nwant\n%s", i, got.String(), want.String())
		}
	}
}

func TestPlanAutoAndSVG(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "plan.svg")
	out, code, err := runCLI(t, "plan", "--nodes", "4", "--model", "gpt-13b", "--auto", "--svg", svg)
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	if !strings.Contains(out, "why: tp ") || !strings.Contains(out, "wins:") {
		t.Errorf("auto output lacks the explanation:\n%s", out)
	}
	pic, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(pic), `class="gpu"`); n != 32 {
		t.Errorf("svg draws %d GPUs, want 32", n)
	}
	if !strings.Contains(string(pic), `class="forward"`) {
		t.Errorf("svg lacks the pipeline timeline")
	}
	// Nothing fits a 1T model on 8 GPUs: exit 3.
	if _, code, _ := runCLI(t, "plan", "--model", "gpt-1t", "--auto"); code != exitNoFit {
		t.Errorf("gpt-1t on 8 GPUs: exit %d, want 3", code)
	}
}

// TestPlanAutoKeepsFixedFlags: flags given with --auto constrain the
// search, and the output says which were fixed.
func TestPlanAutoKeepsFixedFlags(t *testing.T) {
	out, code, err := runCLI(t, "plan", "--model", "gpt-13b", "--nodes", "4", "--auto", "--tp", "8", "--zero", "0", "--schedule", "gpipe", "--json")
	if code != 0 {
		t.Fatalf("exit %d (%v)\n%s", code, err, out)
	}
	var doc struct {
		Fixed string `json:"fixed"`
		Plans []struct {
			Parallel topology.Config `json:"parallel"`
		} `json:"plans"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Fixed != "tp 8, zero 0, schedule gpipe" || len(doc.Plans) == 0 {
		t.Fatalf("fixed %q, %d plans", doc.Fixed, len(doc.Plans))
	}
	for _, p := range doc.Plans {
		if c := p.Parallel; c.TP != 8 || c.Zero != 0 || c.Schedule != "gpipe" {
			t.Errorf("plan tp %d zero %d schedule %s breaks the fixed flags", c.TP, c.Zero, c.Schedule)
		}
	}
	text, _, _ := runCLI(t, "plan", "--model", "gpt-13b", "--nodes", "4", "--auto", "--tp", "8", "--zero", "0", "--schedule", "gpipe")
	if !strings.Contains(text, "fixed by the flags given: tp 8, zero 0, schedule gpipe") {
		t.Errorf("text output does not say what was fixed:\n%s", text)
	}
}

// TestPlanArchitectureFlags: Megatron-LM's argument names give the same
// plan as ours, and --kv-heads, --gated-mlp, --untied-embeddings and
// --position-embedding rope describe a Llama-style model exactly as its
// preset does.
func TestPlanArchitectureFlags(t *testing.T) {
	ours, code, err := runCLI(t, "plan", "--layers", "40", "--hidden", "5120", "--heads", "40", "--seq", "2048", "--vocab", "51200",
		"--tp", "8", "--pp", "4", "--micro-batch", "1", "--global-batch", "16", "--nodes", "4", "--json")
	if code != 0 {
		t.Fatalf("ours: exit %d (%v)", code, err)
	}
	megatron, code, err := runCLI(t, "plan", "--num-layers", "40", "--hidden-size", "5120", "--num-attention-heads", "40", "--seq-length", "2048",
		"--vocab", "51200", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4", "--micro-batch-size", "1",
		"--global-batch-size", "16", "--nodes", "4", "--json")
	if code != 0 {
		t.Fatalf("megatron names: exit %d (%v)", code, err)
	}
	if ours != megatron {
		t.Error("Megatron-LM's flag names give another plan than ours")
	}
	llama, _ := topology.ModelPreset("llama-70b")
	arch := []string{"--layers", strconv.Itoa(llama.Layers), "--hidden", strconv.Itoa(llama.Hidden), "--heads", strconv.Itoa(llama.Heads),
		"--ffn", strconv.Itoa(llama.FFN), "--vocab", strconv.Itoa(llama.Vocab), "--seq", strconv.Itoa(llama.Seq), "--nodes", "8", "--tp", "8", "--pp", "2", "--json"}
	params := func(args ...string) float64 {
		t.Helper()
		out, _, err := runCLI(t, append([]string{"plan"}, args...)...)
		var doc struct {
			Model struct {
				Total float64 `json:"total_params"`
			} `json:"model"`
		}
		if json.Unmarshal([]byte(out), &doc) != nil || doc.Model.Total == 0 {
			t.Fatalf("plan %v: no parameter count (%v):\n%.400s", args, err, out)
		}
		return doc.Model.Total
	}
	preset := params("--model", "llama-70b", "--nodes", "8", "--tp", "8", "--pp", "2", "--json")
	flags := params(append(arch, "--kv-heads", strconv.Itoa(llama.KVHeadCount()), "--gated-mlp", "--untied-embeddings", "--position-embedding", "rope")...)
	plain := params(arch...)
	if flags != preset || plain == preset {
		t.Errorf("params: preset %.6g, flags with --kv-heads/--gated-mlp %.6g, without %.6g: want the first two equal and the third different", preset, flags, plain)
	}
}

// TestPlanHeadroomAndMFU: --headroom keeps memory free when deciding fit,
// says so, and refuses bad values; MFU is TFLOP/s per GPU over the
// cluster's peak (989 for an H100).
func TestPlanHeadroomAndMFU(t *testing.T) {
	base := []string{"plan", "--cluster", "../../examples/clusters/dgx-h100-32.yaml", "--model", "gpt-13b", "--tp", "8", "--pp", "4", "--zero", "1"}
	out, code, _ := runCLI(t, append(base, "--headroom", "5")...)
	if code != 0 || !strings.Contains(out, "capacity 79.2, 5.0 kept free as headroom") || !strings.Contains(out, "of 74.2 GiB") {
		t.Errorf("--headroom 5: exit %d\n%s", code, out)
	}
	out, code, _ = runCLI(t, append(base, "--headroom", "90%")...)
	if code != exitNoFit || !strings.Contains(out, "7.9 GiB usable (79.2 GiB less 71.3 GiB headroom)") {
		t.Errorf("--headroom 90%%: exit %d, want %d with the headroom in the reason\n%s", code, exitNoFit, out)
	}
	for _, bad := range []string{"-1", "100%", "lots", "80"} {
		if _, code, err := runCLI(t, append(base, "--headroom", bad)...); code != exitUsage {
			t.Errorf("--headroom %s: exit %d (%v), want %d", bad, code, err, exitUsage)
		}
	}
	out, _, _ = runCLI(t, append(base, "--json")...)
	var doc struct {
		Step struct {
			TFLOPS float64 `json:"tflops_per_gpu"`
			MFU    float64 `json:"mfu"`
		} `json:"step"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Step.MFU == 0 || math.Abs(doc.Step.MFU-doc.Step.TFLOPS/989) > 1e-12 {
		t.Errorf("mfu %v, want tflops %v / 989", doc.Step.MFU, doc.Step.TFLOPS)
	}
}

// TestPlanAutoReproduces: every plan --auto ranks comes with the command
// that plans it alone, and that command gives the same memory and step
// time, hidden settings (sequence parallelism, the global batch) included;
// a manual plan defaults the global batch as --auto does.
func TestPlanAutoReproduces(t *testing.T) {
	args := []string{"plan", "--model", "llama-70b", "--nodes", "8", "--headroom", "4GiB", "--flash-attention=false", "--auto", "--top", "3", "--json"}
	out, code, err := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("plan --auto exited %d: %v", code, err)
	}
	type plan struct {
		Parallel topology.Config `json:"parallel"`
		Memory   struct {
			PerGPU struct{ Total float64 } `json:"per_gpu"`
		} `json:"memory"`
		Step struct{ Seconds float64 } `json:"step"`
	}
	var doc struct {
		Plans []struct {
			plan
			Command string `json:"command"`
		} `json:"plans"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Plans) != 3 {
		t.Fatalf("plan --auto --json: %v, %d plans\n%s", err, len(doc.Plans), out)
	}
	for i, p := range doc.Plans {
		cmd := strings.Fields(p.Command)
		if len(cmd) < 3 || cmd[0] != "gpucoord" || !strings.Contains(p.Command, "--flash-attention=false") || !strings.Contains(p.Command, "--headroom 4GiB") {
			t.Fatalf("plan %d: command %q", i+1, p.Command)
		}
		one, code, err := runCLI(t, append(cmd[1:], "--json")...)
		var got plan
		if code != 0 || json.Unmarshal([]byte(one), &got) != nil {
			t.Fatalf("%s exited %d: %v", p.Command, code, err)
		}
		if got.Memory.PerGPU.Total != p.Memory.PerGPU.Total || got.Step.Seconds != p.Step.Seconds || got.Parallel != p.Parallel {
			t.Errorf("%s: %.0f bytes, %g s, %+v; --auto said %.0f bytes, %g s, %+v", p.Command, got.Memory.PerGPU.Total, got.Step.Seconds, got.Parallel,
				p.Memory.PerGPU.Total, p.Step.Seconds, p.Parallel)
		}
	}
	manual, _, _ := runCLI(t, "plan", "--model", "llama-70b", "--nodes", "8", "--tp", "8", "--pp", "4", "--json")
	var m plan
	if err := json.Unmarshal([]byte(manual), &m); err != nil || m.Parallel.GlobalBatch != 64 || doc.Plans[0].Parallel.GlobalBatch != 64 {
		t.Errorf("global batch: manual %d, --auto %d; want the world size, 64, for both", m.Parallel.GlobalBatch, doc.Plans[0].Parallel.GlobalBatch)
	}
}

// TestPlanFailures: plan --failures K prints a row per number of lost
// nodes, in text and JSON (its schema); a dp 1 job (--tp 8 --pp 4 on 32
// GPUs) pauses after any loss; --dp and a K that leaves no node are usage
// errors.
func TestPlanFailures(t *testing.T) {
	out, code, err := runCLI(t, "plan", "--nodes", "4", "--model", "gpt-13b", "--global-batch", "16", "--failures", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	var doc planFailuresJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Schema != planFailuresSchema || len(doc.Failures) != 3 {
		t.Fatalf("%v %+v\n%s", err, doc, out)
	}
	for i, f := range doc.Failures {
		if f.Lost != i || f.Nodes != 4-i || f.Pauses || f.TP*f.PP*f.DP != 8*f.Used || f.StepSec <= 0 {
			t.Errorf("row %d: %+v", i, f)
		}
	}
	out, code, _ = runCLI(t, "plan", "--nodes", "4", "--model", "gpt-13b", "--global-batch", "16", "--tp", "8", "--pp", "4", "--failures", "1")
	if code != 0 || !strings.Contains(out, "pauses: no layout fits") {
		t.Errorf("tp 8 pp 4, one lost: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{{"--dp", "4", "--failures", "1"}, {"--failures", "4"}} {
		if _, code, _ := runCLI(t, append([]string{"plan", "--nodes", "4", "--model", "gpt-13b"}, args...)...); code != exitUsage {
			t.Errorf("plan %v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

// TestPlanFailuresLlama70B: plan --failures 4 for llama-70b on 16 DGX H100
// nodes (the default global batch, 128 sequences, kept by every row): each
// row's layout and step time are what plan --auto chooses on the nodes the
// row uses, at that batch.
func TestPlanFailuresLlama70B(t *testing.T) {
	out, code, err := runCLI(t, "plan", "--cluster", "dgx-h100", "--nodes", "16", "--model", "llama-70b", "--failures", "4", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	var doc planFailuresJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Failures) != 5 {
		t.Fatalf("%v %+v\n%s", err, doc, out)
	}
	for _, f := range doc.Failures {
		if f.Pauses {
			t.Errorf("%d nodes left: pauses", f.Nodes)
			continue
		}
		auto, code, err := runCLI(t, "plan", "--auto", "--cluster", "dgx-h100", "--nodes", strconv.Itoa(f.Used), "--model", "llama-70b",
			"--global-batch", "128", "--top", "1", "--json")
		if code != 0 {
			t.Fatalf("plan --auto on %d nodes: exit %d: %v", f.Used, code, err)
		}
		var best struct {
			Plans []struct {
				Parallel struct {
					TP, PP, DP, VPP, Zero int
					MicroBatch            int `json:"micro_batch"`
				}
				Step struct{ Seconds float64 } `json:"step"`
			} `json:"plans"`
		}
		if err := json.Unmarshal([]byte(auto), &best); err != nil || len(best.Plans) == 0 {
			t.Fatalf("plan --auto on %d nodes: %v\n%s", f.Used, err, auto)
		}
		a := best.Plans[0]
		if a.Parallel.TP != f.TP || a.Parallel.PP != f.PP || a.Parallel.DP != f.DP || max(a.Parallel.VPP, 1) != max(f.VPP, 1) ||
			a.Parallel.Zero != f.Zero || a.Parallel.MicroBatch != f.MicroBatch || a.Step.Seconds != f.StepSec {
			t.Errorf("%d lost: --failures %s (%.4g s), --auto on %d nodes %+v (%.4g s)", f.Lost, f.Layout, f.StepSec, f.Used, a.Parallel, a.Step.Seconds)
		}
	}
}
