package worker

import (
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// TestBootEarly: rank 0's node makes its bootstrap while its generation
// waits for earlier ranks to stop: its store serves, its probe is written,
// and it reports the address before it says it stopped (so that the
// opening can carry the address). A node not running rank 0 makes none.
// The next generation coming before the opening ends that store and
// removes that probe; the agent stopping ends the next one's.
func TestBootEarly(t *testing.T) {
	dir := t.TempDir()
	gen := func(n int64) *pb.Assignment {
		return &pb.Assignment{Job: "j", Spec: &pb.JobSpec{Id: "j", CheckpointDir: dir}, GroupWorld: 2,
			Generation: &pb.Generation{Number: n, Members: []*pb.Member{{Node: "n0", FirstRank: 0, Ranks: 4}, {Node: "n1", FirstRank: 4, Ranks: 4}}}}
	}
	agent := func(name string) (*Agent, *runner, *fakeCoordinator) {
		co := &fakeCoordinator{}
		a := &Agent{cfg: &Config{Name: name, Retry: 10 * time.Millisecond}, log: slog.New(slog.NewTextHandler(t.Output(), nil)),
			client: co, net: Network{Host: "127.0.0.1", Bind: "127.0.0.1"}}
		return a, &runner{agent: a}, co
	}
	serves := func(addr string) bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	probes := func() []string {
		m, _ := filepath.Glob(filepath.Join(Owned(dir), ".gpucoord-probe-*"))
		return m
	}

	a, r, co := agent("n0")
	booted := r.apply(t.Context(), gen(2))
	if booted == nil {
		t.Fatal("rank 0's node made no bootstrap for a generation not open")
	}
	a.stopped(t.Context(), gen(2), booted)
	a.bg.Wait()
	calls := co.seen()
	if len(calls) != 2 || calls[0].GetBootstrap() == nil || calls[1].GetStopped().GetBelow() != 2 {
		t.Fatalf("reports %v: want the bootstrap of generation 2, then stopped below 2", calls)
	}
	boot := calls[0].GetBootstrap()
	if calls[0].Generation != 2 || !serves(boot.Master) || len(boot.StoreSecret) == 0 {
		t.Fatalf("bootstrap %v of generation %d: want generation 2's, its store serving, with a secret", boot, calls[0].Generation)
	}
	if p := probes(); len(p) != 1 || filepath.Base(p[0]) != boot.Probe {
		t.Fatalf("probes %v, want the one reported (%s)", p, boot.Probe)
	}
	if r.apply(t.Context(), gen(2)); len(co.seen()) != 2 {
		t.Errorf("generation 2 again: %d reports, want no second bootstrap", len(co.seen()))
	}

	next := r.apply(t.Context(), gen(3))
	<-next
	boot3 := co.seen()[2].GetBootstrap()
	// Generation 3's store may have got the port generation 2's freed:
	// then that one was closed first.
	if boot3.GetMaster() != boot.Master && serves(boot.Master) {
		t.Errorf("generation 2's store still serves once generation 3 came")
	}
	if p := probes(); len(p) != 1 || filepath.Base(p[0]) != boot3.GetProbe() {
		t.Errorf("probes %v, want generation 3's alone (%s)", p, boot3.GetProbe())
	}
	r.stop()
	if serves(boot3.GetMaster()) || len(probes()) != 0 {
		t.Errorf("after the agent stopped: generation 3's store serves %v, probes %v", serves(boot3.GetMaster()), probes())
	}

	_, r1, co1 := agent("n1")
	if booted := r1.apply(t.Context(), gen(2)); booted != nil || len(co1.seen()) != 0 {
		t.Errorf("a node not running rank 0 made a bootstrap (%d reports)", len(co1.seen()))
	}
}
