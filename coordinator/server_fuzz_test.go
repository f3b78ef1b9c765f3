package coordinator

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// FuzzHandlers feeds arbitrary request messages to the unary handlers of
// a coordinator that serves TLS, as a node ("n0"), a client or an admin
// would send them after authentication: the first byte picks the handler
// and the identity, the rest is the request's wire form. Every call must
// return a gRPC status (or nothing), never panic or hang, and the
// coordinator must go on answering.
func FuzzHandlers(f *testing.F) {
	seed := func(method, who byte, m proto.Message) {
		b, _ := proto.Marshal(m)
		f.Add(append([]byte{method, who}, b...))
	}
	seed(0, 0, &pb.RegisterRequest{Node: &pb.Node{Name: "n0", Host: "10.0.0.1", Gpus: 2, Protocol: pb.ProtocolVersion}})
	seed(1, 0, &pb.ReportRequest{Job: "j", Generation: 1, Node: "n0", Kind: &pb.ReportRequest_Exit{Exit: &pb.RankExit{Rank: 0, Code: 1}}})
	seed(1, 0, &pb.ReportRequest{Job: "j", Generation: 1, Node: "n0", Kind: &pb.ReportRequest_Step{Step: &pb.Step{Step: 3, Checkpointed: true}}})
	seed(2, 0, &pb.LeaveRequest{Node: "n0", LeaseId: 7})
	seed(3, 1, &pb.SubmitRequest{Spec: &pb.JobSpec{Id: "j", Nodes: 1, GpusPerNode: 2, Tp: 1, Pp: 1, Command: []string{"true"}}})
	seed(4, 1, &pb.CancelRequest{Job: "j", Reason: "x"})
	seed(5, 1, &pb.StatusRequest{})
	seed(6, 0, &pb.JoinRequest{Token: "gct1.00000000.00000000000000000000000000000000." + string(make([]byte, 64)), Role: "node", Name: "n1"})
	seed(7, 2, &pb.CreateTokenRequest{Roles: []string{"node"}, TtlSeconds: 60})
	seed(8, 2, &pb.ListTokensRequest{})
	seed(9, 2, &pb.RevokeTokenRequest{Id: "00000000"})
	co, _ := testCoordinator(f, testEtcd(f), func(c *Config) {
		c.TokenFile = filepath.Join(f.TempDir(), "token")
		c.Logger = slog.New(slog.DiscardHandler) // a line per call, millions of calls
	})
	s := co.srv
	ids := []pki.Identity{{Role: pki.RoleNode, Name: "n0"}, {Role: pki.RoleClient, Name: "me"}, {Role: pki.RoleAdmin, Name: "ops"}}
	type handler struct {
		req  func() proto.Message
		call func(context.Context, proto.Message) error
	}
	hs := []handler{
		{func() proto.Message { return &pb.RegisterRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Register(ctx, m.(*pb.RegisterRequest))
			return err
		}},
		{func() proto.Message { return &pb.ReportRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Report(ctx, m.(*pb.ReportRequest))
			return err
		}},
		{func() proto.Message { return &pb.LeaveRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Leave(ctx, m.(*pb.LeaveRequest))
			return err
		}},
		{func() proto.Message { return &pb.SubmitRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Submit(ctx, m.(*pb.SubmitRequest))
			return err
		}},
		{func() proto.Message { return &pb.CancelRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Cancel(ctx, m.(*pb.CancelRequest))
			return err
		}},
		{func() proto.Message { return &pb.StatusRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Status(ctx, m.(*pb.StatusRequest))
			return err
		}},
		{func() proto.Message { return &pb.JoinRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.Join(ctx, m.(*pb.JoinRequest))
			return err
		}},
		{func() proto.Message { return &pb.CreateTokenRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.CreateToken(ctx, m.(*pb.CreateTokenRequest))
			return err
		}},
		{func() proto.Message { return &pb.ListTokensRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.ListTokens(ctx, m.(*pb.ListTokensRequest))
			return err
		}},
		{func() proto.Message { return &pb.RevokeTokenRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := s.RevokeToken(ctx, m.(*pb.RevokeTokenRequest))
			return err
		}},
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		h := hs[int(in[0])%len(hs)]
		m := h.req()
		if proto.Unmarshal(in[2:], m) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithValue(t.Context(), identityKey{}, ids[int(in[1])%len(ids)]), 5*time.Second)
		defer cancel()
		err := h.call(ctx, m)
		if _, ok := status.FromError(err); !ok {
			t.Fatalf("%T: not a gRPC status: %v", m, err)
		}
		if ctx.Err() != nil {
			t.Fatalf("%T: the call took its whole 5s", m)
		}
	})
}
