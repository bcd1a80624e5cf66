package faulty_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// Board calls draw faults like the others: WriteNote and DeleteNote are
// writes, ReadNote, WatchNote and ListNotes reads, each under its own
// operation name. Reference: docs/PROTOCOL.md §3.3.
func TestInjectedFaultsOnBoard(t *testing.T) {
	inner := memstore.New()
	s, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	key := location.NoteKey{Mesh: "m", NodeRid: "r", Name: "requests"}

	s.InjectOn("write note", faulty.Unavailable, faulty.IndeterminateLost, faulty.IndeterminateApplied)
	_, err = s.WriteNote(ctx, key, 0, []byte(`{}`))
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, err = s.WriteNote(ctx, key, 0, []byte(`{}`))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	_, err = inner.ReadNote(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound, "neither the unavailable nor the lost write is applied")
	_, err = s.WriteNote(ctx, key, 0, []byte(`{}`))
	require.ErrorIs(t, err, location.ErrIndeterminate)
	got, err := inner.ReadNote(ctx, key)
	require.NoError(t, err, "the indeterminate-applied write is applied")

	for _, op := range []string{"read note", "watch note", "list notes"} {
		s.InjectOn(op, faulty.IndeterminateApplied)
	}
	_, err = s.ReadNote(ctx, key)
	require.ErrorIs(t, err, location.ErrUnavailable, "a read cannot be indeterminate")
	_, err = s.WatchNote(ctx, key, got.Version)
	require.ErrorIs(t, err, location.ErrUnavailable)
	_, err = s.ListNotes(ctx, "")
	require.ErrorIs(t, err, location.ErrUnavailable)
	notes, err := s.ListNotes(ctx, "")
	require.NoError(t, err)
	require.Len(t, notes, 1)

	s.InjectOn("delete note", faulty.IndeterminateLost)
	require.ErrorIs(t, s.DeleteNote(ctx, key, got.Version), location.ErrIndeterminate)
	_, err = inner.ReadNote(ctx, key)
	require.NoError(t, err)
	require.NoError(t, s.DeleteNote(ctx, key, got.Version))
	_, err = inner.ReadNote(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound)
	require.Equal(t, faulty.Stats{Calls: 9, Unavailable: 4, IndeterminateApplied: 1, IndeterminateLost: 2,
		ByOp: map[string]int{"delete note": 2, "list notes": 2, "read note": 1, "watch note": 1, "write note": 3}}, s.Stats())
}

// UpdateNode is a write: an indeterminate outcome is applied or not as
// drawn. Reference: docs/PROTOCOL.md §3.3.
func TestInjectedFaultsOnUpdateNode(t *testing.T) {
	inner := memstore.New()
	s, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	n := &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 1, EntrySpotId: "roam-entry-r"}
	_, err = inner.ClaimNode(ctx, n, 10*time.Second)
	require.NoError(t, err)
	cur, err := inner.ReadNode(ctx, location.NodeKeyOf(n))
	require.NoError(t, err)
	next := proto.Clone(cur.Node).(*location.NodeDescriptor)
	next.Status = messages.NodeStatus_NODE_STATUS_DRAINING

	s.InjectOn("update node", faulty.IndeterminateLost, faulty.IndeterminateApplied)
	_, err = s.UpdateNode(ctx, next, cur.Version)
	require.ErrorIs(t, err, location.ErrIndeterminate)
	got, err := inner.ReadNode(ctx, location.NodeKeyOf(n))
	require.NoError(t, err)
	require.Equal(t, cur.Version, got.Version, "the lost update is not applied")
	_, err = s.UpdateNode(ctx, next, cur.Version)
	require.ErrorIs(t, err, location.ErrIndeterminate)
	got, err = inner.ReadNode(ctx, location.NodeKeyOf(n))
	require.NoError(t, err)
	require.Greater(t, got.Version, cur.Version, "the applied update is applied")
	require.Equal(t, messages.NodeStatus_NODE_STATUS_DRAINING, got.Node.GetStatus())
}

// Wrapping a store that keeps no notes: the board calls are ErrInvalid
// and draw no fault.
func TestBoardOfStoreWithoutBoard(t *testing.T) {
	s, err := faulty.New(plain{memstore.New()}, faulty.Config{Unavailable: 1})
	require.NoError(t, err)
	ctx := context.Background()
	key := location.NoteKey{Mesh: "m", NodeRid: "r", Name: "requests"}
	_, err = s.ReadNote(ctx, key)
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = s.WriteNote(ctx, key, 0, nil)
	require.ErrorIs(t, err, location.ErrInvalid)
	require.ErrorIs(t, s.DeleteNote(ctx, key, 0), location.ErrInvalid)
	_, err = s.WatchNote(ctx, key, 0)
	require.ErrorIs(t, err, location.ErrInvalid)
	_, err = s.ListNotes(ctx, "")
	require.ErrorIs(t, err, location.ErrInvalid)
	require.Zero(t, s.Stats().Calls)
}
