package rankexe

import (
	"os"
	"testing"
)

// TestPath: the environment's binary when it names one, else this one.
func TestPath(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ env, want string }{{"", self}, {"/opt/gpucoord-ranks", "/opt/gpucoord-ranks"}} {
		t.Setenv(Env, tc.env)
		if got, err := Path(); err != nil || got != tc.want {
			t.Errorf("%s=%q: %q, %v; want %q", Env, tc.env, got, err, tc.want)
		}
	}
}
