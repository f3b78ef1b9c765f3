// Package inproc starts the pieces of a gpucoord cluster inside the
// calling process: a coordinator with its embedded etcd, and agents. It
// is what `gpucoord launch --standalone` runs a job on, so that one
// machine needs no other process; the agents still start each rank as a
// process of its own.
package inproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/worker"
)

// Config describes a cluster of Nodes agents of GPUs each, on this host.
type Config struct {
	Nodes, GPUs int
	// DataDir keeps the embedded etcd's data; "" keeps it in the
	// cluster's temporary directory, removed with it.
	DataDir string
	// Logs receives the coordinator's and agents' logs (Info and up).
	Logs io.Writer
	// RankCommand starts a native job's rank (this program's rank
	// subcommand); FenceCommand the agents' fence watchdog.
	RankCommand, FenceCommand []string
	// Version is what the agents report of themselves.
	Version string
}

// Cluster is a running in-process cluster.
type Cluster struct {
	// Addr is the coordinator's address (loopback, a port of its own).
	Addr    string
	stopAll func() // stops the agents, then the coordinator, and waits
	tmp     string
	held    string // the agents' checkpoints, maybe outside tmp (/dev/shm)
	agents  []*worker.Agent
	failed  <-chan struct{} // closed when an agent (or the coordinator) has stopped
	err     func() error    // why, once failed is closed
}

// Start starts the coordinator and the agents; Stop stops them. The
// cluster outlives ctx's cancellation only as far as Stop: the caller
// passes a context it cancels after its job is done.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Nodes < 1 || cfg.GPUs < 1 {
		return nil, fmt.Errorf("inproc: %d nodes of %d GPUs: want at least one of each", cfg.Nodes, cfg.GPUs)
	}
	tmp, err := os.MkdirTemp("", "gpucoord-standalone-")
	if err != nil {
		return nil, err
	}
	dataDir := cmp.Or(cfg.DataDir, filepath.Join(tmp, "etcd"))
	log := slog.New(slog.NewTextHandler(cmp.Or[io.Writer](cfg.Logs, io.Discard), &slog.HandlerOptions{Level: slog.LevelInfo}))
	cc := coordinator.DefaultConfig()
	cc.Listen, cc.Etcd.DataDir, cc.Logger = "127.0.0.1:0", dataDir, log
	co, err := coordinator.New(ctx, cc)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	// The agents hold the checkpoints of jobs without a --checkpoint-dir
	// in memory where there is room, in a directory of this cluster's
	// (named as the temporary directory is), removed with it; each agent
	// keeps its own under it.
	held := worker.CheckpointRoot(filepath.Base(tmp), "", tmp)
	// The agents stop first (they leave the pool while the coordinator
	// still answers), then the coordinator.
	cctx, cancelCo := context.WithCancel(ctx)
	cg, cctx := errgroup.WithContext(cctx)
	cg.Go(func() error { return co.Run(cctx) })
	actx, cancelAgents := context.WithCancel(cctx)
	g, gctx := errgroup.WithContext(actx)
	stop := func() {
		cancelAgents()
		g.Wait()
		cancelCo()
		cg.Wait()
	}
	var agents []*worker.Agent
	for n := range cfg.Nodes {
		wc := worker.DefaultConfig()
		wc.Coordinators, wc.Name, wc.Host, wc.GPUs = []string{co.Addr()}, fmt.Sprintf("node%d", n), "127.0.0.1", cfg.GPUs
		// The caller shows the ranks' output as it does a cluster's: read
		// from the agents.
		wc.NativeCommand, wc.FenceCommand = cfg.RankCommand, cfg.FenceCommand
		wc.WorkDir, wc.Output, wc.Logger, wc.Version = filepath.Join(tmp, "work"), io.Discard, log, cfg.Version
		wc.CheckpointRoot = held
		// The agents run as the caller's user, for the caller alone: the
		// ranks inherit its environment, as torchrun's do, but gpucoord's
		// own variables (a join token among them).
		wc.RankEnv = []string{"*"}
		a, err := worker.New(wc)
		if err != nil {
			stop()
			os.RemoveAll(tmp)
			os.RemoveAll(held)
			return nil, err
		}
		g.Go(func() error { return a.Run(gctx) })
		agents = append(agents, a)
	}
	return &Cluster{Addr: co.Addr(), stopAll: stop, tmp: tmp, held: held, agents: agents, failed: gctx.Done(),
		err: func() error { return cmp.Or(context.Cause(gctx), errors.New("stopped")) }}, nil
}

// Ready waits until every agent is registered and watching, so that a job
// has its nodes at once, for at most timeout.
func (c *Cluster) Ready(ctx context.Context, timeout time.Duration) error {
	deadline := time.After(timeout)
	for _, a := range c.agents {
		select {
		case <-a.Ready():
		case <-c.failed:
			return fmt.Errorf("standalone cluster: %w", c.err())
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("standalone cluster: its agents did not register within %s (gpucoord launch -v shows their logs)", timeout)
		}
	}
	return nil
}

// Stop tears the cluster down: the agents stop their ranks and leave, the
// coordinator and its etcd stop, the temporary files go.
func (c *Cluster) Stop() {
	c.stopAll()
	os.RemoveAll(c.tmp)
	os.RemoveAll(c.held)
}
