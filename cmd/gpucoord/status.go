package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

func init() { subcommands = append(subcommands, newStatusCmd) }

func newStatusCmd() *cobra.Command {
	var coord string
	var asJSON, web bool
	var auth authFlags
	cmd := &cobra.Command{
		Use:   "status --coordinator ADDR [--json | --web]",
		Short: "Show the pool, the jobs, their generations and the leader",
		Long: `status asks the coordinators (the first that answers) for the pool and
the jobs: every registered node with its host, GPUs and the job it runs;
every job with its phase, its current generation (nodes, ranks, layout),
its last step and committed step, each member's state (alive,
disconnected, lost), its stragglers and, for a failed job, the failing
rank's last output. --json prints the same as one JSON object (schema
gpucoord.status/1, docs/LAUNCH.md). --web prints only the address of the
dashboard of the coordinator that answered (coordinator --http), as this
machine reached it: open it in a browser (off loopback the browser needs a
client certificate of the cluster's CA, docs/SECURITY.md).`,
		Example: `  gpucoord status --coordinator 10.0.0.1:7070,10.0.0.2:7070
  gpucoord status --coordinator 127.0.0.1:7070 --web
  gpucoord status --coordinator 10.0.0.1:7070 --json | jq '.jobs[] | {id, phase}'`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			cl, creds, err := dialCoordinators(c.Context(), coord, &auth)
			if err != nil {
				return err
			}
			defer cl.Close()
			// The client bounds the call: each coordinator has
			// --connect-timeout, a few passes over them at most.
			resp, err := cl.Status(c.Context())
			if err != nil {
				return callFailed(coord, err, creds)
			}
			if web {
				if resp.GetDashboard() == "" {
					return fmt.Errorf("the coordinator that answered serves no dashboard: start it with --http HOST:PORT")
				}
				fmt.Fprintln(c.OutOrStdout(), resp.GetDashboard())
				return nil
			}
			return printStatus(c.OutOrStdout(), resp, asJSON)
		},
	}
	cmd.Flags().StringVar(&coord, "coordinator", "", "coordinator addresses, comma-separated (the first that answers)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().BoolVar(&web, "web", false, "print the address of the answering coordinator's dashboard and nothing else")
	cmd.MarkFlagsMutuallyExclusive("json", "web")
	auth.register(cmd)
	return cmd
}

// printStatus writes the coordinator's status as text or JSON.
func printStatus(w io.Writer, s *pb.StatusResponse, asJSON bool) error {
	if asJSON {
		return writeStatusJSON(w, s)
	}
	fmt.Fprintf(w, "leader: %s\n", s.Leader)
	fmt.Fprintf(w, "nodes: %d\n", len(s.Nodes))
	for _, n := range s.Nodes {
		job := n.Job
		if job == "" {
			job = "idle"
		}
		fmt.Fprintf(w, "  %-12s %-21s %d GPUs  %s\n", n.Node.Name, n.Node.Host, n.Node.Gpus, job)
	}
	fmt.Fprintf(w, "jobs: %d\n", len(s.Jobs))
	for _, j := range s.Jobs {
		phase := phaseWord(j.State.GetPhase())
		line := fmt.Sprintf("  %s  %s", j.Spec.Id, phase)
		if g := j.Generation; g != nil {
			names := make([]string, len(g.Members))
			for i, m := range g.Members {
				names[i] = m.Node
			}
			line += fmt.Sprintf("  generation %d: %s, %d ranks (%s)", g.Number, strings.Join(names, ","), g.World, pb.GenerationGrid(j.Spec, g).Label(g.Dp))
		}
		if j.LastStep != nil {
			line += fmt.Sprintf("  step %d loss %.6f (committed %d)", j.LastStep.Step, j.LastStep.Loss, j.CommittedStep)
		}
		if j.State.GetReason() != "" {
			line += "  (" + j.State.Reason + ")"
		}
		fmt.Fprintln(w, line)
		if out := j.State.GetOutput(); out != "" {
			fmt.Fprintf(w, "    last output of rank %d on %s:\n%s\n", j.State.FailedRank, j.State.FailedNode, indent(out, "      "))
		}
		if !pb.Terminal(j.State) {
			for _, m := range j.Members {
				fmt.Fprintf(w, "    %-12s ranks %d-%d  %s\n", m.Node, m.FirstRank, m.FirstRank+m.Ranks-1, m.State)
			}
			for _, s := range j.Stragglers {
				fmt.Fprintf(w, "    straggler: rank %d on %s (GPU %d), %.2fx the median compute time\n", s.Rank, s.Node, s.LocalRank, s.Ratio)
			}
		}
	}
	return nil
}

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}
