package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Credentials are a process's certificate, its key and the CA it trusts,
// in PEM.
type Credentials struct {
	CA, Cert, Key []byte
}

// Files name credentials in files (an organisation's PKI, or a directory
// gpucoord wrote).
type Files struct {
	CA, Cert, Key string
}

// Empty reports whether no file is named.
func (f Files) Empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// Load reads the three files; all must be named.
func (f Files) Load() (Credentials, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return Credentials{}, errors.New("--tls-ca, --tls-cert and --tls-key go together: name all three")
	}
	var c Credentials
	for _, p := range []struct {
		path string
		into *[]byte
	}{{f.CA, &c.CA}, {f.Cert, &c.Cert}, {f.Key, &c.Key}} {
		b, err := os.ReadFile(p.path)
		if err != nil {
			return Credentials{}, err
		}
		*p.into = b
	}
	return c, c.check()
}

// DirFiles are the files of credentials kept in a directory.
func DirFiles(dir string) Files {
	return Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
}

// LoadDir reads credentials Save wrote in dir.
func LoadDir(dir string) (Credentials, error) { return DirFiles(dir).Load() }

// Save writes c into dir (made 0700), each file 0600 and written whole
// before it replaces an earlier one.
func (c Credentials) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f := DirFiles(dir)
	for _, p := range []struct {
		path string
		b    []byte
	}{{f.Key, c.Key}, {f.Cert, c.Cert}, {f.CA, c.CA}} {
		if err := WriteSecret(p.path, p.b); err != nil {
			return err
		}
	}
	return nil
}

// WriteSecret writes b to path with mode 0600 through a temporary file
// renamed into place, so that a reader never sees part of it.
func WriteSecret(path string, b []byte) error {
	return placeSecret(path, b, os.Rename)
}

// CreateSecret is WriteSecret for a path that must not exist yet: when it
// does, it fails with an error that matches os.ErrExist and leaves the
// file alone (several writers, one wins).
func CreateSecret(path string, b []byte) error {
	return placeSecret(path, b, os.Link)
}

// placeSecret writes b, 0600, to a temporary file beside path and puts it
// there with place.
func placeSecret(path string, b []byte, place func(tmp, path string) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return place(tmp.Name(), path)
}

func (c Credentials) check() error {
	_, err := c.leaf()
	return err
}

// leaf parses the certificate and checks the key is its own.
func (c Credentials) leaf() (tls.Certificate, error) {
	pair, err := tls.X509KeyPair(c.Cert, c.Key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate and key: %w", err)
	}
	return pair, nil
}

// Identity is the identity the certificate carries.
func (c Credentials) Identity() (Identity, error) {
	cert, err := ParseCert(c.Cert)
	if err != nil {
		return Identity{}, err
	}
	return IdentityOf(cert)
}

// CAHash is the hash of the CA c trusts (Hash).
func (c Credentials) CAHash() (string, error) {
	ca, err := ParseCert(c.CA)
	if err != nil {
		return "", fmt.Errorf("CA: %w", err)
	}
	return Hash(ca), nil
}

// Valid reports whether the certificate is valid at now.
func (c Credentials) Valid(now time.Time) bool {
	cert, err := ParseCert(c.Cert)
	return err == nil && now.After(cert.NotBefore) && now.Before(cert.NotAfter)
}

func pool(caPEM []byte) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no CA certificate in PEM")
	}
	return p, nil
}

// ServerTLS is a coordinator's TLS: it presents c's certificate with the
// CA's after it (so that a new agent can check the CA against its token's
// hash), and verifies a client's certificate against the CA when one is
// given. A call without one can only join (the handlers' authority says
// which calls need which identity).
func ServerTLS(c Credentials) (*tls.Config, error) {
	pair, err := c.leaf()
	if err != nil {
		return nil, err
	}
	cas, err := pool(c.CA)
	if err != nil {
		return nil, err
	}
	for rest := c.CA; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			pair.Certificate = append(pair.Certificate, block.Bytes)
		}
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: cas,
		MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}, nil
}

// ClientTLS is a mutual TLS client's: it verifies the coordinator against
// c's CA, by the address it dials, and presents c's certificate.
func ClientTLS(c Credentials) (*tls.Config, error) {
	pair, err := c.leaf()
	if err != nil {
		return nil, err
	}
	roots, err := pool(c.CA)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS13}, nil
}

// BootstrapTLS is the TLS of a process that holds only a join token: it
// trusts a coordinator whose certificate chain holds a CA with caHash and
// whose certificate that CA signed for the address dialled. verified is
// told of each connection's verification: the CA (PEM), or why the
// coordinator is not trusted.
func BootstrapTLS(caHash string, verified func(caPEM []byte, err error)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is verified below, against the CA the token names
		// rather than the system's roots.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			ca, err := verifyByHash(cs, caHash)
			verified(ca, err)
			return err
		},
	}
}

func verifyByHash(cs tls.ConnectionState, caHash string) ([]byte, error) {
	if len(cs.PeerCertificates) == 0 {
		return nil, errors.New("the coordinator presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	for _, ca := range cs.PeerCertificates[1:] {
		if !ca.IsCA || Hash(ca) != caHash {
			continue
		}
		roots := x509.NewCertPool()
		roots.AddCert(ca)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: cs.ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return nil, fmt.Errorf("the coordinator's certificate: %w", err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), nil
	}
	return nil, fmt.Errorf("the coordinator's CA is not the one the join token names (sha256 %s...): wrong coordinator, or a token of another cluster", caHash[:12])
}

// PeerTLS is the mutual TLS of an agent's node server: between nodes (an
// agent serving the checkpoints it holds, and its peers fetching them) and
// from users' clients reading rank output (AgentTLS). Each side presents
// its certificate and accepts only one of c's CA: the server a node's, a
// client's or an admin's, a node's client a node's. The peer's identity is
// in the connection state, for the handler to check what it may do.
func PeerTLS(c Credentials) (server, client *tls.Config, err error) {
	pair, roots, err := c.pairAndRoots()
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAnyClientCert,
		MinVersion: tls.VersionTLS13, VerifyConnection: verifyPeer(roots, RoleNode, RoleClient, RoleAdmin)}
	return server, nodeClient(pair, roots), nil
}

// AgentTLS is the TLS a user's client (c's identity) reads an agent's
// node server with: it accepts only a node certificate of c's CA.
func AgentTLS(c Credentials) (*tls.Config, error) {
	pair, roots, err := c.pairAndRoots()
	if err != nil {
		return nil, err
	}
	return nodeClient(pair, roots), nil
}

func (c Credentials) pairAndRoots() (tls.Certificate, *x509.CertPool, error) {
	pair, err := c.leaf()
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	roots, err := pool(c.CA)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return pair, roots, nil
}

// nodeClient dials node servers: the chain is verified by verifyPeer,
// against the cluster's CA, and by identity rather than by the address
// dialled.
func nodeClient(pair tls.Certificate, roots *x509.CertPool) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true,
		MinVersion: tls.VersionTLS13, VerifyConnection: verifyPeer(roots, RoleNode)}
}

// verifyPeer accepts a peer whose certificate roots issued for one of
// roles.
func verifyPeer(roots *x509.CertPool, roles ...string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, ca := range cs.PeerCertificates[1:] {
			inter.AddCert(ca)
		}
		leaf := cs.PeerCertificates[0]
		// Node certificates are issued for client authentication (both
		// sides of a peer connection present one), as are users'.
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return fmt.Errorf("the peer's certificate: %w", err)
		}
		id, err := IdentityOf(leaf)
		if err != nil {
			return err
		}
		if !slices.Contains(roles, id.Role) {
			return fmt.Errorf("the peer is %s, not a %s", id, strings.Join(roles, " or "))
		}
		return nil
	}
}

// PeerIdentity is the identity of the peer of a connection PeerTLS
// verified.
func PeerIdentity(cs *tls.ConnectionState) (Identity, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Identity{}, errors.New("no peer certificate")
	}
	return IdentityOf(cs.PeerCertificates[0])
}
