package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// TestNodeFull: a gather that failed because this node's storage is full
// (as the chaos test's filled /dev/shm made it, through the holder's
// wrappings) is the node's fault, not the step's; a step whose files do
// not check, or whose holders are gone, is the step's.
func TestNodeFull(t *testing.T) {
	enospc := &fs.PathError{Op: "write", Path: "/dev/shm/gpucoord/checkpoints/h4/j/peers/h8/.in-1/shard-0-of-2.bin", Err: syscall.ENOSPC}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"a write to a full /dev/shm", enospc, true},
		{"through the holder's stream and the gather's join",
			fmt.Errorf("restoring step 32: no holder of node h8's files answered: %w",
				errors.Join(errors.New("h8: not alive when the generation was made"), fmt.Errorf("h6: %w", fmt.Errorf("checkpoint stream: step-32/shard-0-of-2.bin: %w", enospc)))),
			true},
		{"a quota", &fs.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT}, true},
		{"checksums", errors.New("checkpoint stream: the files do not match their checksums (2 listed, 1 read)"), false},
		{"no holder alive", errors.New("restoring step 12: no holder of node a's files answered: b: not alive when the generation was made"), false},
		{"a refused connection", &fs.PathError{Op: "dial", Path: "x", Err: syscall.ECONNREFUSED}, false},
	}
	for _, tc := range tests {
		if got := nodeFull(tc.err); got != tc.want {
			t.Errorf("%s: nodeFull = %v, want %v (%v)", tc.name, got, tc.want, tc.err)
		}
	}
}
