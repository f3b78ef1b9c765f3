package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

func init() { subcommands = append(subcommands, newLogsCmd) }

// Output modes of launch and follow (--output).
const (
	outputAll   = "all"   // every rank's lines, as they come
	outputRank0 = "rank0" // rank 0's alone
	outputFail  = "failed"
)

// validOutput checks an --output value.
func validOutput(mode string) error {
	switch mode {
	case outputAll, outputRank0, outputFail:
		return nil
	}
	return fmt.Errorf("--output %q: want all, rank0 or failed", mode)
}

// drainFor is how long launch waits, once its job has ended, for the last
// lines of the ranks to come; a generation's followers are given as long
// after a newer generation starts.
const drainFor = 5 * time.Second

// rankOutput shows the ranks' output as launch follows a job: for each
// generation it reads, from every member's agent (rank 0's alone with
// rank0), that generation's lines, each behind its rank's tag, from its
// first line on, until the generation has ended there. The lines of a
// generation so come after launch's line announcing it.
type rankOutput struct {
	mode string
	job  string
	cl   *ranklog.Client
	// w takes the ranks' lines, warn launch's own about them; each Write
	// is one line, and safe for concurrent use.
	w, warn io.Writer

	last atomic.Int64 // when the last line came, Unix nanoseconds

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	mu   sync.Mutex
	// gen is the newest generation read, stopGen stops its readers.
	gen     int64
	stopGen context.CancelFunc
}

func newRankOutput(mode, job string, cl *ranklog.Client, w, warn io.Writer) *rankOutput {
	ctx, stop := context.WithCancel(context.Background())
	return &rankOutput{mode: mode, job: job, cl: cl, w: w, warn: warn, ctx: ctx, stop: stop}
}

// generation starts reading g's output, and gives the earlier
// generations' readers drainFor to finish (a lost node's never does).
func (o *rankOutput) generation(g *pb.Generation) {
	if o == nil || o.mode == outputFail {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if g.Number <= o.gen {
		return
	}
	if o.stopGen != nil {
		time.AfterFunc(drainFor, o.stopGen)
	}
	ctx, stop := context.WithCancel(o.ctx)
	o.gen, o.stopGen = g.Number, stop
	for _, m := range g.Members {
		rank := -1
		if o.mode == outputRank0 {
			if m.FirstRank != 0 {
				continue
			}
			rank = 0
		}
		if m.CheckpointAddr == "" {
			fmt.Fprintf(o.warn, "the output of %s's ranks is not shown: its agent serves nothing (no credentials, off loopback)\n", m.Node)
			continue
		}
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			err := o.cl.Follow(ctx, m.Node, m.CheckpointAddr, o.job, g.Number, rank, func(b []byte) {
				o.w.Write(b)
				o.last.Store(time.Now().UnixNano())
			})
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(o.warn, "the output of %s's ranks (generation %d) stopped: %v\n", m.Node, g.Number, err)
			}
		}()
	}
}

// lastLine is when the ranks' last line was shown, or since when none
// has been.
func (o *rankOutput) lastLine(since time.Time) time.Time {
	if o == nil {
		return since
	}
	if at := time.Unix(0, o.last.Load()); at.After(since) {
		return at
	}
	return since
}

// drain waits up to d for the readers to finish (the job ended: each ends
// once its node's ranks have stopped and every line is shown), then stops
// the rest.
func (o *rankOutput) drain(d time.Duration) {
	if o == nil {
		return
	}
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
	o.stop()
	<-done
	o.cl.Close()
}

func newLogsCmd() *cobra.Command {
	var coord string
	var rank int
	var auth authFlags
	cmd := &cobra.Command{
		Use:   "logs JOB --coordinator ADDR [--rank R]",
		Short: "Print what a job's ranks printed, from the logs their agents keep",
		Long: `logs prints what a job's ranks printed, each line behind its rank's tag,
from the log each agent keeps per rank (the latest 2 MiB of each; the
logs of a node's last 32 jobs stay after they end). Every node in the
pool is asked, so the ranks of earlier generations on nodes that since
left the job are shown too, node by node. With --rank, only that global
rank's lines.`,
		Example: `  gpucoord logs job-20261125-101500-a1b2c3 --coordinator 10.0.0.1:7070 --rank 3`,
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if c.Flags().Changed("rank") && rank < 0 {
				return usageError(fmt.Errorf("--rank %d: want a global rank, 0 or more", rank))
			}
			cl, creds, err := dialCoordinators(c.Context(), coord, &auth)
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(c.Context(), time.Minute)
			defer cancel()
			st, err := cl.Status(ctx)
			if err != nil {
				return callFailed(coord, err, creds)
			}
			if !slices.ContainsFunc(st.Jobs, func(j *pb.JobStatus) bool { return j.GetSpec().GetId() == args[0] }) {
				return fmt.Errorf("no job %s: gpucoord status lists the jobs", args[0])
			}
			tc, err := auth.agentTLS(ctx, strings.Split(coord, ","))
			if err != nil {
				return err
			}
			agents := ranklog.NewClient(tc)
			defer agents.Close()
			if !c.Flags().Changed("rank") {
				rank = -1
			}
			return printLogs(ctx, c.OutOrStdout(), c.ErrOrStderr(), agents, st.Nodes, args[0], rank)
		},
	}
	cmd.Flags().StringVar(&coord, "coordinator", "", "coordinator addresses, comma-separated")
	cmd.Flags().IntVar(&rank, "rank", 0, "only this global rank's lines")
	auth.register(cmd)
	return cmd
}

// printLogs asks every node (16 at a time) for job's logs and prints what
// they hold, node by node in the pool's order.
func printLogs(ctx context.Context, w, warn io.Writer, agents *ranklog.Client, nodes []*pb.NodeStatus, job string, rank int) error {
	got := make([]bytes.Buffer, len(nodes))
	errs := make([]error, len(nodes))
	var g errgroup.Group
	g.SetLimit(16)
	for i, n := range nodes {
		addr := n.GetNode().GetCheckpointAddr()
		if addr == "" {
			continue
		}
		g.Go(func() error {
			errs[i] = agents.Logs(ctx, n.GetNode().GetName(), addr, job, rank, &got[i])
			return nil
		})
	}
	g.Wait()
	found := false
	for i, n := range nodes {
		switch {
		case errs[i] == nil && got[i].Len() > 0:
			found = true
			w.Write(got[i].Bytes())
		case errs[i] != nil && !errors.Is(errs[i], ranklog.ErrNone):
			fmt.Fprintf(warn, "node %s: %v\n", n.GetNode().GetName(), errs[i])
		}
	}
	if !found {
		what := "job " + job
		if rank >= 0 {
			what = "rank " + strconv.Itoa(rank) + " of " + what
		}
		return fmt.Errorf("no node holds a log of %s: its ranks printed nothing, or the nodes that ran them left the pool", what)
	}
	return nil
}
