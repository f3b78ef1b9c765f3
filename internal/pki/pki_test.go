package pki

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var now = time.UnixMilli(1_700_000_000_000)

func TestTokenParse(t *testing.T) {
	tok, err := NewToken(strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseToken(" " + tok.String() + "\n")
	if err != nil || got != tok {
		t.Fatalf("ParseToken(%q) = %v, %v", tok.String(), got, err)
	}
	for _, bad := range []string{"", "s3cret", "gct1.", "gct1.a.b.c", "gct0." + tok.ID + "." + tok.Secret + "." + tok.CAHash,
		"gct1." + tok.ID + "." + tok.Secret[:31] + "." + tok.CAHash, "gct1." + tok.ID + "." + strings.Repeat("z", 32) + "." + tok.CAHash} {
		_, err := ParseToken(bad)
		if err == nil {
			t.Errorf("ParseToken(%q) took it", bad)
		} else if strings.Contains(err.Error(), tok.Secret) {
			t.Errorf("ParseToken's error shows the secret: %v", err)
		}
	}
	if r, err := ParseRoles("node, client,node"); err != nil || len(r) != 2 {
		t.Errorf("ParseRoles = %v, %v", r, err)
	}
	if _, err := ParseRoles("node,root"); err == nil {
		t.Error("ParseRoles took root")
	}
}

// TestIssue: the CA issues a client certificate that carries the identity
// asked for, for the requester's key, good for client authentication
// only; a server certificate for the hosts given, good for serving only.
func TestIssue(t *testing.T) {
	certPEM, keyPEM, err := NewCA("/c/", now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, _ := NewCA("/other/", now)
	if _, err := ParseCA(certPEM, otherKey); err == nil {
		t.Error("ParseCA took another CA's key")
	}
	id := Identity{Role: RoleNode, Name: "h2"}
	key, csr, err := NewRequest(id)
	if err != nil {
		t.Fatal(err)
	}
	leafPEM, err := ca.SignRequest(csr, id, now)
	if err != nil {
		t.Fatal(err)
	}
	creds := Credentials{CA: ca.PEM(), Cert: leafPEM, Key: key}
	if got, err := creds.Identity(); err != nil || got != id {
		t.Errorf("identity = %v, %v, want %v", got, err, id)
	}
	if h, _ := creds.CAHash(); h != Hash(ca.Cert) || len(h) != 64 {
		t.Errorf("CA hash %q", h)
	}
	leaf, _ := ParseCert(leafPEM)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("a node's certificate verifies as a server's")
	}
	if !creds.Valid(now) || creds.Valid(now.Add(LeafLifetime+time.Hour)) {
		t.Error("validity: want valid now, expired after its lifetime")
	}
	if _, err := ca.SignRequest(csr, Identity{Role: "root", Name: "x"}, now); err == nil {
		t.Error("issued a certificate for role root")
	}
	if _, err := ca.SignRequest(csr[:len(csr)-3], id, now); err == nil {
		t.Error("issued a certificate for a truncated request")
	}
	srvPEM, _, err := ca.ServerCert("c1", []string{"10.0.0.1", "coord-0"}, now)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ParseCert(srvPEM)
	for _, host := range []string{"10.0.0.1", "coord-0"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, DNSName: host}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, DNSName: "10.0.0.2"}); err == nil {
		t.Error("the server certificate verifies for a host it was not issued for")
	}
}

func TestSaveLoad(t *testing.T) {
	certPEM, keyPEM, err := NewCA("/c/", now)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := ParseCA(certPEM, keyPEM)
	id := Identity{Role: RoleClient, Name: "me@here"}
	key, csr, _ := NewRequest(id)
	cert, _ := ca.SignRequest(csr, id, now)
	dir := filepath.Join(t.TempDir(), "creds", "x")
	c := Credentials{CA: ca.PEM(), Cert: cert, Key: key}
	if err := c.Save(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, %v: want 0700", fi.Mode().Perm(), err)
	}
	for _, f := range []string{"ca.pem", "cert.pem", "key.pem"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, %v: want 0600", f, fi.Mode().Perm(), err)
		}
	}
	back, err := LoadDir(dir)
	if err != nil || string(back.Cert) != string(cert) || string(back.Key) != string(key) {
		t.Errorf("LoadDir: %v", err)
	}
	if _, err := (Files{CA: "a"}).Load(); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Errorf("one file of three: %v", err)
	}
}
