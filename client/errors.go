package client

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. A call's error wraps one of these where one applies;
// match them with errors.Is. An answer a coordinator gave is also an
// *Error, which names the coordinator and keeps the gRPC status.
var (
	// ErrUnreachable reports that no coordinator answered: each failed with
	// Unavailable or DeadlineExceeded for Config.Rounds passes (a unary
	// call), or no event came for Config.FollowTimeout (Follow).
	ErrUnreachable = errors.New("client: no coordinator answered")
	// ErrInvalid reports a request a coordinator refused as invalid (an
	// InvalidArgument status), such as a job spec that cannot run.
	ErrInvalid = errors.New("client: invalid request")
	// ErrExists reports a Submit of a job id that is already taken.
	ErrExists = errors.New("client: job already exists")
	// ErrNotFound reports a job no coordinator knows.
	ErrNotFound = errors.New("client: no such job")
	// ErrUnauthenticated reports a call without a client certificate the
	// coordinator accepts (see Credentials), or one whose identity may not
	// make it.
	ErrUnauthenticated = errors.New("client: not authenticated")
	// ErrCompacted reports that a coordinator no longer holds the history
	// from the revision a Follow stream asked for. Follow handles it itself
	// (it follows again from the job as it is now), so it is only seen in
	// a Failover's Err.
	ErrCompacted = errors.New("client: history compacted")
	// ErrClosed reports a call on a closed Client.
	ErrClosed = errors.New("client: closed")
)

// UnreachableError is a unary call's failure when no coordinator answered:
// what each one's last attempt met. It matches ErrUnreachable, and unwraps
// to the last coordinator's *Error.
type UnreachableError struct {
	Addrs []string
	// Faults says, for each of Addrs, what its last attempt met, in a few
	// words: "connection refused", "no answer within 10s", ...
	Faults []string
	Last   *Error
}

// Error implements error: one line naming every coordinator.
func (e *UnreachableError) Error() string {
	parts := make([]string, len(e.Addrs))
	for i, a := range e.Addrs {
		parts[i] = a
		if i < len(e.Faults) && e.Faults[i] != "" {
			parts[i] += " (" + e.Faults[i] + ")"
		}
	}
	return "no coordinator answered at " + strings.Join(parts, ", ")
}

// Is matches ErrUnreachable.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

// Unwrap returns the last coordinator's error.
func (e *UnreachableError) Unwrap() error { return e.Last }

// NothingListens says whether every coordinator's fault was of the
// network (refused, unresolved, unroutable): none took the connection, so
// no TLS question arises.
func (e *UnreachableError) NothingListens() bool {
	for _, f := range e.Faults {
		if !slices.Contains(networkFaults, f) {
			return false
		}
	}
	return true
}

// networkFaults are the faults Describe names as they are: the connection
// was not taken.
var networkFaults = []string{"connection refused", "no such host", "no route to host", "network is unreachable"}

// Describe says in a few words why a call to a coordinator failed: a
// connection refused, a name that does not resolve, no answer within the
// timeout, a TLS failure, or the coordinator's own message.
func Describe(err error, connectTimeout time.Duration) string {
	return describe(status.Convert(err), connectTimeout, 0)
}

func describe(st *status.Status, connectTimeout, callTimeout time.Duration) string {
	msg := st.Message()
	for _, short := range networkFaults {
		if strings.Contains(msg, short) {
			return short
		}
	}
	switch {
	case st.Code() == codes.DeadlineExceeded && callTimeout > 0:
		return fmt.Sprintf("no answer within %s", callTimeout)
	case st.Code() == codes.DeadlineExceeded, strings.Contains(msg, "server preface"), strings.Contains(msg, "deadline exceeded"),
		strings.Contains(msg, "i/o timeout"):
		return fmt.Sprintf("no answer within %s", connectTimeout)
	}
	// gRPC wraps transport failures: "connection error: desc = \"...\"".
	if i := strings.LastIndex(msg, "desc = "); i >= 0 {
		msg = strings.Trim(msg[i+len("desc = "):], `"`)
	}
	return msg
}

// Error is a call's failure at one coordinator: the gRPC status it ended
// with, whether the coordinator answered with it or the connection to it
// produced it. errors.Is matches it against the sentinel of its code
// (Unavailable and DeadlineExceeded are ErrUnreachable, InvalidArgument is
// ErrInvalid, AlreadyExists ErrExists, NotFound ErrNotFound,
// Unauthenticated and PermissionDenied ErrUnauthenticated, OutOfRange
// ErrCompacted), and status.Code and status.Convert read its status.
type Error struct {
	// Addr is the coordinator's address.
	Addr string
	// Status is the gRPC status the call ended with.
	Status *status.Status
}

// Error implements error.
func (e *Error) Error() string { return fmt.Sprintf("coordinator %s: %s", e.Addr, e.Status.Message()) }

// GRPCStatus returns the status, for status.FromError.
func (e *Error) GRPCStatus() *status.Status { return e.Status }

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	s := sentinel(e.Status.Code())
	return s != nil && s == target
}

// sentinel returns the sentinel error of a gRPC code, or nil.
func sentinel(c codes.Code) error {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded:
		return ErrUnreachable
	case codes.InvalidArgument:
		return ErrInvalid
	case codes.AlreadyExists:
		return ErrExists
	case codes.NotFound:
		return ErrNotFound
	case codes.Unauthenticated, codes.PermissionDenied:
		return ErrUnauthenticated
	case codes.OutOfRange:
		return ErrCompacted
	}
	return nil
}

// unaryFault reports whether a unary call that ended with code may
// succeed at another coordinator: this one is down, cut off or too slow.
// Any other answer would come from every coordinator.
func unaryFault(c codes.Code) bool {
	return c == codes.Unavailable || c == codes.DeadlineExceeded
}

// refusal reports whether a Follow stream that ended with code was
// refused for a reason every coordinator shares (no credentials, an unknown
// job). A stream that breaks in any other way is this coordinator's
// fault: it stopped, lost etcd, or the connection broke.
func refusal(c codes.Code) bool {
	switch c {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.Unimplemented:
		return true
	}
	return false
}
