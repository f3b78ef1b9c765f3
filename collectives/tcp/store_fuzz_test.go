package tcp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// fuzzSecret is the secret of the signed target's store; the stranger
// target's store has a secret the input cannot know.
var fuzzSecret = []byte("fuzz-secret-0123456789abcdef")

// mapStore is a store whose Get of a key not set fails at once instead of
// waiting for it: a fuzzed Get must not wait for a Set that never comes.
type mapStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *mapStore) Set(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = value
	return nil
}

func (s *mapStore) Get(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	if !ok {
		return nil, fmt.Errorf("key %q not set", key)
	}
	return v, nil
}

// serveBytes serves one connection of a bounded store with secret, sends
// it in, and returns the store once the server is done with the input.
func serveBytes(t *testing.T, in, secret []byte) *boundedStore {
	st := &boundedStore{Store: &mapStore{m: map[string][]byte{}}, sums: map[string][sha256.Size]byte{}}
	client, srv := net.Pipe()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveStoreConn(ctx, srv, st, secret)
		srv.Close()
	}()
	go io.Copy(io.Discard, client) // replies
	client.Write(in)               // fails once the server hangs up: that is an answer too
	cancel()
	client.Close()
	<-done
	return st
}

func storeSeeds(f *testing.F, secret []byte) {
	sign := func(op byte, key string, val []byte) []byte {
		b := encodeRequest(op, key, val)
		return append(b, requestMAC(secret, b)...)
	}
	f.Add(sign(opSet, "rank/0", []byte("10.0.0.1:29500")))
	f.Add(append(sign(opSet, "k", []byte("v")), sign(opGet, "k", nil)...))
	f.Add(append(sign(opSet, "k", []byte("v")), sign(opSet, "k", []byte("w"))...))
	f.Add(sign('X', "k", nil))
	f.Add(encodeRequest(opSet, "k", []byte("v")))
	f.Add([]byte{opSet, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{opSet, 1, 0, 0, 0, 'k', 0, 0, 1, 0})
	f.Add([]byte{})
}

// FuzzStoreStranger sends what a stranger could: any bytes, without the
// secret. The store must hold nothing afterwards, whatever came in.
func FuzzStoreStranger(f *testing.F) {
	storeSeeds(f, fuzzSecret)
	secret, err := NewSecret()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		st := serveBytes(t, in, secret)
		if len(st.sums) != 0 || st.bytes != 0 {
			t.Fatalf("a request without the secret stored %d keys (%d bytes)", len(st.sums), st.bytes)
		}
	})
}

// FuzzStoreSigned parses the input into requests the way the server does
// and signs each one, so that what follows authentication (the bounds,
// write-once keys, unknown operations) is explored: the store must stay
// within its bounds and hold, for every key, the first value set.
func FuzzStoreSigned(f *testing.F) {
	storeSeeds(f, fuzzSecret)
	f.Fuzz(func(t *testing.T, in []byte) {
		var signed bytes.Buffer
		first := map[string][sha256.Size]byte{}
		r := bufio.NewReader(bytes.NewReader(in))
		for {
			op, key, val, err := readRequest(r)
			if err != nil {
				break
			}
			b := encodeRequest(op, key, val)
			signed.Write(b)
			signed.Write(requestMAC(fuzzSecret, b))
			if _, ok := first[key]; !ok && op == opSet {
				first[key] = sha256.Sum256(val)
			}
		}
		st := serveBytes(t, signed.Bytes(), fuzzSecret)
		if len(st.sums) > maxKeys || st.bytes > maxBytes {
			t.Fatalf("store holds %d keys and %d bytes: over its bounds", len(st.sums), st.bytes)
		}
		for key, sum := range st.sums {
			if sum != first[key] {
				t.Fatalf("key %q holds a value other than the first one set", key)
			}
		}
	})
}
