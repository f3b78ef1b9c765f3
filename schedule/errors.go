package schedule

import "errors"

// ErrUnknownKind is returned by ParseKind and Build for a schedule name that is
// not one of Kinds().
var ErrUnknownKind = errors.New("schedule: unknown schedule kind")

// ErrBadShape is returned by Build for a (stages, micro-batches, virtual)
// combination that the schedule kind cannot run.
var ErrBadShape = errors.New("schedule: invalid pipeline shape")

// ErrBadCosts is returned by Simulate for costs that are negative, not finite,
// or leave a forward or backward pass with no duration.
var ErrBadCosts = errors.New("schedule: invalid costs")

// ErrInvalid is returned by Validate (and Simulate) for a schedule whose op
// lists are malformed: an op out of range, a pass missing or duplicated, a
// send without its receive, or a pass ordered before its inputs.
var ErrInvalid = errors.New("schedule: invalid schedule")

// ErrDeadlock is returned by Validate when the op lists, executed with
// blocking (rendezvous) sends and receives, reach a state where every
// unfinished rank waits on another one.
var ErrDeadlock = errors.New("schedule: deadlock")
