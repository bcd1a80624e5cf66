package spot_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A call's deadline is on the node's clock, the clock its owner compares
// it with: a node whose clock has run ahead of the real one (a logical
// clock here; a node's time is an input) still serves a call that has
// time left, and runs a User Spot command from another node. The call's
// deadline used to be taken on the real clock, so the owner found every
// call's deadline past before it dispatched it; and the owner's check of
// a command with its source gave itself a real-time deadline, so it found
// no time left to ask the source and refused the command Unavailable.
// Reference: docs/PROTOCOL.md §4.3 (the request's deadline header),
// docs/ARCHITECTURE.md ("Writing a node test in logical time").
func TestACallsDeadlineIsOnTheNodesClock(t *testing.T) {
	w := newLogicalWorld(t)
	a, b := w.start(), w.start(withKinds(w.cartKind("cart"))) // User Spots are created on a, by command from b
	_, err := a.SpawnInstanceSpot(ctx, "cart", "ahead")
	require.NoError(t, err)
	w.advance(t, 3*testLeaseTTL) // the clock is now well ahead of the real time
	for _, from := range w.nodes {
		res, err := from.Spots().Request("ahead", wrapperspb.String(from.NodeRid())).Timeout(5 * time.Second).Do(ctx)
		require.NoError(t, err, "a call with 5 s left on its node's clock")
		require.NotNil(t, res)
	}
	res, err := b.Spots().GetOrCreate("lounge", "room").Timeout(5 * time.Second).Do(ctx)
	require.NoError(t, err, "a User Spot command with time left")
	require.Equal(t, a.NodeRid(), res.Ref.NodeRid)
	_, err = b.Spots().Close(ctx, res.Ref, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, w.handledOf("ahead"), 2)
}
