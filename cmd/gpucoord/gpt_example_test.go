package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// gptPython is the interpreter that runs examples/pytorch/gpt.py in these
// tests: Debian's, which has python3-torch after `make deps`.
const gptPython = "/usr/bin/python3"

// gptReport is the part of gpt.py's JSON line these tests read.
type gptReport struct {
	Parameters      int64            `json:"parameters"`
	ModelState      map[string]int64 `json:"model_state"`
	ModelStateBytes int64            `json:"model_state_bytes"`
	PeakAllocated   *int64           `json:"peak_allocated_bytes"`
	DeviceUsed      *int64           `json:"device_used_bytes"`
	ActivationPeak  *int64           `json:"activation_peak_bytes"`
	StepSeconds     float64          `json:"step_seconds"`
	FwdBwdSeconds   float64          `json:"fwd_bwd_seconds"`
	UpdateSeconds   float64          `json:"update_seconds"`
	Steps           int              `json:"steps"`
	Loss            float64          `json:"loss"`
}

// needTorch skips the test when gptPython cannot import torch.
func needTorch(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs PyTorch; skipped with -short")
	}
	if err := exec.Command(gptPython, "-c", "import torch").Run(); err != nil {
		t.Skipf("%s cannot import torch (%v): make deps installs python3-torch", gptPython, err)
	}
}

// runGPT runs gpt.py with args and returns stdout, stderr and the exit code.
func runGPT(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), gptPython, append([]string{"../../examples/pytorch/gpt.py"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	default:
		t.Fatalf("run gpt.py: %v", err)
		return "", "", -1
	}
}

// TestReferenceGPTMatchesPlan: the reference GPT that docs/GPU.md measures
// the planner against counts the same parameters as `plan` for the same
// flags (the shape flags have the same names in both), holds 16 bytes of
// model state a parameter (18 with fp32 gradients), and reports one JSON line
// on the CPU with memory figures null.
func TestReferenceGPTMatchesPlan(t *testing.T) {
	needTorch(t)
	tests := []struct {
		name  string
		shape []string
		grad  int64 // bytes of gradient per parameter
	}{
		{name: "gpt", shape: []string{"--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128", "--micro-batch", "2"}, grad: 2},
		{name: "llama-style", shape: []string{"--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "160", "--gated-mlp",
			"--untied-embeddings", "--position-embedding", "rope", "--seq", "64", "--vocab", "300", "--micro-batch", "1"}, grad: 2},
		{name: "fp32 grads, full recompute", shape: []string{"--layers", "3", "--hidden", "32", "--heads", "2", "--seq", "16", "--vocab", "100",
			"--micro-batch", "2", "--recompute", "full", "--fp32-grads"}, grad: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runGPT(t, nil, append([]string{"--device", "cpu", "--steps", "1", "--warmup", "1"}, tc.shape...)...)
			if code != 0 {
				t.Fatalf("gpt.py exited %d: %s", code, stderr)
			}
			if n := strings.Count(strings.TrimSpace(stdout), "\n"); n != 0 {
				t.Fatalf("stdout has %d lines, want one JSON line:\n%s", n+1, stdout)
			}
			var got gptReport
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("gpt.py output is not JSON: %v\n%s", err, stdout)
			}

			planOut, pcode, err := runCLI(t, append([]string{"plan", "--cluster", "dgx-h100", "--nodes", "1", "--gpus-per-node", "1", "--json"}, tc.shape...)...)
			if pcode != 0 {
				t.Fatalf("plan exited %d: %v", pcode, err)
			}
			var plan struct {
				Model struct {
					TotalParams float64 `json:"total_params"`
				} `json:"model"`
			}
			if err := json.Unmarshal([]byte(planOut), &plan); err != nil {
				t.Fatal(err)
			}
			if float64(got.Parameters) != plan.Model.TotalParams {
				t.Errorf("gpt.py has %d parameters, plan counts %.0f", got.Parameters, plan.Model.TotalParams)
			}

			n := got.Parameters
			want := map[string]int64{"params": 2 * n, "grads": tc.grad * n, "master": 4 * n}
			for k, w := range want {
				if got.ModelState[k] != w {
					t.Errorf("model_state.%s = %d, want %d (%d parameters)", k, got.ModelState[k], w, n)
				}
			}
			// Adam's two fp32 moments, plus a step counter per tensor in some PyTorch versions.
			if m := got.ModelState["moments"]; m < 8*n || m > 8*n+4096 {
				t.Errorf("model_state.moments = %d, want 8 bytes a parameter (%d)", m, 8*n)
			}
			if sum := got.ModelState["params"] + got.ModelState["grads"] + got.ModelState["master"] + got.ModelState["moments"]; got.ModelStateBytes != sum {
				t.Errorf("model_state_bytes = %d, want the parts' sum %d", got.ModelStateBytes, sum)
			}
			if got.PeakAllocated != nil || got.DeviceUsed != nil || got.ActivationPeak != nil {
				t.Errorf("memory figures on the CPU = %v %v %v, want null", got.PeakAllocated, got.DeviceUsed, got.ActivationPeak)
			}
			if got.Steps != 1 || !(got.StepSeconds > 0 && got.FwdBwdSeconds > 0 && got.UpdateSeconds > 0) {
				t.Errorf("steps %d, step %gs, fwd+bwd %gs, update %gs: want 1 measured step with positive times",
					got.Steps, got.StepSeconds, got.FwdBwdSeconds, got.UpdateSeconds)
			}
			if math.IsNaN(got.Loss) || got.Loss <= 0 {
				t.Errorf("loss %g", got.Loss)
			}
		})
	}
}

// TestReferenceGPTNoCUDA: without a CUDA device and without --device cpu,
// gpt.py says so in one line and exits 2, with nothing on stdout.
func TestReferenceGPTNoCUDA(t *testing.T) {
	needTorch(t)
	stdout, stderr, code := runGPT(t, []string{"CUDA_VISIBLE_DEVICES="}, "--steps", "1")
	if code != 2 || stderr != "gpt.py: no CUDA device\n" || stdout != "" {
		t.Errorf("exit %d, stderr %q, stdout %q; want 2, %q and nothing", code, stderr, stdout, "gpt.py: no CUDA device\n")
	}
}
