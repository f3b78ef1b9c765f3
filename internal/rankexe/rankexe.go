// Package rankexe says which binary runs native ranks (train's, bench's
// and an agent's): gpucoord itself, unless the environment names another.
// The tests run the control plane under the race detector and the ranks,
// whose arithmetic it slows tenfold, without it.
package rankexe

import "os"

// Env names the binary that runs native ranks, when it is not this one.
const Env = "GPUCOORD_RANK_EXECUTABLE"

// Path is the binary that runs native ranks: $GPUCOORD_RANK_EXECUTABLE, or
// this one.
func Path() (string, error) {
	if exe := os.Getenv(Env); exe != "" {
		return exe, nil
	}
	return os.Executable()
}
