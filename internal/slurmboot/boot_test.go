package slurmboot

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpucoord/gpucoord/internal/pki"
)

func secret(key string) Secret {
	return Secret{Key: []byte(key), TTL: time.Minute, Now: time.Now}
}

// step returns the configs of a step's n tasks, k of them coordinators,
// all sealing with s, the server on loopback.
func step(t *testing.T, n, k int, s Sealer, job string) []Config {
	ports := Ports(job, "0", "", 4)
	var cfgs []Config
	for i := range n {
		c := Config{Job: job, Step: "0", Node: fmt.Sprintf("s%d", i+1), NodeID: i, Coordinators: k, Sealer: s,
			Server: "127.0.0.1", Bind: "127.0.0.1", Ports: ports, Timeout: 20 * time.Second}
		if i < k {
			c.Self = &Member{Name: c.Node, Addr: fmt.Sprintf("127.0.0.1:%d", 7000+i), PeerURL: fmt.Sprintf("https://127.0.0.1:%d", 2380+i)}
		}
		cfgs = append(cfgs, c)
	}
	return cfgs
}

// agree runs the step's tasks: the first serves, the others fetch.
func agree(t *testing.T, cfgs []Config) ([]Grant, []error) {
	t.Helper()
	srv, err := Serve(t.Context(), cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	grants, errs := make([]Grant, len(cfgs)), make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i := 1; i < len(cfgs); i++ {
		wg.Go(func() { grants[i], errs[i] = Fetch(t.Context(), cfgs[i]) })
	}
	grants[0], errs[0] = srv.Grant(t.Context())
	wg.Wait()
	return grants, errs
}

// TestAgree: five tasks, three coordinators. Every task gets the same CA
// and the coordinators in node order; the coordinators get the CA's key,
// the others a certificate for their node under the CA and no key.
func TestAgree(t *testing.T) {
	cfgs := step(t, 5, 3, secret("0123456789abcdef0123"), "101")
	grants, errs := agree(t, cfgs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
	}
	want := []Member{*cfgs[0].Self, *cfgs[1].Self, *cfgs[2].Self}
	for i, g := range grants {
		if string(g.CA) != string(grants[0].CA) {
			t.Errorf("task %d has another CA", i)
		}
		if fmt.Sprint(g.Members) != fmt.Sprint(want) {
			t.Errorf("task %d: members %v, want %v", i, g.Members, want)
		}
		if (len(g.CAKey) > 0) != (i < 3) || (len(g.Cert) > 0) != (i >= 3) {
			t.Errorf("task %d: CA key %t, certificate %t", i, len(g.CAKey) > 0, len(g.Cert) > 0)
		}
		if i < 3 {
			if _, err := pki.ParseCA(g.CA, g.CAKey); err != nil {
				t.Errorf("task %d: %v", i, err)
			}
			continue
		}
		creds := pki.Credentials{CA: g.CA, Cert: g.Cert, Key: g.Key}
		id, err := creds.Identity()
		if err != nil || id != (pki.Identity{Role: pki.RoleNode, Name: cfgs[i].Node}) {
			t.Errorf("task %d: identity %v, %v", i, id, err)
		}
		client := pki.Credentials{CA: g.CA, Cert: g.ClientCert, Key: g.ClientKey}
		if id, err := client.Identity(); err != nil || id != LaunchIdentity(cfgs[i].Node) {
			t.Errorf("task %d: launch's identity %v, %v", i, id, err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(g.CA)
		cert, _ := pki.ParseCert(g.Cert)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("task %d's certificate: %v", i, err)
		}
	}
}

// TestRefused: a task sealing with another secret is refused, and says
// so once its time is up; a task of another step never gets this step's
// grant.
func TestRefused(t *testing.T) {
	cfgs := step(t, 3, 2, secret("0123456789abcdef0123"), "102")
	srv, err := Serve(t.Context(), cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	bad := cfgs[2]
	bad.Sealer, bad.Timeout = secret("another secret of 20"), 2*time.Second
	if _, err := Fetch(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "MAC is wrong") {
		t.Errorf("another secret: %v", err)
	}
	other := cfgs[2]
	other.Step, other.Timeout = "1", 2*time.Second
	other.Ports = cfgs[0].Ports // as if the hash had met
	if _, err := Fetch(t.Context(), other); err == nil || !strings.Contains(err.Error(), "did not answer within") || !strings.Contains(err.Error(), "step 102.1 asked the bootstrap of step 102.0") {
		t.Errorf("another step: %v", err)
	}
}

// TestRelayRefused: someone in the middle who terminates the TLS
// connection with a certificate of its own and passes the request on gets
// a refusal: the request names the certificate its maker saw.
func TestRelayRefused(t *testing.T) {
	cfgs := step(t, 2, 1, secret("0123456789abcdef0123"), "103")
	srv, err := Serve(t.Context(), cfgs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	leaf, _, err := momentCert()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	relayed := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		in := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{leaf}})
		var req request
		if json.NewDecoder(in).Decode(&req) != nil {
			return
		}
		out, err := tls.Dial("tcp", srv.Addr(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			relayed <- err.Error()
			return
		}
		defer out.Close()
		json.NewEncoder(out).Encode(req)
		b, _ := io.ReadAll(out)
		relayed <- string(b)
		in.Write(b)
	}()
	c := cfgs[1]
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	var p int
	fmt.Sscan(port, &p)
	c.Ports, c.Timeout = []int{p}, 3*time.Second
	_, err = Fetch(t.Context(), c)
	if err == nil || !strings.Contains(err.Error(), "another server's certificate") {
		t.Errorf("relayed: %v", err)
	}
	if r := <-relayed; !strings.Contains(r, "another server's certificate") {
		t.Errorf("the server told the relay %q", r)
	}
}

// TestMunge: with a munged of the test's own, tasks agree through MUNGE
// credentials; a credential another uid made is refused.
func TestMunge(t *testing.T) {
	socket := startMunged(t)
	m := Munge{Socket: socket, UID: os.Getuid()}
	cfgs := step(t, 3, 2, m, "104")
	grants, errs := agree(t, cfgs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
	}
	if len(grants[2].Cert) == 0 || len(grants[1].CAKey) == 0 {
		t.Errorf("grants: %+v", grants)
	}
	// A credential made by another uid (root can make one for any).
	cred, err := exec.Command("munge", "--socket="+socket, "--uid=4242", "--string=x").Output()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(t.Context(), cred); err == nil || !strings.Contains(err.Error(), "uid 4242") {
		t.Errorf("another uid's credential: %v", err)
	}
	// A credential decoded once is refused the second time.
	cred, _ = m.Seal(t.Context(), []byte("once"))
	if _, err := m.Open(t.Context(), cred); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Open(t.Context(), cred); err == nil {
		t.Error("a replayed credential was taken")
	}
}

// startMunged runs a munged of the test's own and returns its socket.
func startMunged(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("munged"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("munged is not installed (scripts/deps.sh installs munge)")
		}
		t.Skip("munged is not installed (scripts/deps.sh installs munge)")
	}
	dir, err := os.MkdirTemp("", "gpucoord-munge-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711)
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(dir, "munge.key"), key, 0o400); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "munge.socket")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "munged", "--foreground", "--force", "--socket="+socket, "--key-file="+filepath.Join(dir, "munge.key"),
		"--log-file="+filepath.Join(dir, "munged.log"), "--pid-file="+filepath.Join(dir, "munged.pid"), "--seed-file="+filepath.Join(dir, "munged.seed"))
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := exec.Command("munge", "--socket="+socket, "--no-input").Run(); err == nil {
			return socket
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "munged.log"))
			t.Fatalf("munged did not answer within 10 s: %s", log)
		}
	}
}

func TestAuthInfoSocket(t *testing.T) {
	for conf, want := range map[string]string{
		"AuthType=auth/munge\nAuthInfo=socket=/run/m/munge.socket.2\n": "/run/m/munge.socket.2",
		"authinfo = cred_expire=30,socket=/x/s # comment\n":            "/x/s",
		"#AuthInfo=socket=/no\nAuthType=auth/munge\n":                  "",
		"AuthInfo=cred_expire=30\n":                                    "",
	} {
		if got := authInfoSocket(conf); got != want {
			t.Errorf("authInfoSocket(%q) = %q, want %q", conf, got, want)
		}
	}
}

func TestPorts(t *testing.T) {
	a, b := Ports("7", "0", "", 4), Ports("7", "0", "", 4)
	if fmt.Sprint(a) != fmt.Sprint(b) || len(a) != 4 {
		t.Fatalf("%v %v", a, b)
	}
	for _, p := range a {
		if p < 20000 || p >= 32000 {
			t.Errorf("port %d outside [20000, 32000)", p)
		}
	}
	if c := Ports("7", "1", "", 4); fmt.Sprint(c) == fmt.Sprint(a) {
		t.Errorf("steps 7.0 and 7.1 have the same ports %v", a)
	}
	if r := Ports("7", "0", "12001-12002", 3); r[0] != 12001 || r[1] != a[0] {
		t.Errorf("reserved ports: %v", r)
	}
}
