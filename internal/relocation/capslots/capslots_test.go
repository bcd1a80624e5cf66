package capslots

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

func actor(id string) location.AuthorityKey { return location.Key(location.KindActor, id) }

// A take picks the lowest indexes that are neither held nor being taken
// or freed; past the capacity it fails CapacityExceeded.
func TestPickTakesTheLowestFree(t *testing.T) {
	v := NewView("n1", 4)
	v.Refreshed([]location.Slot{{Index: 1, Holder: actor("a")}}, time.Unix(0, 0))
	got, err := v.Pick(2)
	require.NoError(t, err)
	require.Equal(t, []uint32{0, 2}, got)

	f := v.BeginFree([]uint32{3})
	_, err = v.Pick(1)
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "0 and 2 being taken, 1 held, 3 being freed")
	v.EndFree(f)
	got, err = v.Pick(1)
	require.NoError(t, err)
	require.Equal(t, []uint32{3}, got, "free once its free ended")
}

// A take that applied (or may have) holds its slots; one that did not
// gives them back to the next pick. An unknown outcome also makes the
// view read the store again before its next take.
func TestTookSettlesTheTake(t *testing.T) {
	for _, c := range []struct {
		o        Outcome
		held     bool
		readNext bool
	}{
		{Took, true, false},
		{Unknown, true, true},
		{Retry, false, false},
		{Exhausted, false, false},
		{Failed, false, false},
	} {
		v := NewView("n1", 2)
		v.Refreshed(nil, time.Unix(0, 0))
		slots, err := v.Pick(1)
		require.NoError(t, err)
		v.Took(slots, []location.AuthorityKey{actor("a")}, c.o)
		next, err := v.Pick(2)
		if c.held {
			require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "outcome %d holds slot 0", c.o)
		} else {
			require.NoError(t, err, "outcome %d gave slot 0 back", c.o)
			require.Equal(t, []uint32{0, 1}, next)
		}
		require.Equal(t, !c.readNext, v.Read(), "outcome %d", c.o)
	}
}

// The store's answer to a take: a conflict on a slot op is retried up to
// max attempts; a conflict on the caller's own ops, or another error, is
// not; an unknown outcome is told apart.
func TestAnswer(t *testing.T) {
	slotLost := &location.ConflictError{Op: "txn", FailedOps: []int{2}}
	ownLost := &location.ConflictError{Op: "txn", FailedOps: []int{1}}
	for _, c := range []struct {
		name    string
		err     error
		attempt int
		want    Outcome
	}{
		{"applied", nil, 1, Took},
		{"slot taken", fmt.Errorf("apply: %w", slotLost), 1, Retry},
		{"slot taken, last attempt", slotLost, 8, Exhausted},
		{"slot taken, before the last", slotLost, 7, Retry},
		{"own record changed", ownLost, 1, Failed},
		{"unknown", fmt.Errorf("apply: %w", location.ErrIndeterminate), 1, Unknown},
		{"store fault", errors.New("boom"), 1, Failed},
	} {
		require.Equal(t, c.want, Answer(c.err, 2, c.attempt, MaxAttempts), c.name)
	}
}

// A node that looks full reads its slots again at most once per
// FullReadEvery after its last read.
func TestReadAgainIsPaced(t *testing.T) {
	t0 := time.Unix(100, 0)
	v := NewView("n1", 1)
	v.Refreshed(nil, t0)
	require.False(t, v.ReadAgain(t0.Add(FullReadEvery-time.Nanosecond)))
	require.True(t, v.ReadAgain(t0.Add(FullReadEvery)))
	require.False(t, v.ReadAgain(t0.Add(FullReadEvery+time.Millisecond)), "counted done")
	require.True(t, v.ReadAgain(t0.Add(2*FullReadEvery)))
}

// A free frees only the slots the store shows held by the object this
// node took them for, and forgets only those the view still sees so.
func TestFreeFreesOnlyItsOwnHolders(t *testing.T) {
	v := NewView("n1", 4)
	v.Refreshed([]location.Slot{{Index: 0, Holder: actor("a")}, {Index: 1, Holder: actor("b")}}, time.Unix(0, 0))
	f := v.BeginFree([]uint32{0, 1, 2})
	ops := f.Ops([]location.Slot{
		{Index: 0, Holder: actor("a")}, // still ours: freed
		{Index: 1, Holder: actor("x")}, // another's now: kept
		{Index: 3, Holder: actor("c")}, // not freed here
	}, func(slot uint32) location.Op { return location.FreeSlotOp(location.NodeKey{NodeRid: "n1"}, slot) })
	require.Len(t, ops, 1)
	require.Equal(t, uint32(0), ops[0].Slot)

	v.Hold(1, actor("y")) // taken again meanwhile (a read)
	v.Freed(f)
	v.EndFree(f)
	got, err := v.Pick(3)
	require.NoError(t, err)
	require.Equal(t, []uint32{0, 2, 3}, got, "slot 1 is y's")
}

// A free ends when it applied or the lease ended; it pauses 10 ms, then
// twice as long each time, up to a second.
func TestFreeEndsAndPauses(t *testing.T) {
	var f Free
	require.True(t, f.Ends(nil))
	require.True(t, f.Ends(fmt.Errorf("apply: %w", location.ErrLeaseEnded)))
	require.False(t, f.Ends(fmt.Errorf("apply: %w", location.ErrIndeterminate)))
	require.False(t, f.Ends(&location.ConflictError{}))

	require.Equal(t, 10*time.Millisecond, FreePause(0))
	require.Equal(t, 20*time.Millisecond, FreePause(10*time.Millisecond))
	require.Equal(t, time.Second, FreePause(640*time.Millisecond))
	require.Equal(t, time.Second, FreePause(time.Second), "at most a second")
}

// Forgetting by holder drops only that holder's slot.
func TestDropHolder(t *testing.T) {
	v := NewView("n1", 2)
	v.Refreshed([]location.Slot{{Index: 0, Holder: actor("a")}, {Index: 1, Holder: actor("b")}}, time.Unix(0, 0))
	v.DropHolder(actor("a"))
	got, err := v.Pick(1)
	require.NoError(t, err)
	require.Equal(t, []uint32{0}, got)
	_, err = v.Pick(1)
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "b still holds 1")
}

// A reservation on another node picks the nth free slot, n drawn at
// random, skipping held ones; a full node fails CapacityExceeded.
func TestPickOn(t *testing.T) {
	held := []location.Slot{{Index: 0}, {Index: 2}}
	for nth, want := range []uint32{1, 3, 4} {
		var asked int
		got, err := PickOn("n2", 5, held, func(n int) int { asked = n; return nth })
		require.NoError(t, err)
		require.Equal(t, 3, asked, "draws among the free slots")
		require.Equal(t, want, got, "free slot %d", nth)
	}
	_, err := PickOn("n2", 2, held, func(int) int { t.Fatal("no draw when full"); return 0 })
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
}
