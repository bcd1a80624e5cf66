package spot_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
	"github.com/roamactors/roam/spot"
)

// A User Spot with members whose owner stopped is not unusable for good:
// GetOrCreate and Close answer Unavailable naming the cause (an ended
// owner's record with members is not released automatically,
// docs/PROTOCOL.md §7.10) until
// an operator accepts the loss with ReleaseEnded, which releases the
// Spot's record and its ended members' records; a member on a live node
// makes ReleaseEnded Unavailable, releasing nothing. Then the Spot is
// created anew and the members' IDs can be spawned again.
func TestEndedOwnersUserSpotWithMembersIsReleasedByTheOperator(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a, b := w.start(), w.start()
		res, err := a.Spots().GetOrCreate("club", "room").Do(ctx)
		require.NoError(t, err)
		owner, other := a, b
		if res.Ref.NodeRid == b.NodeRid() {
			owner, other = b, a
		}
		for _, id := range []string{"m1", "m2"} {
			_, err = owner.Spots().SpawnMember(ctx, res.Ref, "room", id)
			require.NoError(t, err)
		}
		_, err = other.Spots().SpawnMember(ctx, res.Ref, "room", "live-member")
		require.NoError(t, err)
		require.NoError(t, owner.StopNow(ctx)) // no drain: its objects are an ended owner's

		// An owner seen gone is taken for ended a lease TTL later.
		_, err = testwait.Past(t, roamerr.ErrOwnerEnding, func() (spot.CreateResult, error) {
			return other.Spots().GetOrCreate("club", "room").Do(ctx)
		})
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		_, err = other.Spots().Close(ctx, res.Ref)
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		_, err = other.ReleaseEnded(ctx, extension.UserSpotRef("club"))
		require.ErrorIs(t, err, roamerr.ErrUnavailable, "a member on a live node must leave first")
		_, err = store.Read(ctx, location.Key(location.KindActor, "m1"))
		require.NoError(t, err, "nothing released")

		// The live member's node ends too: now every member has an ended owner.
		third := w.start()
		require.NoError(t, other.StopNow(ctx))
		released, err := testwait.Past(t, roamerr.ErrOwnerEnding, func() (bool, error) {
			return third.ReleaseEnded(ctx, extension.UserSpotRef("club"))
		})
		require.NoError(t, err)
		require.True(t, released)
		again, err := third.Spots().GetOrCreate("club", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, again.State)
		for _, id := range []string{"m1", "m2", "live-member"} {
			_, err = third.SpawnActor(ctx, "room", id)
			require.NoError(t, err, "the ID %s is free again", id)
		}
		released, err = third.ReleaseEnded(ctx, extension.UserSpotRef("club"))
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "the new incarnation's owner lives")
		require.False(t, released)
	})
}

// A stateful User Spot without members whose owner ended is never created
// anew empty by GetOrCreate (it used to be, answered Created, without a
// word): it answers Unavailable naming ReleaseEnded; once an operator
// accepts the loss, GetOrCreate creates it anew. A stateless User Spot
// kind is created anew at once, as before.
// Reference: docs/FAULTS.md, End states (an ended owner's User Spot).
func TestEndedOwnersStatefulUserSpotIsNotCreatedAnewEmpty(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a, b := w.start(), w.start()
		res, err := a.Spots().GetOrCreate("lounge", "room").Do(ctx)
		require.NoError(t, err)
		owner, other := a, b
		if res.Ref.NodeRid == b.NodeRid() {
			owner, other = b, a
		}
		rec, err := store.Read(ctx, location.Key(location.KindUserSpot, "lounge"))
		require.NoError(t, err)
		require.True(t, rec.Record.GetPreservesState(), "the owner that committed it hosts the kind and says so")
		require.NoError(t, owner.StopNow(ctx))

		_, err = testwait.Past(t, roamerr.ErrOwnerEnding, func() (spot.CreateResult, error) {
			return other.Spots().GetOrCreate("lounge", "room").Do(ctx)
		})
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		require.Contains(t, err.Error(), "ReleaseEnded")

		released, err := other.ReleaseEnded(ctx, extension.UserSpotRef("lounge"))
		require.NoError(t, err)
		require.True(t, released)
		again, err := other.Spots().GetOrCreate("lounge", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, again.State, "created anew once the loss is accepted")
	})
}
