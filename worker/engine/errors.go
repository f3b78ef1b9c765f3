package engine

import "errors"

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
