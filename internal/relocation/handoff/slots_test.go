package handoff

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Slots taken ahead: the commit keeps them (the records name them); a
// move that ends without one frees them.
func TestArrivalSlotsFreedWithoutACommit(t *testing.T) {
	var a ArrivalSlots
	require.True(t, a.Wanted())
	free, err := a.Taken([]uint32{3, 4}, nil)
	require.NoError(t, err)
	require.Empty(t, free)
	require.False(t, a.Wanted(), "taken once")
	require.Equal(t, []uint32{3, 4}, a.Slots)
	require.Empty(t, a.Complete(true), "committed: the records name them")

	a = ArrivalSlots{}
	_, _ = a.Taken([]uint32{3, 4}, nil)
	require.Equal(t, []uint32{3, 4}, a.Complete(false))
}

// A take with an unknown outcome may hold its slots: they are freed when
// the move ends, committed or not — unless a later take got them (then
// that take's answer shows it did not apply, and they are the move's).
func TestArrivalSlotsOfATakeWithAnUnknownOutcome(t *testing.T) {
	indeterminate := fmt.Errorf("take: %w", location.ErrIndeterminate)
	var a ArrivalSlots
	free, err := a.Taken([]uint32{1, 2}, indeterminate)
	require.ErrorIs(t, err, location.ErrIndeterminate, "the move sees the take's error")
	require.Empty(t, free)
	require.True(t, a.Wanted(), "no take applied for certain")
	_, err = a.Taken([]uint32{2, 5}, nil)
	require.NoError(t, err)
	require.Equal(t, []uint32{1}, a.Complete(true), "slot 2 is the commit's; 1 may be held for nothing")

	a = ArrivalSlots{}
	_, _ = a.Taken([]uint32{1}, indeterminate)
	_, _ = a.Taken([]uint32{2}, nil)
	require.ElementsMatch(t, []uint32{1, 2}, a.Complete(false))
}

// A slot already taken (none free) fails the take: nothing is held.
func TestArrivalSlotsOfAFailedTake(t *testing.T) {
	var a ArrivalSlots
	full := fmt.Errorf("%w: node full", roamerr.ErrCapacityExceeded)
	free, err := a.Taken(nil, full)
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
	require.Empty(t, free)
	require.Empty(t, a.Complete(false))
}

// A take that answers after the move ended frees what it may hold and
// fails Unavailable; one that failed holds nothing.
func TestArrivalSlotsOfATakeAfterTheMoveEnded(t *testing.T) {
	for name, takeErr := range map[string]error{"applied": nil, "unknown": location.ErrIndeterminate} {
		t.Run(name, func(t *testing.T) {
			var a ArrivalSlots
			require.Empty(t, a.Complete(false))
			free, err := a.Taken([]uint32{7}, takeErr)
			require.Equal(t, []uint32{7}, free)
			require.ErrorIs(t, err, roamerr.ErrUnavailable)
		})
	}
	var a ArrivalSlots
	a.Complete(false)
	free, err := a.Taken(nil, location.ErrLeaseEnded)
	require.Empty(t, free)
	require.ErrorIs(t, err, location.ErrLeaseEnded)
}

// A move holds the slots its take picked from before the take is sent
// (another move's free must not free them once it applies), those taken
// while it runs, and none once it ended.
func TestArrivalSlotsHeldWhileTheMoveRuns(t *testing.T) {
	var a ArrivalSlots
	a.Taking([]uint32{3, 4})
	require.ElementsMatch(t, []uint32{3, 4}, a.Held(), "picked, the take in flight")
	_, err := a.Taken([]uint32{3, 4}, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []uint32{3, 4}, a.Held())
	a.Complete(false)
	require.Empty(t, a.Held(), "ended: being freed")
}
