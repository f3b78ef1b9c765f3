package coordinator

import (
	"errors"
	"fmt"
)

// ErrInvalid marks a request or configuration that cannot work.
var ErrInvalid = errors.New("coordinator: invalid")

// ErrUnavailable marks an etcd or a peer that cannot be reached.
var ErrUnavailable = errors.New("coordinator: unavailable")

// kindError is an error whose message stands alone and which matches a
// sentinel with errors.Is.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string        { return e.msg }
func (e *kindError) Is(target error) bool { return target == e.kind }

// errorf returns a one-line error of the given kind.
func errorf(kind error, format string, a ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, a...)}
}
