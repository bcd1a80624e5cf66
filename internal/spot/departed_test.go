package spot_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
)

// A caller's cached route names a node that has since moved the Spot away
// and stopped: the call is not sent into the dead connection (Proto.Actor
// would retry the dial for seconds and then drop it, so the call could
// only end at its deadline). The caller saw that connection end, checks
// the route's owner before it sends, finds it gone, reads the Spot's new
// owner and gets the reply; the message is handled once.
// Reference: docs/PROTOCOL.md §7.8 (the positive cache is only used within
// the owner's lease).
func TestCallOnARouteToANodeThatLeftReachesTheNewOwner(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		ctx := context.Background()
		call := func(caller *extension.Extension, v string) (int64, error) {
			res, err := caller.Spots().Request("x", wrapperspb.String(v)).InstanceSpot("cart").Timeout(time.Minute).Do(ctx)
			if err != nil {
				return 0, err
			}
			return res.(*wrapperspb.Int64Value).Value, nil
		}
		caller := w.nodes[0]
		n, err := call(caller, "one")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		ref, err := caller.Spots().Find(ctx, "x")
		require.NoError(t, err)
		if ref.NodeRid == caller.NodeRid() {
			_, err = caller.Relocate(ctx, extension.InstanceSpotRef("x"), w.nodes[1].NodeRid())
			require.NoError(t, err)
		}
		n, err = call(caller, "two") // the caller caches its route to the owner
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		ref, err = caller.Spots().Find(ctx, "x")
		require.NoError(t, err)
		var owner, third *extension.Extension
		for _, e := range w.nodes[1:] {
			if e.NodeRid() == ref.NodeRid {
				owner = e
			} else {
				third = e
			}
		}
		require.NotNil(t, owner)
		_, err = owner.Relocate(ctx, extension.InstanceSpotRef("x"), third.NodeRid())
		require.NoError(t, err)
		cached, ok := spot.CachedOwner(caller.Spots(), "x")
		require.True(t, ok)
		require.Equal(t, owner.NodeRid(), cached, "the caller's route names the old owner: nothing told it of the move")
		gone := owner.Node().Address()
		require.NoError(t, owner.Stop(ctx))
		eventually(t, "the caller sees its connection to the stopped node end", func() bool {
			return spot.ConnectionEnded(caller.Spots(), gone)
		})
		n, err = call(caller, "after")
		require.NoError(t, err, "a route to a node that left is re-read before the send")
		require.EqualValues(t, int64(len(w.handledOf("x"))), n)
		require.Equal(t, "after", w.handledOf("x")[len(w.handledOf("x"))-1])
	})
}

// A caller's cached route names a node that moved the Spot away and then
// says it is leaving, while still connected: the calls the caller already
// sent on the route are still on their way through that node's Message
// Follow, so the route is drained (a barrier down it) before the caller
// reads the new owner; every send is handled once and in the caller's
// order.
// Reference: docs/PROTOCOL.md §7.8.
func TestARouteToALeavingNodeIsDrainedBeforeTheNewOwner(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		ctx := context.Background()
		caller, owner, third := w.nodes[0], w.nodes[1], w.nodes[2]
		_, err := owner.SpawnInstanceSpot(ctx, "cart", "y")
		require.NoError(t, err)
		_, err = caller.Spots().Request("y", wrapperspb.String("0")).InstanceSpot("cart").Timeout(time.Minute).Do(ctx)
		require.NoError(t, err)
		cached, ok := spot.CachedOwner(caller.Spots(), "y")
		require.True(t, ok)
		require.Equal(t, owner.NodeRid(), cached)
		_, err = owner.Relocate(ctx, extension.InstanceSpotRef("y"), third.NodeRid())
		require.NoError(t, err)

		const n = 400
		for i := 1; i <= n; i++ {
			if i == n/2 {
				// Before the caller hears that its route is followed.
				require.NoError(t, spot.SayLeaving(ctx, owner.Spots(), caller.Node().Address()))
			}
			_, err := caller.Spots().Send("y", wrapperspb.String(strconv.Itoa(i))).InstanceSpot("cart").Do(ctx)
			require.NoError(t, err)
		}
		_, err = caller.Spots().Request("y", wrapperspb.String("last")).InstanceSpot("cart").Timeout(time.Minute).Do(ctx)
		require.NoError(t, err)
		got := w.handledOf("y")
		require.Len(t, got, n+2, "every send handled once")
		for i := 1; i <= n; i++ {
			require.Equal(t, strconv.Itoa(i), got[i], "handled in the caller's order")
		}
	})
}
