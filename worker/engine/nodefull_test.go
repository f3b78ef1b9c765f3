package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// TestNodeFull: a gather or a restore that failed because this node's
// storage is full (as the chaos test's filled /dev/shm made them, through
// the holder's and the sharding's wrappings) is the node's fault, not the
// step's; a step whose files do not check, or whose holders are gone, is
// the step's. Only the step's fault makes a rank's restore unrestorable,
// and never once its context ended.
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
		{"a restore writing its manifest (sharding's commit)",
			fmt.Errorf("restore step 60: /dev/shm/gpucoord/checkpoints/h8/j/own/60/tp1-of-2/chunk0-of-1: %w", fmt.Errorf("sharding: commit step 60: %w",
				&fs.PathError{Op: "write", Path: "/dev/shm/gpucoord/checkpoints/h8/j/own/60/tp1-of-2/chunk0-of-1/step-60/.manifest.json.tmp-1", Err: syscall.ENOSPC})),
			true},
		{"a quota", &fs.PathError{Op: "write", Path: "x", Err: syscall.EDQUOT}, true},
		{"checksums", errors.New("checkpoint stream: the files do not match their checksums (2 listed, 1 read)"), false},
		{"no holder alive", errors.New("restoring step 12: no holder of node a's files answered: b: not alive when the generation was made"), false},
		{"a refused connection", &fs.PathError{Op: "dial", Path: "x", Err: syscall.ECONNREFUSED}, false},
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range tests {
		if got := NodeFull(tc.err); got != tc.want {
			t.Errorf("%s: NodeFull = %v, want %v (%v)", tc.name, got, tc.want, tc.err)
		}
		if got := errors.Is(unrestorable(context.Background(), tc.err), ErrUnrestorable); got == tc.want {
			t.Errorf("%s: unrestorable is ErrUnrestorable: %v, want %v", tc.name, got, !tc.want)
		}
		if errors.Is(unrestorable(ended, tc.err), ErrUnrestorable) {
			t.Errorf("%s: unrestorable once the context ended is ErrUnrestorable", tc.name)
		}
	}
}
