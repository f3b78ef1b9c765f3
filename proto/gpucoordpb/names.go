package gpucoordpb

import (
	"fmt"
	"slices"
	"strings"
)

// Limits on names, in bytes (every allowed character is one byte).
const (
	// MaxJobIDLen bounds a job id.
	MaxJobIDLen = 63
	// MaxNodeNameLen bounds a node's name, as DNS bounds a host name.
	MaxNodeNameLen = 253
)

// ReservedNames are the names of the directories gpucoord keeps its own
// files in, beside or above jobs' and nodes' directories: no job or node
// is named so.
var ReservedNames = []string{"gpucoord", "jobs", "logs", "checkpoints"}

// JobIDRule says what a job id may be, as CheckJobID's errors say it.
var JobIDRule = nameRule(MaxJobIDLen)

// NodeNameRule says what a node's name may be, as CheckNodeName's errors
// say it.
var NodeNameRule = nameRule(MaxNodeNameLen)

func nameRule(max int) string {
	return fmt.Sprintf("want 1 to %d of the characters A-Z a-z 0-9 . _ -, starting with a letter or digit, and not %s",
		max, strings.Join(ReservedNames, ", "))
}

// CheckJobID returns an error that says what a job id may be when id is
// not one: 1 to MaxJobIDLen characters of [A-Za-z0-9._-], the first a
// letter or a digit, and none of ReservedNames. A job id so checked is one
// path element that is never "." or "..", never hidden, and never the name
// of a directory gpucoord keeps for itself: it is the one rule for job ids
// on both sides of the wire (the coordinator's ValidateSpec, launch, the
// agent, its checkpoint holder and its node server).
func CheckJobID(id string) error {
	if !validName(id, MaxJobIDLen) {
		return fmt.Errorf("job id %q: %s", id, JobIDRule)
	}
	return nil
}

// CheckNodeName is CheckJobID's rule for a node's name, up to
// MaxNodeNameLen characters (a host name, or its first label, fits). A
// name so checked cannot start with a coordinator's gossip prefix, which
// holds a ':'.
func CheckNodeName(name string) error {
	if !validName(name, MaxNodeNameLen) {
		return fmt.Errorf("node name %q: %s", name, NodeNameRule)
	}
	return nil
}

// validName applies the rule of names of at most max characters.
func validName(s string, max int) bool {
	if s == "" || len(s) > max || slices.Contains(ReservedNames, s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}
