package tcp

import (
	"bufio"
	"context"
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
// length (uint32 LE), key, value length (uint32 LE), value (empty for get).
// A reply is status (0 ok, 1 error), length, then the value or the error
// text. A get waits on the server until the key is set.
const (
	opSet      = 'S'
	opGet      = 'G'
	maxKey     = 4 << 10
	maxValue   = 16 << 20
	statusOK   = 0
	statusFail = 1
)

// ServeStore serves st to clients accepted on ln until ctx ends, then
// closes ln and every client connection and returns once they are done.
// st is usually a collectives.MemStore; a client's Get waits on the server,
// in st.Get, until the key is set. st.Get must return when ctx ends.
func ServeStore(ctx context.Context, ln net.Listener, st collectives.Store) error {
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
			serveStoreConn(ctx, c, st)
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

func serveStoreConn(ctx context.Context, c net.Conn, st collectives.Store) {
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		op, key, val, err := readRequest(br)
		if err != nil {
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

// writeReply writes a status byte and a length-prefixed blob.
func writeReply(w io.Writer, status byte, blob []byte) error {
	b := binary.LittleEndian.AppendUint32([]byte{status}, uint32(len(blob)))
	_, err := w.Write(append(b, blob...))
	return err
}

// StoreClient is a collectives.Store served by ServeStore. It is safe for
// concurrent use; requests are serialized on one connection.
type StoreClient struct {
	mu sync.Mutex
	c  net.Conn
	br *bufio.Reader
}

var _ collectives.Store = (*StoreClient)(nil)

// DialStore connects to a store at addr, retrying until ctx ends while the
// server is not up yet.
func DialStore(ctx context.Context, addr string) (*StoreClient, error) {
	c, err := dial(ctx, addr, nil)
	if err != nil {
		return nil, fmt.Errorf("tcp: store at %s: %w", addr, err)
	}
	return &StoreClient{c: c, br: bufio.NewReader(c)}, nil
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
	b := []byte{op}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(val)))
	b = append(b, val...)
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
