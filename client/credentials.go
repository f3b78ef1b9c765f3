package client

import (
	"context"

	"google.golang.org/grpc/credentials"

	"github.com/gpucoord/gpucoord/internal/join"
	"github.com/gpucoord/gpucoord/internal/pki"
)

// Credentials returns what a client shows the coordinators (for
// Config.Credentials): mutual TLS as the user on this machine (a client
// identity, user@host), with the certificate a join token bought once and
// kept in dir (empty: ~/.local/state/gpucoord/credentials), obtained now
// from the first coordinator that answers when none is kept. An empty
// token gives nil: plaintext, which only a coordinator on loopback takes.
func Credentials(ctx context.Context, coordinators []string, token, dir string) (credentials.TransportCredentials, error) {
	return join.Credentials(ctx, join.Config{Coordinators: coordinators, Token: token, Dir: dir,
		Identity: pki.Identity{Role: pki.RoleClient, Name: join.UserAtHost()}})
}
