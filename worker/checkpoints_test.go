package worker

import (
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
)

func TestReplicaPace(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name   string
		recent []time.Duration
		peers  int
		want   ckpt.Pace
	}{
		{name: "no step yet", peers: 1},
		{name: "no peer", recent: []time.Duration{100 * ms}},
		{name: "one peer", recent: []time.Duration{100 * ms}, peers: 1, want: ckpt.Pace{Share: 0.25, Within: 50 * ms}},
		// Two streams share the quarter of a core.
		{name: "two peers", recent: []time.Duration{100 * ms}, peers: 2, want: ckpt.Pace{Share: 0.125, Within: 50 * ms}},
		// The median: one slow step (a restore, a straggler) moves nothing.
		{name: "the median", recent: []time.Duration{80 * ms, 900 * ms, 120 * ms}, peers: 1, want: ckpt.Pace{Share: 0.25, Within: 60 * ms}},
		{name: "no time measured", recent: []time.Duration{0}, peers: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := replicaPace(tc.recent, tc.peers); got != tc.want {
				t.Errorf("replicaPace(%v, %d) = %+v, want %+v", tc.recent, tc.peers, got, tc.want)
			}
		})
	}
}

// TestWroteResume: a node keeps its own files of the resume step only when
// the generation names it among the step's writers.
func TestWroteResume(t *testing.T) {
	held := []*pb.Copies{{Node: "h5", Holders: []string{"h5", "h9"}}, {Node: "h9", Holders: []string{"h9", "h5"}}}
	for _, c := range []struct {
		name string
		g    *pb.Generation
		node string
		want bool
	}{
		{"writer", &pb.Generation{ResumeStep: 11, Checkpoint: held}, "h5", true},
		{"holder of another's files only", &pb.Generation{ResumeStep: 11, Checkpoint: []*pb.Copies{{Node: "h5", Holders: []string{"h5", "h4"}}}}, "h4", false},
		{"not named (it wrote step 11 in a generation never committed)", &pb.Generation{ResumeStep: 11, Checkpoint: held}, "h4", false},
		{"from the backup tier", &pb.Generation{ResumeStep: 11, FromBackup: true}, "h5", false},
		{"no holders named", &pb.Generation{ResumeStep: 11}, "h5", true},
	} {
		if got := wroteResume(c.g, c.node); got != c.want {
			t.Errorf("%s: wroteResume = %v, want %v", c.name, got, c.want)
		}
	}
}
