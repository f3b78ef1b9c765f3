package inproc

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/client"
)

// TestStartStop: a cluster of two agents comes up, both registered with
// its coordinator, and Stop leaves none of its files.
func TestStartStop(t *testing.T) {
	if _, err := Start(t.Context(), Config{Nodes: 0, GPUs: 1}); err == nil {
		t.Error("a cluster of no node started")
	}
	c, err := Start(t.Context(), Config{Nodes: 2, GPUs: 1, RankCommand: []string{"false"}, FenceCommand: []string{"false"}, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	if err := c.Ready(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	cfg := client.DefaultConfig()
	cfg.Coordinators = []string{c.Addr}
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	st, err := cl.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range st.Nodes {
		names = append(names, n.GetNode().GetName())
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"node0", "node1"}) {
		t.Errorf("registered nodes %v, want node0 and node1", names)
	}
	c.Stop()
	stopped = true
	for _, dir := range []string{c.tmp, c.held} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s left after Stop: %v", dir, err)
		}
	}
}
