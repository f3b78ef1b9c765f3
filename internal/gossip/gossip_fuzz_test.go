package gossip

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// lineSignal is a log writer that signals each line naming from.
type lineSignal struct {
	from string
	mu   sync.Mutex
	buf  []byte
	seen chan string
}

func (l *lineSignal) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.buf[:i])
		l.buf = l.buf[i+1:]
		if strings.Contains(line, "from="+l.from) {
			select { // never block memberlist: a line nobody waits for is dropped
			case l.seen <- line:
			default:
			}
		}
	}
}

// pool is two members a and b that share a key, on a mock network, and a
// stranger's transport on the same network with no member behind it.
type pool struct {
	a, b     *memberlist.Memberlist
	stranger *memberlist.MockTransport
	logs     *lineSignal
	dead     deadCh
}

// buffered is a mock transport whose packets queue: memberlist's mock
// hands a packet over an unbuffered channel from the sender's goroutine,
// so two members acking each other's probes from their packet listeners
// at once wait on each other forever, which a real UDP socket never does.
type buffered struct {
	*memberlist.MockTransport
	packets chan *memberlist.Packet
}

func bufferedTransport(t *memberlist.MockTransport) *buffered {
	b := &buffered{MockTransport: t, packets: make(chan *memberlist.Packet, 1024)}
	go func() {
		for p := range t.PacketCh() {
			b.packets <- p
		}
	}()
	return b
}

func (b *buffered) PacketCh() <-chan *memberlist.Packet { return b.packets }

func newPool(tb testing.TB) *pool {
	var mock memberlist.MockNetwork
	ta, tb2, ts := mock.NewTransport("a"), mock.NewTransport("b"), mock.NewTransport("stranger")
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i)
	}
	sec := Secure{Keys: [][]byte{key}, Label: "gpucoord:/fuzz/"}
	p := &pool{stranger: ts, dead: make(deadCh, 64)}
	ip, port, _ := ts.FinalAdvertiseAddr("", 0)
	p.logs = &lineSignal{from: (&memberlist.Node{Addr: ip, Port: uint16(port)}).Address(), seen: make(chan string, 64)}
	member := func(name string, tr *memberlist.MockTransport, events Events, logw io.Writer) *memberlist.Memberlist {
		c := memberlist.DefaultLANConfig()
		if err := configure(c, name, DefaultTuning(), sec, events, logw); err != nil {
			tb.Fatal(err)
		}
		c.Transport = bufferedTransport(tr)
		m, err := memberlist.Create(c)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { m.Shutdown() })
		return m
	}
	p.a = member("a", ta, p.dead, p.logs)
	p.b = member("b", tb2, nil, nil)
	if _, err := p.b.Join([]string{p.a.LocalNode().Address()}); err != nil {
		tb.Fatal(err)
	}
	return p
}

// FuzzPacketWithoutKey sends a member of a keyed pool what a stranger on
// the network could: any bytes as a packet, and as a stream. Each must be
// refused (a packet with a logged reason naming its sender, a stream by
// the member closing it) and change nothing: both members stay alive.
func FuzzPacketWithoutKey(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{6, 0, 0, 0, 0})         // a "dead" message type, unencrypted
	f.Add([]byte{244, 3, 'a', 'b', 'c'}) // a label header
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(append([]byte{244, 15}, "gpucoord:/fuzz/\x01 a forged payload with the right label"...))
	p := newPool(f)
	f.Fuzz(func(t *testing.T, in []byte) { strangerPacket(t, p, in) })
}

// strangerPacket sends in as a packet and as a stream, and checks both are refused.
func strangerPacket(t *testing.T, p *pool, in []byte) {
	// Hang guards, not synchronisations: a packet is refused (logged) at
	// once, and a member closes a stream within its TCP timeout (2s).
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	for len(p.logs.seen) > 0 { // lines of earlier inputs
		<-p.logs.seen
	}
	if _, err := p.stranger.WriteTo(in, p.a.LocalNode().Address()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.logs.seen:
	case <-ctx.Done():
		t.Fatalf("a packet of %d bytes without the key was not refused", len(in))
	}
	conn, err := p.stranger.DialTimeout(p.a.LocalNode().Address(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		conn.Write(in)
		conn.Write(make([]byte, 1<<10)) // whatever the member still waits for
	}()
	conn.SetDeadline(time.Now().Add(4 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatalf("a stream without the key was not closed by the member: %v", err)
	}
	conn.Close()
	select {
	case name := <-p.dead:
		t.Fatalf("%s declared dead after a stranger's packet", name)
	default:
	}
	if n := p.a.NumMembers(); n != 2 {
		t.Fatalf("%d members after a stranger's packet, want 2", n)
	}
}
