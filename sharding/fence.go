package sharding

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FenceFile names the file under a checkpoint root that holds the newest
// generation of the job that has started: writers of an older one are
// fenced off (ErrFenced).
const FenceFile = "generation"

// RaiseFence records that generation gen has started writing under root:
// from now on CheckFence refuses every older generation. A lower or equal
// gen leaves the fence as it is. The file is replaced atomically, so a
// reader never sees half of it.
func RaiseFence(root string, gen int64) error {
	cur, err := fence(root)
	if err != nil || cur >= gen {
		return err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("sharding: fence: %w", err)
	}
	tmp, err := os.CreateTemp(root, "."+FenceFile+"-*")
	if err != nil {
		return fmt.Errorf("sharding: fence: %w", err)
	}
	_, err = tmp.WriteString(strconv.FormatInt(gen, 10) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(root, FenceFile))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("sharding: fence: %w", err)
	}
	return nil
}

// CheckFence returns ErrFenced when a generation newer than gen has
// started writing under root, and nil otherwise (no fence yet included).
func CheckFence(root string, gen int64) error {
	cur, err := fence(root)
	if err != nil {
		return err
	}
	if cur > gen {
		return fmt.Errorf("%w: generation %d has started under %s; this is generation %d", ErrFenced, cur, root, gen)
	}
	return nil
}

// fence reads the generation in root's fence file, 0 without one.
func fence(root string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(root, FenceFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sharding: fence: %w", err)
	}
	gen, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: fence file %s: %q", ErrCorrupt, filepath.Join(root, FenceFile), b)
	}
	return gen, nil
}
