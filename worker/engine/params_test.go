package engine

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPrepareParamsDir checks that PrepareParamsDir creates a missing
// directory, removes only the files WriteParams and SaveParams write (and
// their temporary files), leaves no probe behind, and refuses a path that
// cannot be a directory.
func TestPrepareParamsDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := PrepareParamsDir(dir); err != nil {
		t.Fatalf("missing directory: %v", err)
	}
	for _, name := range []string{"params-full.gob", "params-pp1-tp0.gob", "params-pp0-tp1.gob.tmp", "other.gob", "params.txt", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := PrepareParamsDir(dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"notes.txt", "other.gob", "params.txt"}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
	file := filepath.Join(dir, "notes.txt")
	if err := PrepareParamsDir(filepath.Join(file, "sub")); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("below a file: err = %v, want not a directory", err)
	}
}
