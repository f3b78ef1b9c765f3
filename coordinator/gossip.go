package coordinator

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/gossip"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// A node gossips in the pool of its failure domain (gpucoordpb.
// FailureDomain; the nodes that name none share one pool). Coordinators
// are members of none: a member that sees another of its pool declared
// dead tells them (PoolReport), and they take it only from a node of the
// same domain by their own records, once enough of the pool has said so
// (deathQuorum).

// maxSeeds is how many members of its domain's pool a node is given to
// join: any one live is enough; more make a pool split by a bad moment
// (two nodes registering at once, each given no seed) mend sooner.
const maxSeeds = 4

// deathWindow is how long the reports of one death are gathered: a
// report after it, of a death not acted on, starts the count again.
const deathWindow = time.Minute

// deathQuorum is how many members of its pool must report a node's death
// before it is acted on, in a pool of members registered nodes (the dead
// one included): two, so that one member cut off from the rest of its
// pool, which sees every other dead, cannot take them out of the
// cluster; one where the pool has no third member to say otherwise.
func deathQuorum(members int) int {
	if members <= 2 {
		return 1
	}
	return 2
}

// deathVerdict is what a coordinator makes of a member's death reported by
// another member of the pool.
type deathVerdict int

const (
	// deathCounted: the report counts toward the quorum.
	deathCounted deathVerdict = iota
	// deathUnknown: no node of the name is registered (its lease ended, it
	// left, or it never was).
	deathUnknown
	// deathEarlier: the dead member is an earlier run of a node that has
	// registered again; the run registered now is left alone.
	deathEarlier
	// deathForeign: the dead node is of another failure domain than the
	// reporter, by the coordinator's records: refused.
	deathForeign
	// deathSelf: the reporter named itself: ignored.
	deathSelf
)

func (v deathVerdict) String() string {
	return [...]string{"counted", "not registered", "an earlier run", "another failure domain", "the reporter itself"}[v]
}

// judgeDeath is what the death of dead's run instance, reported by
// reporter, counts for; dead is nil when no node of its name is
// registered. Both nodes are as the coordinator registered them, never as
// a report says.
func judgeDeath(reporter, dead *pb.Node, instance string) deathVerdict {
	switch {
	case dead == nil:
		return deathUnknown
	case dead.GetName() == reporter.GetName():
		return deathSelf
	case dead.GetInstance() != instance:
		return deathEarlier
	case pb.FailureDomain(dead) != pb.FailureDomain(reporter):
		return deathForeign
	}
	return deathCounted
}

// deathKey names one registration of one run of a node: a run that
// registered again (a new lease) is another.
type deathKey struct {
	member string // node#instance
	lease  int64
}

// deathReports gathers the reports of each death, so that a death is acted
// on once, when the quorum has reported it, however many report it.
type deathReports struct {
	mu    sync.Mutex
	m     map[deathKey]*deathTally
	swept time.Time
}

type deathTally struct {
	first time.Time
	by    map[string]bool // the reporters
	acted bool
}

func newDeathReports() *deathReports { return &deathReports{m: map[deathKey]*deathTally{}} }

// add records reporter's report of k's death at now and says whether the
// death is to be acted on now: true once, the first time need reporters
// have reported it within deathWindow.
func (d *deathReports) add(k deathKey, reporter string, need int, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if now.Sub(d.swept) > deathWindow/4 {
		for k, t := range d.m {
			if now.Sub(t.first) > deathWindow {
				delete(d.m, k)
			}
		}
		d.swept = now
	}
	t := d.m[k]
	if t == nil || now.Sub(t.first) > deathWindow && !t.acted {
		t = &deathTally{first: now, by: map[string]bool{}}
		d.m[k] = t
	}
	t.by[reporter] = true
	if t.acted || len(t.by) < need {
		return false
	}
	t.acted = true
	return true
}

// retry forgets that k was acted on (its revocation failed), so that the
// next report of it acts again.
func (d *deathReports) retry(k deathKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := d.m[k]; t != nil {
		t.acted = false
	}
}

// deathSeen is what the reports of a node's death came to, for the
// dashboard: the run reported, how many members of its pool reported it,
// when the first did, and whether this coordinator acted on them.
type deathSeen struct {
	instance  string
	reporters int
	first     time.Time
	acted     bool
}

// byNode returns, for each node whose death was reported within
// deathWindow of now, its latest tally.
func (d *deathReports) byNode(now time.Time) map[string]deathSeen {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]deathSeen{}
	for k, t := range d.m {
		if now.Sub(t.first) > deathWindow {
			continue
		}
		name, instance := gossip.ParseMember(k.member)
		if old, ok := out[name]; !ok || t.first.After(old.first) {
			out[name] = deathSeen{instance: instance, reporters: len(t.by), first: t.first, acted: t.acted}
		}
	}
	return out
}

// PoolReport implements pb.CoordinatorServer: a node's report of the
// members its domain's pool declared dead, and its request for members to
// join. The reporter must be registered with the lease it names; each
// death counts only when the dead node is registered, as the run named,
// in the reporter's domain (judgeDeath), and is handed to revokeDead once
// deathQuorum members have reported it.
func (s *server) PoolReport(ctx context.Context, req *pb.PoolReportRequest) (*pb.PoolReportResponse, error) {
	node := req.GetNode()
	if err := s.asNode(ctx, node); err != nil {
		return nil, err
	}
	if len(req.GetDead()) > maxPoolReport {
		return nil, status.Errorf(codes.InvalidArgument, "%d deaths in one report: at most %d", len(req.GetDead()), maxPoolReport)
	}
	if _, err := s.leaseHolder(ctx, node, clientv3.LeaseID(req.GetLeaseId())); err != nil {
		return nil, err
	}
	me, ok := s.cache.registered(node)
	if !ok || me.lease != req.GetLeaseId() {
		return nil, status.Errorf(codes.Unavailable, "node %q's registration is not in this coordinator's view yet: try again", node)
	}
	if me.node.GetGossipAddr() == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "node %q registered without a gossip address: it is in no pool", node)
	}
	s.poolDeaths(me.node, req.GetDead(), time.Now())
	seeds, members := s.cache.poolOf(pb.FailureDomain(me.node), node, maxSeeds)
	return &pb.PoolReportResponse{Seeds: seeds, Members: int32(members)}, nil
}

// maxPoolReport bounds the deaths one report may name: a pool of a
// failure domain is a few tens of nodes.
const maxPoolReport = 4096

// poolDeaths judges each of the deaths reporter reports, as of now, and
// hands those whose quorum it completes to revokeDead. It returns the
// verdicts, in order.
func (s *server) poolDeaths(reporter *pb.Node, dead []string, now time.Time) []deathVerdict {
	out := make([]deathVerdict, len(dead))
	for i, member := range dead {
		name, instance := gossip.ParseMember(member)
		e, ok := s.cache.registered(name)
		var n *pb.Node
		if ok {
			n = e.node
		}
		v := judgeDeath(reporter, n, instance)
		out[i] = v
		switch v {
		case deathCounted:
			_, members := s.cache.poolOf(pb.FailureDomain(n), "", 0)
			k := deathKey{member: member, lease: e.lease}
			if s.deaths.add(k, reporter.GetName(), deathQuorum(members), now) {
				select {
				case s.dead <- k:
				default:
					s.deaths.retry(k)
					s.log.Warn("gossip: dropped a death: too many at once", "member", member)
				}
			}
		case deathForeign:
			s.log.Warn("gossip: a death reported from another failure domain: refused", "reporter", reporter.GetName(), "domain", pb.FailureDomain(reporter),
				"node", name, "its_domain", pb.FailureDomain(n))
		default:
			s.log.Debug("gossip: a reported death left alone", "reporter", reporter.GetName(), "member", member, "why", v.String())
		}
	}
	return out
}

// revokeDead revokes the lease of every node whose death its pool
// reported (PoolReport), so that the node is lost at once for the leader,
// however its gRPC stream looks (a frozen or cut-off agent keeps its TCP
// connection open). Only the run that died is removed: a node that
// restarted and registered again has another instance, and the death of
// its earlier run, which the pool may declare after the new one
// registered, leaves it alone. Every coordinator the reports reach does
// it; a revocation is idempotent. One that fails is tried again at the
// death's next report.
func (c *Coordinator) revokeDead(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case k := <-c.dead:
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := c.revokeMember(rctx, k.member)
			cancel()
			if err != nil && ctx.Err() == nil {
				c.srv.deaths.retry(k)
				c.log.Warn("gossip: revoke", "member", k.member, "err", err)
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
	// revocation does not move: the latest it can be goes to etcd first,
	// for the leader's fence (fenced) to wait out. If this coordinator
	// serves the run's newest stream, that is the last deadline the stream
	// gave (grants: it gives no more from here), so long as the conns key
	// still names the stream (no later one, on any coordinator, can then
	// take it: the key is fenced). Else it is the lease's time left now
	// (etcd rounds it up).
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	windowed, err := c.fenceWindow(ctx, name, instance, lease)
	if err != nil {
		return err
	}
	if !windowed {
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
	}
	if _, err := c.etcd.Client.Revoke(ctx, lease); err != nil {
		return err
	}
	c.log.Warn("node failed its gossip probes: removed from the pool", "node", name, "domain", pb.FailureDomain(&n))
	return nil
}

// fenceWindow writes the fence of node's run (instance, on lease) as the
// last deadline this coordinator's stream gave it, if the stream is the
// run's newest: it says whether it did.
func (c *Coordinator) fenceWindow(ctx context.Context, node, instance string, lease clientv3.LeaseID) (bool, error) {
	bound, conn, ok := c.srv.grants.stop(node, lease)
	if !ok {
		return false, nil
	}
	k := keys(c.cfg.Prefix)
	f := fence{Instance: instance, UntilMs: bound.UnixMilli(), Window: true, Lease: int64(lease)}
	// The stream's key, open or closed (the agent dropped it: a killed
	// host's agent does).
	fenced := []clientv3.Op{clientv3.OpPut(k.conn(node), connFenced, clientv3.WithLease(lease)), clientv3.OpPut(k.fence(node), encodeJSON(f))}
	resp, err := c.etcd.Client.Txn(ctx).If(clientv3.Compare(clientv3.Value(k.conn(node)), "=", conn)).Then(fenced...).
		Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(k.conn(node)), "=", conn+connClosed)}, fenced, nil)).Commit()
	if err != nil {
		return false, err
	}
	ok = resp.Succeeded || resp.Responses[0].GetResponseTxn().GetSucceeded()
	if ok {
		c.log.Info("gossip: a dead node's run fenced by its stream's last deadline", "node", node, "until", bound.Format(time.RFC3339Nano))
	}
	return ok, nil
}

// gossipFor is what Register tells node n about its domain's pool: some
// of its members to join, its label, and the keys as the cache holds them
// now.
func (s *server) gossipFor(n *pb.Node) *pb.Gossip {
	seeds, _ := s.cache.poolOf(pb.FailureDomain(n), n.GetName(), maxSeeds)
	t := s.cfg.GossipTuning
	keys := s.cache.gossipKeys().keys()
	if len(keys) == 0 {
		keys = s.gossip.Keys // the cache has not read them yet
	}
	return &pb.Gossip{Seeds: seeds, ProbeIntervalMs: t.ProbeInterval.Milliseconds(), ProbeTimeoutMs: t.ProbeTimeout.Milliseconds(), SuspicionMult: int32(t.SuspicionMult),
		Keys: keys, Label: gossip.DomainLabel(s.gossip.Label, pb.FailureDomain(n))}
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
// one transaction on the keys as read. Every agent takes the new keys
// from its next assignment; an operator lets them all have
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
