package collectives_test

import (
	"errors"
	"testing"

	"github.com/gpucoord/gpucoord/collectives"
)

// MemberIndex is the member-list rule every Grouper applies (Comm.Group and
// the NCCL world's NewGroup).
func TestMemberIndex(t *testing.T) {
	tests := []struct {
		ranks      []int
		size, rank int
		want       int
		wantErr    error
	}{
		{[]int{2, 0, 3}, 4, 0, 1, nil},
		{[]int{3}, 4, 3, 0, nil},
		{[]int{1, 2}, 4, 0, -1, collectives.ErrNotMember},
		{[]int{0, 4}, 4, 0, -1, collectives.ErrInvalid},
		{[]int{0, -1}, 4, 0, -1, collectives.ErrInvalid},
		{[]int{0, 1, 0}, 4, 0, -1, collectives.ErrInvalid},
		{nil, 4, 0, -1, collectives.ErrNotMember},
	}
	for _, tc := range tests {
		got, err := collectives.MemberIndex(tc.ranks, tc.size, tc.rank)
		if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Errorf("MemberIndex(%v, %d, %d) = %d, %v; want %d, %v", tc.ranks, tc.size, tc.rank, got, err, tc.want, tc.wantErr)
		}
	}
}
