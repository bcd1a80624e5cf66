package relocation

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

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

	// LeaveSpot: arrived's localCall passes; every later one (holdHere's,
	// and any timer firing that comes before it) waits until the caller's
	// context has ended, then runs.
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	var calls atomic.Int32
	DropInbound(d, func(m any) bool {
		if _, ok := m.(*localCall); ok && calls.Add(1) >= 2 {
			<-lctx.Done()
			if calls.Load() == 2 {
				time.Sleep(20 * time.Millisecond) // the caller returns first
			}
		}
		return false
	})
	err = d.LeaveSpot(lctx, key)
	DropInbound(d, nil)
	t.Logf("LeaveSpot: %v", err)
	require.Error(t, err)

	changing, _ := call(ctx, d, func() (int, error) { return int(d.objects[key].changing), nil })
	require.Zero(t, changing, "a membership change given up still holds the Actor")
	deleted, err := d.DeleteActor(ctx, key)
	require.NoError(t, err)
	require.True(t, deleted)
}
