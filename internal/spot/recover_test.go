package spot_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/roamerr"
)

// askPID sends a request to pid and returns the handler's count.
func askPID(t *testing.T, e *extension.Extension, pid *actor.PID, value string) (int64, error) {
	t.Helper()
	reply, err := e.System().Root.RequestFuture(pid, wrapperspb.String(value), 10*time.Second).Result()
	if err != nil {
		return 0, err
	}
	return reply.(*wrapperspb.Int64Value).Value, nil
}

// clubOnADoomedNode creates the User Spot "club" of a room kind
// checkpointed every turn on doomed, the only node that hosts the kind;
// caller hosts another kind.
func clubOnADoomedNode(t *testing.T, w *world) (club extension.Kind, caller, doomed *extension.Extension, res spot.CreateResult) {
	t.Helper()
	club = w.roomKind()
	club.CheckpointEvery = 1
	caller = w.start(withKinds(w.cartKind("cart")))
	doomed = w.start(withKinds(club))
	res, err := caller.Spots().GetOrCreate("club", "room").Do(ctx)
	require.NoError(t, err)
	require.Equal(t, doomed.NodeRid(), res.Ref.NodeRid)
	return club, caller, doomed, res
}

// A User Spot with members whose owner ended comes back by itself, without
// a call, on one live node together with its member Actors, each from its
// last checkpoint: the same incarnations (ObjectGeneration) under the next
// owner generation, so the members are still members and the Spot's
// member count is exact. Nothing waits for an operator.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestUserSpotWithMembersComesBackWithoutACall(t *testing.T) {
	onBothStoresInLogicalTime(t, func(t *testing.T, w *world) {
		store := w.store
		club, caller, doomed, res := clubOnADoomedNode(t, w)
		members := map[string]*actor.PID{}
		for _, id := range []string{"m1", "m2"} {
			pid, err := doomed.Spots().SpawnMember(ctx, res.Ref, "room", id)
			require.NoError(t, err)
			members[id] = pid
		}
		for _, v := range []string{"1", "2"} {
			_, err := request(t, caller, "club", v)
			require.NoError(t, err)
		}
		for i, v := range []string{"a", "b", "c"} {
			n, err := askPID(t, caller, members["m1"], v)
			require.NoError(t, err)
			require.EqualValues(t, i+1, n)
		}
		spotKey := location.Key(location.KindUserSpot, "club")
		// Written off the dispatch path: a stop without a drain loses what
		// was not written yet.
		w.eventually(t, "the checkpoints of the last messages", func() bool {
			return storedCountOf(t, store, spotKey) == 2 && storedCountOf(t, store, location.Key(location.KindActor, "m1")) == 3
		})
		before, err := store.Read(ctx, spotKey)
		require.NoError(t, err)
		require.NoError(t, doomed.StopNow(ctx)) // no drain: its objects are an ended owner's
		rescuer := w.start(withKinds(club))

		for _, key := range []location.AuthorityKey{spotKey, location.Key(location.KindActor, "m1"), location.Key(location.KindActor, "m2")} {
			w.eventually(t, key.String()+" recovered on the live node without a call", func() bool {
				v, err := store.Read(ctx, key)
				require.NoError(t, err)
				return v.Record.GetOwner().GetNodeRid() == rescuer.NodeRid()
			})
		}
		after, err := store.Read(ctx, spotKey)
		require.NoError(t, err)
		require.Equal(t, before.Record.GetObjectGeneration(), after.Record.GetObjectGeneration(), "the same incarnation")
		require.Equal(t, before.Record.GetAuthorityOwnerGeneration()+1, after.Record.GetAuthorityOwnerGeneration())
		require.EqualValues(t, 2, after.Record.GetMemberCount(), "its members are still members")
		m1, err := store.Read(ctx, location.Key(location.KindActor, "m1"))
		require.NoError(t, err)
		require.Equal(t, "club", m1.Record.GetMembership().GetSpotId())
		require.Equal(t, after.Record.GetObjectGeneration(), m1.Record.GetMembership().GetSpotGeneration())

		n, err := request(t, caller, "club", "3")
		require.NoError(t, err)
		require.EqualValues(t, 3, n, "the Spot with its checkpoint's state")
		pid, err := caller.Resolve(ctx, extension.ActorRef("m1"))
		require.NoError(t, err)
		require.Equal(t, rescuer.System().Address(), pid.Address)
		n, err = askPID(t, caller, pid, "d")
		require.NoError(t, err)
		require.EqualValues(t, 4, n, "the member with its checkpoint's state")
	})
}

// An ended owner's object whose first candidate cannot take it (that node
// is full) is not left waiting for good: once it has waited a few passes
// per candidate ahead, the next candidate recovers it.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestRecoveryFallsToTheNextCandidateWhenTheFirstIsFull(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	vault := w.everyTurnVault()
	caller := w.start(withKinds(w.roomKind()))
	doomed := w.start(withKinds(vault))
	ids := []string{"v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10"}
	for _, id := range ids {
		_, err := request(t, caller, id, "1", "vault")
		require.NoError(t, err)
	}
	full := w.start(withKinds(vault), func(c *extension.Config) { c.Node.Capacity = 1 })
	_, err := full.SpawnInstanceSpot(ctx, "vault", "filler")
	require.NoError(t, err)
	free := w.start(withKinds(vault))
	for _, id := range ids {
		w.eventually(t, "checkpoint of "+id, func() bool { return storedCount(t, store, id) == 1 })
	}
	require.NoError(t, doomed.StopNow(ctx))
	for _, id := range ids {
		w.eventually(t, id+" recovered on the node with room", func() bool { return ownerRid(t, store, id) == free.NodeRid() })
	}
	for _, id := range ids {
		n, err := request(t, caller, id, "2", "vault")
		require.NoError(t, err)
		require.EqualValues(t, 2, n, "%s from its checkpoint", id)
	}
}

// A takeover whose record writes keep losing their answers, and whose
// checkpoint store fails for a while, still ends with the object serving
// on the recovering node, with its state: the write is settled by reads
// and sent again for as long as the lifecycle lasts, never abandoned with
// the record perhaps naming a live node without an incarnation.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestTakeOverSettlesLostWritesAndStoreFailures(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	club, caller, doomed, _ := clubOnADoomedNode(t, w)
	for _, v := range []string{"1", "2"} {
		_, err := request(t, caller, "club", v)
		require.NoError(t, err)
	}
	w.eventually(t, "the checkpoint of the second message", func() bool {
		return storedCountOf(t, store, location.Key(location.KindUserSpot, "club")) == 2
	})
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	rescuer := w.start(withStore(f), withKinds(club))
	lost := []faulty.Fault{}
	for range 7 {
		lost = append(lost, faulty.IndeterminateLost)
	}
	f.InjectOn("apply", append(lost, faulty.IndeterminateApplied)...)
	f.InjectOn("put checkpoint", faulty.Unavailable, faulty.Unavailable, faulty.Unavailable)
	require.NoError(t, doomed.StopNow(ctx))
	w.eventually(t, "a takeover write lost its answer", func() bool { return f.Stats().IndeterminateLost > 0 })
	// A pass while that takeover is under way (or after it) recovers
	// nothing itself: it must not count the object a second time, nor stop
	// looking while the write may still not land.
	sw, err := rescuer.Spots().RecoverEnded(ctx)
	require.NoError(t, err)
	require.Zero(t, sw.Recovered, "a takeover under way counted as recovered")

	w.eventually(t, "the Spot recovered on the rescuer", func() bool {
		v, err := store.Read(ctx, location.Key(location.KindUserSpot, "club"))
		require.NoError(t, err)
		return v.Record.GetOwner().GetNodeRid() == rescuer.NodeRid()
	})
	var n int64
	w.eventually(t, "the recovered Spot serves", func() bool {
		n, err = await(t, w, "a call", func() result[int64] { return resultOf(request(t, caller, "club", "3")) }).get()
		return err == nil
	})
	require.EqualValues(t, 3, n, "with its checkpoint's state")
	st := f.Stats()
	require.GreaterOrEqual(t, st.IndeterminateLost, 7, "the lost writes were made")
	require.GreaterOrEqual(t, st.Unavailable, 3, "the checkpoint store failed")
}

// An Actor whose takeover has written its record but not yet opened its
// incarnation (its checkpoint is still being read) is not deleted under
// it: the delete is refused Unavailable, and once the takeover is done the
// Actor serves with its state and its record. Before, the delete took the
// record away and the takeover then opened an incarnation no record named.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestDeleteIsRefusedWhileTheActorIsTakenOver(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	vault, caller, doomed, key := vaultActorOnADoomedNode(t, w, store, "1")

	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	rescuer := w.start(withStore(f), withKinds(vault))
	var failures []faulty.Fault
	for range 12 {
		failures = append(failures, faulty.Unavailable)
	}
	f.InjectOn("get checkpoint", failures...) // the takeover waits for its checkpoint
	require.NoError(t, doomed.StopNow(ctx))
	w.eventually(t, "the record names the rescuer", func() bool {
		v, err := store.Read(ctx, key)
		require.NoError(t, err)
		return v.Record.GetOwner().GetNodeRid() == rescuer.NodeRid()
	})
	_, err = caller.DeleteActor(ctx, extension.ActorRef("a1"))
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "deleted while its takeover waited for its checkpoint")

	require.EqualValues(t, 2, askTakenOver(t, w, caller, "2"), "with its checkpoint's state")
	_, err = store.Read(ctx, key)
	require.NoError(t, err, "its record stays")
	done, err := caller.DeleteActor(ctx, extension.ActorRef("a1"))
	require.NoError(t, err)
	require.True(t, done, "deleted once it serves")
}

// A member Actor is recovered on the node its User Spot serves on when
// that node hosts the member's kind, not on whichever node its own
// candidates name first: here the Spots' kind lives on one survivor only,
// the members' kind on both, and every member comes back with its Spot.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestMembersAreRecoveredWithTheirSpot(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	room := w.roomKind()
	room.CheckpointEvery = 1
	journal := w.roomKind()
	journal.StableType = "journal"
	journal.CheckpointEvery = 1
	doomed := w.start(withKinds(room, journal))
	clubs := []string{"club1", "club2", "club3", "club4", "club5", "club6"}
	for _, id := range clubs {
		res, err := doomed.Spots().GetOrCreate(id, "room").Do(ctx)
		require.NoError(t, err)
		_, err = doomed.Spots().SpawnMember(ctx, res.Ref, "journal", id+"-scribe")
		require.NoError(t, err)
	}
	both := w.start(withKinds(room, journal))
	w.start(withKinds(journal)) // the members' kind only
	require.NoError(t, doomed.StopNow(ctx))
	for _, id := range clubs {
		w.eventually(t, id+" and its member recovered", func() bool {
			s, err := store.Read(ctx, location.Key(location.KindUserSpot, id))
			require.NoError(t, err)
			m, err := store.Read(ctx, location.Key(location.KindActor, id+"-scribe"))
			require.NoError(t, err)
			return s.Record.GetOwner().GetNodeRid() == both.NodeRid() && m.Record.GetOwner().GetNodeRid() != doomed.NodeRid()
		})
		m, err := store.Read(ctx, location.Key(location.KindActor, id+"-scribe"))
		require.NoError(t, err)
		require.Equal(t, both.NodeRid(), m.Record.GetOwner().GetNodeRid(), "%s's member recovered away from its Spot", id)
	}
}

// A member Actor whose User Spot waits for an operator waits with it, and
// is reported so, also on a node that does not host the Spot's kind: that
// node asks the live nodes that do. Before, it counted the member as
// waiting for its Spot's recovery, which never came, and no operator
// listing on that node named it.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestMembersOfASpotThatWaitsForAnOperatorWaitWithIt(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	room := w.operatorRoom()
	journal := w.roomKind()
	journal.StableType = "journal"
	journal.CheckpointEvery = 1
	doomed := w.start(withKinds(room, journal))
	res, err := doomed.Spots().GetOrCreate("club", "room").Do(ctx)
	require.NoError(t, err)
	_, err = doomed.Spots().SpawnMember(ctx, res.Ref, "journal", "scribe")
	require.NoError(t, err)
	w.start(withKinds(room))               // the Spot's kind only
	members := w.start(withKinds(journal)) // the member's kind only
	require.NoError(t, doomed.StopNow(ctx))
	member := location.Key(location.KindActor, "scribe")
	w.eventually(t, "the member reported as waiting for an operator", func() bool {
		sw, err := members.Spots().RecoverEnded(ctx)
		return err == nil && slices.Contains(sw.ForOperator, member)
	})
	v, err := store.Read(ctx, member)
	require.NoError(t, err)
	require.Equal(t, doomed.NodeRid(), v.Record.GetOwner().GetNodeRid(), "nothing recovered it away from its Spot")
}

// vaultActorOnADoomedNode spawns the every-turn vault Actor "a1" on a node
// of its own (doomed), asks it each of values in turn through caller (a
// node without the vault kind), and waits for the checkpoint of the last.
func vaultActorOnADoomedNode(t *testing.T, w *world, store location.Store, values ...string) (vault extension.Kind, caller, doomed *extension.Extension, key location.AuthorityKey) {
	t.Helper()
	vault = w.everyTurnVault()
	caller = w.start(withKinds(w.roomKind()))
	doomed = w.start(withKinds(vault))
	pid, err := doomed.SpawnActor(ctx, "vault", "a1")
	require.NoError(t, err)
	for i, v := range values {
		n, err := askPID(t, caller, pid, v)
		require.NoError(t, err)
		require.EqualValues(t, i+1, n)
	}
	key = location.Key(location.KindActor, "a1")
	w.eventually(t, "the checkpoint of the last message", func() bool { return storedCountOf(t, store, key) == int64(len(values)) })
	return vault, caller, doomed, key
}

// askTakenOver asks the vault Actor "a1" value through caller once it
// serves again after its takeover, and returns its count.
func askTakenOver(t *testing.T, w *world, caller *extension.Extension, value string) int64 {
	t.Helper()
	var n int64
	w.eventually(t, "the taken-over Actor serves", func() bool {
		p, err := caller.Resolve(ctx, extension.ActorRef("a1"))
		if err != nil {
			return false
		}
		n, err = await(t, w, "a call", func() result[int64] { return resultOf(askPID(t, caller, p, value)) }).get()
		return err == nil
	})
	return n
}

// flakyRestore is countState whose first fails restores fail.
type flakyRestore struct {
	countState
	fails *atomic.Int32
}

func (f flakyRestore) Restore(a actor.Actor, b []byte) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("the state adapter cannot read this checkpoint yet")
	}
	return f.countState.Restore(a, b)
}

// A taken-over Actor whose checkpoint the kind's state adapter fails to
// restore does not serve from its producer instead — that would be the
// object re-created empty, its next capture replacing the state for good
// — but is restored again until it works, and then serves with its state.
// Before, the first failure made it serve empty.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestATakeoverWhoseRestoreFailsIsRestoredAgain(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	vault, caller, doomed, key := vaultActorOnADoomedNode(t, w, store, "1", "2")

	fails := &atomic.Int32{}
	fails.Store(2)
	flaky := vault
	flaky.Policy = extension.PreserveStateWith(flakyRestore{fails: fails})
	rescuer := w.start(withKinds(flaky))
	require.NoError(t, doomed.StopNow(ctx))
	n := askTakenOver(t, w, caller, "3")
	require.Less(t, fails.Load(), int32(0), "both failing restores were made")
	require.EqualValues(t, 3, n, "with its checkpoint's state, not from its producer")
	v, err := store.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, rescuer.NodeRid(), v.Record.GetOwner().GetNodeRid())
}

// While a taken-over Actor's checkpoint cannot be restored, a drain of its
// node does not wait for it for ever: it is reported unmovable, with why.
// Once the state adapter restores it, it serves with its state.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestADrainDoesNotWaitForAnUnrestorableTakeover(t *testing.T) {
	w := newLogicalWorld(t)
	store := w.store
	vault, caller, doomed, key := vaultActorOnADoomedNode(t, w, store, "1")

	fails := &atomic.Int32{}
	fails.Store(1 << 20)
	flaky := vault
	flaky.Policy = extension.PreserveStateWith(flakyRestore{fails: fails})
	rescuer := w.start(withKinds(flaky)) // the only node that can recover it
	require.NoError(t, doomed.StopNow(ctx))
	w.eventually(t, "a restore tried and failed", func() bool { return fails.Load() < 1<<20 })
	w.start(withKinds(vault)) // somewhere a drain could move it to

	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d := await(t, w, "the drain", func() result[drain.Result] { return resultOf(rescuer.Drain(dctx, drain.Options{})) })
	res, err := d.get()
	require.NoError(t, err)
	require.NoError(t, dctx.Err(), "the drain waited for the takeover")
	require.Len(t, res.Failed, 1)
	require.Equal(t, key, res.Failed[0].Key)
	require.ErrorIs(t, res.Failed[0].Err, roamerr.ErrUnavailable)
	require.ErrorContains(t, res.Failed[0].Err, "could not be restored")

	fails.Store(0)
	require.EqualValues(t, 2, askTakenOver(t, w, caller, "2"), "with its checkpoint's state")
}
