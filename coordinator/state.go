package coordinator

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"

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
//	jobs/<id>/commit                   Step: the last step in a committed checkpoint, and who holds it
//	jobs/<id>/backup                   Step: the last committed step also in the job's checkpoint_backup
//	jobs/<id>/stored/<node>            Stored: the node's checkpoints no commit covers yet
//	jobs/<id>/exits/<gen>/<rank>       RankExit
//	jobs/<id>/times/<gen>/<coord>      TimesSummary: the compute times reported to one coordinator
//	jobs/<id>/stragglers               Stragglers of the current generation
//	jobs/<id>/policy                   jobPolicy: the leader's timers for the job (JSON)
//	conns/<node>                       the node's open Watch stream, leased with the node
//	jobs/<id>/open                     the newest generation whose ranks may start (decimal)
//	jobs/<id>/stopped/<node>           Stopped: the generation below which the node runs no rank (read, no more written)
//	jobs/<id>/stoppedb/<bucket>        StoppedBucket: the same for each node of a bucket (stoppedBucketOf)
//	fences/<node>                      fence: a revoked node's run and its latest deadline (JSON)
//	generations                        the last generation written (<id>/<number>): the transaction of every
//	                                   generation compares its revision with the one the decision saw, so a
//	                                   node in an unfinished job's generation is never given to another
//	                                   (one job per node, by etcd, with one key whatever the cluster's size)
//	policy/nodes/<node>                nodePolicy: strikes and cooldown (JSON), kept across registrations
//	leader                             the election (etcd concurrency package)
//	gossip/key                         the gossip pools' keys (hex, comma-separated, the one in use first), created once
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
func (k keys) backup(id string) string     { return k.job(id) + "backup" }

// storedBlock is the key of the Stored records of the block whose relay
// is relay (pb.StoredBlock).
func (k keys) storedBlock(id, relay string) string { return k.job(id) + "stored/" + relay }
func (k keys) times(id string, gen int64, coordinator string) string {
	return k.job(id) + "times/" + strconv.FormatInt(gen, 10) + "/" + coordinator
}
func (k keys) stragglers(id string) string    { return k.job(id) + "stragglers" }
func (k keys) policy(id string) string        { return k.job(id) + "policy" }
func (k keys) conns() string                  { return string(k) + "conns/" }
func (k keys) generations() string            { return string(k) + "generations" }
func (k keys) fences() string                 { return string(k) + "fences/" }
func (k keys) fence(node string) string       { return k.fences() + node }
func (k keys) open(id string) string          { return k.job(id) + "open" }
func (k keys) stoppedAll(id string) string    { return k.job(id) + "stopped/" }
func (k keys) stopped(id, node string) string { return k.stoppedAll(id) + node }

func (k keys) conn(node string) string       { return k.conns() + node }
func (k keys) nodePolicies() string          { return string(k) + "policy/nodes/" }
func (k keys) nodePolicy(node string) string { return k.nodePolicies() + node }
func (k keys) leader() string                { return string(k) + "leader" }
func (k keys) gossipKey() string             { return string(k) + "gossip/key" }
func (k keys) ca() string                    { return string(k) + "pki/ca" }
func (k keys) tokens() string                { return string(k) + "tokens/" }
func (k keys) token(id string) string        { return k.tokens() + id }
func (k keys) bootstrap(id string, gen int64) string {
	return k.job(id) + "bootstrap/" + strconv.FormatInt(gen, 10)
}
func (k keys) timesOf(id string, gen int64) string {
	return k.job(id) + "times/" + strconv.FormatInt(gen, 10) + "/"
}
func (k keys) exits(id string, gen int64) string {
	return k.job(id) + "exits/" + strconv.FormatInt(gen, 10) + "/"
}
func (k keys) exit(id string, gen int64, rank int32) string {
	return k.exits(id, gen) + strconv.Itoa(int(rank))
}

// maxWorld bounds a generation's ranks: 2,048 nodes of 8 GPUs with room to
// spare.
const maxWorld = 1 << 20

// decodeGeneration reads a generation from etcd and refuses one the leader
// cannot have written (checkGeneration).
func decodeGeneration(b []byte) (*pb.Generation, error) {
	g := &pb.Generation{}
	if err := decode(b, g); err != nil {
		return nil, err
	}
	return g, checkGeneration(g)
}

// checkGeneration refuses a generation the leader cannot have written: its
// members must hold ranks 0 .. world-1 in order, each at least one. The
// cache leaves out one that does not hold (a value written by hand, or by
// another version): every decision may then trust a generation's ranks.
func checkGeneration(g *pb.Generation) error {
	if g.World < 1 || g.World > maxWorld {
		return fmt.Errorf("generation %d: world %d: want 1 to %d", g.Number, g.World, maxWorld)
	}
	next := int32(0)
	for _, m := range g.Members {
		if m.FirstRank != next || m.Ranks < 1 || m.Ranks > g.World-next {
			return fmt.Errorf("generation %d: member %q holds ranks from %d, %d of them: want from %d, 1 to %d", g.Number, m.Node, m.FirstRank, m.Ranks, next, g.World-next)
		}
		next += m.Ranks
	}
	if next != g.World {
		return fmt.Errorf("generation %d: members hold %d ranks of a world of %d", g.Number, next, g.World)
	}
	return nil
}

// encode and decode are the one encoding of values: protobuf's binary
// form, which a generation of 16,384 members takes a tenth of the time
// to write and read that its protojson did (`gpucoord status --json`
// prints them). decode still reads the protojson that earlier versions
// wrote: a value of a message never starts with '{' (field 15 as a
// group, which no message has).
func encode(m proto.Message) string {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err) // only for messages that cannot be marshalled: a bug
	}
	return string(b)
}

func decode(b []byte, m proto.Message) error {
	if len(b) > 0 && b[0] == '{' {
		return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
	}
	return proto.Unmarshal(b, m)
}

// encodeJSON and decodeJSON encode the leader's own bookkeeping, which is
// not part of the protocol.
func encodeJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only for values that cannot be marshalled: a bug
	}
	return string(b)
}

func decodeJSON(b []byte, v any) error { return json.Unmarshal(b, v) }

// jobPolicy is the leader's timers for one job, kept in etcd with it so
// that a new leader goes on where the old one stopped. Times are Unix
// milliseconds of the leader's clock; 0 means unset.
type jobPolicy struct {
	// PendingSince is when the job started waiting for nodes: submitted
	// and not yet frozen, or paused. The rendezvous timeout counts from it.
	PendingSince int64 `json:"pending_since_ms,omitempty"`
	// EnoughSince is when enough nodes were first free: the last call for
	// more counts from it.
	EnoughSince int64 `json:"enough_since_ms,omitempty"`
	// FailedSince is when a failure of the current generation was first
	// seen: its cause is settled FailureSettle later.
	FailedSince int64 `json:"failed_since_ms,omitempty"`
	// GoneSince is, for each node of the current generation's stopping
	// set, when its lease was first seen ended: its ranks count as stopped
	// FenceMargin later.
	GoneSince map[string]int64 `json:"gone_since_ms,omitempty"`
}

// fence is a revoked node's record: the run of its agent (gossip's
// instance) and the latest its deadline can be, on the revoking
// coordinator's clock, since its lease was renewed last.
type fence struct {
	Instance string `json:"instance"`
	UntilMs  int64  `json:"until_ms"`
	// Window says UntilMs is the last deadline the run's serving stream
	// gave it (a window's, Config.FenceWindow, or the lease's without
	// one: grants), not the lease's time left as etcd said it.
	Window bool `json:"window,omitempty"`
	// Lease is the run's lease that a window fence ended (0 in fences
	// written before it was kept).
	Lease int64 `json:"lease,omitempty"`
	// exact, in a view (not stored), says the fence is a window fence of
	// the lease the node's key had when the cache last saw it go: UntilMs
	// is then the latest the run's ranks can run, however late the key
	// was seen gone (fenced).
	exact bool
}

// nodePolicy is what the leader holds against a node, kept across its
// registrations: every loss or eviction is a strike, and a struck node
// waits out a cooldown that doubles with each before a job takes it back.
type nodePolicy struct {
	Strikes       int   `json:"strikes"`
	CooldownUntil int64 `json:"cooldown_until_ms"`
}

// job is what decide knows of one job: its fields of the current
// generation, as the cache held them at one revision.
type job struct {
	spec      *pb.JobSpec
	state     *pb.JobState
	stateRev  int64 // mod revision of the state key, for transactions
	gen       *pb.Generation
	genRev    int64
	step      *pb.Step
	commit    *pb.Step // last committed step; nil before the first
	commitRev int64    // mod revision of the commit key; 0 when it does not exist
	// open is the newest generation opened (Assignment.open); stopped, by
	// node, the generation below which the node runs no rank (Stopped).
	open      int64
	stopped   map[string]int64
	backup    *pb.Step               // last committed step in the backup tier; nil if none
	exits     map[int32]*pb.RankExit // of the current generation
	exitOrder []int32                // ranks in the order their exits were written
	// times is the current generation's compute times, as the
	// coordinators' summaries give them.
	times      timesView
	stragglers *pb.Stragglers
	created    int64 // create revision of the spec: submission order
	policy     jobPolicy
}

// terminal reports whether the job has ended.
func (j *job) terminal() bool { return pb.Terminal(j.state) }

// equal reports whether p and o are the same timers.
func (p jobPolicy) equal(o jobPolicy) bool {
	return p.PendingSince == o.PendingSince && p.EnoughSince == o.EnoughSince && p.FailedSince == o.FailedSince && maps.Equal(p.GoneSince, o.GoneSince)
}

// stoppedBucket is the key of the Stopped records of the nodes of bucket
// b (stoppedBucketOf).
func (k keys) stoppedBucket(id string, b uint32) string {
	return k.job(id) + "stoppedb/" + strconv.FormatUint(uint64(b), 10)
}

// stoppedBuckets is how many buckets a job's Stopped records are kept in:
// 64 nodes a bucket at 16,384, so that a generation's reports are
// written in four transactions of 64 keys.
const stoppedBuckets = 256

// stoppedBucketOf is node's bucket: a hash of its name, the same in every
// generation and on every coordinator.
func stoppedBucketOf(node string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(node))
	return h.Sum32() % stoppedBuckets
}
