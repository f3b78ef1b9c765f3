// Package client is the Go API of gpucoord's coordinators: submit a job,
// follow it to its end, cancel it, and read the cluster's status, moving
// between the coordinators of a cluster when one fails. gpucoord's own
// launch and status commands are built on it.
//
// # Usage
//
//	cfg := client.DefaultConfig()
//	cfg.Coordinators = []string{"10.0.0.1:7070", "10.0.0.2:7070"}
//	cfg.Credentials, err = client.Credentials(ctx, cfg.Coordinators, token, "")
//	if err != nil {
//		return err // a wrong, expired or revoked token; no coordinator answered
//	}
//	c, err := client.New(cfg)
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	if err := c.Submit(ctx, spec); err != nil {
//		return err // errors.Is(err, client.ErrInvalid): the spec cannot run
//	}
//	final, err := c.Follow(ctx, spec.Id, func(ev *pb.JobEvent) error {
//		if s := ev.Step; s != nil {
//			fmt.Printf("step %d loss %.6f\n", s.Step, s.Loss)
//		}
//		return nil
//	})
//	if ctx.Err() != nil {
//		// Interrupted: cancel the job, with a context of its own.
//		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
//		defer cancel()
//		final, err = c.Cancel(cctx, spec.Id, "interrupted")
//	}
//
// pb is github.com/gpucoord/gpucoord/proto/gpucoordpb; pb.Terminal tells
// a job that has ended.
//
// # Failover
//
// Every call starts at the coordinator that answered last. A unary call
// (Submit, Cancel, Status) whose attempt fails with Unavailable or
// DeadlineExceeded (the coordinator is down, cut off, has lost etcd, or
// took longer than Config.CallTimeout) tries the next one after
// Config.RetryInterval, for Config.Rounds passes over the list, then
// returns an error wrapping ErrUnreachable. Any other answer is one every
// coordinator would give, since they share one etcd: it comes back at
// once as an *Error. A Follow stream that breaks resumes at the next
// coordinator from the last revision seen; see Client.Follow. Each move is
// logged and reported to Config.OnFailover.
//
// # Concurrency
//
// A Client is safe for concurrent use. Follow calls its callback on the
// calling goroutine, one event at a time, and Config.OnFailover runs on
// the goroutine whose call fails over. Close may be called while calls are
// in flight: they fail, and later calls return ErrClosed.
package client
