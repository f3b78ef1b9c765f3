package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gpucoord/gpucoord/collectives/nccl"
	"github.com/gpucoord/gpucoord/internal/localproc"
	"github.com/gpucoord/gpucoord/internal/rankexe"
	"github.com/gpucoord/gpucoord/worker/engine"
)

func init() { subcommands = append(subcommands, newTrainWorkerCmd) }

// trainWorkerCmd is the hidden child of train: one rank of a TCP world.
const trainWorkerCmd = "train-worker"

// launchTrain runs the job as cfg.World() child processes of this binary
// joined over TCP on 127.0.0.1 (internal/localproc). Rank 0 writes its step
// results to its stdout as JSON lines, which are handed to report. With
// --backend nccl, rank r is placed on one of the machine's devices GPUs by
// nccl.PlaceLocal (its --device and its NCCL_HOSTID).
func launchTrain(ctx context.Context, stderr io.Writer, cfg *engine.Config, f *trainFlags, jobPath string, devices int, report func(engine.StepResult) error) error {
	exe, err := rankexe.Path()
	if err != nil {
		return err
	}
	host := localproc.Hostname()
	return localproc.Run(ctx, localproc.Config{
		Ranks:  cfg.World(),
		Stderr: func(int) io.Writer { return stderr },
		Command: func(ctx context.Context, rank int, store string) (*exec.Cmd, error) {
			args := []string{trainWorkerCmd, "--rank", strconv.Itoa(rank), "--store", store,
				"--tp", strconv.Itoa(cfg.TP), "--pp", strconv.Itoa(cfg.PP), "--dp", strconv.Itoa(cfg.DP),
				"--vpp", strconv.Itoa(cfg.Virtual), "--zero", strconv.Itoa(cfg.Zero), "--schedule", string(cfg.Schedule),
				"--steps", strconv.Itoa(cfg.Job.Steps), "--seed", strconv.FormatUint(cfg.Job.Seed, 10)}
			if f.saveParams != "" {
				args = append(args, "--save-params", f.saveParams)
			}
			var env []string
			if f.backend == "nccl" {
				device, hostID := nccl.PlaceLocal(rank, devices, host)
				args = append(args, "--backend", f.backend, "--device", strconv.Itoa(device))
				env = append(os.Environ(), nccl.EnvHostID+"="+hostID)
			}
			cmd := exec.CommandContext(ctx, exe, append(args, jobPath)...)
			cmd.Env = env
			return cmd, nil
		},
	}, report)
}

func newTrainWorkerCmd() *cobra.Command {
	var f trainFlags
	var rank, device int
	var store string
	cmd := &cobra.Command{
		Use:    trainWorkerCmd + " --rank R --store ADDR [train flags] JOB.yaml",
		Short:  "One rank of gpucoord train (started by train; not for direct use)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.config(cmd, args[0])
			if err != nil {
				return usageError(err)
			}
			secret, err := localproc.StoreSecret()
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			p := engine.Process{Rank: rank, Store: store, StoreSecret: secret, SaveParams: f.saveParams, Log: cmd.ErrOrStderr()}
			if f.backend == "nccl" {
				p.NCCL = nccl.DefaultConfig()
				p.NCCL.Device, p.NCCL.Key = device, "train/nccl"
			}
			return engine.RunProcess(cmd.Context(), cfg, p,
				func(s engine.StepResult) error {
					if rank == 0 {
						return enc.Encode(s)
					}
					return nil
				})
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&rank, "rank", 0, "this process's global rank")
	cmd.Flags().StringVar(&store, "store", "", "address of the rendezvous store")
	cmd.Flags().IntVar(&device, "device", 0, "CUDA device of this rank (--backend nccl)")
	return cmd
}
