package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// interruptingCoordinator accepts a job, interrupts launch once the job
// runs, and answers the cancel with state.
type interruptingCoordinator struct {
	pb.UnimplementedCoordinatorServer
	interrupt context.CancelFunc
	state     *pb.JobState

	mu      sync.Mutex
	reasons []string
}

func (c *interruptingCoordinator) Submit(context.Context, *pb.SubmitRequest) (*pb.SubmitResponse, error) {
	return &pb.SubmitResponse{}, nil
}

func (c *interruptingCoordinator) Follow(_ *pb.FollowRequest, stream grpc.ServerStreamingServer[pb.JobEvent]) error {
	if err := stream.Send(&pb.JobEvent{State: &pb.JobState{Phase: pb.JobState_RUNNING}, Revision: 1}); err != nil {
		return err
	}
	c.interrupt()
	<-stream.Context().Done()
	return nil
}

func (c *interruptingCoordinator) Cancel(_ context.Context, req *pb.CancelRequest) (*pb.CancelResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reasons = append(c.reasons, req.GetReason())
	return &pb.CancelResponse{State: c.state}, nil
}

// TestLaunchCancelState: an interrupted launch cancels its job and reports
// the state the cancel produced; without one, the job is cancelled.
func TestLaunchCancelState(t *testing.T) {
	tests := []struct {
		name     string
		state    *pb.JobState
		wantCode int    // 0: launch succeeds
		want     string // in the error, or in the output when it succeeds
	}{
		{name: "no state", wantCode: exitInterrupted, want: "job j cancelled: launch interrupted"},
		{name: "cancelled", state: &pb.JobState{Phase: pb.JobState_CANCELLED, Reason: "launch interrupted", ExitCode: 130},
			wantCode: exitInterrupted, want: "job j cancelled: launch interrupted"},
		{name: "cancelled before", state: &pb.JobState{Phase: pb.JobState_CANCELLED, Reason: "cancelled by ops", ExitCode: 130},
			wantCode: exitInterrupted, want: "job j cancelled: cancelled by ops"},
		{name: "failed first", state: &pb.JobState{Phase: pb.JobState_FAILED, Reason: "rank 0 on n0 exited with code 7", ExitCode: 7},
			wantCode: 7, want: "job j failed: rank 0 on n0 exited with code 7"},
		{name: "succeeded first", state: &pb.JobState{Phase: pb.JobState_SUCCEEDED}, want: "job j succeeded in "},
	}
	t.Setenv("GPUCOORD_TOKEN", "")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, interrupt := context.WithCancel(t.Context())
			defer interrupt()
			fake := &interruptingCoordinator{interrupt: interrupt, state: tc.state}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			pb.RegisterCoordinatorServer(srv, fake)
			served := make(chan struct{})
			go func() {
				defer close(served)
				srv.Serve(lis)
			}()
			defer func() { srv.Stop(); <-served }()

			var out, errOut bytes.Buffer
			err = run(ctx, []string{"launch", "--coordinator", lis.Addr().String(), "--nodes", "1", "--gpus-per-node", "1",
				"--job-id", "j", "--", "true"}, &out, &errOut)
			var ee *exitError
			switch {
			case tc.wantCode == 0 && (err != nil || !strings.Contains(out.String(), tc.want)):
				t.Errorf("err = %v, output:\n%s\nwant success with %q", err, out.String(), tc.want)
			case tc.wantCode != 0 && (!errors.As(err, &ee) || ee.code != tc.wantCode || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want exit %d with %q", err, tc.wantCode, tc.want)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if len(fake.reasons) != 1 || fake.reasons[0] != "launch interrupted" {
				t.Errorf("cancels with reasons %q, want one with %q", fake.reasons, "launch interrupted")
			}
		})
	}
}
