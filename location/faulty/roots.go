package faulty

import (
	"context"
	"fmt"

	"github.com/roamactors/roam/location"
)

var _ location.RootStore = (*Store)(nil)

// roots returns the wrapped store's RootStore, or ErrInvalid when the
// wrapped store keeps no roots (no fault is drawn then).
func (s *Store) roots(what string) (location.RootStore, error) {
	r, ok := s.inner.(location.RootStore)
	if !ok {
		return nil, fmt.Errorf("%w: %s: the wrapped %T is not a location.RootStore", location.ErrInvalid, what, s.inner)
	}
	return r, nil
}

// PutRoot implements location.RootStore: a write, drawn like the others.
func (s *Store) PutRoot(ctx context.Context, key string, data []byte) (location.RootRef, error) {
	r, err := s.roots("put root")
	if err != nil {
		return location.RootRef{}, err
	}
	return write(s, ctx, "put root", func() (location.RootRef, error) { return r.PutRoot(ctx, key, data) })
}

// GetRoot implements location.RootStore: a read, drawn like the others.
func (s *Store) GetRoot(ctx context.Context, key string) ([]byte, location.RootRef, error) {
	r, err := s.roots("get root")
	if err != nil {
		return nil, location.RootRef{}, err
	}
	type got struct {
		data []byte
		ref  location.RootRef
	}
	g, err := read(s, ctx, "get root", func() (got, error) {
		data, ref, err := r.GetRoot(ctx, key)
		return got{data, ref}, err
	})
	return g.data, g.ref, err
}

// DeleteRoot implements location.RootStore: a write, drawn like the others.
func (s *Store) DeleteRoot(ctx context.Context, key string) error {
	r, err := s.roots("delete root")
	if err != nil {
		return err
	}
	_, err = write(s, ctx, "delete root", func() (struct{}, error) { return struct{}{}, r.DeleteRoot(ctx, key) })
	return err
}
