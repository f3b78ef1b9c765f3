package coordinator

import (
	"testing"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestFirstFailure: the cause of a failed generation is the rank that
// failed first in time, whatever order the reports came in.
func TestFirstFailure(t *testing.T) {
	type exit struct {
		rank int32
		code int32
		at   int64
	}
	tests := []struct {
		name     string
		reported []exit // in the order written
		want     int32  // rank; -1 for none
	}{
		{name: "none failed", reported: []exit{{0, 0, 0}, {1, 0, 0}}, want: -1},
		{name: "one failed", reported: []exit{{0, 0, 0}, {1, 7, 100}}, want: 1},
		{name: "earlier failure reported later", reported: []exit{{2, 1, 250}, {5, 1, 260}, {0, 1, 100}}, want: 0},
		{name: "a success does not count however early", reported: []exit{{3, 0, 0}, {2, 1, 300}, {1, 1, 200}}, want: 1},
		{name: "untimed reports keep the order written", reported: []exit{{4, 1, 0}, {1, 1, 0}}, want: 4},
		{name: "a timed failure beats an untimed one", reported: []exit{{4, 1, 0}, {1, 1, 500}}, want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := &job{exits: map[int32]*pb.RankExit{}}
			for _, e := range tc.reported {
				j.exits[e.rank] = &pb.RankExit{Rank: e.rank, Code: e.code, FailedAtUnixMs: e.at}
				j.exitOrder = append(j.exitOrder, e.rank)
			}
			got := int32(-1)
			if f := firstFailure(j); f != nil {
				got = f.Rank
			}
			if got != tc.want {
				t.Errorf("first failure is rank %d, want %d", got, tc.want)
			}
		})
	}
}
