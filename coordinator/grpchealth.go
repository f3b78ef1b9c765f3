package coordinator

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// The gRPC health service (grpc.health.v1) of a coordinator answers for
// two services:
//
//   - "" (the server): SERVING until the coordinator stops. A liveness
//     probe asks this: the process serves.
//   - ServingService, the Coordinator service: SERVING while the
//     coordinator reaches etcd, the state every call reads and writes
//     (the same check that makes its calls fail Unavailable). A readiness
//     probe asks this: a coordinator that cannot reach etcd sends its
//     agents and clients to another.
//
// It is served on the coordinator's own port, to callers with or without
// a certificate (it says nothing but these two states), and in plaintext
// on a port of its own with ServeHealth, for probes that speak no TLS
// (the kubelet's gRPC probe).

// ServingService is the service name whose health says whether this
// coordinator can serve calls: "gpucoord.v1.Coordinator".
var ServingService = pb.Coordinator_ServiceDesc.ServiceName

// healthPoll is how often Watch looks at the state again.
const healthPoll = time.Second

func init() {
	// Health answers without an identity, as Join does.
	methodRoles[healthpb.Health_Check_FullMethodName] = nil
	methodRoles[healthpb.Health_Watch_FullMethodName] = nil
	methodRoles[healthpb.Health_List_FullMethodName] = nil
}

// healthService implements grpc.health.v1.Health over a server's state.
type healthService struct {
	healthpb.UnimplementedHealthServer
	srv *server
}

// state is service's status now; NotFound for a service not served here.
func (h healthService) state(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	stopped := false
	select {
	case <-h.srv.stopping:
		stopped = true
	default:
	}
	switch service {
	case "":
		if stopped {
			return healthpb.HealthCheckResponse_NOT_SERVING, nil
		}
		return healthpb.HealthCheckResponse_SERVING, nil
	case ServingService:
		if stopped || h.srv.health.isDown() {
			return healthpb.HealthCheckResponse_NOT_SERVING, nil
		}
		return healthpb.HealthCheckResponse_SERVING, nil
	}
	return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, status.Errorf(codes.NotFound, "unknown service %q: this coordinator answers for \"\" and %q", service, ServingService)
}

// Check implements grpc.health.v1.Health.
func (h healthService) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, err := h.state(req.GetService())
	if err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// List implements grpc.health.v1.Health.
func (h healthService) List(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	out := &healthpb.HealthListResponse{Statuses: map[string]*healthpb.HealthCheckResponse{}}
	for _, s := range []string{"", ServingService} {
		st, _ := h.state(s)
		out.Statuses[s] = &healthpb.HealthCheckResponse{Status: st}
	}
	return out, nil
}

// Watch implements grpc.health.v1.Health: the status now, then each
// change (looked at every healthPoll), until the caller leaves or the
// coordinator stops. An unknown service is SERVICE_UNKNOWN, as the
// protocol asks.
func (h healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	for {
		st, _ := h.state(req.GetService())
		if st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-h.srv.stopping:
			if st == healthpb.HealthCheckResponse_NOT_SERVING || st == healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
				return status.Error(codes.Unavailable, "coordinator stopping")
			}
		case <-t.C:
		}
	}
}

// ServeHealth serves the health service alone, in plaintext, on ln, for
// probes that speak no TLS (a Kubernetes gRPC probe): it answers the
// states above and nothing else, to anyone who reaches ln. It returns once
// the coordinator has stopped (Run returned or is returning), having
// closed ln.
func (c *Coordinator) ServeHealth(ln net.Listener) error {
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, healthService{srv: c.srv})
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	select {
	case <-c.stopping:
		g.Stop()
		<-served
		return nil
	case err := <-served:
		if errors.Is(err, grpc.ErrServerStopped) {
			err = nil
		}
		return err
	}
}

// registerHealth adds the health service to the coordinator's own server.
func (c *Coordinator) registerHealth() {
	healthpb.RegisterHealthServer(c.grpc, healthService{srv: c.srv})
}
