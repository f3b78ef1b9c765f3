package gpucoordpb

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial returns a client connection to a coordinator that sends token (if
// any) with every call. It connects lazily; the first call reports an
// unreachable address. Mutual TLS will replace the plaintext transport.
func Dial(addr, token string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	return grpc.NewClient(addr, opts...)
}

// bearer sends the join token as TokenHeader metadata.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{TokenHeader: "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
