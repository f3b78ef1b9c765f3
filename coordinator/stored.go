package coordinator

import (
	"context"
	"maps"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// storedTxnOps bounds the records one transaction writes: etcd's default
// --max-txn-ops is 128.
const storedTxnOps = 128

// The Stored records that reach this coordinator are written in groups
// (groupCommit): the records of one generation of a job that arrive while
// a group is being written go in the next, in as few transactions as etcd
// takes, and the writer of a group (not each report) looks for the commit
// it completes. A commit of N nodes so costs about N/128 writes of
// records at each coordinator, not N, and its latency is a few round
// trips to etcd whatever N is.
type storedWriter = groupCommit[storedKey, storedItem, storedOutcome]

// storedKey is a group: a job's generation, by its revision.
type storedKey struct {
	job    string
	genRev int64
}

// storedItem is one node's record, with the generation it was reported in.
type storedItem struct {
	gen *pb.Generation
	rec *pb.Stored
}

// storedOutcome is a group's: the job's last committed step after the
// write, or stale when the generation moved on (nothing was written).
type storedOutcome struct {
	committed int64
	stale     bool
	err       error
}

func newStoredWriter(s *server) *storedWriter {
	return newGroupCommit(&s.background, func(ctx context.Context, k storedKey, items map[string]storedItem) map[string]storedOutcome {
		var g *pb.Generation
		recs := make(map[string]*pb.Stored, len(items))
		for node, it := range items {
			g, recs[node] = it.gen, it.rec
		}
		var o storedOutcome
		o.committed, o.stale, o.err = s.writeStored(ctx, k.job, g, k.genRev, recs)
		out := make(map[string]storedOutcome, len(items))
		for node := range items {
			out[node] = o
		}
		return out
	})
}

// writeStored writes recs (node -> record) of job's generation g into
// their blocks' keys (by the block's relay: pb.StoredBlock), each block
// added to as the view holds it and written only if no other write
// changed it since (else read again and retried), every transaction on
// the generation's revision rev; then commits the newest step every
// member has stored (commitOf) if the view, once at the last write, shows
// one: a second transaction on the generation's and the commit's
// revisions. It returns the job's last committed step, or stale when the
// generation moved on.
func (s *server) writeStored(ctx context.Context, id string, g *pb.Generation, rev int64, recs map[string]*pb.Stored) (int64, bool, error) {
	byBlock := map[string]map[string]*pb.Stored{}
	for node, r := range recs {
		relay := s.cache.relayOf(id, g.Number, node)
		if byBlock[relay] == nil {
			byBlock[relay] = map[string]*pb.Stored{}
		}
		byBlock[relay][node] = r
	}
	relays := slices.Sorted(maps.Keys(byBlock))
	var last int64
	for try := 0; len(relays) > 0; try++ {
		if try == 16 {
			return 0, false, status.Errorf(codes.Aborted, "job %s: writing stored records kept conflicting", id)
		}
		var conflicted []string
		for chunk := range slices.Chunk(relays, storedTxnOps/2) {
			cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.k.generation(id)), "=", rev)}
			ops := make([]clientv3.Op, len(chunk))
			for i, relay := range chunk {
				nodes, at := s.cache.block(id, relay)
				if nodes == nil {
					nodes = map[string]*pb.Stored{}
				}
				maps.Copy(nodes, byBlock[relay])
				key := s.k.storedBlock(id, relay)
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", at))
				ops[i] = clientv3.OpPut(key, encode(&pb.StoredBlock{Nodes: nodes}))
			}
			resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(s.k.generation(id), clientv3.WithKeysOnly())).Commit()
			if err != nil {
				return 0, false, etcdErr(err)
			}
			if resp.Succeeded {
				last = resp.Header.Revision
				continue
			}
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].ModRevision != rev {
				return 0, true, nil // a new generation
			}
			// Another coordinator wrote one of the blocks: read it again
			// once the view has the write.
			if err := s.cache.waitRev(ctx, resp.Header.Revision); err != nil {
				return 0, false, status.FromContextError(err).Err()
			}
			conflicted = append(conflicted, chunk...)
		}
		relays = conflicted
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
