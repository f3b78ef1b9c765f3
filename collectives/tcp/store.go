package tcp

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gpucoord/gpucoord/collectives"
)

// The store protocol: a request is op (1 byte: 'S' set, 'G' get), key
// length (uint32 LE), key, value length (uint32 LE), value (empty for get),
// then HMAC-SHA256 of all of that under the store's secret (32 bytes). A
// reply is status (0 ok, 1 error), length, then the value or the error
// text. A get waits on the server until the key is set. A request whose
// MAC is wrong is answered with an error and ends its connection.
const (
	opSet      = 'S'
	opGet      = 'G'
	statusOK   = 0
	statusFail = 1
)

// The store's bounds. Everything a rendezvous publishes is small (an
// address, a 128-byte NCCL id, a process id), so a request beyond them is
// refused before its bytes are read into memory, and the server's memory
// stays bounded whatever a client sends.
const (
	// maxKey and maxValue bound one key and one value.
	maxKey   = 1 << 10
	maxValue = 64 << 10
	// maxKeys bounds the keys a served store holds: a few per rank of a
	// world of 16,384 ranks (2,048 nodes of 8) with room to spare.
	maxKeys = 1 << 18
	// maxBytes bounds the keys and values a served store holds in all.
	maxBytes = 64 << 20
	// MinSecret is the shortest secret a store takes.
	MinSecret = 16
)

// NewSecret returns a random store secret.
func NewSecret() ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("tcp: store secret: %w", err)
	}
	return b, nil
}

func checkSecret(secret []byte) error {
	if len(secret) < MinSecret {
		return fmt.Errorf("%w: a store secret of %d bytes: want at least %d", collectives.ErrInvalid, len(secret), MinSecret)
	}
	return nil
}

// requestMAC authenticates the request bytes b under secret.
func requestMAC(secret, b []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(b)
	return m.Sum(nil)
}

// ServeStore serves st, to clients that know secret, on ln until ctx ends, then
// closes ln and every client connection and returns once they are done.
// st is usually a collectives.MemStore; a client's Get waits on the server,
// in st.Get, until the key is set. st.Get must return when ctx ends.
//
// A key is written once: setting it again to the same value succeeds (a
// retry), to another value is refused, so an address a rank published
// cannot be replaced. A key or value over its bound, a key past maxKeys and
// bytes past maxBytes are refused with a clear error (a request whose
// length fields exceed the bounds ends its connection unread).
func ServeStore(ctx context.Context, ln net.Listener, st collectives.Store, secret []byte) error {
	if err := checkSecret(secret); err != nil {
		ln.Close()
		return err
	}
	st = &boundedStore{Store: st, sums: map[string][sha256.Size]byte{}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	var err error
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			break
		}
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			c.Close()
			break
		}
		conns[c] = true
		mu.Unlock()
		wg.Go(func() {
			serveStoreConn(ctx, c, st, secret)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("tcp: store: %w", err)
}

func serveStoreConn(ctx context.Context, c net.Conn, st collectives.Store, secret []byte) {
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		op, key, val, err := readRequest(br)
		if err != nil {
			return
		}
		var mac [sha256.Size]byte
		if _, err := io.ReadFull(br, mac[:]); err != nil {
			return
		}
		if !hmac.Equal(mac[:], requestMAC(secret, encodeRequest(op, key, val))) {
			writeReply(bw, statusFail, []byte("unauthenticated: the request's MAC does not match this store's secret"))
			bw.Flush()
			return
		}
		var reply []byte
		status := byte(statusOK)
		switch op {
		case opSet:
			err = st.Set(ctx, key, val)
		case opGet:
			reply, err = st.Get(ctx, key)
		default:
			err = fmt.Errorf("unknown store op %q", op)
		}
		if err != nil {
			status, reply = statusFail, []byte(err.Error())
		}
		if writeReply(bw, status, reply) != nil || bw.Flush() != nil {
			return
		}
	}
}

// boundedStore holds a served store to its bounds and makes its keys
// write-once. It keeps each key's digest, not its value.
type boundedStore struct {
	collectives.Store
	mu    sync.Mutex
	sums  map[string][sha256.Size]byte
	bytes int
}

func (b *boundedStore) Set(ctx context.Context, key string, value []byte) error {
	sum := sha256.Sum256(value)
	b.mu.Lock()
	old, seen := b.sums[key]
	switch {
	case seen && old == sum:
		b.mu.Unlock()
		return nil
	case seen:
		b.mu.Unlock()
		return fmt.Errorf("%w: store key %q is already set to another value (keys are written once)", collectives.ErrInvalid, key)
	case len(b.sums) >= maxKeys:
		b.mu.Unlock()
		return fmt.Errorf("%w: store full: %d keys", collectives.ErrInvalid, maxKeys)
	case b.bytes+len(key)+len(value) > maxBytes:
		b.mu.Unlock()
		return fmt.Errorf("%w: store full: %d of %d bytes held, %d more refused", collectives.ErrInvalid, b.bytes, maxBytes, len(key)+len(value))
	}
	b.sums[key] = sum
	b.bytes += len(key) + len(value)
	b.mu.Unlock()
	return b.Store.Set(ctx, key, value)
}

func readRequest(r *bufio.Reader) (op byte, key string, val []byte, err error) {
	if op, err = r.ReadByte(); err != nil {
		return
	}
	k, err := readBlob(r, maxKey)
	if err != nil {
		return
	}
	val, err = readBlob(r, maxValue)
	return op, string(k), val, err
}

func readBlob(r io.Reader, limit int) ([]byte, error) {
	var lb [4]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(lb[:])
	if int64(n) > int64(limit) {
		return nil, fmt.Errorf("%w: store field of %d bytes exceeds %d", collectives.ErrInvalid, n, limit)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

// encodeRequest is a request's bytes before its MAC.
func encodeRequest(op byte, key string, val []byte) []byte {
	b := make([]byte, 0, 9+len(key)+len(val)+sha256.Size)
	b = append(b, op)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(val)))
	return append(b, val...)
}

// writeReply writes a status byte and a length-prefixed blob.
func writeReply(w io.Writer, status byte, blob []byte) error {
	b := binary.LittleEndian.AppendUint32([]byte{status}, uint32(len(blob)))
	_, err := w.Write(append(b, blob...))
	return err
}

// StoreClient is a collectives.Store served by ServeStore. It is safe for
// concurrent use; requests are serialized on one connection.
type StoreClient struct {
	mu     sync.Mutex
	c      net.Conn
	br     *bufio.Reader
	secret []byte
}

var _ collectives.Store = (*StoreClient)(nil)

// DialStore connects to a store at addr served with secret, retrying until
// ctx ends while the server is not up yet.
func DialStore(ctx context.Context, addr string, secret []byte) (*StoreClient, error) {
	if err := checkSecret(secret); err != nil {
		return nil, err
	}
	c, err := dial(ctx, addr, nil)
	if err != nil {
		return nil, fmt.Errorf("tcp: store at %s: %w", addr, err)
	}
	return &StoreClient{c: c, br: bufio.NewReader(c), secret: secret}, nil
}

// Set implements collectives.Store.
func (s *StoreClient) Set(ctx context.Context, key string, value []byte) error {
	_, err := s.do(ctx, opSet, key, value)
	return err
}

// Get implements collectives.Store.
func (s *StoreClient) Get(ctx context.Context, key string) ([]byte, error) {
	return s.do(ctx, opGet, key, nil)
}

func (s *StoreClient) do(ctx context.Context, op byte, key string, val []byte) ([]byte, error) {
	if len(key) > maxKey || len(val) > maxValue {
		return nil, fmt.Errorf("%w: store key of %d bytes or value of %d bytes too large", collectives.ErrInvalid, len(key), len(val))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { s.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	b := encodeRequest(op, key, val)
	b = append(b, requestMAC(s.secret, b)...)
	_, err := s.c.Write(b)
	var status byte
	if err == nil {
		status, err = s.br.ReadByte()
	}
	var reply []byte
	if err == nil {
		reply, err = readBlob(s.br, maxValue)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		s.c.Close() // the stream is out of step now
		return nil, fmt.Errorf("tcp: store %c %q: %w", op, key, err)
	}
	if status != statusOK {
		return nil, fmt.Errorf("tcp: store %c %q: %w", op, key, errors.New(string(reply)))
	}
	return reply, nil
}

// Close closes the connection.
func (s *StoreClient) Close() error { return s.c.Close() }
