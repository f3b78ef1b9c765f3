package worker

import (
	"strings"
	"testing"
)

func TestFailureCause(t *testing.T) {
	tb := "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    main()\nValueError: bad value 42"
	tests := []struct {
		name, file, output string
		cause, detail      string
	}{
		{"@record's file", `{"message": {"message": "ValueError: bad value 42", "extraInfo": {"py_callstack": "Traceback ...\nValueError: bad value 42\n", "timestamp": "1"}}}`,
			"some output", "ValueError: bad value 42", "Traceback ...\nValueError: bad value 42"},
		{"an older file's plain message", `{"message": "RuntimeError: NCCL error\nmore"}`, "out", "RuntimeError: NCCL error", "out"},
		{"a file without a callstack", `{"message": {"message": "KeyError: 'x'"}}`, "out", "KeyError: 'x'", "out"},
		{"no file: the traceback's last line", "", tb, "ValueError: bad value 42", tb},
		{"a dotted exception type", "", "x\ntorch.distributed.DistBackendError: peer gone", "torch.distributed.DistBackendError: peer gone", "x\ntorch.distributed.DistBackendError: peer gone"},
		{"a bare exception type", "", "KeyboardInterrupt", "KeyboardInterrupt", "KeyboardInterrupt"},
		{"no exception at the end", "", "loss 0.5\nbye", "", "loss 0.5\nbye"},
		{"a file that is not JSON", "not json", tb, "ValueError: bad value 42", tb},
		{"no output at all", "", "", "", ""},
	}
	for _, tc := range tests {
		cause, detail := failureCause([]byte(tc.file), tc.output)
		if cause != tc.cause || detail != tc.detail {
			t.Errorf("%s: (%q, %q), want (%q, %q)", tc.name, cause, detail, tc.cause, tc.detail)
		}
	}
	long := strings.Repeat("x", 3*maxDetail)
	if _, d := failureCause([]byte(`{"message": {"message": "E: m", "extraInfo": {"py_callstack": "`+long+`"}}}`), ""); len(d) != maxDetail+3 {
		t.Errorf("a long callstack kept %d bytes, want the last %d", len(d), maxDetail)
	}
}
