package gossip

import (
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
	a, err := New("a", "127.0.0.1:0", "", DefaultTuning(), dead, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := New("b", "127.0.0.1:0", "", DefaultTuning(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	c, err := New("c", "127.0.0.1:0", "", DefaultTuning(), nil, nil)
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
