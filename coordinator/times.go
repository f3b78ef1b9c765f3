package coordinator

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// timesBuffer holds the compute-time windows agents reported to this
// coordinator, per job generation and node, and writes each generation's
// as one etcd key (jobs/<id>/times/<gen>/<coordinator>) every flush: the
// writes grow with the coordinators, not with the nodes. A window that was
// not yet written when the coordinator stops is lost; the straggler check
// waits for the next ones.
//
// # Concurrency
//
// add may be called from any goroutine; run flushes.
type timesBuffer struct {
	mu      sync.Mutex
	keep    int // windows kept per node: StragglerWindows
	batches map[timesKey]*timesEntry
}

type timesKey struct {
	job string
	gen int64
}

type timesEntry struct {
	batch *pb.TimesBatch
	dirty bool
}

func newTimesBuffer(keep int) *timesBuffer {
	return &timesBuffer{keep: keep, batches: map[timesKey]*timesEntry{}}
}

// add appends node's window to its history of job's generation gen.
func (b *timesBuffer) add(job string, gen int64, node string, w *pb.RankTimes) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := timesKey{job, gen}
	e := b.batches[k]
	if e == nil {
		e = &timesEntry{batch: &pb.TimesBatch{Nodes: map[string]*pb.TimesHistory{}}}
		b.batches[k] = e
	}
	h := e.batch.Nodes[node]
	if h == nil {
		h = &pb.TimesHistory{}
		e.batch.Nodes[node] = h
	}
	h.Windows = append(h.Windows, w)
	if len(h.Windows) > b.keep {
		h.Windows = h.Windows[len(h.Windows)-b.keep:]
	}
	e.dirty = true
}

// take returns a copy of every batch changed since the last take, and
// forgets the generations current reports as no longer running.
func (b *timesBuffer) take(current func(job string, gen int64) bool) map[timesKey]*pb.TimesBatch {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[timesKey]*pb.TimesBatch{}
	for k, e := range b.batches {
		if !current(k.job, k.gen) {
			delete(b.batches, k)
			continue
		}
		if e.dirty {
			out[k] = proto.Clone(e.batch).(*pb.TimesBatch)
			e.dirty = false
		}
	}
	return out
}

// run writes the changed batches every interval until ctx ends, as the
// coordinator named name.
func (b *timesBuffer) run(ctx context.Context, cli *clientv3.Client, k keys, c *cache, name string, every time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	name = strings.ReplaceAll(name, "/", "_")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for key, batch := range b.take(c.running) {
			wctx, cancel := context.WithTimeout(ctx, every)
			_, err := cli.Put(wctx, k.times(key.job, key.gen, name), encode(batch))
			cancel()
			if err != nil && ctx.Err() == nil {
				log.Warn("writing compute times", "job", key.job, "generation", key.gen, "err", err)
			}
		}
	}
}
