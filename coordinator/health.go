package coordinator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// health tracks whether this coordinator reaches etcd. A coordinator that
// does not cannot renew leases, record reports or see decisions, so it
// stops serving: its calls fail Unavailable and its streams end, and the
// agents and launch move to a coordinator that can.
type health struct {
	mu   sync.Mutex
	lost chan struct{} // closed while etcd is unreachable; a fresh one once it is back
	down bool
}

func newHealth() *health { return &health{lost: make(chan struct{})} }

// watch returns a channel closed when etcd becomes unreachable, already
// closed if it is now.
func (h *health) watch() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// isDown reports whether etcd is unreachable now.
func (h *health) isDown() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.down
}

// set records a probe's outcome and says whether the state changed.
func (h *health) set(down bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if down == h.down {
		return false
	}
	h.down = down
	if down {
		close(h.lost)
	} else {
		h.lost = make(chan struct{})
	}
	return true
}

// errEtcdDown is what calls get while etcd is unreachable.
var errEtcdDown = status.Error(codes.Unavailable, "this coordinator cannot reach etcd: try another")

// etcdProbe asks etcd something small that only its current leader
// answers: a probe of whether this coordinator reaches etcd.
func etcdProbe(cli *clientv3.Client, key string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := cli.Get(clientv3.WithRequireLeader(ctx), key, clientv3.WithCountOnly())
		return err
	}
}

// monitor probes etcd every interval until ctx ends. etcd counts as
// unreachable once no probe has been answered for after, and reachable
// again at the next answer. A probe may take up to after: an etcd slow to
// answer under load (a 16,384-node cluster's renewals and reports, on
// the coordinator's cores) is not an unreachable one, and a coordinator
// that stopped serving for it would send every agent's stream elsewhere
// at once.
func (h *health) monitor(ctx context.Context, probe func(context.Context) error, every, after time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	answered := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, after)
		err := probe(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			answered = time.Now()
			if h.set(false) {
				log.Info("etcd is reachable again: serving")
			}
		case time.Since(answered) >= after:
			if h.set(true) {
				log.Warn("etcd is unreachable: this coordinator stops serving so that agents move to another", "err", err, "last_answer", answered.Format(time.RFC3339Nano))
			}
		}
	}
}

// guardStream runs a stream handler that ends with errEtcdDown when etcd
// becomes unreachable: the handler's context is cancelled then.
func (h *health) guardStream(srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	lost := h.watch()
	select {
	case <-lost:
		return errEtcdDown
	default:
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := handler(srv, &guardedStream{ServerStream: ss, ctx: ctx})
	select {
	case <-lost:
		return errEtcdDown
	default:
		return err
	}
}

type guardedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (g *guardedStream) Context() context.Context { return g.ctx }
