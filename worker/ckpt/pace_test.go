package ckpt

import (
	"context"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestPacePause(t *testing.T) {
	paced := Pace{Share: 0.25, Within: 100 * ms}
	tests := []struct {
		name            string
		pace            Pace
		elapsed, paused time.Duration
		sent, total     int64
		want            time.Duration
	}{
		{name: "zero pace", pace: Pace{}, elapsed: 4 * ms, sent: 1, total: 8},
		{name: "a whole core", pace: Pace{Share: 1, Within: 100 * ms}, elapsed: 4 * ms, sent: 1, total: 8},
		{name: "no bound", pace: Pace{Share: 0.25}, elapsed: 4 * ms, sent: 1, total: 8},
		{name: "nothing sent yet", pace: paced, elapsed: 4 * ms, sent: 0, total: 8},
		{name: "all sent", pace: paced, elapsed: 4 * ms, sent: 8, total: 8},
		// 4 ms of work is 16 ms at a quarter of a core; the other 7/8 at
		// the same speed (28 ms) fit in the 100 ms.
		{name: "the share", pace: paced, elapsed: 4 * ms, sent: 1, total: 8, want: 12 * ms},
		// Within 40 ms: 4 + 28 ms of work leave 8 ms of pause.
		{name: "the bound", pace: Pace{Share: 0.25, Within: 40 * ms}, elapsed: 4 * ms, sent: 1, total: 8, want: 8 * ms},
		{name: "behind the bound", pace: Pace{Share: 0.25, Within: 30 * ms}, elapsed: 4 * ms, sent: 1, total: 8},
		{name: "past the bound", pace: paced, elapsed: 120 * ms, paused: 10 * ms, sent: 7, total: 8},
		// 8 ms of work after 12 ms of pause: 32 ms at a quarter, 20 gone.
		{name: "after a pause", pace: paced, elapsed: 20 * ms, paused: 12 * ms, sent: 2, total: 8, want: 12 * ms},
		{name: "ahead of the share", pace: paced, elapsed: 20 * ms, paused: 16 * ms, sent: 1, total: 8},
		{name: "too short to take", pace: Pace{Share: 0.5, Within: 100 * ms}, elapsed: 400 * time.Microsecond, sent: 1, total: 8},
		{name: "no work measured", pace: paced, elapsed: 5 * ms, paused: 5 * ms, sent: 1, total: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.pace.Pause(tc.elapsed, tc.paused, tc.sent, tc.total); got != tc.want {
				t.Errorf("Pause(%s, %s, %d, %d) = %s, want %s", tc.elapsed, tc.paused, tc.sent, tc.total, got, tc.want)
			}
		})
	}
}

// TestPacerSpreads runs a pacer on a fake clock: each chunk of a stream
// costs work, a pause costs what it says (late by lag). The stream must
// keep to its share while it can, end within its bound when the work fits
// in it, and never pause at all when it does not.
func TestPacerSpreads(t *testing.T) {
	tests := []struct {
		name   string
		pace   Pace
		work   time.Duration // per chunk
		chunks int
		lag    time.Duration // each pause overshoots by this
		// wantEnd: when the stream must have ended (at most), and at least
		// wantLeast.
		wantEnd, wantLeast time.Duration
		wantPauses         bool
	}{
		{name: "not paced", pace: Pace{}, work: ms, chunks: 20, wantEnd: 20 * ms, wantLeast: 20 * ms},
		// 20 ms of work at a quarter of a core, inside 100 ms: 80 ms, less
		// the pause after the last chunk (none: the stream is over).
		{name: "spread by the share", pace: Pace{Share: 0.25, Within: 100 * ms}, work: ms, chunks: 20, wantEnd: 77 * ms, wantLeast: 77 * ms, wantPauses: true},
		// At a tenth it would take 200 ms: the bound stops it at 60.
		{name: "held to the bound", pace: Pace{Share: 0.1, Within: 60 * ms}, work: ms, chunks: 20, wantEnd: 61 * ms, wantLeast: 55 * ms, wantPauses: true},
		{name: "late timers", pace: Pace{Share: 0.1, Within: 60 * ms}, work: ms, chunks: 20, lag: 2 * ms, wantEnd: 63 * ms, wantLeast: 55 * ms, wantPauses: true},
		// 20 ms of work and 15 ms allowed: never a pause.
		{name: "the work exceeds the bound", pace: Pace{Share: 0.25, Within: 15 * ms}, work: ms, chunks: 20, wantEnd: 20 * ms, wantLeast: 20 * ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var now time.Time
			pauses := 0
			total := int64(tc.chunks) * paceChunk
			p := &pacer{pace: tc.pace, total: total, start: now, now: func() time.Time { return now },
				sleep: func(_ context.Context, d time.Duration) error {
					pauses++
					now = now.Add(d + tc.lag)
					return nil
				}}
			if !tc.pace.paces() {
				p = nil
			}
			for range tc.chunks {
				now = now.Add(tc.work)
				if err := p.sent(t.Context(), paceChunk); err != nil {
					t.Fatal(err)
				}
			}
			end := now.Sub(time.Time{})
			if end > tc.wantEnd || end < tc.wantLeast {
				t.Errorf("the stream ended at %s, want %s to %s", end, tc.wantLeast, tc.wantEnd)
			}
			if (pauses > 0) != tc.wantPauses {
				t.Errorf("%d pauses, want pauses: %v", pauses, tc.wantPauses)
			}
		})
	}
}

// TestPacerStopsWithContext: a pause ends when the context does, with
// its cause.
func TestPacerStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	p := newPacer(Pace{Share: 0.01, Within: time.Hour}, 2*paceChunk)
	p.start = time.Now().Add(-10 * ms) // 10 ms of work: a pause of about a second
	go func() {
		time.Sleep(10 * ms)
		cancel(context.DeadlineExceeded)
	}()
	start := time.Now()
	if err := p.sent(ctx, paceChunk); err != context.DeadlineExceeded {
		t.Fatalf("sent = %v, want the context's cause", err)
	}
	if d := time.Since(start); d > 500*ms {
		t.Fatalf("the pause went on %s after the context ended", d)
	}
}
