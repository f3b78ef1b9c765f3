package sharding

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the checkpoint in testdata/ckpt-v1 with the current writer")

// goldenTensors and goldenState make the small checkpoint kept in
// testdata: element i of vector k (m, param, v) is i/4 + k*1000.
func goldenTensors() []Tensor {
	return []Tensor{{Name: "w", Shape: []int{5, 7}}, {Name: "b", Shape: []int{7}}, {Name: "gain", Shape: nil}}
}

func goldenState(n int) map[string][]float32 {
	full := make(map[string][]float32)
	for k, name := range stateNames {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i)/4 + float32(k)*1000
		}
		full[name] = v
	}
	return full
}

// TestGoldenCheckpoint reads the checkpoint committed in testdata, written
// at degree 2 by format version 1, so a change that can no longer read old
// checkpoints fails here, and checks that today's writer still produces the
// same bytes (run with -rewrite after an intended format change).
func TestGoldenCheckpoint(t *testing.T) {
	const step = 7
	golden := filepath.Join("testdata", "ckpt-v1")
	p, err := NewPartition(goldenTensors(), 2, &Config{Align: 4})
	if err != nil {
		t.Fatal(err)
	}
	full := goldenState(p.Len())
	fresh := t.TempDir()
	writeCheckpoint(t, fresh, step, p, full)
	files := []string{ManifestFile, ShardFile(0, 2), ShardFile(1, 2)}
	if *rewrite {
		dir := StepDir(golden, step)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			data, err := os.ReadFile(filepath.Join(StepDir(fresh, step), f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range files {
		want, err := os.ReadFile(filepath.Join(StepDir(golden, step), f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(StepDir(fresh, step), f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the writer's %s differs from testdata (%d vs %d bytes); rerun with -rewrite if the format change is intended", f, len(got), len(want))
		}
	}

	if err := Verify(t.Context(), golden, step); err != nil {
		t.Fatal(err)
	}
	latest, err := LatestComplete(t.Context(), golden)
	if err != nil || latest != step {
		t.Fatalf("LatestComplete = %d, %v; want %d", latest, err, step)
	}
	p3, _ := NewPartition(goldenTensors(), 3, &Config{Align: 1})
	for r := range 3 {
		s, err := ReadShard(t.Context(), golden, step, p3, r)
		if err != nil {
			t.Fatal(err)
		}
		checkShardBits(t, p3, r, s, full)
	}
}
