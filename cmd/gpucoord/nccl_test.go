package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/collectives/nccl/nccltest"
	"github.com/gpucoord/gpucoord/internal/e2e"
)

var (
	fakeNCCLOnce sync.Once
	fakeNCCLDir  string // removed by TestMain
	fakeNCCL     *nccltest.Fake
	fakeNCCLErr  error
)

// buildFakeNCCL builds the fake NCCL once per test binary, in a directory
// that lives until TestMain ends: the commands started here load its files.
func buildFakeNCCL(t *testing.T) *nccltest.Fake {
	t.Helper()
	fakeNCCLOnce.Do(func() {
		if fakeNCCLDir, fakeNCCLErr = os.MkdirTemp("", "gpucoord-test-nccl-"); fakeNCCLErr == nil {
			fakeNCCL, fakeNCCLErr = nccltest.Build(fakeNCCLDir)
		}
	})
	if errors.Is(fakeNCCLErr, nccltest.ErrNoCompiler) {
		t.Skip(fakeNCCLErr)
	}
	if fakeNCCLErr != nil {
		t.Fatal(fakeNCCLErr)
	}
	return fakeNCCL
}

// ncclEnv is this process's environment without the variables that point
// the nccl package at other libraries, plus extra.
func ncclEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, nccl.EnvNCCLLibrary+"=") && !strings.HasPrefix(kv, nccl.EnvCUDARTLibrary+"=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// TestNCCLWithoutGPU runs the real commands on a machine without NCCL or a
// GPU (this one): bench and train with --backend nccl must fail at once
// with exit status 1, the one-line reason on stderr, nothing on stdout and
// no process left behind, instead of hanging or starting ranks.
func TestNCCLWithoutGPU(t *testing.T) {
	t.Setenv(nccl.EnvNCCLLibrary, "")
	t.Setenv(nccl.EnvCUDARTLibrary, "")
	if n, err := nccl.Devices(nccl.DefaultConfig()); err == nil {
		t.Skipf("NCCL and %d GPUs are here; scripts/gpu_nccl.sh runs the commands", n)
	}
	exe := e2e.Binary(t)
	job := filepath.Join(t.TempDir(), "tiny.yaml")
	if err := os.WriteFile(job, []byte(tinyJob), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, args := range [][]string{
		{"bench", "--backend", "nccl", "--np", "2", "--sizes", "8K"},
		{"bench", "allgather", "--backend", "nccl", "--np", "4", "--sizes", "8K,64M", "--json"},
		{"train", "--backend", "nccl", "--np", "2", "--pp", "2", job},
		{"train", "--backend", "nccl", "--np", "4", "--tp", "2", "--pp", "2", "--json", job},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			marker := fmt.Sprintf("GPUCOORD_TEST_NCCL=%d-%d", os.Getpid(), i)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, args...)
			cmd.Env = ncclEnv(marker)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitFailure {
				t.Fatalf("exit %v, want status %d; stderr:\n%s", err, exitFailure, stderr.String())
			}
			t.Logf("failed after %s: %s", time.Since(start).Round(time.Millisecond), stderr.String())
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			msg := strings.TrimSuffix(stderr.String(), "\n")
			if !strings.HasPrefix(msg, "gpucoord: nccl: NCCL is not available: ") || strings.Contains(msg, "\n") {
				t.Errorf("stderr %q, want one line starting %q", stderr.String(), "gpucoord: nccl: NCCL is not available: ")
			}
			if left := processesWith(marker); len(left) != 0 {
				t.Errorf("processes %v outlived the command", left)
			}
		})
	}
}

// TestBenchNCCLProcessOnFakes runs bench --backend nccl through its real
// process path (the parent's pre-flight, one child per rank through the
// local launcher, the worker's NCCL communicator and device buffers) on the
// fake NCCL. The fakes join only ranks of one process, so the world is one
// rank; ranks of several processes need a GPU (scripts/gpu_nccl.sh).
func TestBenchNCCLProcessOnFakes(t *testing.T) {
	f := buildFakeNCCL(t)
	exe := e2e.Binary(t)
	for _, op := range []string{"allreduce", "broadcast"} {
		cmd := exec.CommandContext(t.Context(), exe, "bench", op, "--backend", "nccl", "--np", "1", "--sizes", "4K,64K",
			"--jsonl", "--iters", "3", "--warmup", "1")
		cmd.Env = ncclEnv(nccl.EnvNCCLLibrary+"="+f.NCCL, nccl.EnvCUDARTLibrary+"="+f.CUDART)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", op, err, stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 2 {
			t.Fatalf("%s: %d lines, want 2:\n%s", op, len(lines), out)
		}
		host, _ := os.Hostname()
		for i, l := range lines {
			var r benchRecord
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			checkRecord(t, r, op, 1, map[string]float64{"allreduce": 0, "broadcast": 1}[op])
			if r.Backend != "nccl" || r.Host != host || r.Bytes != 4096<<(4*i) {
				t.Errorf("%s: record %+v, want backend nccl, host %q, %d bytes", op, r, host, 4096<<(4*i))
			}
		}
	}
}

// TestTrainNCCLProcessOnFakes runs train --backend nccl through its process
// path on the fake NCCL: the parent's pre-flight and the child's flags
// (--backend, --device). One rank has no group to form, so the losses equal
// TCP's exactly; groups over NCCL are checked in the engine's tests, and
// with several processes by scripts/gpu_nccl.sh.
func TestTrainNCCLProcessOnFakes(t *testing.T) {
	f := buildFakeNCCL(t)
	exe := e2e.Binary(t)
	job := filepath.Join(t.TempDir(), "tiny.yaml")
	if err := os.WriteFile(job, []byte(tinyJob), 0o644); err != nil {
		t.Fatal(err)
	}
	losses := map[string]string{}
	for _, backend := range []string{"tcp", "nccl"} {
		cmd := exec.CommandContext(t.Context(), exe, "train", "--backend", backend, "--np", "1", "--steps", "3", "--json", job)
		cmd.Env = ncclEnv(nccl.EnvNCCLLibrary+"="+f.NCCL, nccl.EnvCUDARTLibrary+"="+f.CUDART)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", backend, err, stderr.String())
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var s struct {
				Loss float64 `json:"loss"`
			}
			if err := json.Unmarshal([]byte(l), &s); err != nil {
				t.Fatalf("%s: line %q: %v", backend, l, err)
			}
			got = append(got, fmt.Sprint(s.Loss))
		}
		losses[backend] = strings.Join(got, " ")
	}
	if losses["nccl"] != losses["tcp"] || strings.Count(losses["tcp"], " ") != 2 {
		t.Errorf("losses over nccl %s, over tcp %s; want the same 3", losses["nccl"], losses["tcp"])
	}
}
