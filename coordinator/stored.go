package coordinator

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// storedTxnOps bounds the records one transaction writes: etcd's default
// --max-txn-ops is 128.
const storedTxnOps = 128

// storedWriter writes the Stored records that reach this coordinator in
// groups, a group commit: the records of one generation of a job that
// arrive while a group is being written go in the next, in as few
// transactions as etcd takes, and the writer that wrote a group (not each
// report) looks for the commit it completes. A commit of N nodes so costs
// about N/128 writes of records at each coordinator, not N, and its
// latency is a few round trips to etcd whatever N is.
type storedWriter struct {
	s  *server
	mu sync.Mutex
	// open are the groups collecting records, by job and the revision of
	// the generation they were reported in; busy, those a writer is
	// writing.
	open map[storedKey]*storedGroup
	busy map[storedKey]bool
}

type storedKey struct {
	job    string
	genRev int64
}

// storedGroup is the records a write carries, and its outcome for every
// report in it (set before done closes).
type storedGroup struct {
	gen  *pb.Generation
	recs map[string]*pb.Stored // node -> its newest record
	done chan struct{}

	committed int64 // the job's last committed step after the write
	stale     bool  // the generation moved on: nothing was written
	err       error
}

func newStoredWriter(s *server) *storedWriter {
	return &storedWriter{s: s, open: map[storedKey]*storedGroup{}, busy: map[storedKey]bool{}}
}

// store writes node's record rec in the next group of job's generation g
// (written at genRev) and waits for that group's write and commit. stale
// says the generation is no longer g: nothing was written.
func (w *storedWriter) store(ctx context.Context, job string, g *pb.Generation, genRev int64, node string, rec *pb.Stored) (committed int64, stale bool, err error) {
	k := storedKey{job, genRev}
	w.mu.Lock()
	grp := w.open[k]
	if grp == nil {
		grp = &storedGroup{gen: g, recs: map[string]*pb.Stored{}, done: make(chan struct{})}
		w.open[k] = grp
	}
	grp.recs[node] = rec
	lead := !w.busy[k]
	w.busy[k] = true
	w.mu.Unlock()
	if lead {
		// The write outlives the report that started it: others wait on
		// it. The server's background group holds it at shutdown.
		w.s.background.Add(1)
		go func() {
			defer w.s.background.Done()
			w.writeAll(k)
		}()
	}
	select {
	case <-grp.done:
		return grp.committed, grp.stale, grp.err
	case <-ctx.Done():
		return 0, false, status.FromContextError(ctx.Err()).Err()
	}
}

// writeAll writes k's groups, one after the other, until none is open.
func (w *storedWriter) writeAll(k storedKey) {
	for {
		w.mu.Lock()
		grp := w.open[k]
		delete(w.open, k)
		if grp == nil {
			delete(w.busy, k)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		grp.committed, grp.stale, grp.err = w.s.writeStored(ctx, k.job, grp.gen, k.genRev, grp.recs)
		cancel()
		close(grp.done)
	}
}

// writeStored writes recs (node -> record) of job's generation g, each
// transaction on the generation's revision rev, then commits the newest
// step every member has stored (commitOf) if the view, once at the last
// write, shows one: a second transaction on the generation's and the
// commit's revisions. It returns the job's last committed step.
func (s *server) writeStored(ctx context.Context, id string, g *pb.Generation, rev int64, recs map[string]*pb.Stored) (int64, bool, error) {
	nodes := slices.Sorted(maps.Keys(recs))
	var last int64
	for chunk := range slices.Chunk(nodes, storedTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, node := range chunk {
			ops[i] = clientv3.OpPut(s.k.stored(id, node), encode(recs[node]))
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.generation(id)), "=", rev)).Then(ops...).Commit()
		if err != nil {
			return 0, false, etcdErr(err)
		}
		if !resp.Succeeded {
			return 0, true, nil
		}
		last = resp.Header.Revision
	}
	// The view at this write holds every record written before it: of
	// two coordinators storing the last copies at once, the later sees
	// both.
	if err := s.cache.waitRev(ctx, last); err != nil {
		return 0, false, status.FromContextError(err).Err()
	}
	for range 16 {
		c, prev, prevRev := s.cache.nextCommit(id, g)
		if c == nil {
			return prev, false, nil
		}
		ops := []clientv3.Op{clientv3.OpPut(s.k.commit(id), encode(c))}
		if c.Backup {
			ops = append(ops, clientv3.OpPut(s.k.backup(id), encode(c)))
		}
		cresp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.generation(id)), "=", rev),
			clientv3.Compare(clientv3.ModRevision(s.k.commit(id)), "=", prevRev)).Then(ops...).
			Else(clientv3.OpGet(s.k.generation(id), clientv3.WithKeysOnly()), clientv3.OpGet(s.k.commit(id), clientv3.WithKeysOnly())).Commit()
		if err != nil {
			return 0, false, etcdErr(err)
		}
		if cresp.Succeeded {
			s.log.Debug("committed", "job", id, "generation", g.Number, "step", c.Step, "backup", c.Backup)
			return c.Step, false, nil
		}
		// Another coordinator committed, or a new generation began: look
		// again once the view has the write that did (the keys' own
		// revisions: the watch brings them).
		var newer int64
		for _, r := range cresp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				newer = max(newer, kv.ModRevision)
			}
		}
		if err := s.cache.waitRev(ctx, newer); err != nil {
			return 0, false, status.FromContextError(err).Err()
		}
		if cur, curRev := s.cache.generation(id); cur.GetNumber() != g.Number || curRev != rev {
			return 0, true, nil // the records go again, on the generation as it is
		}
	}
	return 0, false, status.Errorf(codes.Aborted, "job %s: committing kept conflicting", id)
}
