package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucoord/gpucoord/internal/bench"
	"github.com/gpucoord/gpucoord/internal/e2e"
)

// benchRecord holds the fields scripts rely on.
type benchRecord struct {
	Op        string  `json:"op"`
	N         int     `json:"n"`
	SizeBytes int     `json:"size_bytes"`
	Bytes     int     `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MedianS   float64 `json:"median_s"`
	AlgBW     float64 `json:"algbw_gbps"`
	BusBW     float64 `json:"busbw_gbps"`
	Correct   bool    `json:"correct"`
	Backend   string  `json:"backend"`
	Host      string  `json:"host"`
}

func checkRecord(t *testing.T, r benchRecord, op string, n int, busFactor float64) {
	t.Helper()
	if r.Op != op || r.N != n || !r.Correct || r.Seconds <= 0 || r.MedianS != r.Seconds || r.Bytes != r.SizeBytes {
		t.Errorf("record %+v: want op %s, n %d, correct, positive time", r, op, n)
	}
	if alg := float64(r.SizeBytes) / r.Seconds / 1e9; math.Abs(alg-r.AlgBW) > 1e-9*alg {
		t.Errorf("algbw %v, want size/time/1e9 = %v", r.AlgBW, alg)
	}
	if math.Abs(r.BusBW-r.AlgBW*busFactor) > 1e-9*r.BusBW {
		t.Errorf("busbw %v, want algbw*%v = %v", r.BusBW, busFactor, r.AlgBW*busFactor)
	}
}

func TestBenchInProcJSON(t *testing.T) {
	tests := []struct {
		op        string
		backend   string
		n         int
		busFactor float64
		sizes     []int
	}{
		{"allreduce", "inmem", 3, 4.0 / 3, []int{4096, 65536}},
		{"allgather", "inmem", 3, 2.0 / 3, []int{4092, 65532}}, // rounded down to whole elements per rank
		{"reducescatter", "tcp", 2, 0.5, []int{4096, 65536}},
		{"broadcast", "tcp", 2, 1, []int{4096, 65536}},
	}
	for _, tc := range tests {
		t.Run(tc.op+"/"+tc.backend, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := []string{"bench", tc.op, "--np", strconv.Itoa(tc.n), "--sizes", "4K,64K", "--backend", tc.backend,
				"--inproc", "--json", "--iters", "3", "--warmup", "1"}
			if err := run(t.Context(), args, &out, &errb); err != nil {
				t.Fatalf("%v\n%s", err, errb.String())
			}
			var recs []benchRecord
			if err := json.Unmarshal(out.Bytes(), &recs); err != nil {
				t.Fatalf("output is not a JSON list: %v\n%s", err, out.String())
			}
			if len(recs) != len(tc.sizes) {
				t.Fatalf("%d records, want %d", len(recs), len(tc.sizes))
			}
			for i, r := range recs {
				checkRecord(t, r, tc.op, tc.n, tc.busFactor)
				if r.SizeBytes != tc.sizes[i] {
					t.Errorf("size %d, want %d", r.SizeBytes, tc.sizes[i])
				}
			}
		})
	}
}

// TestBenchProcesses runs the real multi-process path (child processes over
// TCP) in the JSON-lines form that the peer-comparison driver of
// docs/BENCHMARKS.md reads.
func TestBenchProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	exe := e2e.Binary(t)
	out, err := exec.CommandContext(t.Context(), exe, "bench", "allreduce", "--np", "3", "--sizes", "4K:8K",
		"--jsonl", "--iters", "3", "--warmup", "1").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), out)
	}
	for i, l := range lines {
		var r benchRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		checkRecord(t, r, "allreduce", 3, 4.0/3)
		if want := 4096 << i; r.Bytes != want {
			t.Errorf("bytes %d, want %d", r.Bytes, want)
		}
	}
}

// TestBenchRefusesWhatCannotFit: 1024 ranks of 4 GiB need about 4 TiB, so
// bench must refuse with a usage error naming the need and the supply
// instead of starting to allocate.
func TestBenchRefusesWhatCannotFit(t *testing.T) {
	avail, err := bench.MemAvailable()
	if err != nil {
		t.Skipf("no available-memory figure here, so bench does not check: %v", err)
	}
	cfg := bench.DefaultConfig()
	cfg.NP, cfg.Sizes = 1024, []int{4 << 30}
	if need := cfg.MemoryNeeded(); float64(need) <= bench.MaxMemoryFraction*float64(avail) {
		t.Skipf("this machine has %d bytes available, enough for %d", avail, need)
	}
	var out, errb bytes.Buffer
	err = run(t.Context(), []string{"bench", "--np", "1024", "--sizes", "4G"}, &out, &errb)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitUsage || !errors.Is(err, bench.ErrMemory) {
		t.Fatalf("err = %v, want a usage error (exit %d) wrapping bench.ErrMemory", err, exitUsage)
	}
	msg := err.Error()
	for _, want := range []string{"sizes up to 4 GiB on 1024 ranks need about 4100.0 GiB", "GiB available"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error %q is not one line", msg)
	}
	if out.Len() != 0 {
		t.Errorf("a refused run printed %q", out.String())
	}
}

func TestBenchBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"unknown op", []string{"bench", "alltoall"}},
		{"op disagrees", []string{"bench", "allreduce", "--op", "allgather"}},
		{"backwards range", []string{"bench", "--sizes", "64K:4K"}},
		{"bad size", []string{"bench", "--sizes", "lots"}},
		{"unknown backend", []string{"bench", "--backend", "carrier-pigeon"}},
		{"no ranks", []string{"bench", "--np", "0"}},
		{"both outputs", []string{"bench", "--json", "--jsonl"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(t.Context(), tc.args, &out, &errb)
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != exitUsage {
				t.Fatalf("err = %v, want a usage error (exit %d)", err, exitUsage)
			}
		})
	}
}
