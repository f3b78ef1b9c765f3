package coordinator

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// coordinator, etcd server and stream a test starts must be stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
