package gossip

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

type deadCh chan string

func (d deadCh) Dead(name string) { d <- name }

// TestCrashedMemberDeclaredDead: of three members, one stops without
// leaving (as a crashed process); the others declare it dead within the
// default tuning's budget, and name it.
func TestCrashedMemberDeclaredDead(t *testing.T) {
	dead := make(deadCh, 8)
	a, err := New("a", "127.0.0.1:0", "", DefaultTuning(), Secure{}, dead, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := New("b", "127.0.0.1:0", "", DefaultTuning(), Secure{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	c, err := New("c", "127.0.0.1:0", "", DefaultTuning(), Secure{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Join([]string{a.LocalNode().Address()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Join([]string{a.LocalNode().Address()}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); a.NumMembers() != 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d members after 10s, want 3", a.NumMembers())
		}
	}
	start := time.Now()
	c.Shutdown() // no Leave: the others must find out by probing
	select {
	case name := <-dead:
		if name != "c" {
			t.Fatalf("dead member %q, want c", name)
		}
		t.Logf("c declared dead %s after it stopped", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("c not declared dead within 10s")
	}
}

func TestTuningValidate(t *testing.T) {
	for _, bad := range []Tuning{
		{ProbeInterval: time.Millisecond, ProbeTimeout: time.Microsecond, SuspicionMult: 1},
		{ProbeInterval: time.Second, ProbeTimeout: time.Second, SuspicionMult: 1},
		{ProbeInterval: time.Second, ProbeTimeout: 0, SuspicionMult: 1},
		{ProbeInterval: time.Second, ProbeTimeout: time.Millisecond, SuspicionMult: 0},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := DefaultTuning().Validate(); err != nil {
		t.Error(err)
	}
}

// TestMemberName: a run's member name carries its instance and splits back,
// also for node names that contain '#'; a name without one is the node's.
func TestMemberName(t *testing.T) {
	for _, tc := range []struct{ node, instance, member string }{
		{"w1", "9f3a", "w1#9f3a"},
		{"rack#2", "01", "rack#2#01"},
		{"w1", "", "w1"},
	} {
		if got := MemberName(tc.node, tc.instance); got != tc.member {
			t.Errorf("MemberName(%q, %q) = %q, want %q", tc.node, tc.instance, got, tc.member)
		}
		if tc.instance == "" {
			continue
		}
		if n, i := ParseMember(tc.member); n != tc.node || i != tc.instance {
			t.Errorf("ParseMember(%q) = %q, %q", tc.member, n, i)
		}
	}
	if n, i := ParseMember("w1"); n != "w1" || i != "" {
		t.Errorf("ParseMember(w1) = %q, %q", n, i)
	}
}

// TestStrangersKeptOut: two members sharing a key and a label form a pool
// and a third with both joins it; a stranger without the key, with another
// key, or with the key under another label cannot join (its packets are
// dropped), and the pool never counts it.
func TestStrangersKeptOut(t *testing.T) {
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewKey()
	sec := Secure{Keys: [][]byte{key}, Label: "gpucoord:/cluster-a/"}
	a, err := New("a", "127.0.0.1:0", "", DefaultTuning(), sec, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	seed := []string{a.LocalNode().Address()}
	for _, tc := range []struct {
		name string
		sec  Secure
	}{
		{"no key", Secure{Label: sec.Label}},
		{"another key", Secure{Keys: [][]byte{other}, Label: sec.Label}},
		{"another label", Secure{Keys: [][]byte{key}, Label: "gpucoord:/cluster-b/"}},
		{"open", Secure{}},
	} {
		s, err := New("stranger", "127.0.0.1:0", "", DefaultTuning(), tc.sec, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := s.Join(seed); err == nil || n != 0 {
			t.Errorf("%s: joined %d, %v; want refused", tc.name, n, err)
		}
		s.Shutdown()
	}
	b, err := New("b", "127.0.0.1:0", "", DefaultTuning(), sec, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if _, err := b.Join(seed); err != nil {
		t.Fatalf("a member with the key: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); a.NumMembers() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d members after 10s, want a and b", a.NumMembers())
		}
	}
	for _, m := range a.Members() {
		if m.Name == "stranger" {
			t.Fatal("the pool counts a stranger")
		}
	}
}

func TestSecureValidate(t *testing.T) {
	for _, n := range []int{0, 1, 15, 31, 33} {
		if err := (Secure{Keys: [][]byte{make([]byte, n)}}).Validate(); err == nil {
			t.Errorf("a %d-byte key passed", n)
		}
	}
	for _, n := range []int{16, 24, 32} {
		if err := (Secure{Keys: [][]byte{make([]byte, n)}}).Validate(); err != nil {
			t.Errorf("a %d-byte key: %v", n, err)
		}
	}
	if err := (Secure{}).Validate(); err != nil {
		t.Errorf("no keys (an open pool): %v", err)
	}
	if err := (Secure{Keys: [][]byte{make([]byte, 32), make([]byte, 7)}}).Validate(); err == nil {
		t.Error("a bad second key passed")
	}
}

// TestSetKeys: a member's keys change in place; the first is the one it
// sends with; an open pool has none to change.
func TestSetKeys(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	p, err := New("k", "127.0.0.1:0", "", DefaultTuning(), Secure{Keys: [][]byte{a}, Label: "l"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown()
	for _, keys := range [][][]byte{{a, b}, {b, a}, {b}} {
		if err := p.SetKeys(keys); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p.keyring.GetPrimaryKey(), keys[0]) || len(p.keyring.GetKeys()) != len(keys) {
			t.Errorf("after SetKeys(%d keys): primary %x, %d keys", len(keys), p.keyring.GetPrimaryKey()[:1], len(p.keyring.GetKeys()))
		}
	}
	if err := p.SetKeys([][]byte{make([]byte, 5)}); err == nil {
		t.Error("SetKeys took a 5-byte key")
	}
	open, err := New("o", "127.0.0.1:0", "", DefaultTuning(), Secure{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Shutdown()
	if err := open.SetKeys([][]byte{a}); err == nil {
		t.Error("an open pool took keys")
	}
}

// TestDomainLabel: each domain of a cluster has a label of its own, the
// nodes naming none the cluster's; a name too long for a label is hashed,
// and two members of different domains with the cluster's key do not form
// one pool.
func TestDomainLabel(t *testing.T) {
	const cluster = "gpucoord:/gpucoord/"
	long := strings.Repeat("r", 253)
	tests := []struct {
		domain, want string
	}{
		{"", cluster},
		{"rack7", cluster + "#rack7"},
		{long, ""}, // hashed: checked below
	}
	seen := map[string]string{}
	for _, tc := range tests {
		got := DomainLabel(cluster, tc.domain)
		if tc.want != "" && got != tc.want {
			t.Errorf("DomainLabel(%q) = %q, want %q", tc.domain, got, tc.want)
		}
		if err := (Secure{Label: got}).Validate(); err != nil {
			t.Errorf("DomainLabel(%.10q…): %v", tc.domain, err)
		}
		if other, ok := seen[got]; ok {
			t.Errorf("domains %.10q and %.10q share label %q", tc.domain, other, got)
		}
		seen[got] = tc.domain
	}
	if DomainLabel(cluster, long) == DomainLabel(cluster, long[1:]) || DomainLabel(cluster, long) == DomainLabel("gpucoord:/other/", long) {
		t.Error("hashed labels collide")
	}

	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	a, err := New("a", "127.0.0.1:0", "", DefaultTuning(), Secure{Keys: [][]byte{key}, Label: DomainLabel(cluster, "rack1")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := New("b", "127.0.0.1:0", "", DefaultTuning(), Secure{Keys: [][]byte{key}, Label: DomainLabel(cluster, "rack2")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if n, err := b.Join([]string{a.LocalNode().Address()}); err == nil || n != 0 {
		t.Errorf("a member of rack2 joined rack1's pool: %d, %v", n, err)
	}
	if a.NumMembers() != 1 || b.NumMembers() != 1 {
		t.Errorf("members %d and %d, want each alone", a.NumMembers(), b.NumMembers())
	}
}
