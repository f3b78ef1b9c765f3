package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// BenchmarkRendezvous64 times rendezvous of 64 agents into one generation:
// from Submit of a 64-node job until every agent's Watch stream (each over
// its own gRPC connection, as real agents) has delivered its assignment.
// The coordinator runs the embedded etcd. Between iterations the job is
// cancelled and the agents freed, untimed.
func BenchmarkRendezvous64(b *testing.B) {
	nodes := 64 // NODES=n sets another count
	if n, err := strconv.Atoi(os.Getenv("NODES")); err == nil {
		nodes = n
	}
	e, err := OpenEtcd(b.Context(), EtcdConfig{DataDir: b.TempDir(), DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cfg := DefaultConfig()
	cfg.Listen, cfg.Etcd.Endpoints = "127.0.0.1:0", e.Endpoints
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }() // before the etcd closes
	chans := make([]<-chan *pb.Assignment, nodes)
	var ctl pb.CoordinatorClient
	for i := range nodes {
		cc, err := pb.Dial(c.Addr(), nil, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		cl := pb.NewCoordinatorClient(cc)
		ctl = cl
		resp, err := cl.Register(b.Context(), &pb.RegisterRequest{Node: node(fmt.Sprintf("n%02d", i), 8)})
		if err != nil {
			b.Fatal(err)
		}
		stream, err := cl.Watch(b.Context(), &pb.WatchRequest{Node: fmt.Sprintf("n%02d", i), LeaseId: resp.LeaseId})
		if err != nil {
			b.Fatal(err)
		}
		ch := make(chan *pb.Assignment, 16)
		go func() {
			for {
				a, err := stream.Recv()
				if err != nil {
					close(ch)
					return
				}
				ch <- a
			}
		}()
		chans[i] = ch
		<-ch // the first, empty assignment
	}
	wait := func(job string) {
		for _, ch := range chans {
			for a := range ch {
				if !a.Renewal && a.Job == job {
					break
				}
			}
		}
	}
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("j%d", i)
		if _, err := ctl.Submit(b.Context(), &pb.SubmitRequest{Spec: &pb.JobSpec{Id: id, Nodes: int32(nodes), GpusPerNode: 8, Tp: 8, Pp: 1, Command: []string{"true"}}}); err != nil {
			b.Fatal(err)
		}
		wait(id)
		b.StopTimer()
		if _, err := ctl.Cancel(b.Context(), &pb.CancelRequest{Job: id}); err != nil {
			b.Fatal(err)
		}
		wait("")
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/rendezvous")
}
