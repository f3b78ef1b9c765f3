package coordinator

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/pki"
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
	// The agent may run its ranks until its own deadline, which the
	// revocation does not move: the latest it can be, the lease's time
	// left now (etcd rounds it up), goes to etcd first, for the leader's
	// fence (fenced) to wait out.
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	ttl, err := c.etcd.Client.TimeToLive(ctx, lease)
	if err != nil {
		return err
	}
	if ttl.TTL > 0 {
		f := fence{Instance: instance, UntilMs: time.Now().Add(time.Duration(ttl.TTL) * time.Second).UnixMilli()}
		if _, err := c.etcd.Client.Put(ctx, keys(c.cfg.Prefix).fence(name), encodeJSON(f)); err != nil {
			return err
		}
	}
	if _, err := c.etcd.Client.Revoke(ctx, lease); err != nil {
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

// gossipFor is what Register tells an agent about the pool: its keys as
// the cache holds them now.
func (s *server) gossipFor(ctx context.Context) *pb.Gossip {
	seeds, _ := gossipSeeds(ctx, s.cli, s.k)
	t := s.cfg.GossipTuning
	keys := s.cache.gossipKeys().keys()
	if len(keys) == 0 {
		keys = s.gossip.Keys // the cache has not read them yet
	}
	return &pb.Gossip{Seeds: seeds, ProbeIntervalMs: t.ProbeInterval.Milliseconds(), ProbeTimeoutMs: t.ProbeTimeout.Milliseconds(), SuspicionMult: int32(t.SuspicionMult),
		Keys: keys, Label: s.gossip.Label}
}

// keyring is the pool's keys as kept in etcd at gossip/key: hex, comma
// separated, the one in use first. A key after it is either installed
// (members accept it; "use" makes it the one in use) or retired (marked
// "-": the one in use before, accepted until "remove").
type keyring []ringKey

type ringKey struct {
	key     []byte
	retired bool
}

func parseKeyring(b []byte) (keyring, error) {
	var r keyring
	for f := range strings.SplitSeq(strings.TrimSpace(string(b)), ",") {
		h, retired := strings.CutPrefix(f, "-")
		k, err := hex.DecodeString(h)
		if err != nil {
			return nil, fmt.Errorf("gossip key: %v", err)
		}
		r = append(r, ringKey{key: k, retired: retired})
	}
	if len(r) == 0 || r[0].retired {
		return nil, errors.New("gossip keys: none in use")
	}
	return r, (gossip.Secure{Keys: r.keys()}).Validate()
}

func (r keyring) String() string {
	var b strings.Builder
	for i, k := range r {
		if i > 0 {
			b.WriteByte(',')
		}
		if k.retired {
			b.WriteByte('-')
		}
		b.WriteString(hex.EncodeToString(k.key))
	}
	return b.String()
}

// keys are the keys, the one in use first.
func (r keyring) keys() [][]byte {
	out := make([][]byte, len(r))
	for i, k := range r {
		out[i] = k.key
	}
	return out
}

func (r keyring) fingerprints() []string {
	var out []string
	for _, k := range r {
		f := gossip.Fingerprint(k.key)
		if k.retired {
			f += " (retired)"
		}
		out = append(out, f)
	}
	return out
}

// step is the keyring after action, a step of a rotation: "install" a new
// key (refused while an earlier rotation is unfinished), "use" the
// installed key (the one in use is retired), "remove" every key but the
// one in use.
func (r keyring) step(action string) (keyring, error) {
	switch action {
	case "install":
		if len(r) > 1 {
			return nil, errors.New("a rotation is under way: finish it (use, then remove) before installing another key")
		}
		k, err := gossip.NewKey()
		if err != nil {
			return nil, err
		}
		return keyring{r[0], {key: k}}, nil
	case "use": // install leaves at most one key beside the one in use
		if len(r) != 2 || r[1].retired {
			return nil, errors.New("no installed key to use: install one first")
		}
		return keyring{r[1], {key: r[0].key, retired: true}}, nil
	case "remove":
		return r[:1], nil
	}
	return nil, fmt.Errorf("gossip key action %q: want install, use, remove or list", action)
}

// clusterGossip returns the pool's keys and label: the keys in etcd (a new
// key, made now, for the first coordinator of the cluster), and a label
// naming the cluster by its etcd prefix.
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
	sec := gossip.Secure{Keys: [][]byte{fresh}, Label: "gpucoord:" + string(k)}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) != 1 {
			return gossip.Secure{}, fmt.Errorf("gossip key in etcd: %s vanished", k.gossipKey())
		}
		r, err := parseKeyring(kvs[0].Value)
		if err != nil {
			return gossip.Secure{}, fmt.Errorf("gossip keys in etcd at %s: %w", k.gossipKey(), err)
		}
		sec.Keys = r.keys()
	}
	return sec, sec.Validate()
}

// GossipKeys implements pb.CoordinatorServer: one step of a rotation, in
// one transaction on the keys as read. Every coordinator and agent takes
// the new keys from its next assignment; an operator lets them all have
// it (a few seconds) before the next step.
func (s *server) GossipKeys(ctx context.Context, req *pb.GossipKeysRequest) (*pb.GossipKeysResponse, error) {
	resp, err := s.cli.Get(ctx, s.k.gossipKey())
	if err != nil {
		return nil, etcdErr(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, status.Error(codes.FailedPrecondition, "no gossip keys in etcd yet")
	}
	r, err := parseKeyring(resp.Kvs[0].Value)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if req.GetAction() == "list" {
		return &pb.GossipKeysResponse{Fingerprints: r.fingerprints()}, nil
	}
	next, err := r.step(req.GetAction())
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v", err)
	}
	txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.gossipKey()), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpPut(s.k.gossipKey(), next.String())).Commit()
	if err != nil {
		return nil, etcdErr(err)
	}
	if !txn.Succeeded {
		return nil, status.Error(codes.Aborted, "the gossip keys changed meanwhile: try again")
	}
	id, _ := ctx.Value(identityKey{}).(pki.Identity)
	s.log.Info("gossip keys changed", "action", req.GetAction(), "keys", strings.Join(next.fingerprints(), ","), "by", id.String())
	return &pb.GossipKeysResponse{Fingerprints: next.fingerprints()}, nil
}

// slogWriter turns memberlist's log lines into debug records.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(b)))
	return len(b), nil
}
