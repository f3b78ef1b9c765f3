package ckpt

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpucoord/gpucoord/internal/pki"
)

// BenchmarkReplicate streams node a's 64 MiB step (4 files) to b over
// mutual TLS on loopback (send: a replica placed), and c fetches it from b
// (fetch: a restore gathering it): MB/s is the bandwidth of one stream,
// SHA-256 checks and the write to the receiver's directory included. The
// peer, in the same run: copy, b placing its replica in its own directory
// (CopyLocal: a file copy on one disk, no network, no TLS).
func BenchmarkReplicate(b *testing.B) {
	ca, caPEM := newCA(b)
	nodes := map[string]*node{}
	for _, n := range []string{"a", "b", "c"} {
		c := credentials(b, ca, caPEM, pki.Identity{Role: pki.RoleNode, Name: n})
		nodes[n] = startNode(b, n, &c)
		nodes[n].h.Begin("j", 1, 0)
		nodes[n].h.Saw("j", 1, []string{"a", "b", "c"})
	}
	const file = 16 << 20
	body := bytes.Repeat([]byte{0x5a}, file)
	dir := filepath.Join(nodes["a"].h.Own("j"), "1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range 4 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("shard-%d.bin", i)), body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := nodes["a"].h.Seal("j", 1, 1); err != nil {
		b.Fatal(err)
	}
	send := func() error { _, err := nodes["a"].h.Send(b.Context(), nodes["b"].peer("b"), "j", 1, 1); return err }
	if err := send(); err != nil {
		b.Fatal(err)
	}
	b.Run("send", func(b *testing.B) {
		b.SetBytes(4 * file)
		for b.Loop() {
			if err := send(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(4 * file)
		for b.Loop() {
			if err := nodes["b"].h.CopyLocal("j", "a", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fetch", func(b *testing.B) {
		b.SetBytes(4 * file)
		for b.Loop() {
			if _, err := nodes["c"].h.Fetch(b.Context(), nodes["b"].peer("b"), "j", "a", 1, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}
