// Package inproc starts the pieces of a gpucoord cluster inside the
// calling process: a coordinator with its embedded etcd, and agents. A
// Node is what one host runs (an agent, and a coordinator when the host
// is one of the coordinators'): `gpucoord launch` under Slurm starts one
// in every task. A Cluster is a whole cluster on this host, what `gpucoord
// launch --standalone` runs a job on, so that one machine needs no other
// process. The agents still start each rank as a process of its own.
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
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gpucoord/gpucoord/coordinator"
	"github.com/gpucoord/gpucoord/worker"
)

// NodeConfig is what one host runs.
type NodeConfig struct {
	// Coordinator, when not nil, runs a coordinator here (started before
	// the agent, stopped after it).
	Coordinator *coordinator.Config
	// Agent runs the host's agent; nil runs none. When a coordinator runs
	// here and Agent.Coordinators is empty, the agent uses it.
	Agent *worker.Config
}

// Node is a running host: its coordinator and its agent.
type Node struct {
	co        *coordinator.Coordinator
	agent     *worker.Agent
	stopAgent func() // stops the agent and waits
	stopCo    func() // stops the coordinator and waits
	failed    <-chan struct{}
	err       func() error
}

// StartNode starts the coordinator (which binds its port and joins its
// etcd first: an error there is returned) and then the agent. Each runs
// until Stop, or until it fails (Failed). The node outlives ctx's
// cancellation only as far as Stop.
func StartNode(ctx context.Context, cfg NodeConfig) (*Node, error) {
	n := &Node{stopCo: func() {}, stopAgent: func() {}}
	cctx, cancelCo := context.WithCancel(ctx)
	cg, cctx := errgroup.WithContext(cctx)
	if cfg.Coordinator != nil {
		co, err := coordinator.New(ctx, cfg.Coordinator)
		if err != nil {
			cancelCo()
			return nil, err
		}
		n.co = co
		cg.Go(func() error { return co.Run(cctx) })
	}
	n.stopCo = func() { cancelCo(); cg.Wait() }
	actx, cancelAgent := context.WithCancel(cctx)
	ag, actx := errgroup.WithContext(actx)
	n.stopAgent = func() { cancelAgent(); ag.Wait() }
	n.failed, n.err = actx.Done(), func() error { return cmp.Or(context.Cause(actx), errors.New("stopped")) }
	if cfg.Agent != nil {
		if len(cfg.Agent.Coordinators) == 0 && n.co != nil {
			cfg.Agent.Coordinators = []string{n.co.Addr()}
		}
		a, err := worker.New(cfg.Agent)
		if err != nil {
			n.Stop()
			return nil, err
		}
		n.agent = a
		ag.Go(func() error { return a.Run(actx) })
	}
	return n, nil
}

// Coordinator is the node's coordinator, nil when it runs none.
func (n *Node) Coordinator() *coordinator.Coordinator { return n.co }

// Ready is closed once the agent is registered and watching.
func (n *Node) Ready() <-chan struct{} {
	if n.agent == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return n.agent.Ready()
}

// Failed is closed when the agent or the coordinator has stopped on its
// own (or Stop was called); Err says why.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err says why Failed is closed.
func (n *Node) Err() error { return n.err() }

// StopAgent stops the agent: it stops its ranks and leaves the pool. The
// coordinator goes on.
func (n *Node) StopAgent() { n.stopAgent() }

// Stop stops the agent, then the coordinator, and waits for both.
func (n *Node) Stop() {
	n.stopAgent()
	n.stopCo()
}

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
	Addr  string
	nodes []*Node // the first runs the coordinator
	// failed is closed, with why set, when a node has stopped.
	failed chan struct{}
	once   sync.Once
	why    error
	tmp    string
	held   string // the agents' checkpoints, maybe outside tmp (/dev/shm)
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
	log := slog.New(slog.NewTextHandler(cmp.Or[io.Writer](cfg.Logs, io.Discard), &slog.HandlerOptions{Level: slog.LevelInfo}))
	cc := coordinator.DefaultConfig()
	cc.Listen, cc.Etcd.DataDir, cc.Logger = "127.0.0.1:0", cmp.Or(cfg.DataDir, filepath.Join(tmp, "etcd")), log
	// The agents hold the checkpoints of jobs without a --checkpoint-dir
	// in memory where there is room, in a directory of this cluster's
	// (named as the temporary directory is), removed with it; each agent
	// keeps its own under it.
	held, err := worker.TempCheckpointRoot(tmp, filepath.Base(tmp)+"-")
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	c := &Cluster{failed: make(chan struct{}), tmp: tmp, held: held}
	for i := range cfg.Nodes {
		wc := worker.DefaultConfig()
		wc.Name, wc.Host, wc.GPUs = fmt.Sprintf("node%d", i), "127.0.0.1", cfg.GPUs
		// The caller shows the ranks' output as it does a cluster's: read
		// from the agents.
		wc.NativeCommand, wc.FenceCommand = cfg.RankCommand, cfg.FenceCommand
		wc.WorkDir, wc.Output, wc.Logger, wc.Version = filepath.Join(tmp, "work"), io.Discard, log, cfg.Version
		wc.CheckpointRoot = c.held
		// The agents run as the caller's user, for the caller alone: the
		// ranks inherit its environment, as torchrun's do, but gpucoord's
		// own variables (a join token among them).
		wc.RankEnv = []string{"*"}
		nc := NodeConfig{Agent: wc}
		if i == 0 {
			nc.Coordinator = cc
		} else {
			wc.Coordinators = []string{c.Addr}
		}
		n, err := StartNode(ctx, nc)
		if err != nil {
			c.Stop()
			return nil, err
		}
		if i == 0 {
			c.Addr = n.co.Addr()
		}
		c.nodes = append(c.nodes, n)
		c.watch(n)
	}
	return c, nil
}

// Ready waits until every agent is registered and watching, so that a job
// has its nodes at once, for at most timeout.
func (c *Cluster) Ready(ctx context.Context, timeout time.Duration) error {
	deadline := time.After(timeout)
	for _, n := range c.nodes {
		select {
		case <-n.Ready():
		case <-c.failed:
			return fmt.Errorf("standalone cluster: %w", c.why)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("standalone cluster: its agents did not register within %s (gpucoord launch -v shows their logs)", timeout)
		}
	}
	return nil
}

// watch closes c.failed, with the reason in c.why, when the first node
// stops (each stops at the latest with Stop).
func (c *Cluster) watch(n *Node) {
	go func() {
		<-n.Failed()
		c.once.Do(func() {
			c.why = n.Err()
			close(c.failed)
		})
	}()
}

// Stop tears the cluster down: the agents stop their ranks and leave, the
// coordinator and its etcd stop, the temporary files go.
func (c *Cluster) Stop() {
	for _, n := range c.nodes {
		n.StopAgent()
	}
	for _, n := range c.nodes {
		n.Stop()
	}
	os.RemoveAll(c.tmp)
	os.RemoveAll(c.held)
}
