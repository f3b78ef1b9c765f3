package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/client"
	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

func init() { subcommands = append(subcommands, newCancelCmd, newFollowCmd) }

// coordinatorsOf splits coord (comma-separated addresses) and gets the
// credentials auth gives for them.
func coordinatorsOf(ctx context.Context, coord string, auth *authFlags) ([]string, credentials.TransportCredentials, error) {
	if coord == "" {
		return nil, nil, usageError(errors.New("give --coordinator ADDR"))
	}
	addrs := strings.Split(coord, ",")
	creds, err := auth.clientCredentials(ctx, addrs, pki.RoleClient)
	return addrs, creds, err
}

// connectTimeouts gives cfg --connect-timeout: each coordinator has as
// long to answer a connection, and a call at least as long to answer.
func connectTimeouts(cfg *client.Config, d time.Duration) {
	if d > 0 {
		cfg.ConnectTimeout, cfg.CallTimeout = d, max(cfg.CallTimeout, d)
	}
}

// dialCoordinators makes a client of the coordinators coord names, with
// the credentials auth gives.
func dialCoordinators(ctx context.Context, coord string, auth *authFlags) (*client.Client, credentials.TransportCredentials, error) {
	addrs, creds, err := coordinatorsOf(ctx, coord, auth)
	if err != nil {
		return nil, nil, err
	}
	cfg := client.DefaultConfig()
	cfg.Coordinators, cfg.Credentials, cfg.Logger = addrs, creds, slog.New(slog.DiscardHandler)
	connectTimeouts(cfg, auth.connectTimeout)
	cl, err := client.New(cfg)
	if err != nil {
		return nil, nil, usageError(err)
	}
	return cl, creds, nil
}

func newCancelCmd() *cobra.Command {
	var coord, reason string
	var auth authFlags
	cmd := &cobra.Command{
		Use:   "cancel JOB --coordinator ADDR",
		Short: "Cancel a job: its ranks are stopped and it ends as cancelled",
		Long: `cancel ends a job that launch submitted, from anywhere that reaches a
coordinator: every rank of its generation is stopped and the job ends as
CANCELLED (launch, if still following it, exits 130). A job that had
already ended is reported as it ended. Exits 0 either way, 1 when no
coordinator knows the job.`,
		Example: `  gpucoord cancel job-20261125-101500-a1b2c3 --coordinator 10.0.0.1:7070`,
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cl, creds, err := dialCoordinators(c.Context(), coord, &auth)
			if err != nil {
				return err
			}
			defer cl.Close()
			st, err := cl.Cancel(c.Context(), args[0], reason) // bounded by the client, as status's
			switch {
			case errors.Is(err, client.ErrNotFound):
				return fmt.Errorf("no job %s: gpucoord status lists the jobs", args[0])
			case err != nil:
				return callFailed(coord, err, creds)
			case st.GetPhase() == pb.JobState_CANCELLED:
				fmt.Fprintf(c.OutOrStdout(), "job %s cancelled\n", args[0])
			default:
				fmt.Fprintf(c.OutOrStdout(), "job %s had already ended: %s\n", args[0], phaseWord(st.GetPhase()))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&coord, "coordinator", "", "coordinator addresses, comma-separated")
	cmd.Flags().StringVar(&reason, "reason", "cancelled by gpucoord cancel", "why, as the job's state will say")
	auth.register(cmd)
	return cmd
}

func newFollowCmd() *cobra.Command {
	f := &follower{}
	var coord, output string
	var auth authFlags
	cmd := &cobra.Command{
		Use:   "follow JOB --coordinator ADDR [--json]",
		Short: "Follow a running job as launch does, from wherever it stands",
		Long: `follow prints a job's generations and steps as launch does, from the job
as it is now until it ends, and exits with the job's status as launch
would: after launch --detach, or a launch whose terminal went away.
Ctrl-C (or SIGHUP, SIGTERM) stops following and leaves the job running;
gpucoord cancel ends it.`,
		Example: `  gpucoord follow job-20261125-101500-a1b2c3 --coordinator 10.0.0.1:7070`,
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			addrs, creds, err := coordinatorsOf(c.Context(), coord, &auth)
			if err != nil {
				return err
			}
			if err := validOutput(output); err != nil {
				return usageError(err)
			}
			agents, err := auth.agentTLS(c.Context(), addrs)
			if err != nil {
				return err
			}
			f.addrs, f.creds, f.attach, f.connectTimeout = addrs, creds, true, auth.connectTimeout
			f.spec = &pb.JobSpec{Id: args[0]}
			stdout, stderr := &lockedWriter{w: c.OutOrStdout()}, &lockedWriter{w: c.ErrOrStderr()}
			f.out, f.progress = stdout, stdout
			if f.json {
				f.progress = stderr
			}
			f.output = newRankOutput(output, args[0], ranklog.NewClient(agents), rankLines(stdout, stderr, f.json), f.progress)
			return f.run(c.Context())
		},
	}
	cmd.Flags().StringVar(&coord, "coordinator", "", "coordinator addresses, comma-separated")
	cmd.Flags().BoolVar(&f.json, "json", false, "print each step as a JSON line, as launch --json does (other output goes to stderr)")
	cmd.Flags().StringVar(&output, "output", outputAll, "the ranks' output to show, from the current generation's start: all, rank0 or failed")
	auth.register(cmd)
	return cmd
}

// phaseWord is a job phase as the text output spells it.
func phaseWord(p pb.JobState_Phase) string { return strings.ToLower(p.String()) }
