package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/schedule"
	"github.com/gpucoord/gpucoord/worker/engine"
)

func init() { subcommands = append(subcommands, newTrainCmd) }

// trainFlags are the flags of train, shared with its hidden child command.
type trainFlags struct {
	np, tp, pp, dp, vpp, zero int
	schedule                  string
	steps                     int
	seed                      uint64
	inproc, json              bool
	saveParams                string
	backend                   string
}

// trainBackends are the transports of the engine's TP, PP and DP groups.
var trainBackends = []string{"tcp", "nccl"}

func (f *trainFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.np, "np", 0, "number of ranks (default tp*pp*dp)")
	fl.IntVar(&f.tp, "tp", 1, "tensor-parallel degree (divides model.hidden)")
	fl.IntVar(&f.pp, "pp", 1, "pipeline stages (pp*vpp divides model.blocks)")
	fl.IntVar(&f.dp, "dp", 0, "data-parallel degree (default np/(tp*pp), else 1)")
	fl.IntVar(&f.vpp, "vpp", 0, "model chunks per pipeline rank (default 2 with --schedule interleaved, else 1)")
	fl.IntVar(&f.zero, "zero", 0, "ZeRO stage 0-3")
	fl.StringVar(&f.schedule, "schedule", string(schedule.OneFOneB), "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1")
	fl.IntVar(&f.steps, "steps", 0, "optimizer steps (overrides the job file)")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of weights and data (overrides the job file)")
	fl.BoolVar(&f.inproc, "inproc", false, "run the ranks as goroutines over an in-memory network instead of processes over TCP")
	fl.BoolVar(&f.json, "json", false, `print one JSON object per step on stdout: {"step": N, "loss": X, ...}`)
	fl.StringVar(&f.saveParams, "save-params", "", "write the final parameters to this directory (one file per tp/pp rank)")
	fl.StringVar(&f.backend, "backend", "tcp", "transport of the TP, PP and DP groups: "+strings.Join(trainBackends, ", "))
}

// config loads the job, applies the overrides and resolves the layout.
func (f *trainFlags) config(cmd *cobra.Command, path string) (*engine.Config, error) {
	if !slices.Contains(trainBackends, f.backend) {
		return nil, fmt.Errorf("unknown backend %q (want one of %s)", f.backend, strings.Join(trainBackends, ", "))
	}
	if f.backend == "nccl" && f.inproc {
		return nil, errors.New("--backend nccl runs the ranks as processes; --inproc runs them over an in-memory network")
	}
	kind, err := schedule.ParseKind(f.schedule)
	if err != nil {
		return nil, err
	}
	job, err := engine.LoadJob(path, func(j *engine.Job) {
		if cmd.Flags().Changed("steps") {
			j.Steps = f.steps
		}
		if cmd.Flags().Changed("seed") {
			j.Seed = f.seed
		}
	})
	if err != nil {
		return nil, err
	}
	return engine.NewConfig(job, engine.Shape{NP: f.np, TP: f.tp, PP: f.pp, DP: f.dp, Virtual: f.vpp, Zero: f.zero, Schedule: kind})
}

func newTrainCmd() *cobra.Command {
	var f trainFlags
	cmd := &cobra.Command{
		Use:   "train [flags] JOB.yaml",
		Short: "Train a native-engine job on a 3D-parallel layout of local processes",
		Long: `train runs the native Go engine on a job file (examples/jobs/mlp.yaml):
tensor-parallel layers over --tp ranks, --pp pipeline stages run by --schedule,
--dp data-parallel replicas with ZeRO stage --zero. Ranks are local processes
joined over TCP on 127.0.0.1, or goroutines with --inproc. Every layout
computes the same losses as a single process.

With --backend nccl the TP, PP and DP groups are NCCL communicators on the
machine's GPUs (rank r on GPU r mod GPUs; ranks sharing a GPU get NCCL_HOSTIDs
of their own), while the engine computes on the CPU and keeps its buffers in
host memory. Where NCCL, the CUDA runtime or a GPU is missing, train fails at
once with one line saying which, and starts nothing.`,
		Example: `  gpucoord train --np 8 --tp 2 --pp 2 --dp 2 --schedule 1f1b --zero 1 examples/jobs/mlp.yaml
  gpucoord train --np 4 --tp 2 --pp 2 --backend nccl examples/jobs/mlp.yaml`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError(fmt.Errorf("train needs exactly one job file, got %d arguments", len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.config(cmd, args[0])
			if err != nil {
				return usageError(err)
			}
			devices := 0
			if f.backend == "nccl" {
				// Before anything is printed or started: no NCCL or no GPU
				// is one line on stderr.
				if devices, err = nccl.Devices(nccl.DefaultConfig()); err != nil {
					return err
				}
			}
			if f.saveParams != "" {
				// Before any training: a directory that cannot take the
				// files fails now, and no other run's files stay mixed in.
				if err := engine.PrepareParamsDir(f.saveParams); err != nil {
					return usageError(fmt.Errorf("--save-params %s: %w", f.saveParams, err))
				}
			}
			out := newStepPrinter(cmd.OutOrStdout(), cfg, f.json)
			if f.inproc {
				res, err := engine.RunInProc(cmd.Context(), cfg, out.print)
				if err != nil {
					return err
				}
				if f.saveParams != "" {
					if err := engine.SaveParams(f.saveParams, res.Params); err != nil {
						return err
					}
				}
				return out.done()
			}
			if err := launchTrain(cmd.Context(), cmd.ErrOrStderr(), cfg, &f, args[0], devices, out.print); err != nil {
				return err
			}
			return out.done()
		},
	}
	f.register(cmd)
	return cmd
}

// stepPrinter writes rank 0's step results: a progress line per step, or
// JSON lines.
type stepPrinter struct {
	w     io.Writer
	cfg   *engine.Config
	json  *json.Encoder
	last  engine.StepResult
	total float64
}

func newStepPrinter(w io.Writer, cfg *engine.Config, asJSON bool) *stepPrinter {
	p := &stepPrinter{w: w, cfg: cfg}
	if asJSON {
		p.json = json.NewEncoder(w)
	} else {
		fmt.Fprintf(w, "training %s: tp %d pp %d dp %d (%s), %s x%s, ZeRO %d, %s of %d, %s\n",
			cfg.Job.Name, cfg.TP, cfg.PP, cfg.DP, nounCount(cfg.World(), "rank", "ranks"), cfg.Schedule,
			nounCount(cfg.Virtual, "chunk", "chunks"), cfg.Zero, nounCount(cfg.Microbatches(), "micro-batch", "micro-batches"),
			cfg.Job.Batch.Micro, nounCount(cfg.Job.Steps, "step", "steps"))
	}
	return p
}

func (p *stepPrinter) print(s engine.StepResult) error {
	p.last, p.total = s, p.total+s.Seconds
	if p.json != nil {
		return p.json.Encode(s)
	}
	_, err := fmt.Fprintf(p.w, "step %*d/%d  loss %.6f  %7.1f ms  %8.0f samples/s\n",
		len(fmt.Sprint(p.cfg.Job.Steps)), s.Step, p.cfg.Job.Steps, s.Loss, 1e3*s.Seconds, s.SamplesPerSec)
	return err
}

func (p *stepPrinter) done() error {
	if p.last.Step != p.cfg.Job.Steps {
		return fmt.Errorf("training ended after %d of %s", p.last.Step, nounCount(p.cfg.Job.Steps, "step", "steps"))
	}
	if p.json == nil {
		fmt.Fprintf(p.w, "done: %s in %.2f s, final loss %.6f, %.0f samples/s\n",
			nounCount(p.last.Step, "step", "steps"), p.total, p.last.Loss, float64(p.cfg.Job.Steps*p.cfg.Job.Batch.Global)/p.total)
	}
	return nil
}

// nounCount formats n with the singular or plural noun: "1 rank",
// "8 ranks", "1 micro-batch", "4 micro-batches".
func nounCount(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
