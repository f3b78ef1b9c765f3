package coordinator

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// TestHealthSlowIsNotDown: an etcd that answers each probe late (three
// probe intervals, within after) is reachable; one that answers none for
// after is not, and the next answer makes it reachable again.
func TestHealthSlowIsNotDown(t *testing.T) {
	const every, after = 10 * time.Millisecond, 300 * time.Millisecond
	var mode atomic.Int32 // 0 slow, 1 silent, 2 answering
	var probes atomic.Int64
	probe := func(ctx context.Context) error {
		defer probes.Add(1)
		switch mode.Load() {
		case 0:
			select {
			case <-time.After(3 * every): // an answer, late
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		case 1:
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	h := newHealth()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.monitor(ctx, probe, every, after, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() { cancel(); <-done }()
	waitProbes := func(n int64) {
		t.Helper()
		for start := probes.Load(); probes.Load() < start+n; {
			select {
			case <-time.After(time.Millisecond):
			case <-t.Context().Done():
				t.Fatal("test ended")
			}
		}
	}
	waitProbes(60) // for longer than after, with probes of at least every
	if h.isDown() {
		t.Fatal("down while every probe was answered, late")
	}
	mode.Store(1)
	select {
	case <-h.watch():
	case <-time.After(time.Minute):
		t.Fatal("not down a minute after etcd stopped answering")
	}
	mode.Store(2)
	waitProbes(2) // the first answered probe has set it up before the next begins
	if h.isDown() {
		t.Fatal("still down after etcd answered again")
	}
}
