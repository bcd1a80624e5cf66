package spot_test

import (
	"fmt"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location/memstore"
)

// A stop roam did not decide — actor.Stop or a PoisonPill from another
// node to the Spot service, the relocation actor or an Instance Spot's
// incarnation — is refused: the Spot keeps serving with its state, and
// activations placed on that node still complete.
func TestStopFromOutsideLeavesSpotsServing(t *testing.T) {
	w := newWorld(t, memstore.New())
	a, b := w.start(), w.start()
	got, err := request(t, b, "st-cart", "1", "cart")
	require.NoError(t, err)
	require.EqualValues(t, 1, got)
	ref, err := b.Spots().Find(ctx, "st-cart")
	require.NoError(t, err)
	owner, other := a, b
	if ref.NodeRid == b.NodeRid() {
		owner, other = b, a
	}
	root := other.Node().System().Root
	addr := owner.Node().Address()
	inc, err := owner.Resolve(ctx, extension.InstanceSpotRef("st-cart"))
	require.NoError(t, err)
	for _, pid := range []*actor.PID{actor.NewPID(addr, spot.ServiceName), relocation.PID(addr), inc} {
		root.Stop(pid)
		root.Poison(pid)
	}
	got, err = request(t, other, "st-cart", "2", "cart")
	require.NoError(t, err)
	require.EqualValues(t, 2, got, "the incarnation kept its state")
	// New carts are placed on both nodes by their IDs; each activates.
	for i := 0; i < 20; i++ {
		got, err := request(t, other, fmt.Sprintf("st-new-%d", i), "1", "cart")
		require.NoError(t, err)
		require.EqualValues(t, 1, got)
	}
}
