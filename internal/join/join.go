// Package join gives a process (a node's agent, launch, status, the token
// commands) what it shows coordinators: mutual TLS with an identity's
// certificate, obtained once with a join token and kept, or an
// organisation's certificate from files; plaintext only where neither is
// given (a coordinator on loopback).
package join

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

// ErrRefused marks a refusal that trying again cannot fix: a wrong,
// expired or revoked token, a CA that is not the token's, a bad name.
var ErrRefused = errors.New("refused")

// Config says who a process is and what it holds to prove it.
type Config struct {
	// Coordinators are the addresses to join through, tried in turn.
	Coordinators []string
	// Token is a join token; "" for none.
	Token string
	// Files are an organisation's credentials, used as they are; they
	// take the place of a token.
	Files pki.Files
	// Dir keeps the credentials a token bought, one directory per CA and
	// identity; "" means DefaultDir().
	Dir string
	// Identity is who to join as.
	Identity pki.Identity
	// Timeout bounds each Join call; 0 means 10s.
	Timeout time.Duration
}

// UserAtHost names a user's client identity: user@host.
func UserAtHost() string {
	name := "user"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	return name + "@" + host
}

// DefaultDir is where credentials are kept unless told otherwise:
// $XDG_STATE_HOME/gpucoord/credentials, or ~/.local/state/gpucoord/credentials.
func DefaultDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "gpucoord", "credentials")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "gpucoord-credentials")
	}
	return filepath.Join(home, ".local", "state", "gpucoord", "credentials")
}

// Credentials returns the transport credentials for every later call:
// mutual TLS with cfg's files, or with the credentials kept for cfg's
// identity under the token's CA (obtained now, with the token, when none
// are kept or they expired); nil (plaintext) when there is neither token
// nor files.
func Credentials(ctx context.Context, cfg Config) (credentials.TransportCredentials, error) {
	c, ok, err := Load(ctx, cfg)
	if err != nil || !ok {
		return nil, err
	}
	return tlsOf(c)
}

// Load returns the certificate, key and CA Credentials would use; false
// when there is neither token nor files.
func Load(ctx context.Context, cfg Config) (pki.Credentials, bool, error) {
	if !cfg.Files.Empty() {
		c, err := cfg.Files.Load()
		if err != nil {
			return pki.Credentials{}, false, fmt.Errorf("tls: %w", err)
		}
		return c, true, nil
	}
	if cfg.Token == "" {
		return pki.Credentials{}, false, nil
	}
	tok, err := pki.ParseToken(cfg.Token)
	if err != nil {
		return pki.Credentials{}, false, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if err := cfg.Identity.Validate(); err != nil {
		return pki.Credentials{}, false, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	dir := cfg.Dir
	if dir == "" {
		dir = DefaultDir()
	}
	dir = filepath.Join(dir, tok.CAHash[:16], cfg.Identity.Role+"-"+cfg.Identity.Name)
	if c, err := pki.LoadDir(dir); err == nil && c.Valid(time.Now()) {
		if id, err := c.Identity(); err == nil && id == cfg.Identity {
			if h, err := c.CAHash(); err == nil && h == tok.CAHash {
				return c, true, nil
			}
		}
	}
	c, err := Join(ctx, cfg.Coordinators, tok, cfg.Identity, cfg.Timeout)
	if err != nil {
		return pki.Credentials{}, false, err
	}
	if err := c.Save(dir); err != nil {
		return pki.Credentials{}, false, fmt.Errorf("keeping the credentials in %s: %w", dir, err)
	}
	return c, true, nil
}

func tlsOf(c pki.Credentials) (credentials.TransportCredentials, error) {
	t, err := pki.ClientTLS(c)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return credentials.NewTLS(t), nil
}

// Join asks the coordinators, in turn, for a certificate for id with
// token, after checking each one's CA against the token's hash. A refusal
// (a wrong, expired or revoked token) ends it at once.
func Join(ctx context.Context, addrs []string, tok pki.Token, id pki.Identity, timeout time.Duration) (pki.Credentials, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if len(addrs) == 0 {
		return pki.Credentials{}, errors.New("join: no coordinator address")
	}
	keyPEM, csr, err := pki.NewRequest(id)
	if err != nil {
		return pki.Credentials{}, err
	}
	var errs []error
	for _, addr := range addrs {
		var (
			mu        sync.Mutex
			ca        []byte
			verifyErr error
		)
		cc, err := pb.Dial(addr, credentials.NewTLS(pki.BootstrapTLS(tok.CAHash, func(b []byte, err error) {
			mu.Lock()
			ca, verifyErr = b, err
			mu.Unlock()
		})), timeout)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := pb.NewCoordinatorClient(cc).Join(cctx, &pb.JoinRequest{Token: tok.String(), Role: id.Role, Name: id.Name, Csr: csr})
		cancel()
		cc.Close()
		mu.Lock()
		caPEM, bad := ca, verifyErr
		mu.Unlock()
		if bad != nil {
			return pki.Credentials{}, fmt.Errorf("join through %s %w: %v", addr, ErrRefused, bad)
		}
		switch status.Code(err) {
		case codes.OK:
			c := pki.Credentials{CA: caPEM, Cert: resp.GetCertificate(), Key: keyPEM}
			if got, err := c.Identity(); err != nil || got != id {
				return pki.Credentials{}, fmt.Errorf("join through %s: the certificate issued is not for %s", addr, id)
			}
			return c, nil
		case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition:
			return pki.Credentials{}, fmt.Errorf("join through %s %w: %s", addr, ErrRefused, status.Convert(err).Message())
		}
		if ctx.Err() != nil {
			return pki.Credentials{}, ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %s", addr, status.Convert(err).Message()))
	}
	return pki.Credentials{}, fmt.Errorf("join: no coordinator answered: %w", errors.Join(errs...))
}
