package collectives

import (
	"context"
	"testing"
)

// TestNewGroupErrorIsNil: a group that cannot be formed comes back as a
// nil Communicator, not a nil *Comm inside one (which a caller's cleanup
// would call Close on).
func TestNewGroupErrorIsNil(t *testing.T) {
	_, world, err := NewInmemWorld(2, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range world {
			c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	g, err := NewGroup(ctx, world[0], []int{0, 1})
	if err == nil || g != nil {
		t.Fatalf("NewGroup with a cancelled context = %#v, %v: want a nil Communicator and an error", g, err)
	}
}
