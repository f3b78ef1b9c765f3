package collectives_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/collectivestest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func inmemWorld(t *testing.T, n int, cfg *collectives.Config) []*collectives.Comm {
	t.Helper()
	_, comms, err := collectives.NewInmemWorld(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

func TestInmemConformance(t *testing.T) { collectivestest.Run(t, inmemWorld) }

func TestInmemFaults(t *testing.T) {
	tests := []struct {
		name    string
		fault   func(net *collectives.InmemNetwork)
		wantErr error
		peer    int
	}{
		{name: "partition", fault: func(net *collectives.InmemNetwork) { net.Partition(1, 2) }, wantErr: collectives.ErrUnreachable, peer: 2},
		{name: "kill", fault: func(net *collectives.InmemNetwork) { net.Kill(3) }, wantErr: collectives.ErrPeerLost, peer: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := collectivestest.Config(t)
			net, comms, err := collectives.NewInmemWorld(4, cfg)
			if err != nil {
				t.Fatal(err)
			}
			tc.fault(net)
			start := time.Now()
			live := comms[:3]
			if tc.name == "partition" {
				live = comms
			}
			errs := collectivestest.Each(t.Context(), live, func(ctx context.Context, r int, c *collectives.Comm) error {
				return c.AllReduce(ctx, collectives.Float32s(make([]float32, 100)), collectives.Sum)
			})
			if el := time.Since(start); el > cfg.Timeout/2 {
				t.Errorf("took %s, want well under the %s timeout", el, cfg.Timeout)
			}
			named := false
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d: no error", r)
					continue
				}
				var pe *collectives.PeerError
				if errors.As(err, &pe) && errors.Is(err, tc.wantErr) && pe.Peer == tc.peer {
					named = true
				}
				t.Logf("rank %d: %v", r, err)
			}
			if !named {
				t.Errorf("no rank reported %v naming peer %d", tc.wantErr, tc.peer)
			}
		})
	}
}

func TestDelayKeepsOrder(t *testing.T) {
	net, comms, err := collectives.NewInmemWorld(3, collectivestest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	net.Delay(0, 1, 20*time.Millisecond)
	collectivestest.MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		for k := range 3 {
			v := []float64{float64(r + k), float64(r * k)}
			if err := c.AllReduce(ctx, collectives.Float64s(v), collectives.Sum); err != nil {
				return err
			}
			if v[0] != float64(3+3*k) || v[1] != float64(3*k) {
				t.Errorf("rank %d round %d: %v", r, k, v)
			}
		}
		return nil
	})
}

func TestInmemZeroAllocs(t *testing.T) { collectivestest.TestZeroAllocs(t, inmemWorld) }

// TestFramesBeforeDeparture: frames a peer sent before it left are still
// received; only a receive beyond them fails.
func TestFramesBeforeDeparture(t *testing.T) {
	net, comms, err := collectives.NewInmemWorld(2, collectivestest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		if err := comms[1].Send(t.Context(), collectives.Float64s([]float64{float64(k)}), 0); err != nil {
			t.Fatal(err)
		}
	}
	net.Kill(1)
	for k := range 2 {
		v := []float64{-1}
		if err := comms[0].Recv(t.Context(), collectives.Float64s(v), 1); err != nil || v[0] != float64(k) {
			t.Fatalf("message %d: %v, %v", k, v, err)
		}
	}
	if err := comms[0].Recv(t.Context(), collectives.Float64s(make([]float64, 1)), 1); !errors.Is(err, collectives.ErrPeerLost) {
		t.Fatalf("receive after the peer left: %v, want ErrPeerLost", err)
	}
}
