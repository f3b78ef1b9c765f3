package gpucoordpb_test

import (
	"strings"
	"testing"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestNames: one rule for job ids and node names: a single path element
// of safe characters that is never ".", "..", hidden, or a directory
// gpucoord keeps for itself; the error says what is allowed.
func TestNames(t *testing.T) {
	tests := []struct {
		name     string
		job, nod bool // accepted as a job id, as a node name
	}{
		{"h1", true, true},
		{"node-0", true, true},
		{"job-20260101-120000-abcdef", true, true},
		{"gpu07.rack3.example.com", true, true},
		{"a_b.C-9", true, true},
		{"9", true, true},
		{strings.Repeat("a", 63), true, true},
		{strings.Repeat("a", 64), false, true},
		{strings.Repeat("a", 253), false, true},
		{strings.Repeat("a", 254), false, false},
		{"", false, false},
		{".", false, false},
		{"..", false, false},
		{".logs", false, false},
		{"-rf", false, false},
		{"_x", false, false},
		{"a/b", false, false},
		{"../x", false, false},
		{"a b", false, false},
		{"a\x00b", false, false},
		{"coordinator:A", false, false},
		{"h1#abc", false, false},
		{"é", false, false},
		{"checkpoints", false, false},
		{"logs", false, false},
		{"jobs", false, false},
		{"gpucoord", false, false},
		{"Checkpoints", true, true}, // Linux file names are case-sensitive
	}
	for _, tc := range tests {
		jerr, nerr := pb.CheckJobID(tc.name), pb.CheckNodeName(tc.name)
		if (jerr == nil) != tc.job {
			t.Errorf("CheckJobID(%q) = %v, want ok %v", tc.name, jerr, tc.job)
		}
		if (nerr == nil) != tc.nod {
			t.Errorf("CheckNodeName(%q) = %v, want ok %v", tc.name, nerr, tc.nod)
		}
		if jerr != nil && !strings.Contains(jerr.Error(), pb.JobIDRule) {
			t.Errorf("CheckJobID(%q) = %v: does not say what a job id may be", tc.name, jerr)
		}
		if nerr != nil && !strings.Contains(nerr.Error(), pb.NodeNameRule) {
			t.Errorf("CheckNodeName(%q) = %v: does not say what a node name may be", tc.name, nerr)
		}
	}
	want := "want 1 to 63 of the characters A-Z a-z 0-9 . _ -, starting with a letter or digit, and not gpucoord, jobs, logs, checkpoints"
	if pb.JobIDRule != want {
		t.Errorf("JobIDRule = %q, want %q", pb.JobIDRule, want)
	}
}

// FuzzNames: a name either rule accepts is one clean path element.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"h1", "..", ".logs", "a/b", "checkpoints", "x\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, err := range []error{pb.CheckJobID(s), pb.CheckNodeName(s)} {
			if err != nil {
				continue
			}
			if s == "." || s == ".." || strings.HasPrefix(s, ".") || strings.ContainsAny(s, "/\\\x00: ") {
				t.Fatalf("%q accepted", s)
			}
		}
	})
}
