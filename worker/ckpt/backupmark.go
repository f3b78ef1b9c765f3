package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// BackupMark names the newest step of a job that its backup tier holds
// whole, as the job's launch heard the coordinators commit it: what a
// later run of the job (a requeued Slurm job, whose coordinators start
// with nothing) resumes from. Generation and Dp are those that trained
// the step.
type BackupMark struct {
	Step       int64 `json:"step"`
	Generation int64 `json:"generation"`
	Dp         int32 `json:"dp"`
}

// backupMarkFile is the mark's file in a job's backup directory
// (worker.SharedCheckpointDir of the tier).
const backupMarkFile = "committed.json"

// WriteBackupMark writes m into the job's backup directory dir, whole or
// not at all.
func WriteBackupMark(dir string, m BackupMark) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+backupMarkFile+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, backupMarkFile))
}

// ReadBackupMark reads the mark in the job's backup directory dir; ok is
// false when there is none. A mark whose step's directory is gone is an
// error.
func ReadBackupMark(dir string) (m BackupMark, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, backupMarkFile))
	if errors.Is(err, os.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Step < 1 || m.Dp < 1 {
		return m, false, fmt.Errorf("backup mark %s: %q is not a step", filepath.Join(dir, backupMarkFile), b)
	}
	if fi, err := os.Stat(filepath.Join(dir, strconv.FormatInt(m.Step, 10))); err != nil || !fi.IsDir() {
		return m, false, fmt.Errorf("backup mark %s names step %d, which %s does not hold", filepath.Join(dir, backupMarkFile), m.Step, dir)
	}
	return m, true, nil
}
