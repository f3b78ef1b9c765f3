package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// tokenPrefix starts every join token.
const tokenPrefix = "gct1."

// Token is a join token: gct1.<id>.<secret>.<hash>. The id names it (in
// lists and revocations), the secret proves it, and the hash is the
// cluster CA's (Hash): with it a new agent verifies the coordinator before
// it sends the secret, as kubeadm's discovery hash does.
type Token struct {
	ID     string
	Secret string
	CAHash string
}

// NewToken makes a token for the CA whose hash is caHash.
func NewToken(caHash string) (Token, error) {
	b := make([]byte, 4+16)
	if _, err := rand.Read(b); err != nil {
		return Token{}, err
	}
	return Token{ID: hex.EncodeToString(b[:4]), Secret: hex.EncodeToString(b[4:]), CAHash: caHash}, nil
}

func (t Token) String() string { return tokenPrefix + t.ID + "." + t.Secret + "." + t.CAHash }

// ParseToken reads a token. Its error never repeats the token.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, tokenPrefix)
	parts := strings.Split(rest, ".")
	if !ok || len(parts) != 3 {
		return Token{}, fmt.Errorf("not a gpucoord join token (want %s<id>.<secret>.<CA hash>, as `gpucoord token create` prints)", tokenPrefix)
	}
	t := Token{ID: parts[0], Secret: parts[1], CAHash: parts[2]}
	if !isHex(t.ID, 8) || !isHex(t.Secret, 32) || !isHex(t.CAHash, 64) {
		return Token{}, fmt.Errorf("join token %s...: malformed (want 8, 32 and 64 hex digits)", tokenPrefix+safePrefix(t.ID))
	}
	return t, nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func safePrefix(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// TokenRecord is what a coordinator keeps of a token: never its secret,
// only the secret's hash.
type TokenRecord struct {
	SecretSHA256  string   `json:"secret_sha256"`
	Roles         []string `json:"roles"`
	CreatedUnixMs int64    `json:"created_unix_ms"`
	// ExpiresUnixMs is when the token stops working; 0 for never.
	ExpiresUnixMs int64  `json:"expires_unix_ms,omitempty"`
	Description   string `json:"description,omitempty"`
}

// Record is what to keep of t, allowing roles, created at now and expiring
// after ttl (0: never).
func (t Token) Record(roles []string, now time.Time, ttl time.Duration, description string) TokenRecord {
	r := TokenRecord{SecretSHA256: secretHash(t.Secret), Roles: roles, CreatedUnixMs: now.UnixMilli(), Description: description}
	if ttl > 0 {
		r.ExpiresUnixMs = now.Add(ttl).UnixMilli()
	}
	return r
}

func secretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Allows reports whether the token t, whose record r is, may be used now
// for role; the error says why not, in words that name neither secret.
func (r TokenRecord) Allows(t Token, role string, now time.Time) error {
	if subtle.ConstantTimeCompare([]byte(secretHash(t.Secret)), []byte(r.SecretSHA256)) != 1 {
		return fmt.Errorf("join token %s: wrong secret", t.ID)
	}
	if r.ExpiresUnixMs != 0 && now.UnixMilli() >= r.ExpiresUnixMs {
		return fmt.Errorf("join token %s expired at %s", t.ID, time.UnixMilli(r.ExpiresUnixMs).UTC().Format(time.RFC3339))
	}
	if !slices.Contains(r.Roles, role) {
		return fmt.Errorf("join token %s does not allow the %s role (it allows %s)", t.ID, role, strings.Join(r.Roles, ", "))
	}
	return nil
}

// ParseRoles reads a comma-separated list of roles.
func ParseRoles(s string) ([]string, error) {
	var roles []string
	for r := range strings.SplitSeq(s, ",") {
		if r = strings.TrimSpace(r); !slices.Contains(roles, r) {
			roles = append(roles, r)
		}
	}
	return roles, CheckRoles(roles)
}

// CheckRoles refuses an empty list and a role that is none of Roles.
func CheckRoles(roles []string) error {
	if len(roles) == 0 {
		return errors.New("no role: want at least one of " + strings.Join(Roles, ", "))
	}
	for _, r := range roles {
		if !slices.Contains(Roles, r) {
			return fmt.Errorf("role %q: want one of %s", r, strings.Join(Roles, ", "))
		}
	}
	return nil
}
