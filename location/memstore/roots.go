package memstore

import (
	"bytes"
	"context"
	"fmt"

	"github.com/roamactors/roam/location"
)

var _ location.RootStore = (*Store)(nil)

// PutRoot implements location.RootStore (docs/PROTOCOL.md §3.5). The bytes are
// copied in, so the caller may reuse data.
func (s *Store) PutRoot(ctx context.Context, key string, data []byte) (location.RootRef, error) {
	if err := location.ValidateRoot(key, data); err != nil {
		return location.RootRef{}, err
	}
	if err := s.lock(ctx); err != nil {
		return location.RootRef{}, err
	}
	defer s.mu.Unlock()
	if cur, ok := s.roots[key]; ok {
		if !bytes.Equal(cur, data) {
			return location.RootRef{}, &location.ConflictError{Op: fmt.Sprintf("put root %q (other bytes stored)", key)}
		}
		return location.NewRootRef(key, cur), nil
	}
	stored := make([]byte, len(data))
	copy(stored, data)
	s.roots[key] = stored
	return location.NewRootRef(key, data), nil
}

// GetRoot implements location.RootStore (PROTOCOL.md §3.5). The bytes returned
// are the caller's own copy.
func (s *Store) GetRoot(ctx context.Context, key string) ([]byte, location.RootRef, error) {
	if err := location.ValidateID("root key", key); err != nil {
		return nil, location.RootRef{}, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, location.RootRef{}, err
	}
	defer s.mu.Unlock()
	cur, ok := s.roots[key]
	if !ok {
		return nil, location.RootRef{}, fmt.Errorf("%w: root %q", location.ErrNotFound, key)
	}
	out := make([]byte, len(cur))
	copy(out, cur)
	return out, location.NewRootRef(key, cur), nil
}

// DeleteRoot implements location.RootStore (PROTOCOL.md §3.5).
func (s *Store) DeleteRoot(ctx context.Context, key string) error {
	if err := location.ValidateID("root key", key); err != nil {
		return err
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	delete(s.roots, key)
	return nil
}
