package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"

	"github.com/spf13/cobra"
	"gpucoord/collectives"
	"gpucoord/collectives/tcp"
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
		Stderr: stderr,
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
			ctx := cmd.Context()
			st, err := tcp.DialStore(ctx, store)
			if err != nil {
				return err
			}
			defer st.Close()
			// Once every rank has passed the final barrier, sockets closing are
			// the expected end, not news: raise the level then.
			level := new(slog.LevelVar)
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			tc := tcp.DefaultConfig()
			tc.Rank, tc.Size, tc.Store, tc.Logger = rank, cfg.World(), st, log
			t, err := tcp.New(ctx, tc)
			if err != nil {
				return fmt.Errorf("rank %d: connect: %w", rank, err)
			}
			defer t.Close()
			cc := collectives.DefaultConfig()
			cc.Logger = log
			world, err := collectives.New(t, cc)
			if err != nil {
				return err
			}
			defer world.Close()
			enc := json.NewEncoder(cmd.OutOrStdout())
			r, err := engine.Train(ctx, cfg, world, func(s engine.StepResult) error {
				if rank == 0 {
					return enc.Encode(s)
				}
				return nil
			})
			if err != nil {
				return err
			}
			defer r.Close()
			if f.saveParams != "" {
				if err := r.WriteParams(ctx, f.saveParams); err != nil {
					return err
				}
			}
			// Leave together: a rank that closed its sockets early would look
			// like a lost peer to one still finishing its last collective.
			// After the first barrier the run is done and sockets closing are
			// expected; the second makes sure every rank knows that before
			// any rank closes.
			if err := world.Barrier(ctx); err != nil {
				return err
			}
			level.Set(slog.LevelError)
			return world.Barrier(ctx)
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&rank, "rank", 0, "this process's global rank")
	cmd.Flags().StringVar(&store, "store", "", "address of the rendezvous store")
	return cmd
}
