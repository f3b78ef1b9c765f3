package coordinator

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// healthClient is a grpc.health.v1 client of addr over creds.
func healthClient(t *testing.T, addr string, creds credentials.TransportCredentials) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// checkHealth asks h for service's status and wants st, or the code
// wantCode when it is not OK.
func checkHealth(t *testing.T, h healthpb.HealthClient, service string, st healthpb.HealthCheckResponse_ServingStatus, wantCode codes.Code) {
	t.Helper()
	resp, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
	if code := status.Code(err); code != wantCode {
		t.Fatalf("Check(%q): %v, want code %v", service, err, wantCode)
	}
	if err == nil && resp.GetStatus() != st {
		t.Fatalf("Check(%q) = %v, want %v", service, resp.GetStatus(), st)
	}
}

// TestHealth: a coordinator serving mutual TLS answers grpc.health.v1 on
// its own port to a caller without a certificate and in plaintext on the
// port ServeHealth serves; the Coordinator service goes NOT_SERVING when
// etcd goes away while the server itself stays SERVING, and ServeHealth
// returns once the coordinator stops.
func TestHealth(t *testing.T) {
	e, err := OpenEtcd(t.Context(), EtcdConfig{DataDir: t.TempDir(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	etcdOpen := true
	t.Cleanup(func() {
		if etcdOpen {
			e.Close()
		}
	})
	co, stop := testCoordinator(t, e.Endpoints, func(c *Config) {
		c.TokenFile = filepath.Join(t.TempDir(), "token")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- co.ServeHealth(ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("ServeHealth: %v", err)
		}
	})

	plain := healthClient(t, ln.Addr().String(), insecure.NewCredentials())
	// No client certificate: only the server's is checked (here, not
	// at all: what matters is that the call needs no identity).
	own := healthClient(t, co.Addr(), credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
	for name, h := range map[string]healthpb.HealthClient{"health port": plain, "coordinator port": own} {
		t.Run(name, func(t *testing.T) {
			checkHealth(t, h, "", healthpb.HealthCheckResponse_SERVING, codes.OK)
			checkHealth(t, h, ServingService, healthpb.HealthCheckResponse_SERVING, codes.OK)
			checkHealth(t, h, "gpucoord.v1.Nothing", 0, codes.NotFound)
		})
	}
	// The Coordinator service is refused in plaintext on its own port.
	_, err = healthClient(t, co.Addr(), insecure.NewCredentials()).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err == nil {
		t.Errorf("a plaintext health check on the TLS port succeeded")
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	w, err := plain.Watch(ctx, &healthpb.HealthCheckRequest{Service: ServingService})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch first = %v, %v; want SERVING", r, err)
	}
	e.Close()
	etcdOpen = false
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch after etcd closed = %v, %v; want NOT_SERVING", r, err)
	}
	checkHealth(t, plain, ServingService, healthpb.HealthCheckResponse_NOT_SERVING, codes.OK)
	checkHealth(t, plain, "", healthpb.HealthCheckResponse_SERVING, codes.OK)
}
