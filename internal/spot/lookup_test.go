package spot_test

import (
	"context"
	"testing"
	"time"

	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// Proto.Actor's meshnode.Request(identity, kind, msg) reaches a relocatable
// grain through roam's IdentityLookup: the first request activates it as
// the Instance Spot "<kind>/<identity>", and after the grain moves with its
// state the next request reaches it on its new node.
// Reference: docs/PROTOCOL.md §7.11 (Proto.Actor grains).
func TestProtoActorClusterRequestReachesAMovedGrain(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		agent := test.NewInMemAgent()
		member := func(c *extension.Config) {
			c.Node.ProtoCluster = &meshnode.ProtoCluster{Provider: test.NewTestProvider(agent)}
			c.Kinds = []extension.Kind{w.cartKind("counter")}
		}
		w.startN(3, member)
		a := w.nodes[0]
		pc := a.Node().ProtoActorCluster()
		require.NotNil(t, pc)
		ask := func(v string) int64 {
			t.Helper()
			res, err := pc.Request("c1", "counter", wrapperspb.String(v), pcluster.WithTimeout(10*time.Second))
			require.NoError(t, err)
			return res.(*wrapperspb.Int64Value).Value
		}
		require.EqualValues(t, 1, ask("one"))
		require.EqualValues(t, 2, ask("two"))
		id := spot.GrainSpotID("counter", "c1")
		require.Equal(t, "counter/c1", id)
		ref, err := a.Spots().Find(ctx, id)
		require.NoError(t, err)
		var owner, other *extension.Extension
		for _, n := range w.nodes {
			if n.NodeRid() == ref.NodeRid {
				owner = n
			} else if other == nil {
				other = n
			}
		}
		_, err = owner.Relocate(ctx, extension.InstanceSpotRef(id), other.NodeRid())
		require.NoError(t, err)
		require.EqualValues(t, 3, ask("three"), "the state moved with the grain")
		require.Equal(t, []string{"one", "two", "three"}, w.handledOf(id), "the grain's code never saw the activation message")
		require.EqualValues(t, 2, w.count("counter").Load(), "one activation and one restored move; no kill-and-reactivate")
	})
}

// A grain call takes its route like every call by Spot ID: while the
// cached route is being drained after a move (its barrier on the way), the
// lookup waits for the drain instead of reading the new owner and letting
// the grain call overtake this node's earlier calls on the old route.
// Reference: PROTOCOL.md §7.8 (a caller's order holds across a move).
func TestGrainLookupWaitsForARouteBeingDrained(t *testing.T) {
	w := newWorld(t, memstore.New())
	w.startN(2, withKinds(w.cartKind("counter")))
	a := w.nodes[0]
	m := a.Spots()
	pid, err := spot.GrainPID(ctx, m, "counter", "g1")
	require.NoError(t, err)
	id := spot.GrainSpotID("counter", "g1")
	ref, err := m.Find(ctx, id)
	require.NoError(t, err)
	require.Equal(t, pid.Address, addressOf(w, ref.NodeRid))
	hinted, drained := spot.HintRoute(m, id)
	require.True(t, hinted, "the lookup cached the route")

	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = spot.GrainPID(short, m, "counter", "g1")
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded, "the lookup answered while the route was being drained")
	require.ErrorContains(t, err, "drain")

	drained()
	again, err := spot.GrainPID(ctx, m, "counter", "g1")
	require.NoError(t, err)
	require.True(t, again.Equal(pid), "the grain has not moved")
}

func addressOf(w *world, rid string) string {
	for _, n := range w.nodes {
		if n.NodeRid() == rid {
			return n.Node().Address()
		}
	}
	return ""
}
