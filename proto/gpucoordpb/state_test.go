package gpucoordpb_test

import (
	"testing"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

func TestTerminal(t *testing.T) {
	tests := []struct {
		state *pb.JobState
		want  bool
	}{
		{nil, false},
		{&pb.JobState{}, false},
		{&pb.JobState{Phase: pb.JobState_PENDING}, false},
		{&pb.JobState{Phase: pb.JobState_RUNNING}, false},
		{&pb.JobState{Phase: pb.JobState_SUCCEEDED}, true},
		{&pb.JobState{Phase: pb.JobState_FAILED}, true},
		{&pb.JobState{Phase: pb.JobState_CANCELLED}, true},
	}
	for _, tc := range tests {
		if got := pb.Terminal(tc.state); got != tc.want {
			t.Errorf("Terminal(%v) = %v, want %v", tc.state.GetPhase(), got, tc.want)
		}
	}
	// Every phase the proto defines is classified above: a new one must be
	// added to Terminal or to this table.
	if n := len(pb.JobState_Phase_name); n != 6 {
		t.Errorf("JobState has %d phases; this test knows 6", n)
	}
}
