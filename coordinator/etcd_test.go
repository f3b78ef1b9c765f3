package coordinator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdServer starts Debian's etcd-server (an external etcd v3 cluster of
// one) with extra flags and returns its client URL; scheme is http or
// https. It is stopped when the test ends.
func etcdServer(t *testing.T, scheme string, extra ...string) string {
	t.Helper()
	const bin = "/usr/bin/etcd"
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is missing: install Debian's etcd-server (make deps)", bin)
	}
	port := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	client, peer := scheme+"://127.0.0.1:"+port(), "http://127.0.0.1:"+port()
	cmd := exec.Command(bin, append([]string{"--name", "t", "--data-dir", t.TempDir(), "--listen-client-urls", client,
		"--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t=" + peer}, extra...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Ready when its client port accepts connections.
	host := strings.TrimPrefix(strings.TrimPrefix(client, "https://"), "http://")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", host); err == nil {
			c.Close()
			return client
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd at %s did not come up", client)
		}
	}
}

// TestExternalEtcdPassword: with authentication on, the right user and
// password connect, a wrong password is a one-line error.
func TestExternalEtcdPassword(t *testing.T) {
	url := etcdServer(t, "http")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := t.Context()
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "pw-1"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := waitOK(step); err != nil {
			t.Fatal(err)
		}
	}
	e, err := OpenEtcd(ctx, EtcdConfig{Endpoints: []string{url}, Username: "root", Password: "pw-1", DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	if _, err := e.Client.Put(ctx, "/gpucoord/probe", "x"); err != nil {
		t.Errorf("put with auth: %v", err)
	}
	e.Close()
	_, err = OpenEtcd(ctx, EtcdConfig{Endpoints: []string{url}, Username: "root", Password: "wrong", DialTimeout: 5 * time.Second})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "authentication failed") || strings.Contains(err.Error(), "\n") {
		t.Errorf("wrong password: err = %v, want one line saying authentication failed", err)
	}
}

// waitOK retries a call while the fresh server elects itself.
func waitOK(f func() error) error {
	var err error
	for range 100 {
		if err = f(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// TestExternalEtcdTLS: etcd serving TLS and requiring client certificates
// is reached with --etcd-ca/--etcd-cert/--etcd-key, and refused without the
// client certificate.
func TestExternalEtcdTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := certificate(t, dir, "ca", nil, nil)
	certificate(t, dir, "server", ca, caKey)
	certificate(t, dir, "client", ca, caKey)
	url := etcdServer(t, "https", "--cert-file", filepath.Join(dir, "server.crt"), "--key-file", filepath.Join(dir, "server.key"),
		"--trusted-ca-file", filepath.Join(dir, "ca.crt"), "--client-cert-auth")
	cfg := EtcdConfig{Endpoints: []string{url}, CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "client.crt"),
		KeyFile: filepath.Join(dir, "client.key"), DialTimeout: 5 * time.Second}
	e, err := OpenEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatalf("with the client certificate: %v", err)
	}
	e.Close()
	cfg.CertFile, cfg.KeyFile, cfg.DialTimeout = "", "", time.Second
	if _, err := OpenEtcd(t.Context(), cfg); !errors.Is(err, ErrUnavailable) {
		t.Errorf("without a client certificate: err = %v, want unavailable", err)
	}
}

// certificate writes NAME.crt and NAME.key in dir: a CA when parent is
// nil, else a certificate for 127.0.0.1 signed by it.
func certificate(t *testing.T, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestDataDirInUse: a second embedded etcd on a data directory in use
// fails at once naming the first's pid, and the directory is free again
// once the first is closed.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	cfg := EtcdConfig{DataDir: dir, DialTimeout: 5 * time.Second}
	first, err := OpenEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = OpenEtcd(t.Context(), cfg)
	want := "data dir " + dir + " is in use by another coordinator (pid " + strconv.Itoa(os.Getpid()) + ")"
	if !errors.Is(err, ErrUnavailable) || err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second open: %v, want %q", err, want)
	}
	first.Close()
	again, err := OpenEtcd(t.Context(), cfg)
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	again.Close()
}
