package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strconv"

	"github.com/spf13/cobra"
	"gpucoord/internal/localproc"
	"gpucoord/worker/engine"
)

func init() { subcommands = append(subcommands, newTrainWorkerCmd) }

// trainWorkerCmd is the hidden child of train: one rank of a TCP world.
const trainWorkerCmd = "train-worker"

// launchTrain runs the job as cfg.World() child processes of this binary
// joined over TCP on 127.0.0.1 (internal/localproc). Rank 0 writes its step
// results to its stdout as JSON lines, which are handed to report.
func launchTrain(ctx context.Context, stderr io.Writer, cfg *engine.Config, f *trainFlags, jobPath string, report func(engine.StepResult) error) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
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
			return exec.CommandContext(ctx, exe, append(args, jobPath)...), nil
		},
	}, report)
}

func newTrainWorkerCmd() *cobra.Command {
	var f trainFlags
	var rank int
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
			enc := json.NewEncoder(cmd.OutOrStdout())
			return engine.RunProcess(cmd.Context(), cfg, engine.Process{Rank: rank, Store: store, SaveParams: f.saveParams, Log: cmd.ErrOrStderr()},
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
	return cmd
}
