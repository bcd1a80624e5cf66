package relocation_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

// A stop that roam did not decide — actor.Stop or a PoisonPill sent to an
// incarnation or to the relocation actor, locally or from another node —
// is refused: the object goes on serving with its state and still moves.
// Before, such a stop left the store naming a live owner that no longer
// served the object, with nothing to repair it.
func TestStopFromOutsideRoamIsRefused(t *testing.T) {
	c := startNodes(t, 2)
	ctx := context.Background()
	a, b := c.nodes[0], c.nodes[1]
	key := location.Key(location.KindActor, "st1")
	pid, err := a.driver.Spawn(ctx, "counter", key.ID)
	require.NoError(t, err)
	for i := int64(1); i <= 10; i++ {
		a.node.System().Root.Send(pid, wrapperspb.Int64(i))
	}
	// From another node: system Stop and a PoisonPill, then a request on
	// the same connection, answered only if the incarnation still runs.
	b.node.System().Root.Stop(pid)
	b.node.System().Root.Poison(pid)
	b.node.System().Root.Stop(relocation.PID(a.node.Address()))
	require.Equal(t, int64(10), get(t, b.node.System(), pid))
	// Locally, as an application might.
	a.node.System().Root.Stop(pid)
	a.node.System().Root.Poison(pid)
	a.node.System().Root.Stop(relocation.PID(a.node.Address()))
	require.Equal(t, int64(10), get(t, a.node.System(), pid))
	ok, err := a.driver.Serving(ctx, key)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err, "the relocation actor still runs")
	require.Equal(t, int64(10), get(t, a.node.System(), pid))
}
