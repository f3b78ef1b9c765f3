package collectivestest

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/tcp"
)

// Transport is a collectives.Transport that can be closed, as every real
// transport can.
type Transport interface {
	collectives.Transport
	Close() error
}

// Join builds rank's transport in a world of size ranks that meet through
// st. log is nil in a helper process, meaning slog.Default().
type Join func(ctx context.Context, rank, size int, st collectives.Store, log *slog.Logger) (Transport, error)

// KilledPeer configures KilledPeerProcess.
type KilledPeer struct {
	// Size is the world size. The last rank is a helper process; the others
	// run in the test.
	Size int
	// Join builds a rank's transport, in the test and in the helper.
	Join Join
	// HelperEnv is the variable whose presence makes the test binary's
	// TestMain run HelperMain instead of the tests.
	HelperEnv string
	// Env is extra environment for the helper, for its Join to read.
	Env []string
	// Elems is the float32 length of the all-reduce that must fail.
	Elems int
	// Within bounds how long that all-reduce may take to fail.
	Within time.Duration
	// BeforeKill, if set, runs once every rank has completed the first
	// all-reduce, before the helper is killed.
	BeforeKill func()
}

// killedConfig is the communicator configuration of every rank of
// KilledPeerProcess, the helper's included.
func killedConfig(log *slog.Logger) *collectives.Config {
	cfg := collectives.DefaultConfig()
	cfg.Logger = log
	cfg.Timeout = 20 * time.Second
	return cfg
}

// HelperMain is the body of the helper process of KilledPeerProcess, to be
// called from TestMain when kp.HelperEnv is set: it joins the world with
// join, completes one all-reduce, prints "ready" and the sum, and waits to
// be killed. It returns only on failure, with an exit code.
func HelperMain(join Join) int {
	if err := helper(join); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {} // wait to be killed
}

func helper(join Join) error {
	ctx := context.Background()
	rank, _ := strconv.Atoi(os.Getenv("HELPER_RANK"))
	size, _ := strconv.Atoi(os.Getenv("HELPER_SIZE"))
	secret, err := hex.DecodeString(os.Getenv("HELPER_STORE_SECRET"))
	if err != nil {
		return err
	}
	st, err := tcp.DialStore(ctx, os.Getenv("HELPER_STORE"), secret)
	if err != nil {
		return err
	}
	t, err := join(ctx, rank, size, st, nil)
	if err != nil {
		return err
	}
	c, err := collectives.New(t, killedConfig(nil))
	if err != nil {
		return err
	}
	v := make([]float32, 1000)
	for i := range v {
		v[i] = float32(rank)
	}
	if err := c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum); err != nil {
		return err
	}
	fmt.Println("ready", v[0])
	return nil
}

// KilledPeerProcess starts the test binary as a helper process that is the
// last rank of a world of kp.Size, builds the other ranks in the test, and
// SIGKILLs the helper once every rank has completed one all-reduce. The
// next all-reduce must fail on every survivor within kp.Within, and some
// error must name the helper's world rank as lost.
func KilledPeerProcess(t *testing.T, kp KilledPeer) {
	t.Helper()
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	secret, err := tcp.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	go func() { served <- tcp.ServeStore(sctx, ln, collectives.NewMemStore(), secret) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("store: %v", err)
		}
	})

	n, dead := kp.Size, kp.Size-1
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), kp.HelperEnv+"=1", "HELPER_RANK="+strconv.Itoa(dead), "HELPER_SIZE="+strconv.Itoa(n), "HELPER_STORE="+ln.Addr().String(), "HELPER_STORE_SECRET="+hex.EncodeToString(secret))
	cmd.Env = append(cmd.Env, kp.Env...)
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	cfg := killedConfig(Config(t).Logger)
	comms := make([]*collectives.Comm, n-1)
	ready := make(chan error, n-1)
	for r := range n - 1 {
		go func() {
			st, err := tcp.DialStore(ctx, ln.Addr().String(), secret)
			if err != nil {
				ready <- err
				return
			}
			t.Cleanup(func() { st.Close() })
			tr, err := kp.Join(ctx, r, n, st, cfg.Logger)
			if err != nil {
				ready <- err
				return
			}
			t.Cleanup(func() { tr.Close() })
			comms[r], err = collectives.New(tr, cfg)
			ready <- err
		}()
	}
	for range n - 1 {
		if err := <-ready; err != nil {
			t.Fatal(err)
		}
	}
	want := float32(n * (n - 1) / 2)
	MustEach(t, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		v := make([]float32, 1000)
		for i := range v {
			v[i] = float32(r)
		}
		if err := c.AllReduce(ctx, collectives.Float32s(v), collectives.Sum); err != nil {
			return err
		}
		if v[999] != want {
			return fmt.Errorf("sum %v, want %v", v[999], want)
		}
		return nil
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != fmt.Sprintf("ready %v\n", want) {
		t.Fatalf("helper said %q, %v", line, err)
	}
	if kp.BeforeKill != nil {
		kp.BeforeKill()
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() // reap it, so that kill(pid, 0) sees it gone
	start := time.Now()
	errs := Each(ctx, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
		return c.AllReduce(ctx, collectives.Float32s(make([]float32, kp.Elems)), collectives.Sum)
	})
	el := time.Since(start)
	named := false
	for r, err := range errs {
		t.Logf("rank %d after %s: %v", r, el, err)
		var pe *collectives.PeerError
		switch {
		case err == nil:
			t.Errorf("rank %d: no error after the peer was killed", r)
		case errors.As(err, &pe) && pe.World == dead && errors.Is(err, collectives.ErrPeerLost):
			named = true
		case !errors.Is(err, collectives.ErrAborted) && !errors.Is(err, collectives.ErrPeerLost):
			t.Errorf("rank %d: %v, want ErrPeerLost or ErrAborted", r, err)
		}
	}
	if !named {
		t.Errorf("no error names world rank %d as lost", dead)
	}
	if el > kp.Within {
		t.Errorf("took %s; a dead process must be noticed well within the %s timeout", el, cfg.Timeout)
	}
}

// Comms wraps each transport of a local world in a Comm with cfg and closes
// both at the end of the test: the World function of a transport package's
// conformance test.
func Comms[T Transport](t *testing.T, ts []T, cfg *collectives.Config) []*collectives.Comm {
	t.Helper()
	comms := make([]*collectives.Comm, len(ts))
	for r := range ts {
		var err error
		if comms[r], err = collectives.New(ts[r], cfg); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for r := range ts {
			comms[r].Close()
			ts[r].Close()
		}
	})
	return comms
}
