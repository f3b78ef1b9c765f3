package tcp_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpucoord/gpucoord/collectives"
	"github.com/gpucoord/gpucoord/collectives/collectivestest"
	"github.com/gpucoord/gpucoord/collectives/tcp"
)

// BenchmarkAllReduce times one float32 sum all-reduce over loopback TCP in
// one process (every rank a goroutine); ns/op is the slowest rank's time.
// Compare processes with `gpucoord bench allreduce` instead: goroutines
// share one Go scheduler.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("n=%d/bytes=%d", n, size), func(b *testing.B) {
				ts, err := tcp.NewLocal(b.Context(), n, tcp.DefaultConfig())
				if err != nil {
					b.Fatal(err)
				}
				comms := make([]*collectives.Comm, n)
				bufs := make([][]float32, n)
				for r := range n {
					if comms[r], err = collectives.New(ts[r], collectives.DefaultConfig()); err != nil {
						b.Fatal(err)
					}
					bufs[r] = make([]float32, size/4)
				}
				defer func() {
					for r := range n {
						comms[r].Close()
						ts[r].Close()
					}
				}()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				collectivestest.MustEach(b, comms, func(ctx context.Context, r int, c *collectives.Comm) error {
					for range b.N {
						if err := c.AllReduce(ctx, collectives.Float32s(bufs[r]), collectives.Sum); err != nil {
							return err
						}
					}
					return nil
				})
			})
		}
	}
}
