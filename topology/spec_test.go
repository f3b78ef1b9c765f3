package topology

import (
	"errors"
	"strings"
	"testing"
)

// TestParseSpecErrors checks that a malformed cluster or model file is
// refused with one line naming the line, the field as the file spells it
// and the value wanted, without Go type names.
func TestParseSpecErrors(t *testing.T) {
	tests := []struct {
		name, kind, doc, want string
	}{
		{"word for a count", "cluster", "nodes: 1\ngpus_per_node: many\n",
			`cluster spec: line 2: gpus_per_node: want a whole number, got "many"`},
		{"fraction for a count", "model", "preset: gpt-13b\nheads: 3.5\n",
			`model spec: line 2: heads: want a whole number, got "3.5"`},
		{"list for a number", "cluster", "preset: dgx-h100\ngpu_memory_gib: [80]\n",
			"cluster spec: line 2: gpu_memory_gib: want a number, got a list"},
		{"word for a flag", "model", "preset: llama-7b\ngated_mlp: maybe\n",
			`model spec: line 2: gated_mlp: want true or false, got "maybe"`},
		{"unknown field", "cluster", "preset: dgx-h100\ncolour: red\n",
			`cluster spec: line 2: unknown field "colour" (known: gpu_memory_gib, gpus_per_node, host_memory_gib, inter_node_gbps, memory_gbps, name, nodes, nvlink_domain, nvlink_gbps, peak_fp8_tflops, peak_tflops, preset)`},
		{"field twice", "cluster", "preset: dgx-h100\nnodes: 1\nnodes: 2\n",
			`cluster spec: line 3: mapping key "nodes" already defined at line 2`},
		{"not a mapping", "model", "- layers\n- hidden\n",
			"model spec: line 1: want field: value lines, got a list"},
		{"broken syntax", "cluster", "nodes: [2\n",
			"cluster spec: line 1: did not find expected ',' or ']'"},
		{"empty", "model", "", "model spec: empty document"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.kind == "cluster" {
				_, err = ParseCluster([]byte(tc.doc))
			} else {
				_, err = ParseModel([]byte(tc.doc))
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			checkOneLine(t, err)
			if err.Error() != tc.want {
				t.Errorf("err = %q\nwant  %q", err, tc.want)
			}
		})
	}
}

// TestParseSpecOverridesPreset checks that a preset's fields survive the
// strict decoding and only the fields given override them, with whole
// numbers written as floats accepted.
func TestParseSpecOverridesPreset(t *testing.T) {
	m, err := ParseModel([]byte("preset: gpt-13b\nlayers: 2e1\nseq: 4096\n"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ModelPreset("gpt-13b")
	want.Layers, want.Seq = 20, 4096
	if m != want {
		t.Errorf("model = %+v\nwant    %+v", m, want)
	}
}

// checkOneLine fails when a parse error spans lines or shows Go types or
// yaml.v3's type-error wording. The file's own text appears only quoted.
func checkOneLine(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	for _, bad := range []string{"\n", "topology.", "withPreset", "cannot unmarshal", " in type "} {
		if strings.Contains(msg, bad) {
			t.Fatalf("error %q: want one line without Go or YAML type names", msg)
		}
	}
}
