package ckpt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// wholeEntry marks a whole step directory: a replica or a fetched step
// gets it in its staging directory, before the one rename that places it;
// the node's own step gets it when every local rank has written the step
// (Seal). It holds the generation that made the step whole. Has looks for
// it and nothing else.
const wholeEntry = ".whole"

// Staging names: dot-prefixed, so that steps, the tar stream and Prune pass
// them by; Begin sweeps what a crash left.
const (
	stagingPrefix = ".in-"
	retiredPrefix = ".old-"
)

// tmpfs and ramfs, whose files are memory: nothing to fsync.
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// durable says whether the holder's root is on a disk, where a step is
// fsynced before it counts as whole (memory-backed roots are lost with the
// host whatever is synced).
func (h *Holder) durable() bool {
	h.diskOnce.Do(func() {
		os.MkdirAll(h.root, 0o755)
		var st syscall.Statfs_t
		if err := syscall.Statfs(h.root, &st); err == nil {
			t := int64(st.Type)
			h.onDisk = t != tmpfsMagic && t != ramfsMagic
		} else {
			h.onDisk = true
		}
	})
	return h.onDisk
}

// Has reports whether src's files of step are whole on this node: a
// replica or fetched step placed by its one rename, or this node's own
// step sealed once every local rank wrote it. A directory still being
// written, or left half-written by a crash, is not.
func (h *Holder) Has(job, src string, step int64) bool {
	fi, err := os.Stat(filepath.Join(h.stepDir(job, src, step), wholeEntry))
	return err == nil && fi.Mode().IsRegular()
}

// Seal marks this node's own files of step of job as whole, once every
// local rank has written them (generation gen's ranks): on a disk root they
// are fsynced first. Only a sealed step is sent, served or gathered from.
func (h *Holder) Seal(job string, gen, step int64) error {
	dir := h.stepDir(job, h.node, step)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("step %d of job %s: no files of this node's ranks: %w", step, job, ErrNotWhole)
	}
	size, err := dirBytes(dir)
	if err != nil {
		return err
	}
	for {
		old := h.ownMax.Load()
		if size <= old || h.ownMax.CompareAndSwap(old, size) {
			break
		}
	}
	if err := h.markWhole(dir, gen); err != nil {
		return fmt.Errorf("sealing step %d of job %s: %w", step, job, err)
	}
	return nil
}

// markWhole fsyncs dir's files when the root is on a disk, then writes
// the whole marker (itself synced, with its directory).
func (h *Holder) markWhole(dir string, gen int64) error {
	durable := h.durable()
	if durable {
		if err := syncTree(dir); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, ".tmp-"+randHex()+wholeEntry)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "generation %d\n", gen)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, wholeEntry))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if durable {
		return syncDir(dir)
	}
	return nil
}

// wholeGeneration is the generation that made dir whole; false when it is
// not whole.
func wholeGeneration(dir string) (int64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, wholeEntry))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(string(b), "generation")), 10, 64)
	return n, err == nil
}

// stage makes a staging directory in parent for a step on its way in.
func stage(parent string) (string, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(parent, stagingPrefix)
}

// place puts staged, a step directory received whole and marked by gen,
// at dst with one rename. A whole dst of the same generation is the same
// files (a step is written once per generation) and stays; anything else
// at dst (another generation's, or not whole) is moved aside first and
// removed. place owns staged: it is gone when place returns.
func (h *Holder) place(staged, dst string, gen int64) error {
	defer os.RemoveAll(staged)
	if err := h.markWhole(staged, gen); err != nil {
		return err
	}
	h.placeMu.Lock()
	defer h.placeMu.Unlock()
	if g, ok := wholeGeneration(dst); ok && g == gen {
		return nil
	}
	var retired string
	if _, err := os.Lstat(dst); err == nil {
		retired = filepath.Join(filepath.Dir(dst), retiredPrefix+randHex())
		if err := os.Rename(dst, retired); err != nil {
			return err
		}
		defer os.RemoveAll(retired)
	}
	if err := os.Rename(staged, dst); err != nil {
		return err
	}
	if h.durable() {
		return syncDir(filepath.Dir(dst))
	}
	return nil
}

// sweep removes what a crash left in job's directories: staging and
// retired step directories.
func (h *Holder) sweep(job string) {
	dirs := append([]string{filepath.Join(h.root, job), h.peers(job)}, h.stepRoots(job)...)
	for _, dir := range dirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if n := e.Name(); strings.HasPrefix(n, stagingPrefix) || strings.HasPrefix(n, retiredPrefix) {
				os.RemoveAll(filepath.Join(dir, n))
			}
		}
	}
}

// syncTree fsyncs every file under dir, then every directory, deepest
// first.
func syncTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		return err
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	f.Close()
	if errors.Is(err, syscall.EINVAL) {
		return nil // a file system that does not sync directories
	}
	return err
}

// dirBytes is the size of the files under dir that a step stream carries
// (not dot files).
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// linkTree puts the files under src (not dot files) into dst, each as a
// hard link (a copy where links fail) under a temporary name renamed into
// place: a step's files are written once and never changed, so sharing
// them costs no memory.
func linkTree(src, dst string) error {
	return eachFile(src, dst, func(path, target string) error {
		tmp := filepath.Join(filepath.Dir(target), ".tmp-"+randHex()+"-"+filepath.Base(target))
		if err := os.Link(path, tmp); err != nil {
			return copyFile(path, target)
		}
		if err := os.Rename(tmp, target); err != nil {
			os.Remove(tmp)
			return err
		}
		return nil
	})
}
