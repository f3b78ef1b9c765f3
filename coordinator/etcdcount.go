package coordinator

import (
	"context"
	"path"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
)

// requestCounter counts the requests a coordinator sends etcd, by gRPC
// method (Range, Txn, Put, LeaseKeepAlive...): a unary call is one, and
// every message sent on a stream (a watch created, a lease renewed) is
// one. It is the gpucoord_etcd_requests_total metric.
type requestCounter struct {
	counts sync.Map // method -> *atomic.Int64
}

func (r *requestCounter) inc(method string) {
	method = path.Base(method)
	c, ok := r.counts.Load(method)
	if !ok {
		c, _ = r.counts.LoadOrStore(method, new(atomic.Int64))
	}
	c.(*atomic.Int64).Add(1)
}

// each calls f with every method's count.
func (r *requestCounter) each(f func(method string, n int64)) {
	r.counts.Range(func(k, v any) bool {
		f(k.(string), v.(*atomic.Int64).Load())
		return true
	})
}

// dialOptions are the interceptors that count.
func (r *requestCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			r.inc(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &countedStream{ClientStream: s, r: r, method: method}, nil
		}),
	}
}

type countedStream struct {
	grpc.ClientStream
	r      *requestCounter
	method string
}

func (s *countedStream) SendMsg(m any) error {
	s.r.inc(s.method)
	return s.ClientStream.SendMsg(m)
}
