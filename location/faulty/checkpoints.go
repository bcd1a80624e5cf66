package faulty

import (
	"context"
	"fmt"

	"github.com/roamactors/roam/location"
)

var _ location.CheckpointStore = (*Store)(nil)

func (s *Store) checkpoints(what string) (location.CheckpointStore, error) {
	c, ok := s.inner.(location.CheckpointStore)
	if !ok {
		return nil, fmt.Errorf("%w: %s: the wrapped %T is not a location.CheckpointStore", location.ErrInvalid, what, s.inner)
	}
	return c, nil
}

// GetCheckpoint implements location.CheckpointStore: a read, drawn like
// the others.
func (s *Store) GetCheckpoint(ctx context.Context, key location.AuthorityKey) ([]byte, location.StoreVersion, error) {
	c, err := s.checkpoints("get checkpoint")
	if err != nil {
		return nil, 0, err
	}
	type got struct {
		data []byte
		v    location.StoreVersion
	}
	g, err := read(s, ctx, "get checkpoint", func() (got, error) {
		data, v, err := c.GetCheckpoint(ctx, key)
		return got{data, v}, err
	})
	return g.data, g.v, err
}

// PutCheckpoint implements location.CheckpointStore: a write, drawn like
// the others.
func (s *Store) PutCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, data []byte) (location.StoreVersion, error) {
	c, err := s.checkpoints("put checkpoint")
	if err != nil {
		return 0, err
	}
	return write(s, ctx, "put checkpoint", func() (location.StoreVersion, error) { return c.PutCheckpoint(ctx, key, expected, data) })
}

// DeleteCheckpoint implements location.CheckpointStore: a write, drawn
// like the others.
func (s *Store) DeleteCheckpoint(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion) error {
	c, err := s.checkpoints("delete checkpoint")
	if err != nil {
		return err
	}
	_, err = write(s, ctx, "delete checkpoint", func() (struct{}, error) { return struct{}{}, c.DeleteCheckpoint(ctx, key, expected) })
	return err
}
