package coordinator

import (
	"context"
	"sync"
	"time"
)

// queue is the leader's work queue of job ids: an id added while already
// waiting is waiting once (events coalesce), an id can be due later (a
// timer of decide's, or a retry backing off), and one id's failures delay
// only that id.
//
// # Concurrency
//
// add and addAfter may be called from any goroutine; one goroutine gets.
type queue struct {
	mu      sync.Mutex
	now     func() time.Time
	waiting map[string]bool
	order   []string
	due     map[string]time.Time
	retries map[string]int
	wake    chan struct{}
}

func newQueue(now func() time.Time) *queue {
	return &queue{now: now, waiting: map[string]bool{}, due: map[string]time.Time{}, retries: map[string]int{}, wake: make(chan struct{}, 1)}
}

// add makes id due now.
func (q *queue) add(id string) {
	q.mu.Lock()
	q.addLocked(id)
	q.mu.Unlock()
	q.signal()
}

func (q *queue) addLocked(id string) {
	if !q.waiting[id] {
		q.waiting[id] = true
		q.order = append(q.order, id)
	}
}

// addAfter makes id due after d, unless it is due sooner already.
func (q *queue) addAfter(id string, d time.Duration) {
	t := q.now().Add(d)
	q.mu.Lock()
	if old, ok := q.due[id]; !ok || t.Before(old) {
		q.due[id] = t
	}
	q.mu.Unlock()
	q.signal()
}

// retry makes id due after a backoff that doubles with each failure in a
// row: 10 ms up to 5 s.
func (q *queue) retry(id string) {
	q.mu.Lock()
	n := q.retries[id]
	q.retries[id]++
	q.mu.Unlock()
	q.addAfter(id, min(10*time.Millisecond<<min(n, 10), 5*time.Second))
}

// forgetRetries resets id's backoff after a success.
func (q *queue) forgetRetries(id string) {
	q.mu.Lock()
	delete(q.retries, id)
	q.mu.Unlock()
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// get returns the next id due, waiting for one until ctx ends.
func (q *queue) get(ctx context.Context) (string, error) {
	for {
		q.mu.Lock()
		now := q.now()
		var next time.Time
		for id, t := range q.due {
			if !t.After(now) {
				delete(q.due, id)
				q.addLocked(id)
			} else if next.IsZero() || t.Before(next) {
				next = t
			}
		}
		if len(q.order) > 0 {
			id := q.order[0]
			q.order = q.order[1:]
			delete(q.waiting, id)
			q.mu.Unlock()
			return id, nil
		}
		q.mu.Unlock()
		var timer *time.Timer
		var fire <-chan time.Time
		if !next.IsZero() {
			timer = time.NewTimer(next.Sub(now))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-q.wake:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
}
