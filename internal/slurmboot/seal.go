package slurmboot

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// A Sealer vouches for a message between the tasks of one Slurm job:
// Seal wraps a payload in a credential only the job's user could have
// made, Open checks one and returns its payload. Seal's credential goes
// over a TLS connection whose server the payload names (its certificate's
// fingerprint), so that one sealed for a server is of no use to another.
type Sealer interface {
	Seal(ctx context.Context, payload []byte) ([]byte, error)
	Open(ctx context.Context, cred []byte) ([]byte, error)
	// String names the mechanism, for messages.
	String() string
}

// ErrRefused is wrapped by Open's errors for a credential that is not
// good: forged, another user's, expired or replayed.
var ErrRefused = errors.New("slurmboot: credential refused")

// Munge seals with MUNGE (the munge and unmunge programs, through munged's
// Socket): a credential names the uid that made it, which Open requires to
// be this process's, and its payload is encrypted so that only that uid can
// decode it. munged refuses a credential it decoded before, and one older
// than its time to live (5 minutes by default).
type Munge struct {
	// Socket is munged's socket; empty means munge's default.
	Socket string
	// UID is the uid credentials must come from and are restricted to:
	// this process's.
	UID int
}

func (m Munge) String() string { return "munge" }

func (m Munge) args(more ...string) []string {
	if m.Socket != "" {
		more = append(more, "--socket="+m.Socket)
	}
	return more
}

// Seal runs munge: the credential may be decoded by m.UID alone.
func (m Munge) Seal(ctx context.Context, payload []byte) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "munge", m.args("--restrict-uid="+strconv.Itoa(m.UID))...)
	cmd.Stdin = bytes.NewReader(payload)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("munge: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return bytes.TrimSpace(out), nil
}

// Open runs unmunge and checks that the credential's uid is m.UID.
func (m Munge) Open(ctx context.Context, cred []byte) ([]byte, error) {
	dir, err := os.MkdirTemp("", "gpucoord-unmunge-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	meta, payload := dir+"/meta", dir+"/payload"
	cmd := exec.CommandContext(ctx, "unmunge", m.args("--numeric", "--metadata="+meta, "--output="+payload)...)
	cmd.Stdin = bytes.NewReader(cred)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if _, ok := err.(*exec.ExitError); ok {
			return nil, fmt.Errorf("%w: unmunge: %s", ErrRefused, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("unmunge: %v", err)
	}
	md, err := os.ReadFile(meta)
	if err != nil {
		return nil, err
	}
	uid, ok := mungeField(md, "UID")
	if !ok {
		return nil, fmt.Errorf("unmunge: no UID in its metadata")
	}
	if uid != strconv.Itoa(m.UID) {
		return nil, fmt.Errorf("%w: made by uid %s, not this job's user (uid %d)", ErrRefused, uid, m.UID)
	}
	return os.ReadFile(payload)
}

// mungeField reads "KEY: value" from unmunge's metadata.
func mungeField(md []byte, key string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// Secret seals with a key the job's tasks share (GPUCOORD_SLURM_SECRET,
// for clusters without MUNGE): HMAC-SHA256 over the time and the payload.
// A credential is good for TTL after it was made; it is not encrypted, and
// the connection it travels on is what keeps its payload private.
type Secret struct {
	Key []byte
	TTL time.Duration
	Now func() time.Time
}

func (s Secret) String() string { return "GPUCOORD_SLURM_SECRET" }

// Seal returns time (8 bytes) | MAC (32) | payload.
func (s Secret) Seal(_ context.Context, payload []byte) ([]byte, error) {
	if len(s.Key) < 16 {
		return nil, errors.New("GPUCOORD_SLURM_SECRET is shorter than 16 bytes")
	}
	b := binary.BigEndian.AppendUint64(nil, uint64(s.Now().UnixNano()))
	b = append(b, s.mac(b[:8], payload)...)
	return append(b, payload...), nil
}

// Open checks the MAC and the age.
func (s Secret) Open(_ context.Context, cred []byte) ([]byte, error) {
	if len(cred) < 40 {
		return nil, fmt.Errorf("%w: %d bytes, too short", ErrRefused, len(cred))
	}
	ts, mac, payload := cred[:8], cred[8:40], cred[40:]
	if !hmac.Equal(mac, s.mac(ts, payload)) {
		return nil, fmt.Errorf("%w: its MAC is wrong (another GPUCOORD_SLURM_SECRET)", ErrRefused)
	}
	made := time.Unix(0, int64(binary.BigEndian.Uint64(ts)))
	if age := s.Now().Sub(made); age > s.TTL || age < -s.TTL {
		return nil, fmt.Errorf("%w: made %s ago, more than %s", ErrRefused, age.Round(time.Second), s.TTL)
	}
	return payload, nil
}

func (s Secret) mac(ts, payload []byte) []byte {
	h := hmac.New(sha256.New, s.Key)
	h.Write(ts)
	h.Write(payload)
	return h.Sum(nil)
}

// MungeSocket returns munged's socket as slurm.conf names it
// (AuthInfo=socket=PATH), reading the file SLURM_CONF names or
// /etc/slurm/slurm.conf; "" (munge's default) when it names none.
func MungeSocket(getenv func(string) string) string {
	path := getenv("SLURM_CONF")
	if path == "" {
		path = "/etc/slurm/slurm.conf"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return authInfoSocket(string(b))
}

// authInfoSocket reads socket= from slurm.conf's AuthInfo line.
func authInfoSocket(conf string) string {
	for line := range strings.Lines(conf) {
		line, _, _ = strings.Cut(line, "#")
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "AuthInfo") {
			continue
		}
		for opt := range strings.SplitSeq(strings.TrimSpace(v), ",") {
			if name, val, ok := strings.Cut(opt, "="); ok && strings.TrimSpace(name) == "socket" {
				return strings.TrimSpace(val)
			}
		}
	}
	return ""
}
