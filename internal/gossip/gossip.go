// Package gossip builds the memberlist (SWIM) pools in which gpucoord's
// agents find each other's failures, one pool per failure domain (a rack,
// a few tens of hosts): every member probes the others of its pool over
// UDP, and a member that stops answering (crashed, frozen or cut off) is
// suspected and then declared dead within about a second with the default
// tuning. Pools are kept apart by their labels (DomainLabel). It is the
// one place the memberlist configuration is made, so that every member
// probes alike.
package gossip

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Tuning sets how fast a silent member is declared dead: roughly
// ProbeInterval (until some member probes it) + ProbeTimeout + indirect
// probes + SuspicionMult * ProbeInterval (for pools under ten members; the
// suspicion grows with log10 of the pool size).
type Tuning struct {
	// ProbeInterval is how often each member probes a random other.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for its ack.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspect may refute before it is
	// declared dead.
	SuspicionMult int
}

// DefaultTuning detects a dead member in about a second on a LAN.
func DefaultTuning() Tuning {
	return Tuning{ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond, SuspicionMult: 3}
}

// Profiles are the named tunings: "lan", DefaultTuning (a dead member
// found in about a second where round trips take a millisecond), and
// "wan", memberlist's WAN settings (probe every 5 s, 3 s for an ack,
// suspicion 6), for round trips of hundreds of milliseconds, at the cost
// of finding a dead member in tens of seconds (the lease still finds one
// that stopped renewing within its TTL).
var Profiles = map[string]Tuning{
	"lan": DefaultTuning(),
	"wan": {ProbeInterval: 5 * time.Second, ProbeTimeout: 3 * time.Second, SuspicionMult: 6},
}

// Profile returns the tuning named name (Profiles).
func Profile(name string) (Tuning, error) {
	t, ok := Profiles[name]
	if !ok {
		return Tuning{}, fmt.Errorf("gossip profile %q: want lan or wan", name)
	}
	return t, nil
}

// Validate names the first field that cannot work.
func (t Tuning) Validate() error {
	if t.ProbeInterval < 10*time.Millisecond || t.ProbeTimeout <= 0 || t.ProbeTimeout >= t.ProbeInterval || t.SuspicionMult < 1 {
		return fmt.Errorf("gossip: probe interval %s, timeout %s, suspicion %d: want interval >= 10ms, 0 < timeout < interval, suspicion >= 1",
			t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult)
	}
	return nil
}

// MemberName is the pool name of one run of a node: node#instance, or the
// node's name alone where the run has no instance. A node that restarts
// joins as a new member while the pool may still be declaring its earlier
// run dead; the instance tells the two apart.
func MemberName(node, instance string) string {
	if instance == "" {
		return node
	}
	return node + "#" + instance
}

// ParseMember splits a MemberName into the node and the instance ("" for a
// name without one).
func ParseMember(member string) (node, instance string) {
	if i := strings.LastIndexByte(member, '#'); i >= 0 {
		return member[:i], member[i+1:]
	}
	return member, ""
}

// Secure is what makes a pool the cluster's alone: a packet that is not
// encrypted and authenticated with one of Keys (AES-GCM, memberlist's
// keyring) or carries another Label is dropped, so a stranger on the
// network can neither join nor declare a member dead.
type Secure struct {
	// Keys are 16, 24 or 32 bytes each (AES-128, -192 or -256): a member
	// sends with the first and accepts any. None leaves the pool open, for
	// tests of the pool itself only.
	Keys [][]byte
	// Label names the cluster; pools with other labels do not mix.
	Label string
}

// NewKey returns a random 32-byte pool key.
func NewKey() ([]byte, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	return k, nil
}

// Validate names what is wrong with s.
func (s Secure) Validate() error {
	for _, k := range s.Keys {
		switch len(k) {
		case 16, 24, 32:
		default:
			return fmt.Errorf("gossip key of %d bytes: want 16, 24 or 32", len(k))
		}
	}
	if len(s.Label) > maxLabel {
		return fmt.Errorf("gossip label of %d bytes: want at most 255", len(s.Label))
	}
	return nil
}

// maxLabel is the longest label memberlist sends.
const maxLabel = 255

// DomainLabel is the label of the pool of failure domain domain in the
// cluster labelled cluster: the cluster's own for the pool of the nodes
// that name no domain (""), else the cluster's and the domain's names
// (their SHA-256 where that would be longer than a label may be). A
// member of one domain's pool never joins another's by mistake: the
// other's packets carry another label and are dropped.
func DomainLabel(cluster, domain string) string {
	if domain == "" {
		return cluster
	}
	if l := cluster + "#" + domain; len(l) <= maxLabel {
		return l
	}
	sum := sha256.Sum256([]byte(cluster + "\x00" + domain))
	return "gpucoord-domain:" + hex.EncodeToString(sum[:])
}

// Pool is a member of the pool.
type Pool struct {
	*memberlist.Memberlist
	keyring *memberlist.Keyring // nil for an open pool
}

// SetKeys makes keys the member's keys, without a restart: it sends with
// the first from now on and accepts only these. A pool's keys change in
// steps that every member takes before the next (install a new key beside
// the one in use, use it, remove the old), so that no two members ever
// lack a key in common.
func (p *Pool) SetKeys(keys [][]byte) error {
	if p.keyring == nil || len(keys) == 0 {
		return errors.New("gossip: an open pool has no keys to change")
	}
	if err := (Secure{Keys: keys}).Validate(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := p.keyring.AddKey(k); err != nil {
			return err
		}
	}
	if err := p.keyring.UseKey(keys[0]); err != nil {
		return err
	}
	for _, k := range p.keyring.GetKeys() {
		if !slices.ContainsFunc(keys, func(w []byte) bool { return bytes.Equal(w, k) }) {
			if err := p.keyring.RemoveKey(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// Fingerprint names a key without showing it: the first 8 bytes of its
// SHA-256, in hex.
func Fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// Events receives membership changes. Calls come from memberlist's
// goroutines, one at a time.
type Events interface {
	// Dead is called when the member named name has left or been declared
	// dead.
	Dead(name string)
}

// New starts a member named name listening on bind ("host:port"; port 0
// picks a free one, the same for TCP and UDP) and telling the others to
// reach it at advertise with the same port (empty: bind's host, which must
// then not be unspecified), keeping out whoever lacks sec's key. events
// may be nil. Logs go to logw (nil discards them). Shutdown with Leave then
// Shutdown.
func New(name, bind, advertise string, t Tuning, sec Secure, events Events, logw io.Writer) (*Pool, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if err := sec.Validate(); err != nil {
		return nil, err
	}
	host, portStr, err := net.SplitHostPort(bind)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %v", bind, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: bad port", bind)
	}
	if port == 0 {
		if port, err = FreePort(host); err != nil {
			return nil, err
		}
	}
	c := memberlist.DefaultLANConfig()
	if advertise == "" {
		advertise = host
	}
	if net.ParseIP(advertise) == nil { // memberlist wants an address, not a name
		ips, err := net.LookupIP(advertise)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("gossip: advertised host %q: %v", advertise, err)
		}
		advertise = ips[0].String()
	}
	c.BindAddr, c.BindPort, c.AdvertiseAddr, c.AdvertisePort = host, port, advertise, port
	if err := configure(c, name, t, sec, events, logw); err != nil {
		return nil, err
	}
	m, err := memberlist.Create(c)
	if err != nil {
		return nil, fmt.Errorf("gossip on %s: %w", net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	return &Pool{Memberlist: m, keyring: c.Keyring}, nil
}

// configure sets everything of c but its addresses: the member's name, its
// timing, its keys and label (every packet and stream in and out is
// encrypted and labelled: one without them is dropped), events and logs.
func configure(c *memberlist.Config, name string, t Tuning, sec Secure, events Events, logw io.Writer) error {
	c.Name = name
	c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult
	c.GossipInterval = t.ProbeInterval / 2
	c.Label = sec.Label
	if len(sec.Keys) > 0 {
		kr, err := memberlist.NewKeyring(sec.Keys, sec.Keys[0])
		if err != nil {
			return fmt.Errorf("gossip keys: %w", err)
		}
		c.Keyring = kr
	}
	c.GossipVerifyIncoming, c.GossipVerifyOutgoing = true, true
	c.TCPTimeout = 10 * t.ProbeInterval
	if logw == nil {
		logw = io.Discard
	}
	c.Logger = log.New(logw, "", 0)
	if events != nil {
		c.Events = eventAdapter{events}
	}
	return nil
}

// FreePort finds a port free for both TCP and UDP on host, for a member
// whose address must be known before it starts (another process may
// take the port meanwhile; New then fails).
func FreePort(host string) (int, error) {
	for range 20 {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("gossip: %w", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err == nil {
			pc.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("gossip: no port free for both TCP and UDP on %s", host)
}

type eventAdapter struct{ e Events }

func (a eventAdapter) NotifyJoin(*memberlist.Node)    {}
func (a eventAdapter) NotifyUpdate(*memberlist.Node)  {}
func (a eventAdapter) NotifyLeave(n *memberlist.Node) { a.e.Dead(n.Name) }
