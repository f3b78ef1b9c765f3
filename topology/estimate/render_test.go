package estimate

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/gpucoord/gpucoord/topology"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden outputs in testdata with the current renderer")

// golden compares got with testdata/name byte for byte, or rewrites the
// file with -rewrite (review the diff before keeping it).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *rewrite {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (rerun with -rewrite if the change is intended):\n%s", path, got)
	}
}

// TestWriteTextGolden renders the worked example of docs/PLANNING.md (the
// plan `make plan-demo` prints, with the cluster file it uses) and a one-GPU
// plan, whose counts of one read in the singular.
func TestWriteTextGolden(t *testing.T) {
	cl, err := topology.LoadCluster(filepath.Join("..", "..", "examples", "clusters", "dgx-h100-32.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := topology.ModelPreset("gpt-13b")
	cfg := topology.DefaultConfig()
	cfg.TP, cfg.PP, cfg.Zero, cfg.GlobalBatch = 8, 4, 1, 16
	worked, err := topology.New(cl, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	one, _ := topology.ClusterPreset("dgx-h100")
	one.GPUsPerNode = 1
	m, _ = topology.ModelPreset("gpt-1.7b")
	cfg = topology.DefaultConfig()
	cfg.GlobalBatch = 1
	single, err := topology.New(one, m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file string
		p    *topology.Plan
	}{{"worked-example.txt", worked}, {"single-gpu.txt", single}} {
		t.Run(tc.file, func(t *testing.T) {
			r, err := Evaluate(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := WriteText(&b, tc.p, r); err != nil {
				t.Fatal(err)
			}
			checkSingular(t, b.String())
			golden(t, tc.file, b.Bytes())
		})
	}
}

// TestWriteSearchGolden renders `plan --auto` for gpt-13b on four DGX H100
// nodes (text, and JSON of the best plan), and for gpt-1t on one node,
// where nothing fits.
func TestWriteSearchGolden(t *testing.T) {
	search := func(model string, nodes, top int) (topology.Cluster, topology.Model, SearchResult) {
		cl, _ := topology.ClusterPreset("dgx-h100")
		cl.Nodes = nodes
		m, _ := topology.ModelPreset(model)
		res, err := Search(cl, m, topology.DefaultConfig(), topology.DefaultSearchSpace(), top, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cl, m, res
	}
	var b bytes.Buffer
	cl, m, res := search("gpt-13b", 4, 5)
	if err := WriteSearchText(&b, cl, m, res); err != nil {
		t.Fatal(err)
	}
	golden(t, "auto-gpt-13b-32.txt", b.Bytes())

	b.Reset()
	res.Top = res.Top[:1]
	if err := WriteSearchJSON(&b, res); err != nil {
		t.Fatal(err)
	}
	golden(t, "auto-gpt-13b-32-top1.json", b.Bytes())

	b.Reset()
	cl, m, res = search("gpt-1t", 1, 5)
	if len(res.Top) != 0 {
		t.Fatalf("gpt-1t fits on 8 GPUs: %s", res.Why)
	}
	if err := WriteSearchText(&b, cl, m, res); err != nil {
		t.Fatal(err)
	}
	golden(t, "auto-none-fits.txt", b.Bytes())
}

// pluralAfterOne finds a count of one followed by a plural noun.
var pluralAfterOne = regexp.MustCompile(`\b1 (nodes|GPUs|groups|stages|micro-batches|ranks|layouts|steps)\b`)

func checkSingular(t *testing.T, text string) {
	t.Helper()
	if m := pluralAfterOne.FindString(text); m != "" {
		t.Errorf("%q: a count of one takes the singular", m)
	}
}
