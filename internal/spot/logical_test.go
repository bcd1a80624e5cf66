package spot_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
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

// The pauses between the tries of a taken-over Actor's failing restore
// are on its node's clock: they double from a second (1+2+4+8+16+30 s for
// six failures), and once that much of the node's time has passed the
// Actor serves with its state. They used to be on the real clock, so a
// node in logical time waited them out in real seconds, whatever its
// clock said.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestARestoresRetriesArePacedOnTheNodesClock(t *testing.T) {
	w := newLogicalWorld(t)
	vault, caller, doomed, _ := vaultActorOnADoomedNode(t, w, w.store, "1")
	fails := &atomic.Int32{}
	fails.Store(6)
	flaky := vault
	flaky.Policy = extension.PreserveStateWith(flakyRestore{fails: fails})
	w.start(withKinds(flaky))
	require.NoError(t, doomed.StopNow(ctx))
	w.eventuallyWithin(t, 3*time.Minute, "the six failing restores tried, and the seventh", func() bool { return fails.Load() < 0 })
	require.EqualValues(t, 2, askTakenOver(t, w, caller, "2"), "with its checkpoint's state")
}
