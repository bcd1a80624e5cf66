package relocation

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// After a cold activation's first turn, dispatch waits for the recovery
// pointer's removal. When a close is releasing record and pointer together
// (pointerGone false), dispatch goes on — the close must run what the
// incarnation accepted — but a move keeps waiting: it would find the
// object closing, the close would put the pointer back, and the move
// would carry it to a target that never removes it. The incarnation's end
// releases the waiting moves (they then find it ended).
// Reference: docs/PROTOCOL.md §7.5 step 12, §7.9.
func TestAMoveWaitsUntilTheRecoveryPointerIsGone(t *testing.T) {
	d := &Driver{}
	settling := func() *object {
		o := &object{d: d}
		o.flags.set(flagActivating, true)
		o.flags.set(flagPointerHeld, true)
		return o
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	o := settling()
	waiting := o.settled() // a move that waits
	o.pointerSettled(false)
	require.False(t, o.flags.load(flagPointerHeld), "dispatch goes on for the close")
	require.True(t, o.flags.load(flagActivating), "a move still waits")
	require.False(t, closed(waiting))
	require.False(t, closed(o.settled()))
	o.moveMayStart() // the incarnation ended
	require.True(t, closed(waiting))
	require.Empty(t, d.settling, "the channel is gone with the wait")
	require.True(t, closed(o.settled()), "a later move does not wait")
	o.moveMayStart() // idempotent
	o.pointerSettled(true)

	o = settling()
	o.pointerSettled(true)
	require.False(t, o.flags.load(flagPointerHeld))
	require.False(t, o.flags.load(flagActivating))
	require.Empty(t, d.settling, "no move waited: no channel was made")
	require.True(t, closed(o.settled()), "the pointer is gone: moves start")
	o.pointerSettled(true) // idempotent
}
