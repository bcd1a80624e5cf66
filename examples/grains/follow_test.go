package grains_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/grains"
	"github.com/roamactors/roam/examples/grains/shoppb"
	"github.com/roamactors/roam/internal/testwait"
)

// A node that called a grain before it moved (and so has its route
// cached) reaches it after the move, to a third node or to the caller's
// own: its next call follows the grain.
func TestGrainCallAfterAMoveFromANodeThatCalledBefore(t *testing.T) {
	t.Parallel() // as TestGrainsMoveWithStateWhileAPlainKindAnswers, and so are its cases
	t.Run("to a third node", func(t *testing.T) { t.Parallel(); callAfterMove(t, false, false) })
	t.Run("to the caller's node", func(t *testing.T) { t.Parallel(); callAfterMove(t, true, false) })
	t.Run("from the caller's node", func(t *testing.T) { t.Parallel(); callAfterMove(t, false, true) })
}

func callAfterMove(t *testing.T, toCaller, fromCaller bool) {
	ctx := context.Background()
	nodes := startNodes(t, 3)
	timeout := cluster.WithTimeout(min(testwait.Patience(t), time.Minute))
	caller := nodes[0]
	// A cart activated on another node than the caller's (fromCaller: on
	// the caller's).
	var id string
	var owner *grains.Node
	for i := 0; owner == nil || (owner == caller) != fromCaller; i++ {
		id = fmt.Sprintf("c%d", i)
		_, err := shoppb.GetCartGrainClient(caller.Cluster, id).Add(&shoppb.AddItem{Sku: "tea", Quantity: 1}, timeout)
		require.NoError(t, err)
		ref, err := caller.Roam.Spots().Find(ctx, roam.GrainID(grains.CartKind, id))
		require.NoError(t, err)
		for _, n := range nodes {
			if n.Roam.NodeRid() == ref.NodeRid {
				owner = n
			}
		}
	}
	target := caller
	for _, n := range nodes {
		if n != owner && (n != caller || fromCaller) && !toCaller {
			target = n
		}
	}
	_, err := owner.Roam.Relocate(ctx, roam.GrainRef(grains.CartKind, id), target.Roam.NodeRid())
	require.NoError(t, err)
	got, err := shoppb.GetCartGrainClient(caller.Cluster, id).Add(&shoppb.AddItem{Sku: "tea", Quantity: 1}, timeout)
	require.NoError(t, err, "the caller's next call after the move")
	require.EqualValues(t, 2, got.GetItems()["tea"])
}
