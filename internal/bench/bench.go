package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/collectives/shm"
	"github.com/gpucoord/gpucoord/collectives/tcp"
	"github.com/gpucoord/gpucoord/internal/localproc"
)

// Ops are the operations Run can time.
var Ops = []string{"allreduce", "reducescatter", "allgather", "broadcast"}

// Backends are the transports Run can use. "nccl" runs the operations with
// NCCL on device memory (collectives/nccl DeviceBuffers), one GPU per rank
// where there are enough, several ranks per GPU where not.
var Backends = []string{"tcp", "shm", "inmem", "nccl"}

// Config configures a benchmark run. Start from DefaultConfig.
type Config struct {
	// Op is the operation: one of Ops.
	Op string `json:"op"`
	// NP is the number of ranks.
	NP int `json:"np"`
	// Sizes are the buffer sizes in bytes (the all-reduce buffer, the
	// reduce-scatter input, the all-gather output, the broadcast buffer),
	// rounded down to whole float32 elements divisible by NP where the
	// operation needs it.
	Sizes []int `json:"sizes"`
	// Backend is the transport: one of Backends.
	Backend string `json:"backend"`
	// InProc runs the ranks as goroutines of this process instead of child
	// processes (always so for inmem). With nccl it needs a GPU per rank:
	// NCCL refuses two ranks of one process on one GPU.
	InProc bool `json:"inproc"`
	// Warmup is the number of untimed operations per size.
	Warmup int `json:"warmup"`
	// Iters is the number of timed samples per size; 0 picks 7..50 to fill
	// Budget.
	Iters int `json:"iters"`
	// Batch is the number of back-to-back operations in one sample; 0 picks
	// enough for MinSample (at most 100).
	Batch int `json:"batch"`
	// MinSample is the shortest sample the automatic Batch aims for.
	MinSample time.Duration `json:"min_sample"`
	// Budget is roughly how long the samples of one size may take.
	Budget time.Duration `json:"budget"`
	// ChunkBytes overrides collectives.Config.ChunkBytes when > 0.
	ChunkBytes int `json:"chunk_bytes"`
	// DirectBytes overrides collectives.Config.DirectBytes when > 0; < 0
	// sets it to 0, turning the one-round all-reduce off.
	DirectBytes int `json:"direct_bytes"`
	// SmallBytes overrides collectives.Config.SmallBytes when > 0; < 0 sets
	// it to 0, turning the latency algorithms off.
	SmallBytes int `json:"small_bytes"`
	// SocketBuffer sets the TCP send and receive buffers in bytes (0: the
	// kernel's autotuning).
	SocketBuffer int `json:"socket_buffer"`
	// Timeout is the collectives timeout (a dead peer is reported sooner);
	// with nccl it bounds every NCCL call, the communicator's creation
	// included.
	Timeout time.Duration `json:"timeout"`
	// WorkerCommand is the argv that starts one worker process (which must
	// call RunWorker); required unless InProc.
	WorkerCommand []string `json:"-"`
	// Stderr receives the workers' standard error; nil discards it.
	Stderr io.Writer `json:"-"`
}

// DefaultConfig returns a 4-rank TCP all-reduce from 4 KiB to 64 MiB.
func DefaultConfig() *Config {
	sizes, _ := ParseSizes("4K:64M")
	return &Config{Op: "allreduce", NP: 4, Sizes: sizes, Backend: "tcp", Warmup: 3,
		MinSample: 10 * time.Millisecond, Budget: 3 * time.Second, Timeout: 60 * time.Second}
}

// Validate names the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case !slices.Contains(Ops, c.Op):
		return fmt.Errorf("bench: unknown op %q (want one of %s)", c.Op, strings.Join(Ops, ", "))
	case !slices.Contains(Backends, c.Backend):
		return fmt.Errorf("bench: unknown backend %q (want one of %s)", c.Backend, strings.Join(Backends, ", "))
	case c.NP < 1 || c.NP > 1024:
		return fmt.Errorf("bench: np %d is outside [1, 1024]", c.NP)
	case len(c.Sizes) == 0:
		return errors.New("bench: no sizes")
	case c.Warmup < 0 || c.Iters < 0 || c.Batch < 0 || c.SocketBuffer < 0:
		return errors.New("bench: warmup, iters, batch and socket buffer must not be negative")
	case c.MinSample <= 0 || c.Budget <= 0:
		return errors.New("bench: min-sample and budget must be positive")
	case c.Timeout < time.Millisecond:
		return fmt.Errorf("bench: timeout %s is below 1ms", c.Timeout)
	case !c.InProc && c.Backend != "inmem" && len(c.WorkerCommand) == 0:
		return errors.New("bench: WorkerCommand is required to start worker processes")
	}
	for _, s := range c.Sizes {
		if s < 4 || int64(s) > 1<<32 {
			return fmt.Errorf("bench: size %d is outside [4 B, 4 GiB]", s)
		}
	}
	return nil
}

func (c *Config) collectives() *collectives.Config {
	cc := collectives.DefaultConfig()
	cc.Timeout = c.Timeout
	if c.ChunkBytes > 0 {
		cc.ChunkBytes = c.ChunkBytes
	}
	for _, o := range []struct {
		dst *int
		v   int
	}{{&cc.DirectBytes, c.DirectBytes}, {&cc.SmallBytes, c.SmallBytes}} {
		if o.v != 0 {
			*o.dst = max(o.v, 0)
		}
	}
	return cc
}

// Result is the timing of one size. The JSON field names are those of
// nccl-tests-style tools and of the peer baselines in docs/BENCHMARKS.md
// (bytes, median_s), so their drivers read it unchanged.
type Result struct {
	// Op is the operation timed.
	Op string `json:"op"`
	// Backend is the transport used.
	Backend string `json:"backend"`
	// N is the number of ranks.
	N int `json:"n"`
	// SizeBytes is the buffer size in bytes after rounding to whole
	// elements (Count * 4).
	SizeBytes int `json:"size_bytes"`
	// Bytes equals SizeBytes, under the name peer scripts use.
	Bytes int `json:"bytes"`
	// Count is the number of float32 elements in the buffer.
	Count int `json:"count"`
	// Seconds is the median time of one operation, slowest rank per sample.
	Seconds float64 `json:"seconds"`
	// MedianS equals Seconds, under the name peer scripts use.
	MedianS float64 `json:"median_s"`
	// MinS is the fastest sample's time of one operation.
	MinS float64 `json:"min_s"`
	// AlgBW is Bytes / Seconds in GB/s (1e9 bytes).
	AlgBW float64 `json:"algbw_gbps"`
	// BusBW is AlgBW times the operation's bus factor, as nccl-tests
	// defines it.
	BusBW float64 `json:"busbw_gbps"`
	// Iters is the number of timed samples.
	Iters int `json:"iters"`
	// Batch is the number of back-to-back operations in one sample.
	Batch int `json:"batch"`
	// Correct reports whether the checked call gave the expected result on
	// every rank.
	Correct bool `json:"correct"`
	// Host is rank 0's host name. When the same bench runs on every node
	// of a cluster, the lines of a slow node (its GPUs, NVLink or PCIe)
	// stand out by their busbw; within one run every rank waits for the
	// slowest, so no rank of it can.
	Host string `json:"host"`
}

// busFactor converts algbw to busbw as nccl-tests does.
func busFactor(op string, n int) float64 {
	switch op {
	case "allreduce":
		return 2 * float64(n-1) / float64(n)
	case "reducescatter", "allgather":
		return float64(n-1) / float64(n)
	}
	return 1
}

// ParseSizes reads "4K:64M" (powers of two from 4 KiB to 64 MiB), "1M,16M"
// or a single size; suffixes K, M, G (and KiB, MiB, GiB, and KB, MB, GB as
// nccl-tests reads them) are powers of 1024.
func ParseSizes(s string) ([]int, error) {
	if lo, hi, ok := strings.Cut(s, ":"); ok {
		a, err := parseSize(lo)
		if err != nil {
			return nil, err
		}
		b, err := parseSize(hi)
		if err != nil {
			return nil, err
		}
		if a > b {
			return nil, fmt.Errorf("bench: size range %q runs backwards", s)
		}
		var out []int
		for x := a; x <= b; x *= 2 {
			out = append(out, x)
		}
		return out, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		x, err := parseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

func parseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mul := 1
	for _, u := range []struct {
		suf string
		m   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, u.suf) {
			t, mul = strings.TrimSuffix(t, u.suf), u.m
			break
		}
	}
	v, err := strconv.Atoi(t)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bench: bad size %q (want e.g. 4096, 4K, 64M, 64MiB)", s)
	}
	return v * mul, nil
}

// Run times every size and calls emit with each result, in order.
//
// With nccl it first loads NCCL and the CUDA runtime here and counts the
// GPUs (nccl.Devices): where either is missing, or no GPU is visible, it
// returns that error, wrapping nccl.ErrUnavailable, before starting any
// rank.
func Run(ctx context.Context, cfg *Config, emit func(Result) error) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	devices := 0
	if cfg.Backend == "nccl" {
		var err error
		if devices, err = nccl.Devices(nccl.DefaultConfig()); err != nil {
			return err
		}
	}
	if cfg.InProc || cfg.Backend == "inmem" {
		return runInProc(ctx, cfg, devices, emit)
	}
	return runProcs(ctx, cfg, devices, emit)
}

// rankZero passes rank 0's results to emit and drops the others'.
func rankZero(rank int, emit func(Result) error) func(Result) error {
	return func(res Result) error {
		if rank == 0 {
			return emit(res)
		}
		return nil
	}
}

// runInProcNCCL runs the ranks as goroutines, one per GPU.
func runInProcNCCL(ctx context.Context, cfg *Config, devices int, emit func(Result) error) error {
	if cfg.NP > devices {
		return fmt.Errorf("bench: %d ranks in one process need as many GPUs, and %d are visible: NCCL refuses two ranks of one process on one GPU (run the ranks as processes, without --inproc)",
			cfg.NP, devices)
	}
	store := collectives.NewMemStore()
	g, gctx := errgroup.WithContext(ctx)
	for r := range cfg.NP {
		g.Go(func() error {
			device, _ := nccl.PlaceLocal(r, devices, "") // one process: one NCCL host id
			c, err := nccl.New(gctx, cfg.ncclConfig(r, device, store))
			if err != nil {
				return err
			}
			defer c.Close()
			return measure(gctx, cfg, c, devicePayloads(gctx, c, cfg.Op), rankZero(r, emit))
		})
	}
	return g.Wait()
}

// ncclConfig is rank's NCCL communicator of a run of c, on device.
func (c *Config) ncclConfig(rank, device int, store nccl.Store) *nccl.Config {
	nc := nccl.DefaultConfig()
	nc.Rank, nc.Size, nc.Device, nc.Store, nc.Key, nc.Timeout = rank, c.NP, device, store, "bench/nccl", c.Timeout
	return nc
}

func runInProc(ctx context.Context, cfg *Config, devices int, emit func(Result) error) error {
	if cfg.Backend == "nccl" {
		return runInProcNCCL(ctx, cfg, devices, emit)
	}
	comms := make([]*collectives.Comm, cfg.NP)
	switch cfg.Backend {
	case "inmem":
		_, cs, err := collectives.NewInmemWorld(cfg.NP, cfg.collectives())
		if err != nil {
			return err
		}
		copy(comms, cs)
	case "tcp", "shm":
		var ts []transport
		if cfg.Backend == "tcp" {
			tc := tcp.DefaultConfig()
			tc.SocketBuffer = cfg.SocketBuffer
			tt, err := tcp.NewLocal(ctx, cfg.NP, tc)
			if err != nil {
				return err
			}
			for _, t := range tt {
				ts = append(ts, t)
			}
		} else {
			st, err := shm.NewLocal(ctx, cfg.NP, shm.DefaultConfig())
			if err != nil {
				return err
			}
			for _, t := range st {
				ts = append(ts, t)
			}
		}
		defer func() {
			for _, t := range ts {
				t.Close()
			}
		}()
		for r, t := range ts {
			var err error
			if comms[r], err = collectives.New(t, cfg.collectives()); err != nil {
				return err
			}
		}
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	for r, c := range comms {
		g.Go(func() error { return measure(gctx, cfg, c, hostPayloads(gctx, c, cfg.Op), rankZero(r, emit)) })
	}
	return g.Wait()
}

// transport is a collectives.Transport that can be closed.
type transport interface {
	collectives.Transport
	Close() error
}

// WorkerEnv is the environment variable that carries a worker's settings.
const WorkerEnv = "GPUCOORD_BENCH_WORKER"

type workerSpec struct {
	Config
	Rank  int    `json:"rank"`
	Store string `json:"store"`
	// Device is the rank's GPU (nccl).
	Device int `json:"device"`
}

// runProcs runs the ranks as child processes. With nccl, rank r of a
// machine with devices GPUs is placed by nccl.PlaceLocal: its GPU, and an
// NCCL_HOSTID of its own where it shares that GPU.
func runProcs(ctx context.Context, cfg *Config, devices int, emit func(Result) error) error {
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	host := localproc.Hostname()
	return localproc.Run(ctx, localproc.Config{
		Ranks:  cfg.NP,
		Stderr: func(int) io.Writer { return stderr },
		Command: func(ctx context.Context, rank int, store string) (*exec.Cmd, error) {
			spec := workerSpec{Config: *cfg, Rank: rank, Store: store}
			var env []string
			if cfg.Backend == "nccl" {
				var hostID string
				spec.Device, hostID = nccl.PlaceLocal(rank, devices, host)
				env = append(env, nccl.EnvHostID+"="+hostID)
			}
			b, err := json.Marshal(spec)
			if err != nil {
				return nil, err
			}
			cmd := exec.CommandContext(ctx, cfg.WorkerCommand[0], cfg.WorkerCommand[1:]...)
			cmd.Env = append(append(os.Environ(), env...), WorkerEnv+"="+string(b))
			return cmd, nil
		},
	}, emit)
}

// RunWorker runs one rank of a multi-process benchmark with the settings in
// the environment variable WorkerEnv; rank 0 writes each Result to out as a
// JSON line.
func RunWorker(ctx context.Context, out io.Writer) error {
	var spec workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &spec); err != nil {
		return fmt.Errorf("bench: worker settings in %s: %w", WorkerEnv, err)
	}
	secret, err := localproc.StoreSecret()
	if err != nil {
		return err
	}
	st, err := tcp.DialStore(ctx, spec.Store, secret)
	if err != nil {
		return err
	}
	defer st.Close()
	var c collectives.Communicator
	var alloc func(count int) (payload, error)
	switch spec.Backend {
	case "nccl":
		nc, err := nccl.New(ctx, spec.ncclConfig(spec.Rank, spec.Device, st))
		if err != nil {
			return err
		}
		defer nc.Close()
		c, alloc = nc, devicePayloads(ctx, nc, spec.Op)
	default:
		var t transport
		if spec.Backend == "shm" {
			sc := shm.DefaultConfig()
			sc.Rank, sc.Size, sc.Store = spec.Rank, spec.NP, st
			t, err = shm.New(ctx, sc)
		} else {
			tc := tcp.DefaultConfig()
			tc.Rank, tc.Size, tc.Store, tc.SocketBuffer = spec.Rank, spec.NP, st, spec.SocketBuffer
			t, err = tcp.New(ctx, tc)
		}
		if err != nil {
			return err
		}
		defer t.Close()
		cc, err := collectives.New(t, spec.collectives())
		if err != nil {
			return err
		}
		defer cc.Close()
		c, alloc = cc, hostPayloads(ctx, cc, spec.Op)
	}
	enc := json.NewEncoder(out)
	err = measure(ctx, &spec.Config, c, alloc, rankZero(spec.Rank, func(res Result) error { return enc.Encode(res) }))
	if err == nil {
		err = c.Barrier(ctx) // leave together: no rank sees another's exit as a failure
	}
	return err
}

// elements is the number of float32 elements measure uses for size bytes on
// n ranks: whole elements, a multiple of n where the operation splits the
// buffer into one block per rank, and at least n.
func elements(op string, n, size int) int {
	count := size / 4
	if op == "reducescatter" || op == "allgather" {
		count = count / n * n
	}
	if count == 0 {
		count = n
	}
	return count
}

// payload is one rank's buffers for one size and the operation timed on
// them.
type payload interface {
	// reset fills the buffers with the rank's known data: rank+1 everywhere.
	reset() error
	// run performs the operation once.
	run() error
	// correct reports whether the buffers hold the result of one run after
	// a reset.
	correct() (bool, error)
	// free releases the buffers.
	free() error
}

// hostPayload runs the operation on host memory through any Communicator.
type hostPayload struct {
	ctx        context.Context
	c          collectives.Communicator
	op         string
	buf, shard []float32
}

// newHostPayload allocates count elements (the buffer) and count/n (the
// shard).
func newHostPayload(ctx context.Context, c collectives.Communicator, op string, count int) *hostPayload {
	return &hostPayload{ctx: ctx, c: c, op: op, buf: make([]float32, count), shard: make([]float32, count/c.Size())}
}

// hostPayloads makes host payloads for measure.
func hostPayloads(ctx context.Context, c collectives.Communicator, op string) func(count int) (payload, error) {
	return func(count int) (payload, error) { return newHostPayload(ctx, c, op, count), nil }
}

func (p *hostPayload) reset() error {
	for _, s := range [][]float32{p.buf, p.shard} {
		for i := range s {
			s[i] = float32(p.c.Rank() + 1)
		}
	}
	return nil
}

func (p *hostPayload) run() error {
	buf, shard := collectives.Float32s(p.buf), collectives.Float32s(p.shard)
	switch p.op {
	case "allreduce":
		return p.c.AllReduce(p.ctx, buf, collectives.Sum)
	case "reducescatter":
		return p.c.ReduceScatter(p.ctx, buf, shard, collectives.Sum)
	case "allgather":
		return p.c.AllGather(p.ctx, shard, buf)
	}
	return p.c.Broadcast(p.ctx, buf, 0)
}

func (p *hostPayload) correct() (bool, error) {
	return check(p.op, p.c.Size(), p.c.Rank(), p.buf, p.shard), nil
}

func (p *hostPayload) free() error { return nil }

// devicePayload runs the operation on NCCL device memory, in place, with no
// copy; its host buffers only set the data up and check the result.
type devicePayload struct {
	hostPayload
	nc        *nccl.Communicator
	dbuf, dsh *nccl.DeviceBuffer
	hbuf, hsh collectives.Buffer
}

// devicePayloads makes device payloads of count and count/n elements, with
// host buffers of the same sizes.
func devicePayloads(ctx context.Context, nc *nccl.Communicator, op string) func(count int) (payload, error) {
	return func(count int) (payload, error) {
		p := &devicePayload{hostPayload: *newHostPayload(ctx, nc, op, count), nc: nc}
		p.hbuf, p.hsh = collectives.Float32s(p.buf), collectives.Float32s(p.shard)
		var err error
		if p.dbuf, err = nc.Alloc(ctx, collectives.Float32, len(p.buf)); err != nil {
			return nil, err
		}
		if p.dsh, err = nc.Alloc(ctx, collectives.Float32, len(p.shard)); err != nil {
			p.dbuf.Free()
			return nil, err
		}
		return p, nil
	}
}

func (p *devicePayload) reset() error {
	p.hostPayload.reset()
	if err := p.dbuf.CopyFrom(p.ctx, p.hbuf); err != nil {
		return err
	}
	return p.dsh.CopyFrom(p.ctx, p.hsh)
}

func (p *devicePayload) run() error {
	switch p.op {
	case "allreduce":
		return p.nc.AllReduceDevice(p.ctx, p.dbuf, collectives.Sum)
	case "reducescatter":
		return p.nc.ReduceScatterDevice(p.ctx, p.dbuf, p.dsh, collectives.Sum)
	case "allgather":
		return p.nc.AllGatherDevice(p.ctx, p.dsh, p.dbuf)
	}
	return p.nc.BroadcastDevice(p.ctx, p.dbuf, 0)
}

func (p *devicePayload) correct() (bool, error) {
	if err := p.dbuf.CopyTo(p.ctx, p.hbuf); err != nil {
		return false, err
	}
	if err := p.dsh.CopyTo(p.ctx, p.hsh); err != nil {
		return false, err
	}
	return p.hostPayload.correct()
}

func (p *devicePayload) free() error {
	return errors.Join(p.dbuf.Free(), p.dsh.Free())
}

// measure runs the whole size sweep on one rank, with the buffers alloc
// makes for each size.
func measure(ctx context.Context, cfg *Config, c collectives.Communicator, alloc func(count int) (payload, error), emit func(Result) error) error {
	for _, size := range cfg.Sizes {
		if err := measureSize(ctx, cfg, c, alloc, size, emit); err != nil {
			return err
		}
	}
	return nil
}

// measureSize times one size: a checked call with known data, warm-up, a
// probe that sizes batch and iters alike on all ranks, then the samples.
func measureSize(ctx context.Context, cfg *Config, c collectives.Communicator, alloc func(count int) (payload, error), size int, emit func(Result) error) (err error) {
	n := c.Size()
	count := elements(cfg.Op, n, size)
	p, err := alloc(count)
	if err != nil {
		return err
	}
	defer func() {
		if ferr := p.free(); err == nil {
			err = ferr
		}
	}()
	// Correctness on one call with known data.
	if err := p.reset(); err != nil {
		return err
	}
	if err := p.run(); err != nil {
		return err
	}
	ok, err := p.correct()
	if err != nil {
		return err
	}
	for range cfg.Warmup {
		if err := p.run(); err != nil {
			return err
		}
	}
	// Probe: 3 calls, slowest rank, to size batch and iters alike on all.
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	for range 3 {
		if err := p.run(); err != nil {
			return err
		}
	}
	probe := []float64{time.Since(t0).Seconds() / 3, 0}
	if !ok {
		probe[1] = 1
	}
	if err := c.AllReduce(ctx, collectives.Float64s(probe), collectives.Max); err != nil {
		return err
	}
	batch := cfg.Batch
	if batch == 0 {
		batch = max(1, min(100, int(math.Ceil(cfg.MinSample.Seconds()/max(probe[0], 1e-9)))))
	}
	iters := cfg.Iters
	if iters == 0 {
		iters = max(7, min(50, int(cfg.Budget.Seconds()/max(probe[0]*float64(batch), 1e-9))))
	}
	samples := make([]float64, iters)
	for i := range samples {
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		for range batch {
			if err := p.run(); err != nil {
				return err
			}
		}
		samples[i] = time.Since(t0).Seconds() / float64(batch)
	}
	if err := c.AllReduce(ctx, collectives.Float64s(samples), collectives.Max); err != nil {
		return err
	}
	slices.Sort(samples)
	med := samples[len(samples)/2]
	if len(samples)%2 == 0 {
		med = (samples[len(samples)/2-1] + samples[len(samples)/2]) / 2
	}
	bytes := count * 4
	alg := float64(bytes) / med / 1e9
	return emit(Result{Op: cfg.Op, Backend: cfg.Backend, N: n, SizeBytes: bytes, Bytes: bytes, Count: count,
		Seconds: med, MedianS: med, MinS: samples[0], AlgBW: alg, BusBW: alg * busFactor(cfg.Op, n),
		Iters: iters, Batch: batch, Correct: probe[1] == 0, Host: localproc.Hostname()})
}

// check verifies one call's result: rank r contributed r+1 everywhere.
func check(op string, n, r int, buf, shard []float32) bool {
	sum := float32(n * (n + 1) / 2)
	switch op {
	case "allreduce":
		return allEq(buf, sum)
	case "reducescatter":
		return allEq(shard, sum)
	case "allgather":
		m := len(shard)
		for k := range n {
			if !allEq(buf[k*m:(k+1)*m], float32(k+1)) {
				return false
			}
		}
		return true
	}
	return allEq(buf, 1) // broadcast from rank 0
}

func allEq(v []float32, x float32) bool {
	for _, y := range v {
		if y != x {
			return false
		}
	}
	return true
}
