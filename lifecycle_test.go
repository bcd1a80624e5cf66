package roam_test

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// memberCount is the member count on a User Spot's record.
func memberCount(t *testing.T, store location.Store, spotID string) uint32 {
	t.Helper()
	v, err := store.Read(context.Background(), location.Key(location.KindUserSpot, spotID))
	require.NoError(t, err)
	return v.Record.GetMemberCount()
}

// The Actor lifecycle from any node: members join a User Spot (its record
// counts them), leave it, are deleted; Close keeps a Spot with members and
// closes it once none is left; a deleted Actor's ID is free again.
// Reference: docs/PROTOCOL.md §7.9 (Close and membership), §7.10.
func TestActorLifecycleKeepsTheMemberCount(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		a := start(t, store, roam.WithNodeName("node-a"))
		b := start(t, store, roam.WithNodeName("node-b"))
		club, err := a.Spots().GetOrCreate("club", "counter").Do(ctx)
		require.NoError(t, err)
		_, err = a.Spots().SpawnMember(ctx, club.Ref, "counter", "m1")
		require.NoError(t, err)
		_, err = b.Spots().SpawnMember(ctx, club.Ref, "counter", "m2")
		require.NoError(t, err)
		require.EqualValues(t, 2, memberCount(t, store, "club"))
		closed, err := a.Spots().Close(ctx, club.Ref)
		require.NoError(t, err)
		require.False(t, closed, "members keep the Spot")

		// m1 (on a) leaves, asked from b; then it is an Entry Spot member.
		require.NoError(t, b.LeaveSpot(ctx, roam.ActorRef("m1")))
		require.EqualValues(t, 1, memberCount(t, store, "club"))
		require.ErrorIs(t, a.LeaveSpot(ctx, roam.ActorRef("m1")), roamerr.ErrInvalidOperation, "no longer a User Spot's member")
		n, err := tick(ctx, a, roam.ActorRef("m1"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "it serves on")

		// m2 (on b) is deleted, asked from a.
		n, err = tick(ctx, a, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		deleted, err := a.DeleteActor(ctx, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.True(t, deleted)
		_, err = store.Read(ctx, roam.ActorRef("m2"))
		require.ErrorIs(t, err, location.ErrNotFound)
		require.EqualValues(t, 0, memberCount(t, store, "club"))
		_, err = tick(ctx, a, roam.ActorRef("m2"))
		require.Error(t, err, "a deleted Actor answers nothing")
		deleted, err = b.DeleteActor(ctx, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.False(t, deleted, "already gone")

		closed, err = b.Spots().Close(ctx, club.Ref)
		require.NoError(t, err)
		require.True(t, closed, "no member left")

		// The ID is free again: a new, empty Actor.
		_, err = b.SpawnActor(ctx, "counter", "m2")
		require.NoError(t, err)
		n, err = tick(ctx, a, roam.ActorRef("m2"))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})
}

// A member whose owner ended is released by the operator together with
// its place in its User Spot's count, so the Spot can close.
func TestReleasedMemberLeavesTheCount(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	// Only b hosts the Spot's kind, so the Spot is b's and its member a's.
	house := roam.NewKind("clubhouse", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
	a := start(t, store, roam.WithNodeName("node-a"), roam.WithDrainOnStop(false))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(house)) // with counter, start's kind
	club, err := a.Spots().GetOrCreate("club", "clubhouse").Do(ctx)
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), club.Ref.NodeRid)
	_, err = a.Spots().SpawnMember(ctx, club.Ref, "counter", "x")
	require.NoError(t, err)
	require.EqualValues(t, 1, memberCount(t, store, "club"))
	require.NoError(t, a.Stop(ctx))
	released, err := testwait.Past(t, roamerr.ErrOwnerEnding, func() (bool, error) {
		return b.ReleaseEnded(ctx, roam.ActorRef("x"))
	})
	require.NoError(t, err)
	require.True(t, released)
	require.EqualValues(t, 0, memberCount(t, store, "club"))
	closed, err := b.Spots().Close(ctx, club.Ref)
	require.NoError(t, err)
	require.True(t, closed)
}
