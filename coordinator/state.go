package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// keys names the coordinator's etcd keys under one prefix. Every key of a
// job carries its id, so two jobs never share state:
//
//	nodes/<node>                       Node, leased: dies with the node's lease
//	jobs/<id>/spec                     JobSpec, written once by Submit
//	jobs/<id>/state                    JobState
//	jobs/<id>/generation               Generation: the frozen members and layout
//	jobs/<id>/bootstrap/<gen>          Bootstrap: rank 0's rendezvous address and the checkpoint probe
//	jobs/<id>/progress                 Step: rank 0's last finished step
//	jobs/<id>/commit                   Step: the last step in a committed checkpoint
//	jobs/<id>/exits/<gen>/<rank>       RankExit
//	jobs/<id>/times/<gen>/<node>       RankTimes: the node's ranks' last window
//	jobs/<id>/stragglers               Stragglers of the current generation
//	leader                             the election (etcd concurrency package)
//	coordinators/<name>                a coordinator's gossip address, leased
type keys string

func (k keys) nodes() string               { return string(k) + "nodes/" }
func (k keys) node(name string) string     { return k.nodes() + name }
func (k keys) jobs() string                { return string(k) + "jobs/" }
func (k keys) job(id string) string        { return k.jobs() + id + "/" }
func (k keys) spec(id string) string       { return k.job(id) + "spec" }
func (k keys) state(id string) string      { return k.job(id) + "state" }
func (k keys) generation(id string) string { return k.job(id) + "generation" }
func (k keys) progress(id string) string   { return k.job(id) + "progress" }
func (k keys) commit(id string) string     { return k.job(id) + "commit" }
func (k keys) times(id string, gen int64, node string) string {
	return k.job(id) + "times/" + strconv.FormatInt(gen, 10) + "/" + node
}
func (k keys) stragglers(id string) string    { return k.job(id) + "stragglers" }
func (k keys) leader() string                 { return string(k) + "leader" }
func (k keys) coordinators() string           { return string(k) + "coordinators/" }
func (k keys) coordinator(name string) string { return k.coordinators() + name }
func (k keys) bootstrap(id string, gen int64) string {
	return k.job(id) + "bootstrap/" + strconv.FormatInt(gen, 10)
}
func (k keys) exits(id string, gen int64) string {
	return k.job(id) + "exits/" + strconv.FormatInt(gen, 10) + "/"
}
func (k keys) exit(id string, gen int64, rank int32) string {
	return k.exits(id, gen) + strconv.Itoa(int(rank))
}

// encode and decode are the one encoding of values: protojson, readable
// with etcdctl.
func encode(m proto.Message) string {
	b, err := protojson.Marshal(m)
	if err != nil {
		panic(err) // only for messages that cannot be marshalled: a bug
	}
	return string(b)
}

func decode(b []byte, m proto.Message) error {
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
}

// job is everything etcd holds about one job, read in one revision.
type job struct {
	spec      *pb.JobSpec
	state     *pb.JobState
	stateRev  int64 // mod revision of the state key, for transactions
	gen       *pb.Generation
	genRev    int64
	boot      *pb.Bootstrap // of the current generation; nil until reported
	step      *pb.Step
	commit    *pb.Step               // last committed step; nil before the first
	exits     map[int32]*pb.RankExit // of the current generation
	exitOrder []int32                // ranks in the order their exits were written
	// times holds each member node's last window of compute times in the
	// current generation, with the revision that wrote it.
	times      map[string]*pb.TimesHistory
	stragglers *pb.Stragglers
	created    int64 // create revision of the spec: submission order
}

// terminal reports whether the job has ended.
func (j *job) terminal() bool {
	switch j.state.GetPhase() {
	case pb.JobState_SUCCEEDED, pb.JobState_FAILED, pb.JobState_CANCELLED:
		return true
	}
	return false
}

// snapshot is the pool and every job at one etcd revision.
type snapshot struct {
	rev   int64
	nodes map[string]*pb.Node
	// nodeRev is each node key's create revision: a node that registered
	// again (after its lease was lost) has a new one.
	nodeRev map[string]int64
	jobs    []*job // in submission order
}

// read loads a snapshot; only is a job id to read just that job ("" all).
func read(ctx context.Context, cli *clientv3.Client, k keys, only string) (*snapshot, error) {
	nodes, err := cli.Get(ctx, k.nodes(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	prefix := k.jobs()
	if only != "" {
		prefix = k.job(only)
	}
	jr, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(nodes.Header.Revision))
	if err != nil {
		return nil, err
	}
	s := &snapshot{rev: nodes.Header.Revision, nodes: map[string]*pb.Node{}, nodeRev: map[string]int64{}}
	for _, kv := range nodes.Kvs {
		n := &pb.Node{}
		if decode(kv.Value, n) == nil {
			s.nodes[n.Name], s.nodeRev[n.Name] = n, kv.CreateRevision
		}
	}
	byID := map[string]*job{}
	get := func(id string) *job {
		if j := byID[id]; j != nil {
			return j
		}
		j := &job{exits: map[int32]*pb.RankExit{}, times: map[string]*pb.TimesHistory{}}
		byID[id] = j
		return j
	}
	type exitKV struct {
		gen  int64
		rank int32
		rev  int64
		e    *pb.RankExit
	}
	exits := map[string][]exitKV{}
	timesOf := map[string]map[int64]map[string]*pb.TimesHistory{}
	boots := map[string]map[int64]*pb.Bootstrap{}
	for _, kv := range jr.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), k.jobs())
		id, field, ok := strings.Cut(rest, "/")
		if !ok {
			continue
		}
		j := get(id)
		switch {
		case field == "spec":
			j.spec, j.created = &pb.JobSpec{}, kv.CreateRevision
			if err := decode(kv.Value, j.spec); err != nil {
				return nil, fmt.Errorf("job %s spec: %w", id, err)
			}
		case field == "state":
			j.state, j.stateRev = &pb.JobState{}, kv.ModRevision
			decode(kv.Value, j.state)
		case field == "generation":
			j.gen, j.genRev = &pb.Generation{}, kv.ModRevision
			decode(kv.Value, j.gen)
		case field == "progress":
			j.step = &pb.Step{}
			decode(kv.Value, j.step)
		case field == "commit":
			j.commit = &pb.Step{}
			decode(kv.Value, j.commit)
		case field == "stragglers":
			j.stragglers = &pb.Stragglers{}
			decode(kv.Value, j.stragglers)
		case strings.HasPrefix(field, "times/"):
			parts := strings.Split(field, "/")
			if len(parts) != 3 {
				continue
			}
			g, _ := strconv.ParseInt(parts[1], 10, 64)
			t := &pb.TimesHistory{}
			if decode(kv.Value, t) == nil {
				if timesOf[id] == nil {
					timesOf[id] = map[int64]map[string]*pb.TimesHistory{}
				}
				if timesOf[id][g] == nil {
					timesOf[id][g] = map[string]*pb.TimesHistory{}
				}
				timesOf[id][g][parts[2]] = t
			}
		case strings.HasPrefix(field, "bootstrap/"):
			g, _ := strconv.ParseInt(strings.TrimPrefix(field, "bootstrap/"), 10, 64)
			if boots[id] == nil {
				boots[id] = map[int64]*pb.Bootstrap{}
			}
			b := &pb.Bootstrap{}
			if decode(kv.Value, b) == nil {
				boots[id][g] = b
			}
		case strings.HasPrefix(field, "exits/"):
			parts := strings.Split(field, "/")
			if len(parts) != 3 {
				continue
			}
			g, _ := strconv.ParseInt(parts[1], 10, 64)
			e := &pb.RankExit{}
			if decode(kv.Value, e) == nil {
				exits[id] = append(exits[id], exitKV{g, e.Rank, kv.ModRevision, e})
			}
		}
	}
	for id, j := range byID {
		if j.spec == nil {
			continue // a job being deleted, or keys without a spec
		}
		if j.state == nil {
			j.state = &pb.JobState{Phase: pb.JobState_PENDING, FailedRank: -1}
		}
		if j.gen != nil {
			maps.Copy(j.times, timesOf[id][j.gen.Number])
			if j.stragglers != nil && j.stragglers.Generation != j.gen.Number {
				j.stragglers = nil
			}
			j.boot = boots[id][j.gen.Number]
			es := exits[id]
			slices.SortFunc(es, func(a, b exitKV) int { return int(a.rev - b.rev) })
			for _, e := range es {
				if e.gen == j.gen.Number {
					if _, seen := j.exits[e.rank]; !seen {
						j.exitOrder = append(j.exitOrder, e.rank)
					}
					j.exits[e.rank] = e.e
				}
			}
		}
		s.jobs = append(s.jobs, j)
	}
	slices.SortFunc(s.jobs, func(a, b *job) int { return int(a.created - b.created) })
	return s, nil
}

// busy returns the running job of each node that is in one.
func (s *snapshot) busy() map[string]string {
	out := map[string]string{}
	for _, j := range s.jobs {
		if j.terminal() || j.gen == nil {
			continue
		}
		for _, m := range j.gen.Members {
			out[m.Node] = j.spec.Id
		}
	}
	return out
}

// assignment returns what node should run now: the generation of the
// unfinished job that holds it, or an empty Assignment.
func (s *snapshot) assignment(node string) *pb.Assignment {
	for _, j := range s.jobs {
		if j.state.GetPhase() != pb.JobState_RUNNING || j.gen == nil {
			continue // pending, paused or ended: nothing runs
		}
		for _, m := range j.gen.Members {
			if m.Node == node {
				return &pb.Assignment{Job: j.spec.Id, Spec: j.spec, Generation: j.gen, Master: j.boot.GetMaster(), Probe: j.boot.GetProbe()}
			}
		}
	}
	return &pb.Assignment{}
}
