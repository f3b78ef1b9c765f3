package worker

import (
	"cmp"
	"encoding/json"
	"regexp"
	"strings"
)

// EnvErrorFile is where a rank's program may write why it failed, as
// torchrun tells it: PyTorch's @record
// (torch.distributed.elastic.multiprocessing.errors) writes the exception
// and its traceback there.
const EnvErrorFile = "TORCHELASTIC_ERROR_FILE"

// errorFile is what @record writes: {"message": {"message": "ValueError:
// ...", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "..."}}},
// or, from older writers, a plain string message.
type errorFile struct {
	Message json.RawMessage `json:"message"`
}

type errorMessage struct {
	Message   string `json:"message"`
	ExtraInfo struct {
		Callstack string `json:"py_callstack"`
	} `json:"extraInfo"`
}

// exceptionLine matches the last line of a Python traceback: the
// exception's type (maybe dotted) and its message.
var exceptionLine = regexp.MustCompile(`^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)(: .*)?$`)

// failureCause is why a rank failed, in one line, and the text to show
// with it: the error file's message and traceback when the program wrote
// one; else the exception line of a Python traceback that ends the rank's
// output, with that output; else nothing better than the exit status
// (cause "") and the output.
func failureCause(file []byte, output string) (cause, detail string) {
	if len(file) > 0 {
		var f errorFile
		if json.Unmarshal(file, &f) == nil && len(f.Message) > 0 {
			var m errorMessage
			if json.Unmarshal(f.Message, &m) == nil && m.Message != "" {
				return oneLine(m.Message), lastBytes(cmp.Or(strings.TrimRight(m.ExtraInfo.Callstack, "\n"), output))
			}
			var s string
			if json.Unmarshal(f.Message, &s) == nil && s != "" {
				return oneLine(s), output
			}
		}
	}
	lines := strings.Split(strings.TrimRight(output, "\n"), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); exceptionLine.MatchString(last) {
		return last, output
	}
	return "", output
}

// maxDetail bounds the text shown with a failure (the end is kept).
const maxDetail = 16 << 10

// lastBytes is the end of s, at most maxDetail bytes.
func lastBytes(s string) string {
	if len(s) > maxDetail {
		return "..." + s[len(s)-maxDetail:]
	}
	return s
}

// oneLine is s's first line, at most 300 bytes.
func oneLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
