package spot_test

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/location"
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

// A User Spot with members whose owner ended comes back by itself, without
// a call, on one live node together with its member Actors, each from its
// last checkpoint: the same incarnations (ObjectGeneration) under the next
// owner generation, so the members are still members and the Spot's
// member count is exact. Nothing waits for an operator.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestUserSpotWithMembersComesBackWithoutACall(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		club := w.roomKind()
		club.CheckpointEvery = 1
		caller := w.start(withKinds(w.cartKind("cart")))
		doomed := w.start(withKinds(club))
		res, err := caller.Spots().GetOrCreate("club", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, doomed.NodeRid(), res.Ref.NodeRid)
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
		before, err := store.Read(ctx, spotKey)
		require.NoError(t, err)
		require.NoError(t, doomed.StopNow(ctx)) // no drain: its objects are an ended owner's
		rescuer := w.start(withKinds(club))

		for _, key := range []location.AuthorityKey{spotKey, location.Key(location.KindActor, "m1"), location.Key(location.KindActor, "m2")} {
			eventually(t, key.String()+" recovered on the live node without a call", func() bool {
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
