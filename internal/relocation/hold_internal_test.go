package relocation

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

type quietActor struct{}

func (quietActor) Receive(actor.Context) {}

// A LeaveSpot (or JoinSpot) whose caller's context ends while its hold on
// the Actor waits in the driver's queue (a loaded node) does not leave the
// Actor held: a hold counted after its caller had gone, with no one to
// release it, would refuse every later delete and move for good.
func TestAMembershipChangeGivenUpReleasesTheActor(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	node, err := meshnode.Start(ctx, meshnode.Config{Store: store, Logger: testlog.Logger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	d, err := New(node, store, Config{Logger: testlog.Logger()})
	require.NoError(t, err)
	require.NoError(t, d.RegisterKind(Kind{StableType: "plain", Producer: func() actor.Actor { return quietActor{} }, Policy: RecreateOnRelocation()}))

	// A User Spot record this node owns, and a member of it.
	spotKey := location.Key(location.KindUserSpot, "club")
	spotRec := &location.Record{ObjectGeneration: 1, AuthorityOwnerGeneration: 1, State: messages.LifecycleState_LIFECYCLE_STATE_READY,
		StableType: "plain", Owner: d.owner(), SpotKind: messages.SpotKind_SPOT_KIND_USER}
	_, err = store.Apply(ctx, []location.Op{location.CreateOp(spotKey, spotRec)})
	require.NoError(t, err)
	spotV, err := store.Read(ctx, spotKey)
	require.NoError(t, err)
	key := location.Key(location.KindActor, "m1")
	_, err = d.SpawnMember(ctx, "plain", key.ID, &messages.Membership{SpotId: "club", SpotGeneration: 1}, spotV)
	require.NoError(t, err)

	// LeaveSpot's caller gives up just as the hold is asked for: the
	// hold is taken after its context ended.
	lctx, cancel := context.WithCancel(ctx)
	asked := false
	d.beforeHold = func() { asked = true; cancel() }
	err = d.LeaveSpot(lctx, key)
	d.beforeHold = nil
	t.Logf("LeaveSpot: %v", err)
	require.True(t, asked, "LeaveSpot never asked for its hold")
	require.ErrorIs(t, err, context.Canceled)

	changing, _ := call(ctx, d, func() (int, error) { return int(d.objects[key].r().changing), nil })
	require.Zero(t, changing, "a membership change given up still holds the Actor")
	deleted, err := d.DeleteActor(ctx, key)
	require.NoError(t, err)
	require.True(t, deleted)
}
