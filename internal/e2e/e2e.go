// Package e2e holds what the end-to-end tests of more than one package
// share: the gpucoord binaries they start (built once a test process),
// the process's environment for them, and train's losses to compare a
// job's with. Only tests import it.
package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpucoord/gpucoord/internal/rankexe"
	"github.com/gpucoord/gpucoord/worker/engine"
)

// Binary builds gpucoord once for the test process and returns its path.
// Under the race detector the control plane is built with it, and the
// native ranks run a second build without it (rankexe.Env, set here for
// every process the tests start; Ranks): the race detector slows their
// arithmetic tenfold and checks nothing of the control plane there. The
// binaries live until the process ends (Main removes their directory).
// It skips the test under -short.
func Binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: starts gpucoord processes (runs without -short)")
	}
	bin.once.Do(func() {
		dir, err := os.MkdirTemp("", "gpucoord-test-bin-")
		if err != nil {
			bin.err = err
			return
		}
		bin.dir, bin.path = dir, filepath.Join(dir, "gpucoord")
		build := func(out string, checked bool) error {
			args := []string{"build", "-o", out}
			if checked {
				args = append(args, "-race")
			}
			if b, err := exec.Command("go", append(args, "github.com/gpucoord/gpucoord/cmd/gpucoord")...).CombinedOutput(); err != nil {
				return fmt.Errorf("go build: %v\n%s", err, b)
			}
			return nil
		}
		if bin.err = build(bin.path, race); bin.err != nil || !race {
			return
		}
		bin.ranks = filepath.Join(dir, "gpucoord-ranks")
		if bin.err = build(bin.ranks, false); bin.err == nil {
			bin.err = os.Setenv(rankexe.Env, bin.ranks)
		}
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// Ranks is the ranks' binary without the race detector, once Binary has
// built it; "" when the tests run without the race detector.
func Ranks() string { return bin.ranks }

var bin struct {
	once             sync.Once
	dir, path, ranks string
	err              error
}

// Main runs a test process's tests (m) in the environment the binaries'
// processes want, and removes what it made; then it exits. The
// standalone launches the tests start log to the cache directory: the
// tests' own, removed at the end. Go's build cache stays where it is (it
// lives under the same directory by default): Binary's builds reuse what
// compiling the tests left there instead of starting cold. A race-enabled
// process sleeps a second at exit (GORACE atexit_sleep_ms, 1000 by
// default) so that late reports can be printed; the tests start hundreds
// of such processes (a race found is still reported, and fails its
// process with status 66). remove names more directories to remove at
// the end.
func Main(m *testing.M, remove ...*string) {
	if os.Getenv("GOCACHE") == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			os.Setenv("GOCACHE", filepath.Join(dir, "go-build"))
		}
	}
	cache, err := os.MkdirTemp("", "gpucoord-test-cache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_CACHE_HOME", cache)
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	code := m.Run()
	os.RemoveAll(cache)
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
	for _, dir := range remove {
		if *dir != "" {
			os.RemoveAll(*dir)
		}
	}
	os.Exit(code)
}

// Losses parses the JSON step lines of train --json or launch --json: the
// loss of each step as last reported.
func Losses(t *testing.T, out string) []float64 {
	t.Helper()
	var ls []float64
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, `{"step"`) {
			continue
		}
		var s engine.StepResult
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if s.Step < 1 || s.Step > len(ls)+1 {
			t.Fatalf("step %d after %d steps", s.Step, len(ls))
		}
		// A step trained again by a later generation replaces the earlier
		// line (and those after it).
		ls = append(ls[:s.Step-1], s.Loss)
	}
	return ls
}

// Reference runs train --np 1 --json and returns its losses.
func Reference(t *testing.T, exe string, args ...string) []float64 {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), exe, append([]string{"train", "--np", "1", "--json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("train --np 1: %v", err)
	}
	return Losses(t, string(out))
}

// SameLosses checks that got are want (train --np 1's) within 1e-5
// relative, step by step.
func SameLosses(t *testing.T, got, want []float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%d steps, want %d", len(got), len(want))
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-5*math.Abs(want[i]) {
			t.Errorf("step %d: loss %.9g, want %.9g (train --np 1)", i+1, got[i], want[i])
		}
	}
}

// SameParams checks that world ranks of examples/pytorch/ddp.py (or a
// program printing the same lines) reported their final parameters in
// out, and that they are all rank 0's.
func SameParams(t *testing.T, out string, world int) {
	t.Helper()
	digests := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, "final-params "); i >= 0 {
			digests[line[strings.Index(line, "rank "):strings.Index(line, "/")]] = line[i+len("final-params "):]
		}
	}
	if len(digests) != world {
		t.Fatalf("%d ranks reported parameters, want %d", len(digests), world)
	}
	for r, d := range digests {
		if d != digests["rank 0"] {
			t.Errorf("%s parameters %s differ from rank 0's %s", r, d, digests["rank 0"])
		}
	}
}

// TorchPython is Debian's python3 with torch (make deps installs it).
func TorchPython(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		t.Fatalf("%s cannot import torch (make deps installs python3-torch): %v", py, err)
	}
	return py
}
