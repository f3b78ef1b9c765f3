package sharding

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestFence: once generation g has raised the fence, every older
// generation's check fails with ErrFenced, g's and newer ones pass, and a
// lower raise leaves it as it is.
func TestFence(t *testing.T) {
	root := filepath.Join(t.TempDir(), "job")
	if err := CheckFence(root, 1); err != nil {
		t.Fatalf("check without a fence: %v", err)
	}
	steps := []struct {
		raise   int64 // 0: no raise
		check   int64
		fenced  bool
		wantGen string
	}{
		{raise: 3, check: 2, fenced: true, wantGen: "3\n"},
		{check: 3, wantGen: "3\n"},
		{check: 4, wantGen: "3\n"},
		{raise: 2, check: 2, fenced: true, wantGen: "3\n"},
		{raise: 5, check: 4, fenced: true, wantGen: "5\n"},
		{raise: 5, check: 5, wantGen: "5\n"},
	}
	for i, s := range steps {
		if s.raise > 0 {
			if err := RaiseFence(root, s.raise); err != nil {
				t.Fatalf("step %d: raise %d: %v", i, s.raise, err)
			}
		}
		err := CheckFence(root, s.check)
		if got := errors.Is(err, ErrFenced); got != s.fenced {
			t.Errorf("step %d: check %d: %v, want fenced %v", i, s.check, err, s.fenced)
		}
		if b, _ := os.ReadFile(filepath.Join(root, FenceFile)); string(b) != s.wantGen {
			t.Errorf("step %d: fence file %q, want %q", i, b, s.wantGen)
		}
	}
	os.WriteFile(filepath.Join(root, FenceFile), []byte("x"), 0o644)
	if err := CheckFence(root, 9); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a garbled fence file: %v, want ErrCorrupt", err)
	}
}
