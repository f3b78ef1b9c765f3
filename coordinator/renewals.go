package coordinator

import (
	"sync"
	"time"
)

// renewals are the lease renewals this coordinator sent on the Watch
// streams it serves: each node's last, in memory only. A renewal every
// third of a lease's TTL for every node is too many writes for etcd, and
// only the coordinator holding a node's stream sees them; the dashboard
// shows them for the nodes this coordinator serves and names the serving
// coordinator for the others (conns/<node>).
//
// # Concurrency
//
// Every method may be called from any goroutine.
type renewals struct {
	mu sync.Mutex
	m  map[string]renewal
}

// renewal is the last renewal of a node's lease sent on its stream.
type renewal struct {
	at    time.Time // when it was sent (sent_unix_nanos)
	ttlMs int64     // the lease's TTL, as etcd granted it
}

func newRenewals() *renewals { return &renewals{m: map[string]renewal{}} }

// sent records that node's lease was renewed for ttlMs and the renewal
// sent at at.
func (r *renewals) sent(node string, at time.Time, ttlMs int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[node] = renewal{at: at, ttlMs: ttlMs}
}

// last returns each node's last renewal, for the nodes keep accepts; the
// others are forgotten (a node no longer registered).
func (r *renewals) last(keep func(node string) bool) map[string]renewal {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]renewal, len(r.m))
	for node, x := range r.m {
		if !keep(node) {
			delete(r.m, node)
			continue
		}
		out[node] = x
	}
	return out
}
