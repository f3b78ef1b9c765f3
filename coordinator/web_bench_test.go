package coordinator

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// webCache is a cache holding n registered and connected nodes in
// failure domains of 128 and one job running on all of them, 8 ranks a
// node, with rank 0's step and every node's compute times.
func webCache(tb testing.TB, n int) (*cache, keys) {
	tb.Helper()
	k := keys("/b/")
	c := newCache(nil, k, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var kvs []*mvccpb.KeyValue
	put := func(key, value string) {
		rev := int64(len(kvs) + 1)
		kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), CreateRevision: rev, ModRevision: rev})
	}
	g := &pb.Generation{Job: "j", Number: 1, World: int32(8 * n), Dp: int32(n)}
	nodes := map[string]*nodeTimes{}
	for i := range n {
		name := fmt.Sprintf("n%04d", i)
		put(k.node(name), encode(&pb.Node{Name: name, Host: "10.0.0.1", Gpus: 8, Instance: name, FailureDomain: fmt.Sprintf("rack-%02d", i/128)}))
		put(k.conn(name), connValue(1, "c/1"))
		g.Members = append(g.Members, &pb.Member{Node: name, FirstRank: int32(8 * i), Ranks: 8, Instance: name})
		w := &pb.RankTimes{}
		for r := range 8 {
			w.Add(int32(8*i+r), 0.09+0.001*float64(r), 10)
		}
		nodes[name] = &nodeTimes{}
		nodes[name].push(w, 3)
	}
	put(k.spec("j"), encode(&pb.JobSpec{Id: "j", Nodes: int32(n), GpusPerNode: 8, Tp: 8, Command: []string{"true"}}))
	put(k.state("j"), encode(&pb.JobState{Phase: pb.JobState_RUNNING, FailedRank: -1}))
	put(k.generation("j"), encode(g))
	put(k.open("j"), "1")
	put(k.progress("j"), encode(&pb.Step{Step: 1, Loss: 2, Seconds: 0.1, Generation: 1}))
	put(k.times("j", 1, "c"), encode(summarize(nodes, nil, 3, 2, 8*n <= smallJob)))
	c.reset(int64(len(kvs)), kvs)
	return c, k
}

// BenchmarkWebRebuild2048 is the dashboard's rebuild of its model at
// 2,048 nodes (16,384 ranks) after a step: what every tick of a live
// cluster costs the coordinator (steady), and the same with a new
// generation's grid, members and history to encode (generation).
func BenchmarkWebRebuild2048(b *testing.B) {
	c, k := webCache(b, 2048)
	h := newWebHub(c, "c", func() bool { return true }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h.rebuild(time.Now())
	sub, _ := h.subscribe("job:j")
	rev := c.rev
	step := func(s int64, gen int64) {
		rev++
		c.apply(rev, []*clientv3.Event{{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(k.progress("j")),
			Value: []byte(encode(&pb.Step{Step: s, Loss: 1 / float64(s), Seconds: 0.1, Generation: gen})), ModRevision: rev}}})
	}
	drain := func() (n int) {
		for {
			select {
			case m := <-sub.ch:
				n += len(m)
			default:
				return n
			}
		}
	}
	b.Run("steady", func(b *testing.B) {
		bytes := 0
		for i := 0; b.Loop(); i++ {
			step(int64(i+2), 1)
			h.rebuild(time.Now())
			bytes += drain()
		}
		b.ReportMetric(float64(bytes)/float64(b.N), "bytes/op")
	})
	b.Run("generation", func(b *testing.B) {
		g, _ := c.generation("j")
		bytes := 0
		for i := 0; b.Loop(); i++ {
			next := proto.Clone(g).(*pb.Generation)
			next.Number = g.Number + int64(i) + 1
			next.Members = next.Members[:len(next.Members)-1-i%2]
			next.World, next.Dp = int32(8*len(next.Members)), int32(len(next.Members))
			rev++
			c.apply(rev, []*clientv3.Event{{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(k.generation("j")),
				Value: []byte(encode(next)), ModRevision: rev}}})
			h.rebuild(time.Now())
			bytes += drain()
		}
		b.ReportMetric(float64(bytes)/float64(b.N), "bytes/op")
	})
}
