package engine

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// NodeFull says whether err is this node's own storage refusing a write
// (its /dev/shm or disk full, a quota): a fault of the node, for now, not
// of the checkpoint step being gathered or restored, which must not be
// marked unrestorable for it (the chaos test's full /dev/shm did: once a
// job lost every kept step, once a restore writing its manifest passed
// over the step).
func NodeFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// unrestorable is the error of a restore that failed with err: the
// checkpoint's fault (ErrUnrestorable), unless ctx ended or the node has
// no room to write (NodeFull), which say nothing of the checkpoint.
func unrestorable(ctx context.Context, err error) error {
	if ctx.Err() != nil || NodeFull(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnrestorable, err)
}

// ErrInvalidJob is wrapped by every error about a job file or an engine
// Config that cannot work: a bad field, a layout that does not divide the
// model or the batch.
var ErrInvalidJob = errors.New("engine: invalid job")

// invalidJob is an ErrInvalidJob whose message stands on its own (a job
// file that cannot be read needs no "invalid job" before its name).
type invalidJob string

func (e invalidJob) Error() string        { return string(e) }
func (e invalidJob) Is(target error) bool { return target == ErrInvalidJob }

// ErrDiverged is returned when a step produces a loss that is not finite.
var ErrDiverged = errors.New("engine: loss is not finite")

// ErrUnrestorable is wrapped by the error of a rank that could not
// restore the checkpoint it resumes from (missing, corrupt, half-written).
var ErrUnrestorable = errors.New("engine: the checkpoint cannot be restored")

// ErrAmbiguousCheckpoint is returned by Restore when Config.CheckpointLayout
// is unknown and the checkpoint directory holds the step at several
// layouts, none of them the rank's own: which one to read is the caller's
// to say.
var ErrAmbiguousCheckpoint = errors.New("engine: several layouts hold the checkpoint")

// ErrPreempted is returned by Train on a rank whose Config.Preempted
// reported true, after the checkpoint of the step every rank finished.
var ErrPreempted = errors.New("engine: preempted after a checkpoint")
