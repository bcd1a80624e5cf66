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
// time left. Its deadline used to be taken on the real clock, so the
// owner found every call's deadline past before it dispatched it.
// Reference: docs/PROTOCOL.md §4.3 (the request's deadline header),
// docs/ARCHITECTURE.md ("Writing a node test in logical time").
func TestACallsDeadlineIsOnTheNodesClock(t *testing.T) {
	w := newLogicalWorld(t)
	a := w.start()
	w.start()
	_, err := a.SpawnInstanceSpot(ctx, "cart", "ahead")
	require.NoError(t, err)
	w.advance(t, 3*testLeaseTTL) // the clock is now well ahead of the real time
	for _, from := range w.nodes {
		res, err := from.Spots().Request("ahead", wrapperspb.String(from.NodeRid())).Timeout(5 * time.Second).Do(ctx)
		require.NoError(t, err, "a call with 5 s left on its node's clock")
		require.NotNil(t, res)
	}
	require.Len(t, w.handledOf("ahead"), 2)
}
