package capslots

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
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

	f := v.BeginFree([]uint32{3}, nil, time.Time{})
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

// A free frees only its own slots that the store shows pending for one of
// its move's participants and that no move running here claims: not an
// active slot (a commit made it an object's), not another holder's, not
// one a later move of the same object took. It forgets in the view only
// those the view still sees held by its participants.
func TestFreeFreesOnlyItsMovesPendingSlots(t *testing.T) {
	v := NewView("n1", 5)
	v.Refreshed([]location.Slot{{Index: 0, Holder: actor("a"), Pending: true}, {Index: 1, Holder: actor("b"), Pending: true}}, time.Unix(0, 0))
	f := v.BeginFree([]uint32{0, 1, 2, 4}, []location.AuthorityKey{actor("a"), actor("m")}, time.Time{})
	claimed := func(slot uint32) bool { return slot == 4 }
	cands := f.Candidates([]location.Slot{
		{Index: 0, Holder: actor("a"), Pending: true}, // still the move's: freed
		{Index: 1, Holder: actor("x"), Pending: true}, // another's now: kept
		{Index: 2, Holder: actor("m")},                // active: a commit's, kept
		{Index: 3, Holder: actor("a"), Pending: true}, // not this free's: kept
		{Index: 4, Holder: actor("a"), Pending: true}, // a running move's: kept
	}, claimed)
	require.Equal(t, []location.Slot{{Index: 0, Holder: actor("a"), Pending: true}}, cands)

	v.Hold(1, actor("y")) // taken again meanwhile (a read)
	v.Freed(f)
	v.EndFree(f)
	got, err := v.Pick(4)
	require.NoError(t, err)
	require.Equal(t, []uint32{0, 2, 3, 4}, got, "slot 1 is y's")
}

// A candidate whose holder's record names it on this node is that
// object's own (reserved here by another node since) and stays; each slot
// freed goes with a check of its holder's record as read, absent or at
// its version.
func TestFreeKeepsASlotItsHoldersRecordNames(t *testing.T) {
	v := NewView("n1", 4)
	spot := location.Key(location.KindUserSpot, "s")
	f := v.BeginFree([]uint32{0, 1, 2}, []location.AuthorityKey{spot, actor("m")}, time.Time{})
	named := &location.Record{Owner: &messages.Owner{NodeRid: "n1"}, CapacitySlot: 1} // slot 0
	records := map[location.AuthorityKey]location.Versioned{spot: {Key: spot, Record: named, Version: 7}}
	ops := f.Ops([]location.Slot{
		{Index: 0, Holder: spot, Pending: true}, // the record names it: kept
		{Index: 1, Holder: spot, Pending: true}, // a stray of the same Spot: freed
		{Index: 2, Holder: actor("m"), Pending: true},
	}, "n1", func(k location.AuthorityKey) (location.Versioned, bool) { r, ok := records[k]; return r, ok },
		func(slot uint32) location.Op { return location.FreeSlotOp(location.NodeKey{NodeRid: "n1"}, slot) })
	require.Equal(t, []location.Op{
		location.CheckOp(spot, 7), location.FreeSlotOp(location.NodeKey{NodeRid: "n1"}, 1),
		location.CheckOp(actor("m"), 0), location.FreeSlotOp(location.NodeKey{NodeRid: "n1"}, 2),
	}, ops)
}

// Two frees of one index keep it from being picked until both ended.
func TestOverlappingFreesHoldTheirIndexUntilTheLastEnds(t *testing.T) {
	v := NewView("n1", 1)
	v.Refreshed(nil, time.Unix(0, 0))
	a := v.BeginFree([]uint32{0}, []location.AuthorityKey{actor("a")}, time.Time{})
	b := v.BeginFree([]uint32{0}, []location.AuthorityKey{actor("b")}, time.Time{})
	v.EndFree(b)
	_, err := v.Pick(1)
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "a still frees 0")
	v.EndFree(a)
	got, err := v.Pick(1)
	require.NoError(t, err)
	require.Equal(t, []uint32{0}, got)
}

// A free ends when a try applied (or found nothing) past its settling
// time, or when the lease ended; otherwise it pauses 10 ms, then twice as
// long each time, up to a second, and while settling no later than the
// settling time.
func TestFreeEndsAndPauses(t *testing.T) {
	t0 := time.Unix(100, 0)
	v := NewView("n1", 2)
	f := v.BeginFree([]uint32{0}, []location.AuthorityKey{actor("a")}, time.Time{})
	for _, c := range []struct {
		err  error
		done bool
	}{
		{nil, true},
		{fmt.Errorf("apply: %w", location.ErrLeaseEnded), true},
		{fmt.Errorf("apply: %w", location.ErrIndeterminate), false},
		{&location.ConflictError{}, false},
	} {
		done, _ := f.Next(c.err, t0, 0)
		require.Equal(t, c.done, done, "%v", c.err)
	}
	settling := v.BeginFree([]uint32{1}, []location.AuthorityKey{actor("a")}, t0.Add(50*time.Millisecond))
	done, pause := settling.Next(nil, t0, 0)
	require.False(t, done, "a take of it may still apply: look again")
	require.Equal(t, 10*time.Millisecond, pause)
	done, pause = settling.Next(nil, t0.Add(45*time.Millisecond), 40*time.Millisecond)
	require.False(t, done)
	require.Equal(t, 5*time.Millisecond, pause, "not past the settling time")
	done, _ = settling.Next(nil, t0.Add(50*time.Millisecond), pause)
	require.True(t, done, "settled")

	require.Equal(t, 10*time.Millisecond, FreePause(0))
	require.Equal(t, 20*time.Millisecond, FreePause(10*time.Millisecond))
	require.Equal(t, time.Second, FreePause(640*time.Millisecond))
	require.Equal(t, time.Second, FreePause(time.Second), "at most a second")
}

// A slot freed elsewhere (a move's commit on its target) makes the view
// read the store again before its next pick.
func TestUnreadMakesTheNextTakeRead(t *testing.T) {
	v := NewView("n1", 2)
	v.Refreshed(nil, time.Unix(0, 0))
	require.True(t, v.Read())
	v.Unread()
	require.False(t, v.Read())
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
