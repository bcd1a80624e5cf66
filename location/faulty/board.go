package faulty

import (
	"context"
	"fmt"

	"github.com/roamactors/roam/location"
)

var _ location.Board = (*Store)(nil)

// board returns the wrapped store's Board, or ErrInvalid when the wrapped
// store keeps no notes (no fault is drawn then).
func (s *Store) board(what string) (location.Board, error) {
	b, ok := s.inner.(location.Board)
	if !ok {
		return nil, fmt.Errorf("%w: %s: the wrapped %T is not a location.Board", location.ErrInvalid, what, s.inner)
	}
	return b, nil
}

// ReadNote implements location.Board: a read, drawn like the others.
func (s *Store) ReadNote(ctx context.Context, key location.NoteKey) (location.Note, error) {
	b, err := s.board("read note")
	if err != nil {
		return location.Note{}, err
	}
	return read(s, ctx, "read note", func() (location.Note, error) { return b.ReadNote(ctx, key) })
}

// WriteNote implements location.Board: a write, drawn like the others.
func (s *Store) WriteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion, value []byte) (location.StoreVersion, error) {
	b, err := s.board("write note")
	if err != nil {
		return 0, err
	}
	return write(s, ctx, "write note", func() (location.StoreVersion, error) { return b.WriteNote(ctx, key, expected, value) })
}

// DeleteNote implements location.Board: a write, drawn like the others.
func (s *Store) DeleteNote(ctx context.Context, key location.NoteKey, expected location.StoreVersion) error {
	b, err := s.board("delete note")
	if err != nil {
		return err
	}
	_, err = write(s, ctx, "delete note", func() (struct{}, error) { return struct{}{}, b.DeleteNote(ctx, key, expected) })
	return err
}

// WatchNote implements location.Board: a read, drawn like the others.
func (s *Store) WatchNote(ctx context.Context, key location.NoteKey, after location.StoreVersion) (location.Note, error) {
	b, err := s.board("watch note")
	if err != nil {
		return location.Note{}, err
	}
	return read(s, ctx, "watch note", func() (location.Note, error) { return b.WatchNote(ctx, key, after) })
}

// ListNotes implements location.Board: a read, drawn like the others.
func (s *Store) ListNotes(ctx context.Context, mesh string) ([]location.Note, error) {
	b, err := s.board("list notes")
	if err != nil {
		return nil, err
	}
	return read(s, ctx, "list notes", func() ([]location.Note, error) { return b.ListNotes(ctx, mesh) })
}
