package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// simFleet is the simulated agents of one benchmark run, each a gRPC
// connection of the test with its own lease and Watch stream, against one
// coordinator (TestControlPlaneLoad, TestWebLoad).
//
// # Concurrency
//
// register and watch may be called from many goroutines. Every goroutine
// of an agent ends when the agent is stopped or the fleet's context ends;
// wait waits for them.
type simFleet struct {
	ctx  context.Context // the run's: every agent ends with it
	addr string
	full bool // decode assignments whole (see watchSlim)
	wg   sync.WaitGroup
}

func newSimFleet(ctx context.Context, addr string, full bool) *simFleet {
	return &simFleet{ctx: ctx, addr: addr, full: full}
}

// simAgent is one simulated agent.
type simAgent struct {
	name string
	node *pb.Node
	cc   *grpc.ClientConn
	cl   pb.CoordinatorClient
	ctx  context.Context
	// cancel stops the agent, as a node lost: its stream ends and it does
	// not come back.
	cancel context.CancelFunc
	lease  atomic.Int64 // the lease of its registration
}

// Lease is the agent's current lease.
func (a *simAgent) Lease() int64 { return a.lease.Load() }

func (a *simAgent) close() {
	a.cancel()
	a.cc.Close()
}

// register dials the coordinator and registers node, with ctx bounding
// the registration. The agent does nothing more until watch.
func (f *simFleet) register(ctx context.Context, node *pb.Node) (*simAgent, *pb.RegisterResponse, error) {
	cc, err := pb.Dial(f.addr, nil, 0)
	if err != nil {
		return nil, nil, err
	}
	cl := pb.NewCoordinatorClient(cc)
	resp, err := cl.Register(ctx, &pb.RegisterRequest{Node: node})
	if err != nil {
		cc.Close()
		return nil, nil, fmt.Errorf("register %s: %w", node.Name, err)
	}
	actx, cancel := context.WithCancel(f.ctx)
	a := &simAgent{name: node.Name, node: node, cc: cc, cl: cl, ctx: actx, cancel: cancel}
	a.lease.Store(resp.LeaseId)
	return a, resp, nil
}

// simHooks is what an agent does with its assignments beyond what every
// simulated agent does.
type simHooks struct {
	// rank0 says the node runs rank 0: it reports rank 0's address when
	// a generation opens without one.
	rank0 bool
	// bootstrap, if not nil, is called as rank 0's node reports the
	// address.
	bootstrap func()
	// assigned, if not nil, is called with every assignment but
	// renewals, on the agent's goroutine, after the agent's own reports.
	assigned func(*slimAssignment)
}

// watch opens the agent's Watch stream and follows it on a goroutine of
// the fleet until it ends (the agent stops or the fleet's context ends).
// Following it, the agent reports it stopped earlier ranks when a
// generation waits for them (as every real agent does) and, for rank 0's
// node, rank 0's address. If the stream cannot be opened the agent is
// closed and the error returned.
func (f *simFleet) watch(a *simAgent, hooks simHooks) error {
	recv, err := watchSlim(a.ctx, a.cc, &pb.WatchRequest{Node: a.name, LeaseId: a.lease.Load()}, f.full)
	if err != nil {
		a.close()
		return err
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer a.close()
		var stopped int64 // the generation below which this node said it runs nothing
		f.follow(a, recv, hooks, &stopped)
	}()
	return nil
}

// follow reads one stream until it ends; received says whether it
// brought anything.
func (f *simFleet) follow(a *simAgent, recv func() (*slimAssignment, error), hooks simHooks, stopped *int64) (received bool, err error) {
	for {
		asg, err := recv()
		if err != nil {
			return received, err
		}
		received = true
		if asg.renewal {
			continue
		}
		if asg.job != "" && !asg.open && asg.gen > *stopped {
			// A generation that waits for earlier ranks to stop: the node
			// stops its own and says so, as every real agent does.
			*stopped = asg.gen
			req := &pb.ReportRequest{Job: asg.job, Node: a.name, LeaseId: a.lease.Load(),
				Kind: &pb.ReportRequest_Stopped{Stopped: &pb.Stopped{Below: asg.gen}}}
			f.wg.Go(func() { a.cl.Report(a.ctx, req) })
		}
		if asg.job != "" && asg.open && asg.master == "" && hooks.rank0 {
			// This node runs rank 0: it reports its address.
			if hooks.bootstrap != nil {
				hooks.bootstrap()
			}
			req := &pb.ReportRequest{Job: asg.job, Generation: asg.gen, Node: a.name,
				Kind: &pb.ReportRequest_Bootstrap{Bootstrap: &pb.Bootstrap{Master: "127.0.0.1:29500"}}}
			f.wg.Go(func() { a.cl.Report(a.ctx, req) })
		}
		if hooks.assigned != nil {
			hooks.assigned(asg)
		}
	}
}

// wait waits until every agent's goroutines have ended: call it after
// the fleet's context ended.
func (f *simFleet) wait() { f.wg.Wait() }
