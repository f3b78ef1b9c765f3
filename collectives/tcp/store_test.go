package tcp_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/tcp"
)

// testSecret is the secret of the stores these tests serve.
var testSecret = []byte("0123456789abcdef0123456789abcdef")

// serveStore serves a MemStore on loopback, with testSecret, until the test
// ends.
func serveStore(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- tcp.ServeStore(ctx, ln, collectives.NewMemStore(), testSecret) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

// TestStoreWriteOnce: a key set again to its value is a retry and
// succeeds; set to another value (a stranger replacing a rank's address)
// it is refused and keeps its first value.
func TestStoreWriteOnce(t *testing.T) {
	st, err := tcp.DialStore(t.Context(), serveStore(t), testSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Set(t.Context(), "addr/0", []byte("10.0.0.1:4000")); err != nil {
		t.Fatal(err)
	}
	if err := st.Set(t.Context(), "addr/0", []byte("10.0.0.1:4000")); err != nil {
		t.Fatalf("the same value again: %v", err)
	}
	if err := st.Set(t.Context(), "addr/0", []byte("6.6.6.6:4000")); err == nil || !strings.Contains(err.Error(), "already set to another value") {
		t.Fatalf("another value: %v, want refused", err)
	}
	if v, err := st.Get(t.Context(), "addr/0"); err != nil || string(v) != "10.0.0.1:4000" {
		t.Fatalf("Get = %q, %v; want the first value", v, err)
	}
}

// TestStoreBounds: a value over 64 KiB is refused; the store holds at most
// 64 MiB: 1,023 values of 64 KiB with their 5-byte keys (67,048,443 bytes)
// fit, the 1,024th (67,113,984 > 67,108,864) is refused with the reason,
// and a refused Set stores nothing.
func TestStoreBounds(t *testing.T) {
	st, err := tcp.DialStore(t.Context(), serveStore(t), testSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Set(t.Context(), "big", make([]byte, 64<<10+1)); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("a 64 KiB + 1 value: %v, want refused", err)
	}
	val := make([]byte, 64<<10)
	for i := range 1024 {
		binary.LittleEndian.PutUint64(val, uint64(i)) // a distinct value each
		err := st.Set(t.Context(), fmt.Sprintf("k%04d", i), val)
		if i < 1023 && err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
		if i == 1023 && (err == nil || !strings.Contains(err.Error(), "store full")) {
			t.Fatalf("set past 64 MiB: %v, want store full", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := st.Get(ctx, "k1023"); err == nil {
		t.Fatal("the refused key was stored")
	}
}

// TestStoreOversizedRequestsUnread: eight requests announcing 16 MiB
// values, from eight connections at once, are cut off at their length
// field: the server's heap does not grow by their size.
func TestStoreOversizedRequestsUnread(t *testing.T) {
	addr := serveStore(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	payload := make([]byte, 16<<20)
	done := make(chan error, 8)
	for range 8 {
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			hdr := []byte{'S'}
			hdr = binary.LittleEndian.AppendUint32(hdr, 1)
			hdr = append(hdr, 'k')
			hdr = binary.LittleEndian.AppendUint32(hdr, 16<<20)
			c.Write(hdr)
			c.Write(payload) // fails once the server has closed: expected (the MAC is never reached)
			var b [1]byte
			_, err = c.Read(b[:]) // the server closes without a reply
			if err == nil {
				done <- fmt.Errorf("the server answered an oversized request")
				return
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// The test's own 16 MiB payload is in both readings; the server must
	// not have read 8 x 16 MiB.
	if grew := int64(after.TotalAlloc - before.TotalAlloc); grew > 64<<20 {
		t.Fatalf("allocated %d MiB serving 8 oversized requests, want under 64 MiB", grew>>20)
	}
}

// TestBoundedStoreKeyCount: past 262,144 keys a served store refuses new
// keys; it checks the count before the store holds anything more.
func TestBoundedStoreKeyCount(t *testing.T) {
	if testing.Short() {
		t.Skip("sets 262,145 keys over loopback")
	}
	st, err := tcp.DialStore(t.Context(), serveStore(t), testSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 1<<18 + 1 {
		err := st.Set(t.Context(), fmt.Sprint(i), nil)
		if i < 1<<18 && err != nil {
			t.Fatalf("set %d: %v", i, err)
		}
		if i == 1<<18 && (err == nil || !strings.Contains(err.Error(), "262144 keys")) {
			t.Fatalf("key 262,145: %v, want store full", err)
		}
	}
}

// TestStoreRefusesStrangers: a client without the store's secret can
// neither set nor read a key (the store answers the first request with
// the reason and ends the connection), and a store is not served or
// dialled without a secret.
func TestStoreRefusesStrangers(t *testing.T) {
	addr := serveStore(t)
	owner, err := tcp.DialStore(t.Context(), addr, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if err := owner.Set(t.Context(), "addr/0", []byte("10.0.0.1:4000")); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"set", "get"} {
		stranger, err := tcp.DialStore(t.Context(), addr, []byte("not-the-secret-not-the-secret---"))
		if err != nil {
			t.Fatal(err)
		}
		if op == "set" {
			err = stranger.Set(t.Context(), "addr/1", []byte("6.6.6.6:4000"))
		} else {
			_, err = stranger.Get(t.Context(), "addr/0")
		}
		stranger.Close()
		if err == nil || !strings.Contains(err.Error(), "unauthenticated") {
			t.Fatalf("a stranger's %s: %v, want unauthenticated", op, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := owner.Get(ctx, "addr/1"); err == nil {
		t.Fatal("the stranger's key was stored")
	}
	if _, err := tcp.DialStore(t.Context(), addr, nil); err == nil {
		t.Fatal("dialled without a secret")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := tcp.ServeStore(t.Context(), ln, collectives.NewMemStore(), []byte("short")); err == nil {
		t.Fatal("served with a 5-byte secret")
	}
}
