package engine

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/sharding"
	"github.com/gpucoord/gpucoord/topology"
)

// Groups are the three process groups one rank belongs to. A nil group is a
// group of one (the rank alone), which needs no communication.
type Groups struct {
	// TP is the tensor-parallel group: the ranks holding pieces of the same
	// layers, group rank = TP coordinate.
	TP collectives.Communicator
	// PP is the pipeline group: one rank per stage, group rank = stage.
	PP collectives.Communicator
	// DP is the data-parallel group: the replicas, group rank = DP coordinate.
	DP collectives.Communicator
}

func groupRank(c collectives.Communicator) (rank, size int) {
	if c == nil {
		return 0, 1
	}
	return c.Rank(), c.Size()
}

// Span is one executed op on a rank's timeline.
type Span struct {
	// Op is F, B (input gradient, or full backward), W, send, recv, or step.
	Op string
	// MB and Chunk are the micro-batch and local chunk, -1 when not relevant.
	MB, Chunk int
	// Start and End are offsets from the start of the step.
	Start, End time.Duration
}

// StepStats splits one step's wall time on one rank.
type StepStats struct {
	// Wall is the step's wall time.
	Wall time.Duration
	// Compute is time in forward, backward and weight passes and the optimizer
	// update, less the TP collectives inside them.
	Compute time.Duration
	// TP is time in tensor-parallel all-reduces.
	TP time.Duration
	// DP is time in data-parallel reductions and parameter gathers, and the
	// loss reduction.
	DP time.Duration
	// Send is time in pipeline sends.
	Send time.Duration
	// Recv is time blocked in pipeline receives: waiting for the neighbour
	// stage (bubble) plus the transfer itself.
	Recv time.Duration
}

// chunkState is a chunk with its buffers on this rank.
type chunkState struct {
	*chunk
	part     *sharding.Partition
	owned    sharding.Range // this DP rank's block of the padded flat buffer
	params   []float32      // full local params (padded); sharded params (ZeRO-3): nil
	shard    []float32      // sharded params (ZeRO-3): the owned block of params
	grads    []float32      // full local gradients; sharded gradients (ZeRO-2/3): nil
	gshard   []float32      // reduce-scattered gradients (ZeRO-1..3): the owned block
	m, v     []float32      // Adam moments of the owned range (replicated optimizer, ZeRO-0: everything)
	stash    map[int]*mbStash
	actIn    map[int][]float32
	gradIn   map[int][]float32
	actOut   map[int][]float32
	gradOut  map[int][]float32
	sendTemp []float32 // gathered after the step (ZeRO-1/2): all-gather source, a copy of the owned block

	// Scratch reused by every pass instead of allocated per micro-batch,
	// made on first use: ZeRO-3's gathered parameters (between acquire and
	// release), ZeRO-2/3's per-micro-batch full gradient and its
	// reduce-scattered block. The memory account still counts them only
	// while a pass uses them, as a framework's buffer pool would.
	gathered, gradTmp, recvTmp []float32
}

// reuse returns *buf resized to n, allocating only the first time; zero
// clears it (for buffers that are accumulated into).
func reuse(buf *[]float32, n int, zero bool) []float32 {
	if cap(*buf) < n {
		*buf = make([]float32, n)
		return *buf
	}
	*buf = (*buf)[:n]
	if zero {
		clear(*buf)
	}
	return *buf
}

// Rank is one process's share of a 3D-parallel training run: the chunks of
// its pipeline stage, cut for its TP rank and sharded for its DP rank. Its
// methods must not be called concurrently.
type Rank struct {
	cfg     *Config
	zero    sharding.StageSpec // what the ZeRO stage keeps whole, shards and communicates
	coord   topology.Coord
	g       Groups
	ops     []schedule.Op
	split   bool // the schedule has separate weight-gradient ops
	chunks  []*chunkState
	teacher *teacher
	log     *slog.Logger
	tp, pp  int // group sizes
	dp      int
	micro   int
	step    int
	loss    float64 // summed per-sample loss of this step on this rank
	mem     Memory
	stepMem Memory // peaks of the last step
	stats   StepStats
	spans   []Span
	t0      time.Time
	x       []float32 // data scratch, micro x Width
	labels  []int32
	y       []float32
}

// NewRank builds the rank at coord with its groups: it cuts its chunks out
// of the initial model (the same for every layout) and allocates buffers
// as the ZeRO stage says.
func NewRank(cfg *Config, coord topology.Coord, g Groups) (*Rank, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		name       string
		comm       collectives.Communicator
		want, size int
	}{{"tp", g.TP, coord.TP, cfg.TP}, {"pp", g.PP, coord.PP, cfg.PP}, {"dp", g.DP, coord.DP, cfg.DP}} {
		rank, size := groupRank(c.comm)
		if size != c.size || rank != c.want {
			return nil, fmt.Errorf("%w: %s group is rank %d of %d, want %d of %d", ErrInvalidJob, c.name, rank, size, c.want, c.size)
		}
	}
	sched, err := cfg.schedule()
	if err != nil {
		return nil, err
	}
	zero, err := cfg.Stage().Spec()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJob, err)
	}
	job := cfg.Job
	r := &Rank{
		cfg: cfg, zero: zero, coord: coord, g: g, ops: sched.Ranks[coord.PP], split: sched.Kind.SplitBackward(),
		teacher: newTeacher(job.Model, job.Seed),
		log:     cfg.logger().With("component", "engine", "tp", coord.TP, "pp", coord.PP, "dp", coord.DP),
		tp:      cfg.TP, pp: cfg.PP, dp: cfg.DP, micro: job.Batch.Micro,
	}
	r.x = make([]float32, r.micro*job.Model.Width)
	r.labels = make([]int32, r.micro)
	r.y = make([]float32, r.micro*job.Model.Outputs)
	perChunk := job.Model.Blocks / (cfg.PP * cfg.Virtual)
	nChunks := cfg.PP * cfg.Virtual
	for k := range cfg.Virtual {
		idx := k*cfg.PP + coord.PP
		c := newChunk(job.Model, idx, idx*perChunk, perChunk, idx == nChunks-1, cfg.TP)
		cs, err := r.newChunkState(c)
		if err != nil {
			return nil, err
		}
		r.chunks = append(r.chunks, cs)
	}
	return r, nil
}

func (r *Rank) newChunkState(c *chunk) (*chunkState, error) {
	tensors := make([]sharding.Tensor, len(c.tensors))
	for i, ti := range c.tensors {
		rows, cols, _, _ := ti.local(r.coord.TP, r.tp)
		tensors[i] = sharding.Tensor{Name: ti.name, Shape: []int{rows, cols}}
	}
	part, err := sharding.NewPartition(tensors, r.dp, nil)
	if err != nil {
		return nil, fmt.Errorf("engine: partition of chunk %d: %w", c.index, err)
	}
	owned, err := part.Range(r.coord.DP)
	if err != nil {
		return nil, err
	}
	cs := &chunkState{
		chunk: c, part: part, owned: owned,
		stash: map[int]*mbStash{}, actIn: map[int][]float32{}, gradIn: map[int][]float32{},
		actOut: map[int][]float32{}, gradOut: map[int][]float32{},
	}
	full := make([]float32, part.PaddedLen())
	for i, ti := range c.tensors {
		initLocal(ti, r.cfg.Job.Seed, r.coord.TP, r.tp, c.view(full, i))
	}
	// Allocate as the stage's Spec says. Buffers made once here are counted
	// once; those made per pass are counted by the pass.
	shardLen := part.ShardLen()
	optLen := len(full)
	if r.zero.OptState == sharding.Sharded {
		optLen = shardLen
	}
	cs.m, cs.v = make([]float32, optLen), make([]float32, optLen)
	r.mem.add(MemOptimizer, 2*optLen)
	switch r.zero.Params {
	case sharding.Replicated:
		cs.params = full
		r.mem.add(MemParams, len(full))
	case sharding.Sharded:
		cs.shard = append([]float32(nil), full[owned.Lo:owned.Hi]...)
		r.mem.add(MemParams, shardLen)
	}
	if r.zero.Gather == sharding.GatherAfterStep {
		// The updated block is copied out of params and gathered back.
		cs.sendTemp = make([]float32, shardLen)
		r.mem.add(MemParams, shardLen)
	}
	if r.zero.Grads == sharding.Replicated {
		cs.grads = make([]float32, len(full))
		r.mem.add(MemGrads, len(full))
	}
	if r.zero.GradSync == sharding.ReduceScatter {
		cs.gshard = make([]float32, shardLen)
		r.mem.add(MemGrads, shardLen)
	}
	return cs, nil
}

// Memory returns the rank's byte accounting so far.
func (r *Rank) Memory() Memory { return r.mem }

// Spans returns the timeline of the last step (only with Config.Timeline).
func (r *Rank) Spans() []Span { return r.spans }

// Stats returns the time split of the last step.
func (r *Rank) Stats() StepStats { return r.stats }

// Step runs optimizer step number step (counting from 0) and returns the
// mean loss over the global batch, the same on every rank. Its errors name
// the step counting from 1, as StepResult.Step does; a loss that is not
// finite is ErrDiverged, named for the step whose forward produced it.
func (r *Rank) Step(ctx context.Context, step int) (float64, error) {
	n := step + 1 // the step as reported
	r.step, r.loss, r.stats, r.spans = step, 0, StepStats{}, r.spans[:0]
	r.mem.resetPeaks()
	r.t0 = time.Now()
	stepped := false
	for _, o := range r.ops {
		if err := r.exec(ctx, o); err != nil {
			return 0, fmt.Errorf("step %d, %s: %w", n, o, err)
		}
		stepped = stepped || o.Kind == schedule.OptimizerStep
	}
	if !stepped {
		if err := r.exec(ctx, schedule.Op{Kind: schedule.OptimizerStep}); err != nil {
			return 0, fmt.Errorf("step %d, optimizer: %w", n, err)
		}
	}
	for _, cs := range r.chunks {
		if left := len(cs.stash) + len(cs.actIn) + len(cs.gradIn) + len(cs.actOut) + len(cs.gradOut); left != 0 {
			return 0, fmt.Errorf("step %d: schedule left %d buffers of chunk %d unconsumed", n, left, cs.index)
		}
	}
	r.stepMem = r.mem
	loss, err := r.reduceLoss(ctx)
	r.stats.Wall = time.Since(r.t0)
	if err != nil {
		return 0, fmt.Errorf("step %d, loss: %w", n, err)
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return loss, fmt.Errorf("step %d: %w (%v)", n, ErrDiverged, loss)
	}
	return loss, nil
}

// reduceLoss sums the loss over DP replicas and hands the last stage's value
// to every stage, then divides by the global batch.
func (r *Rank) reduceLoss(ctx context.Context) (float64, error) {
	start := time.Now()
	defer func() { r.stats.DP += time.Since(start) }()
	buf := []float64{r.loss}
	if r.dp > 1 {
		if err := r.g.DP.AllReduce(ctx, collectives.Float64s(buf), collectives.Sum); err != nil {
			return 0, err
		}
	}
	if r.pp > 1 {
		if err := r.g.PP.Broadcast(ctx, collectives.Float64s(buf), r.pp-1); err != nil {
			return 0, err
		}
	}
	return buf[0] / float64(r.cfg.Job.Batch.Global), nil
}

// record appends a span when the timeline is on.
func (r *Rank) record(name string, mb, chunk int, start time.Time) {
	if r.cfg.Timeline {
		r.spans = append(r.spans, Span{Op: name, MB: mb, Chunk: chunk, Start: start.Sub(r.t0), End: time.Since(r.t0)})
	}
}

// tpReduce is the TP all-reduce of Megatron's f (backward) and g (forward).
func (r *Rank) tpReduce(ctx context.Context, buf []float32) error {
	if r.tp == 1 {
		return nil
	}
	start := time.Now()
	err := r.g.TP.AllReduce(ctx, collectives.Float32s(buf), collectives.Sum)
	r.stats.TP += time.Since(start)
	return err
}

func (r *Rank) exec(ctx context.Context, o schedule.Op) error {
	if o.Kind == schedule.OptimizerStep {
		start := time.Now()
		err := r.optimizerStep(ctx)
		r.record("step", -1, -1, start)
		return err
	}
	if o.Chunk < 0 || o.Chunk >= len(r.chunks) {
		return fmt.Errorf("chunk %d outside [0, %d)", o.Chunk, len(r.chunks))
	}
	cs := r.chunks[o.Chunk]
	defer r.countActivations()
	start := time.Now()
	tp0 := r.stats.TP
	var err error
	switch o.Kind {
	case schedule.Forward:
		err = r.forward(ctx, cs, o)
		r.stats.Compute += time.Since(start) - (r.stats.TP - tp0)
		r.record("F", o.MicroBatch, o.Chunk, start)
	case schedule.Backward:
		err = r.backward(ctx, cs, o)
		r.stats.Compute += time.Since(start) - (r.stats.TP - tp0)
		r.record("B", o.MicroBatch, o.Chunk, start)
	case schedule.WeightGrad:
		dp0 := r.stats.DP
		err = r.weight(ctx, cs, o.MicroBatch)
		r.stats.Compute += time.Since(start) - (r.stats.DP - dp0)
		r.record("W", o.MicroBatch, o.Chunk, start)
	case schedule.SendAct, schedule.SendGrad:
		box := cs.actOut
		if o.Kind == schedule.SendGrad {
			box = cs.gradOut
		}
		buf, ok := box[o.MicroBatch]
		if !ok {
			return fmt.Errorf("nothing to send: op order runs a send before its compute")
		}
		delete(box, o.MicroBatch)
		if r.pp == 1 {
			return fmt.Errorf("send to stage %d with a single stage", o.Peer)
		}
		err = r.g.PP.Send(ctx, collectives.Float32s(buf), o.Peer)
		r.stats.Send += time.Since(start)
		r.record("send", o.MicroBatch, o.Chunk, start)
	case schedule.RecvAct, schedule.RecvGrad:
		box := cs.actIn
		if o.Kind == schedule.RecvGrad {
			box = cs.gradIn
		}
		if r.pp == 1 {
			return fmt.Errorf("receive from stage %d with a single stage", o.Peer)
		}
		buf := make([]float32, r.micro*cs.spec.Width)
		err = r.g.PP.Recv(ctx, collectives.Float32s(buf), o.Peer)
		box[o.MicroBatch] = buf
		r.stats.Recv += time.Since(start)
		r.record("recv", o.MicroBatch, o.Chunk, start)
	default:
		err = fmt.Errorf("unknown op kind %s", o.Kind)
	}
	return err
}

// countActivations sets the activation account to what the stashes and the
// send and receive buffers hold now. It runs after every op, so the peak is
// taken at op boundaries (buffers inside one pass are not counted).
func (r *Rank) countActivations() {
	var n int64
	for _, cs := range r.chunks {
		for _, st := range cs.stash {
			n += st.bytes()
		}
		for _, box := range []map[int][]float32{cs.actIn, cs.gradIn, cs.actOut, cs.gradOut} {
			for _, b := range box {
				n += int64(4 * len(b))
			}
		}
	}
	r.mem.addBytes(MemActivations, n-r.mem.cur[MemActivations])
}

// acquire returns the chunk's full local parameters; when the stage gathers
// them before use (ZeRO-3) it all-gathers them across DP first (release
// frees them again).
func (r *Rank) acquire(ctx context.Context, cs *chunkState) ([]float32, error) {
	if r.zero.Gather != sharding.GatherBeforeUse {
		return cs.params, nil
	}
	start := time.Now()
	defer func() { r.stats.DP += time.Since(start) }()
	full := reuse(&cs.gathered, cs.part.PaddedLen(), false)
	r.mem.add(MemParams, len(full))
	if r.dp == 1 {
		copy(full, cs.shard)
		return full, nil
	}
	if err := r.g.DP.AllGather(ctx, collectives.Float32s(cs.shard), collectives.Float32s(full)); err != nil {
		return nil, err
	}
	return full, nil
}

func (r *Rank) release(cs *chunkState, full []float32) {
	if r.zero.Gather == sharding.GatherBeforeUse {
		r.mem.add(MemParams, -len(full))
	}
}

func (r *Rank) forward(ctx context.Context, cs *chunkState, o schedule.Op) error {
	if _, dup := cs.stash[o.MicroBatch]; dup {
		return fmt.Errorf("forward ran twice")
	}
	n, w := r.micro, cs.spec.Width
	var x []float32
	if cs.index == 0 {
		x = make([]float32, n*w)
		r.teacher.batch(r.cfg.Job.Seed, r.step, r.first(o.MicroBatch), n, x, r.labels, r.y)
	} else {
		var ok bool
		if x, ok = cs.actIn[o.MicroBatch]; !ok {
			return fmt.Errorf("no input activation: op order runs forward before its receive")
		}
		delete(cs.actIn, o.MicroBatch)
	}
	params, err := r.acquire(ctx, cs)
	if err != nil {
		return err
	}
	defer r.release(cs, params)
	st := &mbStash{}
	out, err := cs.forward(ctx, r.tpReduce, params, x, n, st)
	if err != nil {
		return err
	}
	cs.stash[o.MicroBatch] = st
	if cs.hasHead {
		r.teacher.batch(r.cfg.Job.Seed, r.step, r.first(o.MicroBatch), n, r.x, r.labels, r.y)
		r.loss += cs.loss(params, out, r.labels, r.y, float32(1/float64(r.cfg.Job.Batch.Global)), st)
		return nil
	}
	if r.pp == 1 {
		r.chunks[o.Chunk+1].actIn[o.MicroBatch] = out
	} else {
		cs.actOut[o.MicroBatch] = out
	}
	return nil
}

// first returns the global sample index of micro-batch mb of this replica.
func (r *Rank) first(mb int) int {
	return (r.coord.DP*r.cfg.Microbatches() + mb) * r.micro
}

func (r *Rank) backward(ctx context.Context, cs *chunkState, o schedule.Op) error {
	st, ok := cs.stash[o.MicroBatch]
	if !ok {
		return fmt.Errorf("no stash: op order runs backward before forward")
	}
	var dOut []float32
	if !cs.hasHead {
		if dOut, ok = cs.gradIn[o.MicroBatch]; !ok {
			return fmt.Errorf("no output gradient: op order runs backward before its receive")
		}
		delete(cs.gradIn, o.MicroBatch)
	}
	params, err := r.acquire(ctx, cs)
	if err != nil {
		return err
	}
	dx, err := cs.backwardInput(ctx, r.tpReduce, params, dOut, st)
	r.release(cs, params)
	if err != nil {
		return err
	}
	if cs.index > 0 {
		if r.pp == 1 {
			r.chunks[o.Chunk-1].gradIn[o.MicroBatch] = dx
		} else {
			cs.gradOut[o.MicroBatch] = dx
		}
	}
	if !r.split {
		return r.weight(ctx, cs, o.MicroBatch)
	}
	return nil
}

// weight runs the weight-gradient pass of (mb, chunk). When the stage shards
// the gradients (ZeRO-2/3) the micro-batch's gradient is reduce-scattered at
// once into the owned shard, so no full gradient buffer outlives the pass.
func (r *Rank) weight(ctx context.Context, cs *chunkState, mb int) error {
	st, ok := cs.stash[mb]
	if !ok || st.dlogits == nil && st.blocks[0].dz == nil {
		return fmt.Errorf("weight pass of micro-batch %d before its backward", mb)
	}
	delete(cs.stash, mb)
	if r.zero.Grads == sharding.Replicated {
		cs.backwardWeight(cs.grads, st)
		return nil
	}
	grads := reuse(&cs.gradTmp, cs.part.PaddedLen(), true)
	r.mem.add(MemGrads, len(grads))
	defer r.mem.add(MemGrads, -len(grads))
	cs.backwardWeight(grads, st)
	start := time.Now()
	defer func() { r.stats.DP += time.Since(start) }()
	if r.dp == 1 {
		for i, g := range grads {
			cs.gshard[i] += g
		}
		return nil
	}
	recv := reuse(&cs.recvTmp, len(cs.gshard), false)
	if err := r.g.DP.ReduceScatter(ctx, collectives.Float32s(grads), collectives.Float32s(recv), collectives.Sum); err != nil {
		return err
	}
	for i, g := range recv {
		cs.gshard[i] += g
	}
	return nil
}

// optimizerStep reduces gradients across DP as the ZeRO stage says, runs Adam
// on what this rank owns and, when the stage gathers after the step (ZeRO 1
// and 2), all-gathers the updated parameters.
func (r *Rank) optimizerStep(ctx context.Context) error {
	t := r.step + 1
	o := r.cfg.Job.Optimizer
	for _, cs := range r.chunks {
		dpStart := time.Now()
		switch {
		case r.zero.GradSync == sharding.AllReduce:
			// Replicated optimizer: every rank updates its whole replica.
			if r.dp > 1 {
				if err := r.g.DP.AllReduce(ctx, collectives.Float32s(cs.grads), collectives.Sum); err != nil {
					return err
				}
			}
			r.stats.DP += time.Since(dpStart)
			start := time.Now()
			adamUpdate(o, t, cs.params, cs.grads, cs.m, cs.v)
			clear(cs.grads)
			r.stats.Compute += time.Since(start)
			continue
		case r.zero.Grads == sharding.Replicated:
			// Whole gradients accumulated over the micro-batches (ZeRO-1):
			// reduce-scatter them now. Sharded gradients were
			// reduce-scattered pass by pass into gshard.
			if r.dp > 1 {
				if err := r.g.DP.ReduceScatter(ctx, collectives.Float32s(cs.grads), collectives.Float32s(cs.gshard), collectives.Sum); err != nil {
					return err
				}
			} else {
				copy(cs.gshard, cs.grads)
			}
			clear(cs.grads)
		}
		r.stats.DP += time.Since(dpStart)
		start := time.Now()
		owned := cs.shard
		if r.zero.Params == sharding.Replicated {
			owned = cs.sendTemp
			copy(owned, cs.params[cs.owned.Lo:cs.owned.Hi])
		}
		adamUpdate(o, t, owned, cs.gshard, cs.m, cs.v)
		clear(cs.gshard)
		r.stats.Compute += time.Since(start)
		if r.zero.Gather != sharding.GatherAfterStep {
			continue
		}
		gStart := time.Now()
		if r.dp > 1 {
			if err := r.g.DP.AllGather(ctx, collectives.Float32s(owned), collectives.Float32s(cs.params)); err != nil {
				return err
			}
		} else {
			copy(cs.params, owned)
		}
		r.stats.DP += time.Since(gStart)
	}
	return nil
}

// pieces returns this rank's parameter pieces for reassembly, gathering
// sharded parameters (ZeRO-3) across DP first.
func (r *Rank) pieces(ctx context.Context) ([]paramPiece, error) {
	var out []paramPiece
	for _, cs := range r.chunks {
		params, err := r.acquire(ctx, cs)
		if err != nil {
			return nil, err
		}
		for i, ti := range cs.tensors {
			rows, cols, row0, col0 := ti.local(r.coord.TP, r.tp)
			out = append(out, paramPiece{Name: ti.name, Rows: ti.rows, Cols: ti.cols, Row0: row0, Col0: col0,
				PRows: rows, PCols: cols, Data: append([]float32(nil), cs.view(params, i)...)})
		}
		r.release(cs, params)
	}
	return out, nil
}
