package worker

import (
	"testing"
	"time"

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
