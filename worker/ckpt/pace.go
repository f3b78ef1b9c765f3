package ckpt

import (
	"context"
	"time"
)

// Pace spreads a replica's work over the time it has, so that it does not
// take, in one burst at the start of a step, the cores the ranks train on.
// The sender pauses between chunks of the stream (paceChunk bytes): while
// it is ahead, it keeps its share of one core at most Share, and it never
// pauses so long that the rest of the stream, at the speed it has had so
// far, would end more than Within after it started. A sender that is
// behind never pauses, so pacing makes no replica later than Within, or
// than it would have been without pacing. The receiver works as the
// sender sends, so it is paced with it. The zero Pace does not pace.
type Pace struct {
	// Share is the most of one core the sender keeps busy while it is
	// ahead (0.25: a quarter): after working for w, it pauses until w/Share
	// has passed since it started. Outside (0, 1): no pacing.
	Share float64
	// Within is how long after the start the replica may take: the pauses
	// stop once the rest, at the speed so far, would end later. 0: no
	// pacing.
	Within time.Duration
}

// paceChunk is how many bytes of a paced stream go between two pauses.
const paceChunk = 256 << 10

// minPause is the shortest pause taken; a shorter one is skipped (a timer
// costs more than it spreads).
const minPause = 500 * time.Microsecond

// Pause is how long a sender paced by p waits before its next chunk: it
// started elapsed ago, has spent paused of that pausing, and has sent sent
// of total bytes. It reads no clock.
func (p Pace) Pause(elapsed, paused time.Duration, sent, total int64) time.Duration {
	if !p.paces() || sent <= 0 || sent >= total {
		return 0
	}
	busy := elapsed - paused
	if busy <= 0 {
		return 0
	}
	// The share: busy's worth of work should take busy/Share of time.
	d := time.Duration(float64(busy)/p.Share) - elapsed
	// The bound: what is left, at the speed so far, must still end within.
	rest := time.Duration(float64(busy) * float64(total-sent) / float64(sent))
	d = min(d, p.Within-elapsed-rest)
	if d < minPause {
		return 0
	}
	return d
}

// paces says whether p pauses at all.
func (p Pace) paces() bool { return p.Share > 0 && p.Share < 1 && p.Within > 0 }

// pacer applies a Pace to one stream of total bytes: call sent after each
// chunk. The clock and the sleep are its fields, so tests give their own.
type pacer struct {
	pace   Pace
	total  int64
	start  time.Time
	done   int64
	paused time.Duration
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
}

// newPacer starts pacing a stream of total bytes now; nil when pace does
// not pace.
func newPacer(pace Pace, total int64) *pacer {
	if !pace.paces() {
		return nil
	}
	return &pacer{pace: pace, total: total, start: time.Now(), now: time.Now, sleep: sleepCtx}
}

// sent notes n more bytes sent and pauses as the Pace says; it returns
// early with ctx's error when ctx ends. A nil pacer does nothing.
func (p *pacer) sent(ctx context.Context, n int) error {
	if p == nil {
		return nil
	}
	p.done += int64(n)
	now := p.now()
	d := p.pace.Pause(now.Sub(p.start), p.paused, p.done, p.total)
	if d <= 0 {
		return nil
	}
	err := p.sleep(ctx, d)
	p.paused += p.now().Sub(now) // what it really paused: timers run late
	return err
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
