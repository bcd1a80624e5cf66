package memstore

import (
	"context"
	"fmt"
	"slices"

	"github.com/roamactors/roam/location"
)

var _ location.Board = (*Store)(nil)

type noteEntry struct {
	value   []byte
	version location.StoreVersion
}

func (s *Store) noteLocked(key location.NoteKey) location.Note {
	e := s.notes[key]
	if e == nil {
		return location.Note{Key: key}
	}
	return location.Note{Key: key, Value: slices.Clone(e.value), Version: e.version}
}

// ReadNote implements location.Board.
func (s *Store) ReadNote(ctx context.Context, key location.NoteKey) (location.Note, error) {
	if err := key.Validate(); err != nil {
		return location.Note{}, err
	}
	if err := s.lock(ctx); err != nil {
		return location.Note{}, err
	}
	defer s.mu.Unlock()
	n := s.noteLocked(key)
	if n.Version == 0 {
		return location.Note{}, fmt.Errorf("%w: %s", location.ErrNotFound, key)
	}
	return n, nil
}

// WriteNote implements location.Board. A note's version comes from the
// store's one counter, so a write wakes watchers as a record write does.
func (s *Store) WriteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion, value []byte) (location.StoreVersion, error) {
	if err := location.ValidateNote(key, value); err != nil {
		return 0, err
	}
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if cur := s.noteLocked(key).Version; cur != expected {
		return 0, &location.ConflictError{Op: "write " + key.String(), FailedOps: []int{0}}
	}
	v := s.bumpLocked()
	s.notes[key] = &noteEntry{value: slices.Clone(value), version: v}
	return v, nil
}

// DeleteNote implements location.Board.
func (s *Store) DeleteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e := s.notes[key]
	if e == nil {
		return nil
	}
	if expected != 0 && e.version != expected {
		return &location.ConflictError{Op: "delete " + key.String(), FailedOps: []int{0}}
	}
	delete(s.notes, key)
	s.bumpLocked()
	return nil
}

// WatchNote implements location.Board.
func (s *Store) WatchNote(ctx context.Context, key location.NoteKey, after location.StoreVersion) (location.Note, error) {
	if err := key.Validate(); err != nil {
		return location.Note{}, err
	}
	for {
		if err := s.lock(ctx); err != nil {
			return location.Note{}, err
		}
		n := s.noteLocked(key)
		changed := s.changed
		s.mu.Unlock()
		if n.Version != after {
			return n, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return location.Note{}, fmt.Errorf("%w: watch %s: %w", location.ErrUnavailable, key, ctx.Err())
		}
	}
}

// ListNotes implements location.Board.
func (s *Store) ListNotes(ctx context.Context, mesh string) ([]location.Note, error) {
	if mesh != "" {
		if err := location.ValidateID("mesh", mesh); err != nil {
			return nil, err
		}
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []location.Note
	for k := range s.notes {
		if mesh == "" || k.Mesh == mesh {
			out = append(out, s.noteLocked(k))
		}
	}
	location.SortNotes(out)
	return out, nil
}
