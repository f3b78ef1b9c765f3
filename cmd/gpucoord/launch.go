package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"
	"gopkg.in/yaml.v3"

	"github.com/gpucoord/gpucoord/client"
	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/internal/inproc"
	"github.com/gpucoord/gpucoord/internal/pki"
	"github.com/gpucoord/gpucoord/internal/rankexe"
	"github.com/gpucoord/gpucoord/internal/slurm"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/topology"
	"github.com/gpucoord/gpucoord/worker/engine"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

func init() { subcommands = append(subcommands, newLaunchCmd) }

type launchFlags struct {
	standalone                     bool
	coordinator                    string
	auth                           authFlags
	nodes, maxNodes, gpus          int
	tp, pp, dp, vpp, zero          int
	schedule, order                string
	steps                          int
	seed                           uint64
	json, dryRun, detach, verbose  bool
	hostfile, jobID, dataDir       string
	output                         string
	rendezvous, lastCall           time.Duration
	maxRestarts                    int
	env                            []string
	workdir                        string
	minNodes, ckptEvery, keepCkpts int
	ckptDir, ckptBackup            string
	ckptReplicas, backupEvery      int
	hangTimeout                    time.Duration
	evictStragglers                bool
	// Slurm: --slurm, --spares, --munge-socket, how long the tasks wait
	// for each other at start, and the step launch runs in (nil outside
	// one).
	slurmMode, mungeSocket string
	gossipProfile          string
	spares                 int
	bootTimeout            time.Duration
	slurm                  *slurm.Env
	// Re-planning: --replan, the planner's model and cluster, the limits
	// and the thresholds.
	replan, planModel, planCluster string
	replanTP, replanPP, replanDP   []int
	replanGain, minSamples         float64
	ckptOverhead                   string
}

func newLaunchCmd() *cobra.Command {
	var f launchFlags
	cmd := &cobra.Command{
		Use:   "launch [--standalone | --coordinator ADDR] --nodes N --gpus-per-node G [flags] (JOB.yaml | -- CMD ARGS...)",
		Short: "Launch a job: the native engine on a job file, or your program on every rank",
		Long: `launch runs a job on N nodes of G ranks each, laid out as --tp x --pp x dp
(dp = N*G/(tp*pp) unless --dp fixes it) in Megatron-LM's rank order.

  --standalone          start an embedded etcd, a coordinator and N local
                        worker agents in this process tree, run the job, and
                        tear everything down (each agent's "GPUs" are local
                        processes on a CPU machine)
  --coordinator ADDR    submit to a running coordinator (gpucoord coordinator)
                        whose worker agents run the ranks
  --hostfile FILE       DeepSpeed-style "host slots=N" lines: the nodes to use,
                        in rank order, and G from slots
  (under Slurm)         srun --no-kill --ntasks-per-node=1 gpucoord launch ...
                        runs the job on the step's nodes: the tasks start
                        the coordinators and agents themselves, N and G come
                        from Slurm (--spares K keeps K nodes aside), and the
                        first task prints the job (docs/SLURM.md)

A job file (examples/jobs/mlp.yaml) runs gpucoord's native Go engine; its
loss equals gpucoord train's. After "--", CMD runs on every rank with
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) plus
GPUCOORD_TP_RANK/SIZE, GPUCOORD_PP_RANK/SIZE, GPUCOORD_DP_RANK/SIZE,
GPUCOORD_PLAN and more, so a torchrun script runs unchanged.

Elastic: with --min-nodes M --max-restarts R a lost node (killed, frozen or
cut off), a failed rank, a hung rank (no progress for --hang-timeout) or a
preempted node (SIGTERM to its agent) makes a new generation on the live
nodes, DP shrunk, from the last committed checkpoint; a node that comes
back rejoins. Re-planning (--plan-model MODEL, --replan auto): the new
generation runs the layout the planner ranks fastest on the nodes left
(tp, pp and dp all change, down to one node), and the job grows back when
nodes return and the estimate gains --replan-gain; checkpoints restore
under any layout. Checkpoints need no shared file system: the agents hold them
in /dev/shm and replicate each node's files to --checkpoint-replicas - 1
peers (the native engine checkpoints every step and loses at most the step
in flight; your program writes under GPUCOORD_CHECKPOINT_DIR/N and says
"checkpoint N" on GPUCOORD_PROGRESS). docs/LAUNCH.md has the details.

Prints one line per step of a native job, every rank's output behind its
tag (--output), a line after 10s in which a program printed nothing, and
exits with the job's status: 0, or the first failing rank's exit code
with that rank named.`,
		Example: `  gpucoord launch --standalone --nodes 2 --gpus-per-node 4 --tp 2 --pp 2 examples/jobs/mlp.yaml
  gpucoord launch --standalone --nodes 2 --gpus-per-node 2 -- /usr/bin/python3 examples/pytorch/ddp.py
  gpucoord launch --coordinator 10.0.0.1:7070 --hostfile hosts.txt --tp 8 examples/jobs/mlp.yaml
  gpucoord launch --nodes 4 --gpus-per-node 8 --tp 8 --pp 2 --dry-run examples/jobs/mlp.yaml
  srun --no-kill --ntasks-per-node=1 gpucoord launch --tp 8 --spares 1 examples/jobs/mlp.yaml`,
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.detectSlurm(); err != nil {
				return usageError(err)
			}
			spec, err := f.spec(c, args)
			if err != nil {
				return usageError(err)
			}
			if f.dryRun {
				return printLaunchPlan(c.OutOrStdout(), spec, f.json)
			}
			return f.run(c, spec)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.standalone, "standalone", false, "run etcd, a coordinator and the agents in this process tree")
	fl.StringVar(&f.coordinator, "coordinator", "", "coordinator addresses, comma-separated")
	fl.IntVar(&f.nodes, "nodes", 0, "nodes the job needs")
	fl.IntVar(&f.maxNodes, "max-nodes", 0, "take up to this many nodes if they come within --last-call (default --nodes)")
	fl.IntVar(&f.gpus, "gpus-per-node", 0, "ranks per node")
	fl.IntVar(&f.tp, "tp", 1, "tensor-parallel degree (a TP group stays inside a node)")
	fl.IntVar(&f.pp, "pp", 1, "pipeline stages")
	fl.IntVar(&f.dp, "dp", 0, "data-parallel degree (default: world / (tp*pp))")
	fl.IntVar(&f.vpp, "vpp", 0, "model chunks per pipeline rank (native; default 2 with --schedule interleaved)")
	fl.IntVar(&f.zero, "zero", 0, "ZeRO stage 0-3")
	fl.StringVar(&f.schedule, "schedule", string(schedule.OneFOneB), "pipeline schedule (native): gpipe, 1f1b, interleaved, zb-h1")
	fl.StringVar(&f.order, "order", topology.DefaultOrder, "rank order, fastest axis first")
	fl.IntVar(&f.steps, "steps", 0, "optimizer steps (native; overrides the job file)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed (native; overrides the job file)")
	fl.BoolVar(&f.json, "json", false, "print each step as a JSON line, as train --json does (other output goes to stderr)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "print the plan the job would run on and exit")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "standalone: the coordinator's and agents' logs on stderr (default: a file in the cache directory, named once)")
	fl.BoolVar(&f.detach, "detach", false, "submit the job, print its id and exit: gpucoord follow JOB shows it, gpucoord cancel JOB ends it (not with --standalone)")
	fl.StringVar(&f.hostfile, "hostfile", "", `DeepSpeed-style hostfile: "host slots=N" per line`)
	fl.StringVar(&f.jobID, "job-id", "", "the job's id (default job-<time>-<random>)")
	fl.StringVar(&f.dataDir, "data-dir", "", "standalone: the embedded etcd's data directory (default a temporary one, removed after)")
	fl.DurationVar(&f.rendezvous, "rendezvous-timeout", 5*time.Minute, "fail when the nodes have not come within this time (0 waits forever)")
	fl.DurationVar(&f.lastCall, "last-call", 0, "with --max-nodes: how long to wait for more nodes once --nodes have come")
	fl.IntVar(&f.maxRestarts, "max-restarts", 0, "new generations allowed after a failure or for a rejoining node (TORCHELASTIC_MAX_RESTARTS)")
	fl.BoolVar(&f.evictStragglers, "evict-stragglers", false, "treat a node with a straggling rank (2x the median compute time for 3 windows) as failed: the job goes on without it")
	fl.IntVar(&f.minNodes, "min-nodes", 0, "after a node is lost, go on with as few as this many nodes (default --nodes: no shrinking)")
	fl.IntVar(&f.ckptEvery, "checkpoint-every", 0, "native: checkpoint every N steps (and after the last); a new generation resumes from the last committed (default: every step when the agents hold the checkpoints, only the last with --checkpoint-dir)")
	fl.StringVar(&f.ckptOverhead, "checkpoint-overhead", "", "native, instead of --checkpoint-every: choose the interval as the job trains so that checkpoints add at most this share of the step time (5% or 0.05), printing the steps a loss may redo")
	fl.IntVar(&f.keepCkpts, "keep-checkpoints", 2, "committed checkpoint steps each node keeps; older ones are removed after each commit (0 keeps every one in a --checkpoint-dir, 2 in the agents' memory)")
	fl.StringVar(&f.ckptDir, "checkpoint-dir", "", "a directory every node mounts for the checkpoints, checked at every generation (default: none, the agents hold them: node-local, in /dev/shm when it has room, replicated to peers)")
	fl.IntVar(&f.ckptReplicas, "checkpoint-replicas", pb.DefaultReplicas, "without --checkpoint-dir: how many nodes hold each node's files of a step, itself included; a step is committed when all are in place")
	fl.StringVar(&f.ckptBackup, "checkpoint-backup", "", "without --checkpoint-dir: a second tier, a directory every node mounts, copied to every --backup-every steps; a job whose replicas of a step are all lost resumes from it")
	fl.IntVar(&f.backupEvery, "backup-every", 0, "with --checkpoint-backup: copy every this many steps there (default 10)")
	fl.DurationVar(&f.hangTimeout, "hang-timeout", 0, "a rank with no progress line (step, checkpoint, heartbeat) for this long is hung: its stacks are captured and the generation restarts (default 10x the median step time, at least 30s)")
	fl.StringArrayVar(&f.env, "env", nil, "KEY=VALUE added to every rank's environment (repeatable)")
	fl.StringVar(&f.output, "output", outputAll, "the ranks' output to show: all (each line behind its rank's tag), rank0, or failed (the last lines of a rank that fails)")
	fl.StringVar(&f.slurmMode, "slurm", string(slurm.ModeAuto), "run as the tasks of a Slurm step (srun --ntasks-per-node=1 gpucoord launch ...): auto (when SLURM_JOB_ID and SLURM_STEP_ID are set and neither --standalone nor --coordinator is given), on, or off")
	fl.StringVar(&f.gossipProfile, "gossip-profile", "lan", "under Slurm: the step's failure detection, as coordinator --gossip-profile: lan (a dead node found in about a second) or wan (round trips of hundreds of ms, or nodes whose cores training starves; tens of seconds)")
	fl.IntVar(&f.spares, "spares", 0, "under Slurm: nodes of the step kept as hot spares (--nodes defaults to the step's nodes less these)")
	fl.StringVar(&f.mungeSocket, "munge-socket", "", "under Slurm: munged's socket (default: slurm.conf's AuthInfo=socket=, else munge's own)")
	fl.DurationVar(&f.bootTimeout, "slurm-start-timeout", 2*time.Minute, "under Slurm: how long the step's tasks wait for each other at start")
	fl.StringVar(&f.replan, "replan", "", "when the nodes change: auto (the planner's fastest layout on the nodes left: tp, pp and dp), dp-only (tp and pp as launched) or off (never fewer nodes than --nodes); default auto with --plan-model, else dp-only")
	fl.StringVar(&f.planModel, "plan-model", "", "the model the planner re-plans for (a plan --model preset or YAML file): what gpucoord plan --auto would be given")
	fl.StringVar(&f.planCluster, "plan-cluster", "dgx-h100", "with --plan-model: the nodes' GPUs, memory and links (a plan --cluster preset or YAML file)")
	fl.IntSliceVar(&f.replanTP, "replan-tp", nil, "tensor-parallel degrees a re-plan may choose (default: any the model and a node allow)")
	fl.IntSliceVar(&f.replanPP, "replan-pp", nil, "pipeline degrees a re-plan may choose (default: any the model allows)")
	fl.IntSliceVar(&f.replanDP, "replan-dp", nil, "data-parallel degrees a re-plan may choose (default: any the global batch splits into)")
	fl.Float64Var(&f.replanGain, "replan-gain", coordinator.DefaultGrowGain, "grow into returning nodes only when the planner estimates steps this much shorter (0.1: 10%)")
	fl.Float64Var(&f.minSamples, "min-samples-per-second", 0, "never run a re-planned layout estimated slower than this; pause instead")
	fl.StringVar(&f.workdir, "workdir", "", "directory the ranks start in; must exist on every node (default: this directory)")
	f.auth.register(cmd)
	return cmd
}

// spec checks the flags and builds the job to submit.
func (f *launchFlags) spec(c *cobra.Command, args []string) (*pb.JobSpec, error) {
	if f.slurm != nil {
		if err := f.slurmDefaults(c); err != nil {
			return nil, err
		}
	} else if f.standalone == (f.coordinator != "") && !f.dryRun {
		return nil, errors.New("give exactly one of --standalone and --coordinator ADDR (or run launch as the tasks of a Slurm step: srun --ntasks-per-node=1 gpucoord launch ...)")
	}
	if f.slurm == nil && c.Flags().Changed("gossip-profile") {
		return nil, errors.New("--gossip-profile is for launch under Slurm, where its tasks run the coordinators (give a coordinator its own --gossip-profile)")
	}
	if f.standalone && f.hostfile != "" {
		return nil, errors.New("--hostfile names the nodes of a cluster (--coordinator ADDR); a --standalone cluster's nodes are node0 to nodeN-1 on this machine: give --nodes and --gpus-per-node")
	}
	if f.standalone && f.detach {
		return nil, errors.New("--detach needs --coordinator: a --standalone cluster ends with launch")
	}
	if err := validOutput(f.output); err != nil {
		return nil, err
	}
	var err error
	id := f.jobID
	if id == "" {
		b := make([]byte, 3)
		rand.Read(b)
		id = fmt.Sprintf("job-%s-%s", time.Now().UTC().Format("20060102-150405"), hex.EncodeToString(b))
	}
	spec := &pb.JobSpec{Id: id, Nodes: int32(f.nodes), MaxNodes: int32(f.maxNodes), GpusPerNode: int32(f.gpus),
		Tp: int32(f.tp), Pp: int32(f.pp), Dp: int32(f.dp), Vpp: int32(f.vpp), Zero: int32(f.zero), Schedule: f.schedule,
		Order: f.order, RendezvousTimeoutMs: f.rendezvous.Milliseconds(), LastCallMs: f.lastCall.Milliseconds(),
		MaxRestarts: int32(f.maxRestarts), Env: map[string]string{}, MinNodes: int32(f.minNodes), CheckpointEvery: int32(f.ckptEvery),
		CheckpointDir: f.ckptDir, EvictStragglers: f.evictStragglers, KeepCheckpoints: int32(f.keepCkpts),
		CheckpointBackup: f.ckptBackup, BackupEvery: int32(f.backupEvery), HangTimeoutMs: f.hangTimeout.Milliseconds()}
	if f.ckptDir == "" {
		spec.CheckpointReplicas = int32(f.ckptReplicas)
	} else if c.Flags().Changed("checkpoint-replicas") {
		return nil, errors.New("--checkpoint-replicas is for checkpoints the agents hold, not with --checkpoint-dir")
	}
	if f.ckptOverhead != "" {
		v, pct := strings.CutSuffix(strings.TrimSpace(f.ckptOverhead), "%")
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("--checkpoint-overhead %q: want a share such as 5%% or 0.05", f.ckptOverhead)
		}
		if pct {
			x /= 100
		}
		spec.CheckpointOverhead = x
	}
	if spec.CheckpointBackup != "" && !c.Flags().Changed("backup-every") {
		spec.BackupEvery = 10
	}
	// What only launch knows fills the spec first; coordinator.ValidateSpec
	// then checks every rule of a spec, as Submit will.
	for _, p := range []*string{&spec.CheckpointDir, &spec.CheckpointBackup} {
		if *p != "" {
			if *p, err = filepath.Abs(*p); err != nil {
				return nil, err
			}
		}
	}
	if f.order == "" {
		return nil, errors.New(`--order "": give an order such as tp-cp-dp-pp`)
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		spec.Env[k] = v
	}
	if f.hostfile != "" {
		hosts, slots, err := readHostfile(f.hostfile)
		if err != nil {
			return nil, err
		}
		if f.nodes != 0 && f.nodes != len(hosts) {
			return nil, fmt.Errorf("--nodes %d but hostfile %s lists %d hosts", f.nodes, f.hostfile, len(hosts))
		}
		if f.gpus != 0 && f.gpus != slots {
			return nil, fmt.Errorf("--gpus-per-node %d but hostfile %s gives slots=%d", f.gpus, f.hostfile, slots)
		}
		spec.Hosts, spec.Nodes, spec.GpusPerNode = hosts, int32(len(hosts)), int32(slots)
	}
	var job *engine.Job // a native job's, nil for a program
	if dash := c.ArgsLenAtDash(); dash >= 0 {
		if dash != 0 {
			return nil, fmt.Errorf("give either a job file or -- CMD, not both (%q before --)", args[:dash])
		}
		if len(args) == 0 {
			return nil, errors.New("no command after --")
		}
		if f.standalone {
			// The ranks run on this machine: a missing program is known now.
			if _, err := exec.LookPath(args[0]); err != nil {
				return nil, fmt.Errorf("command %q: %v", args[0], errors.Unwrap(err))
			}
		}
		for _, name := range []string{"steps", "seed", "schedule", "vpp"} {
			if c.Flags().Changed(name) {
				return nil, fmt.Errorf("--%s is for native-engine jobs, not for a command", name)
			}
		}
		spec.Command, spec.Schedule = args, ""
		if spec.Workdir = f.workdir; spec.Workdir == "" {
			if spec.Workdir, err = os.Getwd(); err != nil {
				return nil, err
			}
		}
	} else {
		if len(args) != 1 {
			return nil, fmt.Errorf("give one job file, or -- CMD ARGS (got %d arguments)", len(args))
		}
		if job, err = engine.LoadJob(args[0], func(j *engine.Job) {
			if c.Flags().Changed("steps") {
				j.Steps = f.steps
			}
			if c.Flags().Changed("seed") {
				j.Seed = f.seed
			}
		}); err != nil {
			return nil, err
		}
		if spec.NativeJob, err = yaml.Marshal(job); err != nil {
			return nil, err
		}
		spec.GlobalBatch, spec.MicroBatch = int32(job.Batch.Global), int32(job.Batch.Micro)
	}
	if err := f.replanSpec(c, spec, job); err != nil {
		return nil, err
	}
	if err := coordinator.ValidateSpecWith(spec, flagName); err != nil {
		return nil, err
	}
	if job != nil {
		// What the coordinator cannot check: the model's rules (tp divides
		// model.hidden, pp*vpp divides model.blocks).
		if _, err := engine.NewConfig(job, engine.Shape{NP: int(spec.Nodes * spec.GpusPerNode), TP: f.tp, PP: f.pp, DP: f.dp,
			Virtual: f.vpp, Zero: f.zero, Schedule: schedule.Kind(f.schedule), Order: f.order}); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

// replanSpec fills spec's re-planning policy from the flags: the
// planner's input (model, cluster, the job's global batch, the degrees it
// may choose: for a native job, those its model splits into).
func (f *launchFlags) replanSpec(c *cobra.Command, spec *pb.JobSpec, job *engine.Job) error {
	if job != nil && job.Replan != nil {
		r := job.Replan
		// The job file's replan section, where no flag overrides it.
		for name, set := range map[string]func(){
			"replan":                 func() { f.replan = r.Mode },
			"plan-model":             func() { f.planModel = r.Model },
			"plan-cluster":           func() { f.planCluster = cmp.Or(r.Cluster, f.planCluster) },
			"replan-gain":            func() { f.replanGain = cmp.Or(r.Gain, f.replanGain) },
			"min-samples-per-second": func() { f.minSamples = r.MinSamplesPerSecond },
		} {
			if !c.Flags().Changed(name) {
				set()
			}
		}
	}
	for _, name := range []string{"plan-cluster", "replan-tp", "replan-pp", "replan-dp"} {
		if c.Flags().Changed(name) && f.planModel == "" {
			return fmt.Errorf("--%s is for re-planning: give --plan-model too", name)
		}
	}
	if f.planModel == "" {
		if f.replan != "" {
			spec.Replan = &pb.Replan{Mode: f.replan}
		}
		return nil
	}
	m, err := topology.LoadModel(f.planModel)
	if err != nil {
		return fmt.Errorf("--plan-model: %w", err)
	}
	cl, err := topology.LoadCluster(f.planCluster)
	if err != nil {
		return fmt.Errorf("--plan-cluster: %w", err)
	}
	cl.Nodes, cl.GPUsPerNode = int(spec.Nodes), int(spec.GpusPerNode)
	base := topology.DefaultConfig()
	base.MicroBatch = max(int(spec.MicroBatch), 1)
	base.GlobalBatch = int(spec.GlobalBatch)
	if base.GlobalBatch == 0 {
		// A program's: the plan's default for the submitted nodes, kept
		// by every re-plan.
		base.GlobalBatch = topology.DefaultGlobalBatch(cl, base.MicroBatch)
	}
	limits := coordinator.Limits{TP: f.replanTP, PP: f.replanPP, DP: f.replanDP}
	if job != nil {
		// The native engine splits model.hidden over tp and model.blocks
		// over pp (times vpp): only those degrees.
		vpp := max(f.vpp, 1)
		if len(limits.TP) == 0 {
			for tp := 1; tp <= int(spec.GpusPerNode); tp++ {
				if job.Model.Hidden%tp == 0 {
					limits.TP = append(limits.TP, tp)
				}
			}
		}
		if len(limits.PP) == 0 {
			for pp := 1; pp*vpp <= job.Model.Blocks; pp++ {
				if job.Model.Blocks%(pp*vpp) == 0 {
					limits.PP = append(limits.PP, pp)
				}
			}
		}
	}
	in, err := json.Marshal(coordinator.PlannerInput{Cluster: cl, Model: m, Config: base, Limits: limits})
	if err != nil {
		return err
	}
	spec.Replan = &pb.Replan{Mode: f.replan, Planner: in, GrowGain: f.replanGain, MinSamplesPerSecond: f.minSamples}
	if coordinator.ReplanMode(spec) == coordinator.ReplanAuto && !c.Flags().Changed("min-nodes") {
		spec.MinNodes = 0 // re-planned down to one node, not Slurm's default of one replica's nodes
	}
	return nil
}

// flagName names a JobSpec field, in coordinator.ValidateSpecWith's
// errors, by the launch flag that sets it.
func flagName(field string) string {
	switch field {
	case "id":
		return "--job-id"
	case "hang_timeout_ms":
		return "--hang-timeout"
	case "replan.mode":
		return "--replan"
	case "replan.planner":
		return "--plan-model"
	case "replan.grow_gain":
		return "--replan-gain"
	case "replan.min_samples_per_second":
		return "--min-samples-per-second"
	}
	return "--" + strings.ReplaceAll(field, "_", "-")
}

// readHostfile parses DeepSpeed's hostfile: "host slots=N" per line, '#'
// comments. Every host must have the same slots.
func readHostfile(path string) ([]string, int, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("hostfile: %w", err)
	}
	defer fh.Close()
	return parseHostfile(fh, path)
}

// parseHostfile parses the hostfile r, called path in errors.
func parseHostfile(r io.Reader, path string) ([]string, int, error) {
	var hosts []string
	slots := 0
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		s := 1
		if len(fields) > 2 {
			return nil, 0, fmt.Errorf("hostfile %s line %d: %q: want \"host slots=N\"", path, n, sc.Text())
		}
		if len(fields) == 2 {
			v, ok := strings.CutPrefix(fields[1], "slots=")
			var err error
			if s, err = strconv.Atoi(v); !ok || err != nil || s < 1 {
				return nil, 0, fmt.Errorf("hostfile %s line %d: %q: want slots=N with N at least 1", path, n, fields[1])
			}
		}
		if slots != 0 && s != slots {
			return nil, 0, fmt.Errorf("hostfile %s line %d: slots=%d but earlier hosts have %d: every node runs the same number of ranks", path, n, s, slots)
		}
		slots = s
		hosts = append(hosts, fields[0])
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("hostfile %s: %w", path, err)
	}
	if len(hosts) == 0 {
		return nil, 0, fmt.Errorf("hostfile %s lists no hosts", path)
	}
	return hosts, slots, nil
}

// printLaunchPlan prints the layout the job would run on.
func printLaunchPlan(w io.Writer, spec *pb.JobSpec, asJSON bool) error {
	l, err := coordinator.Layout(spec, int(spec.Nodes))
	if err != nil {
		return usageError(err)
	}
	type rankRow struct {
		Rank, LocalRank int
		topology.Coord
	}
	type nodeRow struct {
		Node  string    `json:"node"`
		Ranks []rankRow `json:"ranks"`
	}
	doc := struct {
		Job    string          `json:"job"`
		World  int             `json:"world"`
		TP     int             `json:"tp"`
		PP     int             `json:"pp"`
		DP     int             `json:"dp"`
		Order  string          `json:"order"`
		Nodes  []nodeRow       `json:"nodes"`
		Groups topology.Groups `json:"groups"`
		Replan *replanJSON     `json:"replan,omitempty"`
	}{Job: spec.Id, World: l.World(), TP: l.TP, PP: l.PP, DP: l.DP, Order: cmp.Or(spec.Order, l.Order.String()), Groups: l.Groups(),
		Replan: newReplanJSON(spec)}
	g := int(spec.GpusPerNode)
	for n := range int(spec.Nodes) {
		name := fmt.Sprintf("node%d", n)
		if len(spec.Hosts) > n {
			name = spec.Hosts[n]
		}
		row := nodeRow{Node: name}
		for lr := range g {
			r := n*g + lr
			row.Ranks = append(row.Ranks, rankRow{Rank: r, LocalRank: lr, Coord: l.Coord(topology.Rank(r))})
		}
		doc.Nodes = append(doc.Nodes, row)
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	what := "command " + strings.Join(spec.Command, " ")
	if len(spec.NativeJob) > 0 {
		what = "native engine"
	}
	fmt.Fprintf(w, "job %s: %d node%s x %d = %d ranks, tp %d pp %d dp %d, order %s, %s\n",
		spec.Id, spec.Nodes, plural(int(spec.Nodes)), g, l.World(), l.TP, l.PP, l.DP, doc.Order, what)
	for _, n := range doc.Nodes {
		parts := make([]string, len(n.Ranks))
		for i, r := range n.Ranks {
			parts[i] = fmt.Sprintf("r%d(tp%d pp%d dp%d)", r.Rank, r.TP, r.PP, r.DP)
		}
		fmt.Fprintf(w, "  %-8s %s\n", n.Node, strings.Join(parts, " "))
	}
	for _, ax := range []struct {
		name   string
		groups [][]topology.Rank
	}{{"tp", doc.Groups.TP}, {"pp", doc.Groups.PP}, {"dp", doc.Groups.DP}} {
		fmt.Fprintf(w, "  %s groups: %v\n", ax.name, ax.groups)
	}
	if r := doc.Replan; r != nil {
		line := "  when the nodes change: " + r.Mode
		if r.Model != "" {
			line += fmt.Sprintf(" (the planner's fastest layout of %s on %s", r.Model, r.Cluster)
			for _, x := range []struct {
				name string
				v    []int
			}{{"tp", r.Limits.TP}, {"pp", r.Limits.PP}, {"dp", r.Limits.DP}} {
				if len(x.v) > 0 {
					line += fmt.Sprintf(", %s %s", x.name, strings.Trim(strings.Join(strings.Fields(fmt.Sprint(x.v)), ","), "[]"))
				}
			}
			line += fmt.Sprintf("; grows for %.0f%% shorter steps)", 100*r.GrowGain)
		}
		fmt.Fprintln(w, line)
	}
	return nil
}

// replanJSON is launch --dry-run's account of a job's re-planning.
type replanJSON struct {
	Mode     string             `json:"mode"`
	Model    string             `json:"model,omitempty"`
	Cluster  string             `json:"cluster,omitempty"`
	Limits   coordinator.Limits `json:"limits,omitzero"`
	GrowGain float64            `json:"grow_gain,omitempty"`
	MinRate  float64            `json:"min_samples_per_second,omitempty"`
}

func newReplanJSON(spec *pb.JobSpec) *replanJSON {
	r := &replanJSON{Mode: coordinator.ReplanMode(spec)}
	if b := spec.GetReplan().GetPlanner(); len(b) > 0 {
		var in coordinator.PlannerInput
		if json.Unmarshal(b, &in) == nil {
			r.Model, r.Cluster, r.Limits = in.Model.Name, in.Cluster.Name, in.Limits
		}
		r.GrowGain, r.MinRate = cmp.Or(spec.GetReplan().GetGrowGain(), coordinator.DefaultGrowGain), spec.GetReplan().GetMinSamplesPerSecond()
	}
	return r
}

// plural returns "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// run submits the job (to a standalone cluster started here, or to the
// coordinators given) and follows it to its end.
func (f *launchFlags) run(c *cobra.Command, spec *pb.JobSpec) error {
	ctx := c.Context()
	// The agents of a standalone cluster write rank output from their own
	// goroutines to the same writers as the progress lines.
	stdout, stderr := &lockedWriter{w: c.OutOrStdout()}, &lockedWriter{w: c.ErrOrStderr()}
	progress := io.Writer(stdout)
	if f.json {
		progress = stderr
	}
	if f.slurm != nil {
		return f.runSlurm(c, spec)
	}
	addrs := strings.Split(f.coordinator, ",")
	if f.standalone {
		// The cluster outlives an interrupt until the job is cancelled
		// (its agents then stop their ranks as for any cancel); only then
		// is it stopped, with no job left to preempt.
		// Its coordinator's and agents' logs go to a file (stderr with
		// --verbose), so that launch's lines and the ranks' come alone.
		logs, closeLogs, logPath, err := standaloneLog(spec.Id, f.verbose, stderr)
		if err != nil {
			return err
		}
		defer closeLogs()
		if logPath != "" {
			fmt.Fprintf(progress, "logs of the standalone cluster: %s\n", logPath)
		}
		exe, err := rankexe.Path()
		if err != nil {
			return err
		}
		cl, err := inproc.Start(context.WithoutCancel(ctx), inproc.Config{Nodes: int(spec.Nodes), GPUs: int(spec.GpusPerNode),
			DataDir: f.dataDir, Logs: logs, RankCommand: []string{exe, rankCmd}, FenceCommand: []string{exe, fenceCmd}, Version: buildVersion()})
		if err != nil {
			return err
		}
		defer cl.Stop()
		if err := cl.Ready(ctx, 30*time.Second); err != nil {
			return err
		}
		addrs = []string{cl.Addr}
	}
	var creds credentials.TransportCredentials
	var agents *tls.Config
	if !f.standalone {
		var err error
		if creds, err = f.auth.clientCredentials(ctx, addrs, pki.RoleClient); err != nil {
			return err
		}
		if agents, err = f.auth.agentTLS(ctx, addrs); err != nil {
			return err
		}
	}
	fl := &follower{addrs: addrs, creds: creds, connectTimeout: f.auth.connectTimeout, spec: spec, out: stdout, progress: progress,
		json: f.json, detach: f.detach}
	if !f.detach {
		fl.output = newRankOutput(f.output, spec.Id, ranklog.NewClient(agents), rankLines(stdout, stderr, f.json), progress)
	}
	return fl.run(ctx)
}

// rankLines is where the ranks' lines go: stdout, or stderr when stdout
// carries JSON.
func rankLines(stdout, stderr io.Writer, asJSON bool) io.Writer {
	if asJSON {
		return stderr
	}
	return stdout
}

// outputKind names what a failed rank's output is: its stacks when it
// hung, else the last lines it printed.
func outputKind(hung bool) string {
	if hung {
		return "stacks"
	}
	return "last output"
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// standaloneLog opens where a standalone cluster logs: stderr when
// verbose, else a file of the job's in the user's cache directory
// (gpucoord/logs/JOB.log), whose path it returns.
func standaloneLog(job string, verbose bool, stderr io.Writer) (io.Writer, func() error, string, error) {
	if verbose {
		return stderr, func() error { return nil }, "", nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return nil, nil, "", fmt.Errorf("no directory for the standalone cluster's logs (%v): give --verbose to see them on stderr", err)
	}
	dir = filepath.Join(dir, "gpucoord", "logs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, "", fmt.Errorf("the standalone cluster's logs: %w (--verbose puts them on stderr)", err)
	}
	path := filepath.Join(dir, job+".log")
	fl, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, "", fmt.Errorf("the standalone cluster's logs: %w (--verbose puts them on stderr)", err)
	}
	return &lockedWriter{w: fl}, fl.Close, path, nil
}

// follower submits a job through the client and prints its progress until
// it ends.
type follower struct {
	addrs          []string
	creds          credentials.TransportCredentials
	connectTimeout time.Duration
	spec           *pb.JobSpec
	out, progress  io.Writer
	json           bool
	attach         bool // follow a submitted job (gpucoord follow)
	detach         bool // submit and return (launch --detach)
	// quiet follows a job another task submits (a Slurm step's other
	// tasks): no submit, and "no such job" is taken for notFoundFor.
	quiet       bool
	notFoundFor time.Duration
	// onBackup, when set, hears each commit of a step the backup tier
	// holds, newest last (under mu).
	onBackup   func(*pb.Step)
	lastBackup int64
	steps      int // a native job's total steps
	started    time.Time
	// output shows the ranks' lines; nil shows none.
	output *rankOutput
	said   time.Time // when launch last printed a line of its own (guarded by mu)

	// mu guards what show records: the ticker of a program's job reads it.
	mu         sync.Mutex
	state      *pb.JobState // the job's state as last reported
	lastGen    int64
	lastNodes  int
	lastStep   int64
	lastCommit int64
	lastReason string
	hangs      int32 // the generations ended by a hang, as last heard
	lastLoss   float64
}

func (f *follower) run(ctx context.Context) error {
	f.started = time.Now()
	f.said = f.started
	cfg := client.DefaultConfig()
	cfg.Coordinators, cfg.Credentials, cfg.OnFailover = f.addrs, f.creds, f.failover
	connectTimeouts(cfg, f.connectTimeout)
	cfg.Logger = slog.New(slog.DiscardHandler) // the moves are printed by failover
	cl, err := client.New(cfg)
	if err != nil {
		return usageError(err)
	}
	defer cl.Close()
	if f.attach {
		if err := f.attachTo(ctx, cl); err != nil {
			return err
		}
	} else if f.quiet {
		f.countSteps()
	} else if err := f.submit(ctx, cl); err != nil || f.detach {
		return err
	}
	st, err := f.follow(ctx, cl)
	if ctx.Err() != nil {
		f.output.drain(0)
	} else {
		f.output.drain(drainFor)
	}
	switch {
	case ctx.Err() != nil && f.attach:
		return &exitError{code: exitInterrupted, err: fmt.Errorf("stopped following job %s, which goes on (gpucoord cancel %s ends it)", f.spec.Id, f.spec.Id)}
	case ctx.Err() != nil:
		return f.cancel(cl)
	case errors.Is(err, client.ErrNotFound):
		return fmt.Errorf("no job %s: gpucoord status lists the jobs", f.spec.Id)
	case errors.Is(err, client.ErrUnreachable):
		last := err // the last coordinator's failure, as gRPC reported it
		var ce *client.Error
		if errors.As(err, &ce) {
			last = ce.Status.Err()
		}
		return fmt.Errorf("lost the coordinators (%s) for a minute: %v; the job may still run: gpucoord follow %s", strings.Join(f.addrs, ","), last, f.spec.Id)
	case err != nil:
		return errors.New(coordinatorSaid(err))
	}
	return f.finish(st)
}

// attachTo reads the spec of the job to follow from the coordinators.
func (f *follower) attachTo(ctx context.Context, cl *client.Client) error {
	resp, err := cl.Status(ctx) // bounded by the client, as status's
	if err != nil {
		return callFailed(strings.Join(f.addrs, ","), err, f.creds)
	}
	for _, j := range resp.Jobs {
		if j.GetSpec().GetId() == f.spec.Id {
			f.spec = j.Spec
			f.countSteps()
			if f.json {
				json.NewEncoder(f.out).Encode(launchEvent{Schema: launchSchema, Event: "following", Job: f.spec.Id})
			}
			return nil
		}
	}
	return fmt.Errorf("no job %s: gpucoord status lists the jobs", f.spec.Id)
}

// countSteps reads a native job's total steps from its spec.
func (f *follower) countSteps() {
	if len(f.spec.NativeJob) > 0 {
		if job, err := engine.ParseJob(bytes.NewReader(f.spec.NativeJob), nil); err == nil {
			f.steps = job.Steps
		}
	}
}

// submit submits the job and says so; with detach it prints the job's id
// on stdout and is done.
func (f *follower) submit(ctx context.Context, cl *client.Client) error {
	f.countSteps()
	resp, err := cl.SubmitJob(ctx, f.spec)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return err
		case errors.Is(err, client.ErrInvalid), errors.Is(err, client.ErrExists):
			return usageError(errors.New(coordinatorSaid(err)))
		case errors.Is(err, client.ErrUnreachable):
			return callFailed(strings.Join(f.addrs, ","), err, f.creds)
		}
		return errors.New(coordinatorSaid(err))
	}
	what := "native engine"
	if len(f.spec.Command) > 0 {
		what = strings.Join(f.spec.Command, " ")
	}
	fmt.Fprintf(f.progress, "job %s submitted: %d node%s x %d rank%s, tp %d pp %d, %s\n",
		f.spec.Id, f.spec.Nodes, plural(int(f.spec.Nodes)), f.spec.GpusPerNode, plural(int(f.spec.GpusPerNode)), f.spec.Tp, f.spec.Pp, what)
	if u := resp.GetDashboard(); u != "" {
		fmt.Fprintf(f.progress, "dashboard: %s#/jobs/%s\n", u, f.spec.Id)
	}
	switch {
	case f.json:
		json.NewEncoder(f.out).Encode(launchEvent{Schema: launchSchema, Event: "submitted", Job: f.spec.Id})
	case f.detach:
		fmt.Fprintln(f.out, f.spec.Id)
	}
	return nil
}

// follow follows the job to its end. While a program's job runs, a line
// shows it is alive after every quietFor without a line from launch or
// its ranks: a program reports no steps.
func (f *follower) follow(ctx context.Context, cl *client.Client) (*pb.JobState, error) {
	if len(f.spec.Command) > 0 {
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-tctx.Done():
					return
				case <-tick.C:
					f.alive()
				}
			}
		}()
		defer func() { cancel(); <-done }()
	}
	for start := time.Now(); ; {
		st, err := cl.Follow(ctx, f.spec.Id, f.show)
		if !errors.Is(err, client.ErrNotFound) || f.attach || time.Since(start) > max(submittedFor, f.notFoundFor) {
			return st, err
		}
		// Submitted a moment ago, through a coordinator that said so: one
		// that has not heard of it yet answered (the chaos test saw it
		// twice in one run, after a partition healed). The job is there; ask
		// again.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// submittedFor is how long after its submission launch takes "no such
// job" for a coordinator that has not heard of it yet.
const submittedFor = 30 * time.Second

// quietFor is how long a program's job may print nothing before launch
// says it is still running.
const quietFor = 10 * time.Second

// alive prints the running line of a program's job after quietFor of
// silence.
func (f *follower) alive() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state.GetPhase() != pb.JobState_RUNNING || time.Since(f.output.lastLine(f.said)) < quietFor {
		return
	}
	fmt.Fprintf(f.progress, "running %s: generation %d, %d node%s\n", since(f.started), f.lastGen, f.lastNodes, plural(f.lastNodes))
	f.said = time.Now()
}

// failover prints where following the job moves when a coordinator fails.
// A Submit moves on without a word.
func (f *follower) failover(fo client.Failover) {
	if fo.Method != "Follow" {
		return
	}
	next := "trying the next"
	if errors.Is(fo.Err, client.ErrCompacted) {
		// The history since our last event is compacted: the steps in
		// between are not shown again.
		next = "following from now"
	}
	fmt.Fprintf(f.progress, "coordinator %s: %s; %s\n", fo.Addr, coordinatorSaid(fo.Err), next)
}

// cancel cancels the job after launch was interrupted, and reports the
// state the cancel produced: cancelled, or the end the job reached first.
func (f *follower) cancel(cl *client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if st, _ := cl.Cancel(ctx, f.spec.Id, "launch interrupted"); pb.Terminal(st) {
		return f.finish(st)
	}
	err := &exitError{code: exitInterrupted, err: fmt.Errorf("job %s cancelled: launch interrupted", f.spec.Id)}
	f.end(phaseWord(pb.JobState_CANCELLED), "launch interrupted", err)
	return err
}

// plaintextHint says, after a failure without credentials, that the
// coordinator may want them.
func plaintextHint(creds credentials.TransportCredentials) string {
	if creds != nil {
		return ""
	}
	return " (without a join token this command speaks plaintext; a coordinator that serves TLS: give a join token with --token-file or GPUCOORD_TOKEN)"
}

// callFailed is the error of a command whose call to the coordinators
// (addrs, comma-separated) failed: what each one met when none answered,
// else what the one that answered said.
func callFailed(addrs string, err error, creds credentials.TransportCredentials) error {
	var ue *client.UnreachableError
	if errors.As(err, &ue) {
		if ue.NothingListens() {
			return ue
		}
		return fmt.Errorf("%s%s", ue.Error(), plaintextHint(creds))
	}
	return fmt.Errorf("coordinator %s: %s%s", addrs, coordinatorSaid(err), plaintextHint(creds))
}

// coordinatorSaid is the message of the coordinator's answer in err, or
// err's text when no coordinator answered.
func coordinatorSaid(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Status.Message()
	}
	return err.Error()
}

// show records and prints what is new in ev.
func (f *follower) show(ev *pb.JobEvent) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev.State != nil {
		f.state = ev.State
	}
	if g := ev.Generation; g != nil && g.Number != f.lastGen {
		f.lastGen, f.lastNodes = g.Number, len(g.Members)
		names := make([]string, len(g.Members))
		for i, m := range g.Members {
			names[i] = m.Node
		}
		line := fmt.Sprintf("generation %d: %d node%s (%s), %d ranks, %s",
			g.Number, len(names), plural(len(names)), strings.Join(names, ", "), g.World, pb.GenerationGrid(f.spec, g).Label(g.Dp))
		switch {
		case g.Reason == "":
		case g.ResumeStep > 0:
			line += fmt.Sprintf(" (%s; resuming after step %d)", g.Reason, g.ResumeStep)
		case len(f.spec.Command) > 0 && f.spec.CheckpointDir != "":
			line += fmt.Sprintf(" (%s; restarted: the program resumes from what %s holds)", g.Reason, f.spec.CheckpointDir)
		default:
			line += fmt.Sprintf(" (%s; starting over from step 1: no checkpoint was committed)", g.Reason)
		}
		fmt.Fprintln(f.progress, line)
		f.said = time.Now()
		if f.json {
			l := jobLayout(f.spec, g)
			json.NewEncoder(f.out).Encode(launchEvent{Event: "generation", Generation: generationOf(g), Layout: &l})
		}
		f.output.generation(g)
		if g.Output != "" {
			fmt.Fprintf(f.progress, "  %s of the rank that failed:\n%s\n", outputKind(g.Hangs > f.hangs), indent(g.Output, "    "))
		}
		f.hangs = g.Hangs
		if g.Number > 1 {
			// Steps after the resume point are trained again by this
			// generation: show them again.
			f.lastStep = g.ResumeStep
		}
	}
	if s := ev.Step; s != nil && s.Step > f.lastStep && (s.Generation == 0 || s.Generation == f.lastGen) {
		f.lastStep, f.lastLoss = s.Step, s.Loss
		if f.json {
			json.NewEncoder(f.out).Encode(stepEvent{launchStep: *stepOf(s), Event: "step"})
		} else {
			of := "" // a program's total is not known
			if f.steps > 0 {
				of = fmt.Sprintf("%*d/%d", len(fmt.Sprint(f.steps)), s.Step, f.steps)
			} else {
				of = fmt.Sprint(s.Step)
			}
			fmt.Fprintf(f.out, "step %s  loss %.6f  %7.1f ms  (generation %d, %d node%s)\n",
				of, s.Loss, 1e3*s.Seconds, f.lastGen, f.lastNodes, plural(f.lastNodes))
		}
	}
	if c := ev.Commit; c != nil && c.Backup && !c.BackupOnly && c.Step > f.lastBackup && f.onBackup != nil {
		f.lastBackup = c.Step
		f.onBackup(c)
	}
	if c := ev.Commit; c != nil && f.json && c.Step != f.lastCommit {
		f.lastCommit = c.Step
		json.NewEncoder(f.out).Encode(commitEvent{launchCommit{Committed: c.Step, Generation: c.Generation, Backup: c.Backup}, "commit"})
	}
	if st := ev.State; st.GetPhase() == pb.JobState_PENDING && st.Reason != f.lastReason {
		f.lastReason = st.Reason
		fmt.Fprintf(f.progress, "pending: %s\n", st.Reason)
	}
	return nil
}

// finish turns the final state into launch's result.
func (f *follower) finish(st *pb.JobState) error {
	var err error
	switch st.Phase {
	case pb.JobState_SUCCEEDED:
		if f.lastStep > 0 {
			fmt.Fprintf(f.progress, "job %s succeeded in %s: %d steps, final loss %.6f\n", f.spec.Id, since(f.started), f.lastStep, f.lastLoss)
		} else {
			fmt.Fprintf(f.progress, "job %s succeeded in %s\n", f.spec.Id, since(f.started))
		}
	case pb.JobState_CANCELLED:
		code := exitInterrupted
		if strings.HasPrefix(st.Reason, requeueReason) {
			code = exitRequeue
		}
		err = &exitError{code: code, err: fmt.Errorf("job %s cancelled: %s", f.spec.Id, st.Reason)}
	default:
		code := int(st.ExitCode)
		if code == 0 {
			code = exitFailure
		}
		e := fmt.Errorf("job %s failed: %s", f.spec.Id, st.Reason)
		if st.Output != "" {
			e = fmt.Errorf("%w\nlast output of rank %d on %s:\n%s", e, st.FailedRank, st.FailedNode, indent(st.Output, "  "))
		}
		err = &exitError{code: code, err: e}
	}
	f.end(phaseWord(st.Phase), st.Reason, err)
	return err
}

// end writes launch --json's last line: the job's phase and the status
// launch exits with.
func (f *follower) end(phase, reason string, err error) {
	if !f.json {
		return
	}
	code := int32(0)
	var ee *exitError
	if errors.As(err, &ee) {
		code = int32(ee.code)
	}
	json.NewEncoder(f.out).Encode(launchEvent{Event: "end", Job: f.spec.Id, Phase: phase, Reason: reason, ExitCode: &code})
}
