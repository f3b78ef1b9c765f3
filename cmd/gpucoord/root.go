package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// Exit codes scripts may rely on.
const (
	exitFailure = 1 // the command failed while running
	exitUsage   = 2 // invalid input: bad flags, spec or parallel layout
	exitNoFit   = 3 // plan: the plan is valid but does not fit in memory
	// exitInterrupted is 128+SIGINT: the command was stopped by SIGINT or
	// SIGTERM (launch: the job was cancelled).
	exitInterrupted = 130
	// exitRequeue is launch's under Slurm after SIGUSR1 (sbatch
	// --signal=USR1@T): the job stopped at a step of its backup tier, for
	// a requeue to resume from (EX_TEMPFAIL, as a native rank preempted).
	exitRequeue = 75
)

// exitError carries a specific process exit code. A nil err prints nothing.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageError marks err as invalid input (exit code 2).
func usageError(err error) error { return &exitError{code: exitUsage, err: err} }

// run parses args and runs one gpucoord subcommand. It is main without the
// process: tests call it with their own writers.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := &cobra.Command{
		Use:   "gpucoord",
		Short: "Plan, launch and benchmark 3D-parallel (tensor, pipeline, data) training",
		Long: `gpucoord is a topology-aware training coordinator: it plans tensor, pipeline
and data parallelism with ZeRO sharding over a cluster before a GPU is rented
(plan), launches jobs that survive node loss (launch, on one machine with
--standalone or on a cluster run by coordinator and worker; status shows
it), benchmarks its collectives (bench) and trains with its native engine
(train). Every subcommand has --help with examples.

  gpucoord launch --standalone --nodes 2 --gpus-per-node 4 --tp 2 --pp 2 examples/jobs/mlp.yaml
  gpucoord plan --cluster dgx-h100 --nodes 4 --model gpt-13b --tp 8 --pp 4`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	root.Version = buildVersion()
	root.SetVersionTemplate("gpucoord {{.Version}}\n")
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	// Wrong arguments are invalid input (exit 2) wherever cobra checks them.
	for _, c := range root.Commands() {
		if check := c.Args; check != nil {
			c.Args = func(c *cobra.Command, args []string) error {
				if err := check(c, args); err != nil {
					return usageError(err)
				}
				return nil
			}
		}
	}
	if _, _, err := root.Find(args); err != nil {
		return usageError(err)
	}
	return root.ExecuteContext(ctx)
}

// subcommands holds the constructors of every subcommand; each lives in its
// own file and registers itself in an init function.
var subcommands []func() *cobra.Command
