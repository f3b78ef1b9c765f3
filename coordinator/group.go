package coordinator

import (
	"context"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// writeTimeout bounds one group's write.
const writeTimeout = 10 * time.Second

// groupCommit writes what reports bring in groups, a group commit: the
// first report of a key starts a write at once, and those of the same key
// that arrive while it is under way go together in the next, made as soon
// as it ends. N reports at once so cost a few writes, not N, and none
// waits longer than two writes. Each report's outcome is its own (out,
// by the name it was added under).
type groupCommit[K comparable, V, R any] struct {
	// write writes one group's items (name -> item) and says each one's
	// outcome; it outlives the report that started it, on its own
	// context.
	write func(ctx context.Context, k K, items map[string]V) map[string]R
	// bg holds a write under way at shutdown.
	bg *sync.WaitGroup

	mu   sync.Mutex
	open map[K]*group[V, R] // gathering
	busy map[K]bool         // a write under way
}

type group[V, R any] struct {
	items map[string]V
	done  chan struct{}
	out   map[string]R // set before done closes
}

func newGroupCommit[K comparable, V, R any](bg *sync.WaitGroup, write func(context.Context, K, map[string]V) map[string]R) *groupCommit[K, V, R] {
	return &groupCommit[K, V, R]{write: write, bg: bg, open: map[K]*group[V, R]{}, busy: map[K]bool{}}
}

// add puts item, under name, in k's next group and waits for that group's
// write (or ctx). A second item of a name in one group replaces the first.
func (w *groupCommit[K, V, R]) add(ctx context.Context, k K, name string, item V) (R, error) {
	out, err := w.addAll(ctx, k, map[string]V{name: item})
	return out[name], err
}

// addAll puts items (name -> item) in k's next group, all in the same
// one, and waits once for that group's write (or ctx): a relay's call of
// 32 reports is one wait, not 32. The outcomes are the group's, by name
// (read only: every report of the group shares them).
func (w *groupCommit[K, V, R]) addAll(ctx context.Context, k K, items map[string]V) (map[string]R, error) {
	w.mu.Lock()
	g := w.open[k]
	if g == nil {
		g = &group[V, R]{items: make(map[string]V, len(items)), done: make(chan struct{})}
		w.open[k] = g
	}
	maps.Copy(g.items, items)
	lead := !w.busy[k]
	w.busy[k] = true
	w.mu.Unlock()
	if lead {
		w.bg.Add(1)
		go func() {
			defer w.bg.Done()
			w.writeAll(k)
		}()
	}
	select {
	case <-g.done:
		return g.out, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// writeAll writes k's groups, one after the other, until none is open.
func (w *groupCommit[K, V, R]) writeAll(k K) {
	for {
		w.mu.Lock()
		g := w.open[k]
		delete(w.open, k)
		if g == nil {
			delete(w.busy, k)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		g.out = w.write(ctx, k, g.items)
		cancel()
		close(g.done)
	}
}
