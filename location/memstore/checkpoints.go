package memstore

import (
	"context"
	"fmt"

	"github.com/roamactors/roam/location"
)

var _ location.CheckpointStore = (*Store)(nil)

// checkpointEntry is one stored checkpoint; its version comes from the
// store's one index, so it differs from every earlier one.
type checkpointEntry struct {
	data    []byte
	version location.StoreVersion
}

// GetCheckpoint implements location.CheckpointStore. The bytes returned are
// the caller's own copy.
func (s *Store) GetCheckpoint(ctx context.Context, key location.AuthorityKey) ([]byte, location.StoreVersion, error) {
	if err := key.Validate(); err != nil {
		return nil, 0, err
	}
	unlock, err := s.rlock(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer unlock()
	e, ok := s.checkpoints[key]
	if !ok {
		return nil, 0, fmt.Errorf("%w: checkpoint of %s", location.ErrNotFound, key)
	}
	return append([]byte{}, e.data...), e.version, nil
}

// PutCheckpoint implements location.CheckpointStore.
func (s *Store) PutCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, data []byte) (location.StoreVersion, error) {
	if err := location.ValidateCheckpoint(key, data); err != nil {
		return 0, err
	}
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var cur location.StoreVersion
	if e, ok := s.checkpoints[key]; ok {
		cur = e.version
	}
	if cur != expected {
		return 0, &location.ConflictError{Op: fmt.Sprintf("put checkpoint of %s at version %d (now %d)", key, expected, cur)}
	}
	s.index++
	s.checkpoints[key] = &checkpointEntry{data: append([]byte{}, data...), version: s.index}
	return s.index, nil
}

// DeleteCheckpoint implements location.CheckpointStore.
func (s *Store) DeleteCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e, ok := s.checkpoints[key]
	switch {
	case !ok:
		return nil
	case expected != 0 && e.version != expected:
		return &location.ConflictError{Op: fmt.Sprintf("delete checkpoint of %s at version %d (now %d)", key, expected, e.version)}
	}
	delete(s.checkpoints, key)
	return nil
}
