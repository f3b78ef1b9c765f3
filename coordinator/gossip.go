package coordinator

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gpucoord/gpucoord/internal/gossip"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// coordinatorMember prefixes a coordinator's name in the gossip pool; node
// names may not start with it.
const coordinatorMember = "coordinator:"

// Dead implements gossip.Events: a member the pool declared dead is handed
// to revokeDead, which takes its node out of etcd. It never blocks
// memberlist.
func (c *Coordinator) Dead(name string) {
	if strings.HasPrefix(name, coordinatorMember) {
		return
	}
	select {
	case c.dead <- name:
	default:
		c.log.Warn("gossip: dropped a dead-node event", "node", name)
	}
}

// revokeDead revokes the lease of every node whose member the pool declares
// dead, so that the node is lost at once for the leader, however its gRPC
// stream looks (a frozen or cut-off agent keeps its TCP connection open).
// Only the run that died is removed: a node that restarted and registered
// again has another instance, and the death of its earlier run, which the
// pool may declare after the new one registered, leaves it alone. Every
// coordinator does it; a revocation is idempotent.
func (c *Coordinator) revokeDead(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case member := <-c.dead:
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := c.revokeMember(rctx, member)
			cancel()
			if err != nil && ctx.Err() == nil {
				c.log.Warn("gossip: revoke", "member", member, "err", err)
			}
		}
	}
}

// revokeMember revokes the lease of the node registered by the run the
// gossip member names, if that run is still the registered one.
func (c *Coordinator) revokeMember(ctx context.Context, member string) error {
	name, instance := gossip.ParseMember(member)
	resp, err := c.etcd.Client.Get(ctx, keys(c.cfg.Prefix).node(name))
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		return err
	}
	var n pb.Node
	if err := decode(resp.Kvs[0].Value, &n); err != nil {
		return err
	}
	if n.GetInstance() != instance {
		c.log.Info("gossip: an earlier run of a node was declared dead; the node has registered again", "node", name, "dead", instance, "registered", n.GetInstance())
		return nil
	}
	if _, err := c.etcd.Client.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		return err
	}
	c.log.Warn("node failed its gossip probes: removed from the pool", "node", name)
	return nil
}

// advertise publishes this coordinator's gossip address under
// coordinators/<name> for as long as it runs (a leased key), joins the
// members already published, and keeps the key alive.
func (c *Coordinator) advertise(ctx context.Context) error {
	k := keys(c.cfg.Prefix)
	cli := c.etcd.Client
	for ctx.Err() == nil {
		lease, err := cli.Grant(ctx, int64(c.cfg.ElectionTTL/time.Second))
		if err == nil {
			_, err = cli.Put(ctx, k.coordinator(c.cfg.Name), c.pool.LocalNode().Address(), clientv3.WithLease(lease.ID))
		}
		var alive <-chan *clientv3.LeaseKeepAliveResponse
		if err == nil {
			if seeds, err := gossipSeeds(ctx, cli, k); err == nil {
				if _, err := c.pool.Join(seeds); err != nil && len(seeds) > 1 {
					c.log.Warn("gossip: join", "seeds", seeds, "err", err)
				}
			}
			alive, err = cli.KeepAlive(ctx, lease.ID)
		}
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("gossip: advertise", "err", err)
			}
		} else {
			for range alive { // until ctx ends or the lease is lost
			}
		}
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		} else if err == nil {
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			cli.Revoke(rctx, lease.ID)
			cancel()
		}
	}
	return nil
}

// gossipSeeds lists the coordinators' gossip addresses.
func gossipSeeds(ctx context.Context, cli *clientv3.Client, k keys) ([]string, error) {
	resp, err := cli.Get(ctx, k.coordinators(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	seeds := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		seeds = append(seeds, string(kv.Value))
	}
	return seeds, nil
}

// gossipFor is what Register tells an agent about the pool.
func (s *server) gossipFor(ctx context.Context) *pb.Gossip {
	seeds, _ := gossipSeeds(ctx, s.cli, s.k)
	t := s.cfg.GossipTuning
	return &pb.Gossip{Seeds: seeds, ProbeIntervalMs: t.ProbeInterval.Milliseconds(), ProbeTimeoutMs: t.ProbeTimeout.Milliseconds(), SuspicionMult: int32(t.SuspicionMult),
		Key: s.gossip.Key, Label: s.gossip.Label}
}

// clusterGossip returns the pool's key and label: the key the first
// coordinator of the cluster created in etcd (one it makes now if none
// exists), and a label naming the cluster by its etcd prefix.
func clusterGossip(ctx context.Context, cli *clientv3.Client, k keys) (gossip.Secure, error) {
	fresh, err := gossip.NewKey()
	if err != nil {
		return gossip.Secure{}, err
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k.gossipKey()), "=", 0)).
		Then(clientv3.OpPut(k.gossipKey(), hex.EncodeToString(fresh))).Else(clientv3.OpGet(k.gossipKey())).Commit()
	if err != nil {
		return gossip.Secure{}, fmt.Errorf("gossip key in etcd: %w", err)
	}
	sec := gossip.Secure{Key: fresh, Label: "gpucoord:" + string(k)}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) != 1 {
			return gossip.Secure{}, fmt.Errorf("gossip key in etcd: %s vanished", k.gossipKey())
		}
		if sec.Key, err = hex.DecodeString(string(kvs[0].Value)); err != nil {
			return gossip.Secure{}, fmt.Errorf("gossip key in etcd at %s: %w", k.gossipKey(), err)
		}
	}
	return sec, sec.Validate()
}

// slogWriter turns memberlist's log lines into debug records.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(b)))
	return len(b), nil
}
