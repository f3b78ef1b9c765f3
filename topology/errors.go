package topology

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error that rejects a cluster, model or
// parallel configuration; the message names the value and the rule.
var ErrInvalid = errors.New("invalid")

// ErrUnknownPreset is wrapped when a cluster or model preset name is unknown.
var ErrUnknownPreset = errors.New("unknown preset")

// invalid returns an error wrapping ErrInvalid.
func invalid(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// invalidErr returns err, which a package below this one returned, as an
// error that also wraps ErrInvalid.
func invalidErr(err error) error {
	return &invalidError{msg: err.Error(), err: err}
}

type invalidError struct {
	msg string
	err error // what it wraps besides ErrInvalid; may be nil
}

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }
func (e *invalidError) Unwrap() error        { return e.err }
