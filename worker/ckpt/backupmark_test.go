package ckpt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBackupMark(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := ReadBackupMark(dir); ok || err != nil {
		t.Fatalf("no mark: %v %v", ok, err)
	}
	want := BackupMark{Step: 40, Generation: 2, Dp: 3}
	if err := WriteBackupMark(dir, want); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadBackupMark(dir); err == nil || !strings.Contains(err.Error(), "does not hold") {
		t.Errorf("a mark of a step the tier lacks: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "40"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, ok, err := ReadBackupMark(dir)
	if !ok || err != nil || got != want {
		t.Errorf("read %v %v %v, want %v", got, ok, err, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("files left: %v", entries)
	}
	os.WriteFile(filepath.Join(dir, backupMarkFile), []byte("{}"), 0o644)
	if _, _, err := ReadBackupMark(dir); err == nil {
		t.Error("an empty mark was taken")
	}
}
