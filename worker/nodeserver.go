package worker

import (
	"context"
	"errors"
	"net/http"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
	"github.com/gpucoord/gpucoord/worker/ckpt"
	"github.com/gpucoord/gpucoord/worker/ranklog"
)

// nodeMux is the node server's handler: the checkpoints h holds, to the
// nodes of their jobs (ckpt.Holder.Handle), what the ranks print, to
// users' clients and admins (ranklog.Store.Handle), and, when not nil,
// the reports of the node's block to relay (Agent.relayReport) and the
// renewals its relay forwards (Agent.relayRenewal).
func nodeMux(h *ckpt.Holder, output *ranklog.Store, relay, renewal http.HandlerFunc) *http.ServeMux {
	mux := http.NewServeMux()
	h.Handle(mux)
	output.Handle(mux)
	if relay != nil {
		mux.HandleFunc(relayRoute, relay)
	}
	if renewal != nil {
		mux.HandleFunc(renewalRoute, renewal)
	}
	return mux
}

// sawAssignment tells the holder, as soon as an assignment arrives, of
// the generation it names and its members: the node server serves the
// job's checkpoints to them, and takes their replicas of that generation,
// from now on. Peers that heard of it first wait for it a little
// (ckpt.Limits.PeerWait).
func (a *Agent) sawAssignment(asg *pb.Assignment) {
	g := asg.GetGeneration()
	if a.holder == nil || asg.GetJob() == "" || g == nil || asg.Spec == nil || !held(asg) {
		return
	}
	names := make([]string, len(g.Members))
	for i, m := range g.Members {
		names[i] = m.Node
	}
	if err := a.holder.Saw(asg.Job, g.GetNumber(), names); err != nil {
		a.log.Warn("recording the job's generation for the node server", "job", asg.Job, "generation", g.GetNumber(), "err", err)
	}
}

// members asks the coordinator the agent follows for job's current
// generation and whether node is one of its members (the node alone, or
// none): what the node server serves a job's held checkpoints by to a
// member its assignment did not name, or once this node has left the job.
func (a *Agent) members(ctx context.Context, job, node string) (int64, []string, error) {
	a.mu.Lock()
	client := a.client
	a.mu.Unlock()
	if client == nil {
		return 0, nil, errors.New("no coordinator answered yet")
	}
	cctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	resp, err := client.Members(cctx, &pb.MembersRequest{Job: job, Node: node})
	if err != nil {
		return 0, nil, err
	}
	return resp.GetGeneration(), resp.GetNodes(), nil
}
