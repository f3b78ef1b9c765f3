package collectives

import (
	"context"
	"fmt"
	"sync"
)

// Store is the rendezvous a world bootstraps through: ranks publish what
// peers need (a TCP listen address, an NCCL unique id) and wait for each
// other's. collectives/tcp serves one over TCP for local process groups
// (tcp.ServeStore, tcp.DialStore); the coordinator can back one with etcd
// (docs/COLLECTIVES.md: jobs/<id>/bootstrap/<gen>/<group>). Keys are plain strings;
// give each world its own prefix.
//
// Implementations are safe for concurrent use.
type Store interface {
	// Set stores value under key, replacing any previous value.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns the value under key, waiting until some rank sets it or
	// ctx ends.
	Get(ctx context.Context, key string) ([]byte, error)
}

// MemStore is an in-process Store.
type MemStore struct {
	mu      sync.Mutex
	m       map[string][]byte
	changed chan struct{} // closed and replaced on every Set
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	return &MemStore{m: map[string][]byte{}, changed: make(chan struct{})}
}

// Set implements Store. It copies value.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = append([]byte(nil), value...)
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// Get implements Store. The caller owns the returned slice.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		s.mu.Lock()
		v, ok := s.m[key]
		ch := s.changed
		s.mu.Unlock()
		if ok {
			return append([]byte(nil), v...), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("collectives: store: waiting for %q: %w", key, ctx.Err())
		}
	}
}
