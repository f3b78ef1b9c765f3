// Package pki is the cluster's certificates and join tokens: a cluster CA,
// the identities its certificates carry, the coordinator's server
// certificate, and tokens that carry the CA's hash and a secret.
//
// An identity is a role and a name: a node's agent (RoleNode, its node
// name), a user's client (RoleClient) or an operator's (RoleAdmin). A
// certificate carries it as its subject: the name in the common name, the
// role in the organizational unit, so that an organisation's own PKI can
// issue the same certificates.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"
)

// The roles an identity can have.
const (
	// RoleNode is a node's agent: it registers, watches, reports and
	// leaves as its own node only.
	RoleNode = "node"
	// RoleClient submits, follows, cancels and reads status of jobs.
	RoleClient = "client"
	// RoleAdmin may do what a client does and manage join tokens.
	RoleAdmin = "admin"
)

// Roles lists every role, in the order tokens print them.
var Roles = []string{RoleNode, RoleClient, RoleAdmin}

// Lifetimes of what the CA signs.
const (
	CALifetime     = 10 * 365 * 24 * time.Hour
	LeafLifetime   = 365 * 24 * time.Hour
	clockSkewGrace = 5 * time.Minute
)

// Identity is who a certificate speaks for.
type Identity struct {
	Role string
	Name string
}

func (id Identity) String() string { return id.Role + " " + id.Name }

// Validate names what is wrong with id.
func (id Identity) Validate() error {
	if !slices.Contains(Roles, id.Role) {
		return fmt.Errorf("role %q: want one of %s", id.Role, strings.Join(Roles, ", "))
	}
	if id.Name == "" || len(id.Name) > 253 || strings.ContainsAny(id.Name, "/ \t\r\n,=+<>#;\"\\") {
		return fmt.Errorf("identity name %q: want 1 to 253 characters without '/', spaces or any of ,=+<>#;\"\\", id.Name)
	}
	return nil
}

// IdentityOf reads the identity a verified certificate carries.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	if len(cert.Subject.OrganizationalUnit) != 1 {
		return Identity{}, fmt.Errorf("certificate %q has %d organizational units: want one, its role (%s)", cert.Subject.CommonName, len(cert.Subject.OrganizationalUnit), strings.Join(Roles, ", "))
	}
	id := Identity{Role: cert.Subject.OrganizationalUnit[0], Name: cert.Subject.CommonName}
	return id, id.Validate()
}

// CA is the cluster's certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a CA for cluster (a name shown in its subject) and returns its
// certificate and key in PEM.
func NewCA(cluster string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gpucoord cluster CA " + cluster, Organization: []string{"gpucoord"}},
		NotBefore:             now.Add(-clockSkewGrace),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// ParseCA reads a CA from its certificate and key in PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("CA certificate %q is not a CA", cert.Subject.CommonName)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !publicEqual(cert.PublicKey, key.Public()) {
		return nil, errors.New("the CA key does not belong to the CA certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// PEM is the CA's certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// Hash is the hash a join token carries of a CA: SHA-256 of its
// certificate's public key (its SubjectPublicKeyInfo), as kubeadm's
// discovery hash.
func Hash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// SignRequest issues a certificate for id to the holder of the key that
// signed the certificate request csrDER, for client authentication.
func (ca *CA) SignRequest(csrDER []byte, id Identity, now time.Time) (certPEM []byte, err error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id.Name, OrganizationalUnit: []string{id.Role}, Organization: []string{"gpucoord"}},
		NotBefore:    now.Add(-clockSkewGrace),
		NotAfter:     minTime(now.Add(LeafLifetime), ca.Cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// ServerCert issues a coordinator's server certificate, valid for hosts
// (addresses and names), with a new key; it returns both in PEM.
func (ca *CA) ServerCert(name string, hosts []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	return ca.leafWithKey(pkix.Name{CommonName: name, OrganizationalUnit: []string{"coordinator"}, Organization: []string{"gpucoord"}},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, hosts, now)
}

// PeerCN is the common name of the peer certificate of the embedded etcd
// member named member. It holds a '/', which no identity name may
// (Identity.Validate), so no certificate a join token buys can pass for
// an etcd peer.
func PeerCN(member string) string { return "etcd-peer/" + member }

// PeerCert issues the certificate an embedded etcd member speaks to its
// peers with, as server and as client (CommonName PeerCN(member)), valid
// for hosts, with a new key; it returns both in PEM.
func (ca *CA) PeerCert(member string, hosts []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	return ca.leafWithKey(pkix.Name{CommonName: PeerCN(member), OrganizationalUnit: []string{"etcd-peer"}, Organization: []string{"gpucoord"}},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, hosts, now)
}

// leafWithKey issues a certificate for subject with a new key.
func (ca *CA) leafWithKey(subject pkix.Name, usage []x509.ExtKeyUsage, hosts []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    now.Add(-clockSkewGrace),
		NotAfter:     minTime(now.Add(LeafLifetime), ca.Cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = EncodeKey(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// NewRequest makes a key and a certificate request for id; the key stays
// with its maker, the request goes to the CA.
func NewRequest(id Identity) (keyPEM, csrDER []byte, err error) {
	if err := id.Validate(); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: id.Name, OrganizationalUnit: []string{id.Role}}}, key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = EncodeKey(key)
	return keyPEM, csrDER, err
}

// EncodeKey writes a private key in PKCS #8 PEM.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKey reads a private key in PEM: PKCS #8, EC or PKCS #1.
func ParseKey(b []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, err
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T key cannot sign", key)
	}
	return s, nil
}

// ParseCert reads the first certificate in PEM.
func ParseCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func publicEqual(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}
