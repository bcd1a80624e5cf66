package spot_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// operatorRoom is the room kind waiting for an operator after its owner
// ended (RecoverByOperator).
func (w *world) operatorRoom() extension.Kind {
	k := w.roomKind()
	k.RecoverByOperator = true
	return k
}

// A User Spot with members of a RecoverByOperator kind whose owner stopped
// is not unusable for good:
// GetOrCreate and Close answer Unavailable naming the cause (an ended
// owner's record with members is not released automatically,
// docs/PROTOCOL.md §7.10) until
// an operator accepts the loss with ReleaseEnded, which releases the
// Spot's record and its ended members' records; a member on a live node
// makes ReleaseEnded Unavailable, releasing nothing. Then the Spot is
// created anew and the members' IDs can be spawned again.
func TestEndedOwnersUserSpotWithMembersIsReleasedByTheOperator(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		a, b := w.start(withKinds(w.operatorRoom())), w.start(withKinds(w.operatorRoom()))
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
		_, err = past(t, w, roamerr.ErrOwnerEnding, func() (spot.CreateResult, error) {
			return other.Spots().GetOrCreate("club", "room").Do(ctx)
		})
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		_, err = other.Spots().Close(ctx, res.Ref)
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		_, err = other.ReleaseEnded(ctx, extension.UserSpotRef("club"))
		require.ErrorIs(t, err, roamerr.ErrUnavailable, "a member on a live node must leave first")
		_, err = store.Read(ctx, location.Key(location.KindActor, "m1"))
		require.NoError(t, err, "nothing released")
		w.eventually(t, "the Spot and its two ended members counted as waiting for an operator", func() bool {
			return other.Spots().ForOperator() == 3
		})

		// The live member's node ends too: now every member has an ended owner.
		third := w.start(withKinds(w.operatorRoom()))
		require.NoError(t, other.StopNow(ctx))
		released, err := past(t, w, roamerr.ErrOwnerEnding, func() (bool, error) {
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
// word): of a RecoverByOperator kind it answers Unavailable naming
// ReleaseEnded; once an operator accepts the loss, GetOrCreate creates it
// anew.
// Reference: docs/FAULTS.md, End states (an ended owner's User Spot).
func TestEndedOwnersStatefulUserSpotIsNotCreatedAnewEmpty(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		a, b := w.start(withKinds(w.operatorRoom())), w.start(withKinds(w.operatorRoom()))
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

		_, err = past(t, w, roamerr.ErrOwnerEnding, func() (spot.CreateResult, error) {
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

// A stateful User Spot without members of a kind that checkpoints (the
// default) whose owner ended comes back from its checkpoint by itself;
// GetOrCreate finds it Existing with its state, never Created anew empty.
// Reference: docs/FAULTS.md, End states (an ended owner's User Spot).
func TestEndedOwnersStatefulUserSpotComesBackFromItsCheckpoint(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		lounge := w.roomKind()
		lounge.CheckpointEvery = 1
		a, b := w.start(withKinds(lounge)), w.start(withKinds(lounge))
		res, err := a.Spots().GetOrCreate("lounge", "room").Do(ctx)
		require.NoError(t, err)
		owner, other := a, b
		if res.Ref.NodeRid == b.NodeRid() {
			owner, other = b, a
		}
		for _, v := range []string{"1", "2"} {
			_, err := request(t, other, "lounge", v)
			require.NoError(t, err)
		}
		// Written off the dispatch path: a stop without a drain loses what
		// was not written yet.
		w.eventually(t, "the checkpoint of the second message", func() bool {
			return storedCountOf(t, w.store, location.Key(location.KindUserSpot, "lounge")) == 2
		})
		require.NoError(t, owner.StopNow(ctx))
		var again spot.CreateResult
		w.eventually(t, "GetOrCreate finds the recovered Spot", func() bool {
			again, err = other.Spots().GetOrCreate("lounge", "room").Do(ctx)
			if err != nil {
				require.ErrorIs(t, err, roamerr.ErrUnavailable, "until it is recovered")
				return false
			}
			return true
		})
		require.Equal(t, spot.Existing, again.State, "never created anew")
		n, err := request(t, other, "lounge", "3")
		require.NoError(t, err)
		require.EqualValues(t, 3, n, "with its checkpoint's state")
	})
}

// The members of a User Spot that waits for an operator wait with it, even
// when their own kind recovers by itself: recovered alone, a member would
// serve for a Spot that does not, and keep the operator from releasing
// the Spot (a member on a live node). The operator's release takes them
// with it. An object whose kind recovers by itself has no loss to accept:
// ReleaseEnded refuses it.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestMembersOfASpotWaitingForAnOperatorWaitWithIt(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	journal := w.roomKind()
	journal.StableType = "journal"
	journal.CheckpointEvery = 1
	owner := w.start(withKinds(w.operatorRoom(), journal))
	res, err := owner.Spots().GetOrCreate("club", "room").Do(ctx)
	require.NoError(t, err)
	_, err = owner.Spots().SpawnMember(ctx, res.Ref, "journal", "scribe")
	require.NoError(t, err)
	_, err = owner.SpawnActor(ctx, "journal", "loner")
	require.NoError(t, err)
	rescuer := w.start(withKinds(w.operatorRoom(), journal))
	require.NoError(t, owner.StopNow(ctx))

	w.eventually(t, "the loner, of a kind that recovers by itself, recovered", func() bool {
		v, err := store.Read(ctx, location.Key(location.KindActor, "loner"))
		require.NoError(t, err)
		return v.Record.GetOwner().GetNodeRid() == rescuer.NodeRid()
	})
	w.eventually(t, "the Spot and its member counted as waiting for an operator", func() bool {
		return rescuer.Spots().ForOperator() == 2
	})
	member, err := store.Read(ctx, location.Key(location.KindActor, "scribe"))
	require.NoError(t, err)
	require.Equal(t, owner.NodeRid(), member.Record.GetOwner().GetNodeRid(), "the member waits with its Spot")

	_, err = rescuer.ReleaseEnded(ctx, extension.ActorRef("loner"))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "no loss to accept")
	released, err := rescuer.ReleaseEnded(ctx, extension.UserSpotRef("club"))
	require.NoError(t, err)
	require.True(t, released)
	_, err = store.Read(ctx, location.Key(location.KindActor, "scribe"))
	require.ErrorIs(t, err, location.ErrNotFound, "the member released with its Spot")
}
