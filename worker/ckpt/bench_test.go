package ckpt

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
)

// BenchmarkReplicate streams node a's 64 MiB step (4 files) to b over
// mutual TLS on loopback (send: a replica placed), and c fetches it from b
// (fetch: a restore gathering it): MB/s is the bandwidth of one stream,
// CRC-32C checks and the write to the receiver's directory included, and
// cpu-ms/MB the CPU both ends spent on it (the process's user and system
// time). The peer, in the same run: copy, b placing its replica in its
// own directory (CopyLocal: a file copy, no network, no TLS). The roots
// are on the disk (fsynced steps), and under shm/ in /dev/shm (memory,
// where an agent keeps them when it fits: nothing to fsync).
func BenchmarkReplicate(b *testing.B) {
	b.Run("disk", func(b *testing.B) { benchReplicate(b, b.TempDir()) })
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		b.Run("shm", func(b *testing.B) {
			root, err := os.MkdirTemp("/dev/shm", "ckpt-bench-")
			if err != nil {
				b.Skip(err)
			}
			b.Cleanup(func() { os.RemoveAll(root) })
			benchReplicate(b, root)
		})
	}
}

func benchReplicate(b *testing.B, root string) {
	ca, caPEM := newCA(b)
	nodes := map[string]*node{}
	for _, n := range []string{"a", "b", "c"} {
		c := credentials(b, ca, caPEM, pki.Identity{Role: pki.RoleNode, Name: n})
		nodes[n] = startNodeIn(b, filepath.Join(root, n), n, &c)
		nodes[n].h.Begin("j", 1, 0, true)
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
	run := func(name string, op func() error) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(4 * file)
			cpu0 := cpuTime()
			for b.Loop() {
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Millisecond)/(float64(b.N)*4*file/1e6), "cpu-ms/MB")
		})
	}
	run("send", send)
	run("copy", func() error { return nodes["b"].h.CopyLocal("j", "a", 1) })
	run("fetch", func() error {
		_, err := nodes["c"].h.Fetch(b.Context(), nodes["b"].peer("b"), "j", "a", 1, 1)
		return err
	})
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
