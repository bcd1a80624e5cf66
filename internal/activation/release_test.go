package activation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// closingRecord is cart-1 Closing at generation 40 under this node.
func closingRecord(v location.StoreVersion, rr *messages.ActivationRecovery) location.Versioned {
	return record(v, closing, self, rr)
}

func newRelease(t *testing.T) (*Release, *location.Record) {
	t.Helper()
	wasReady := record(80, ready, self, nil).Record
	r, effects := NewRelease(cfg, cartKey, 40, 81, wasReady, t0)
	require.Equal(t, []string{"DropRoute", "StartTimer", "CloseLocal"}, names(effects))
	require.Equal(t, DropRoute{SpotID: cartKey.ID}, effects[0])
	require.Equal(t, StartTimer{Timer: TimerDeadline, At: t0.Add(30 * time.Second)}, effects[1])
	require.Equal(t, CloseLocal{Key: cartKey, Generation: 40}, effects[2])
	return r, wasReady
}

// After the Closing write the local incarnation handles what it accepted
// and stops; then the record is deleted with its version while it is
// still Closing at the closed generation under this owner, and a root it
// still names is deleted.
// Reference: docs/PROTOCOL.md §7.9.
func TestReleaseDeletesTheClosingRecord(t *testing.T) {
	r, _ := newRelease(t)
	effects := step(t, r, LocalClosed{}, "ReadRecord")
	require.Equal(t, ReadRecord{Key: cartKey}, effects[0])
	closing := closingRecord(81, &messages.ActivationRecovery{RecoveryKey: "activation-x"})
	effects = step(t, r, RecordRead{Record: closing, Now: t0}, "Delete")
	require.Equal(t, Delete{Key: cartKey, Version: 81, Record: closing.Record}, effects[0])
	effects = step(t, r, Deleted{Now: t0}, "DeleteRoot", "Finish")
	require.Equal(t, DeleteRoot{RootKey: "activation-x"}, effects[0])
	require.NoError(t, effects[1].(Finish).Err)
	require.Equal(t, AuthorityReleased, r.Phase())

	// A slow local close is logged and the release goes on; a record
	// already gone is released.
	r, _ = newRelease(t)
	effects = step(t, r, LocalClosed{Err: roamerr.ErrDeadlineExceeded}, "Log", "ReadRecord")
	require.Equal(t, "close_local_slow", effects[0].(Log).Event)
	step(t, r, RecordRead{Err: location.ErrNotFound, Now: t0}, "Finish")
	require.Equal(t, AuthorityReleased, r.Phase())

	r, _ = newRelease(t)
	step(t, r, LocalClosed{Err: roamerr.ErrNotFound}, "ReadRecord")
}

// A record that is no longer this close's (another generation, owner or
// state) ends the close Stale and is not deleted.
// Reference: PROTOCOL.md §7.9 (the record is released with the same fence).
func TestReleaseRefusesAChangedRecord(t *testing.T) {
	r, _ := newRelease(t)
	step(t, r, LocalClosed{}, "ReadRecord")
	effects := step(t, r, RecordRead{Record: record(90, ready, self, nil), Now: t0}, "Finish")
	require.ErrorIs(t, effects[0].(Finish).Err, roamerr.ErrStale)
	require.Equal(t, ReleaseFailed, r.Phase())
}

// Failed reads and deletes are tried again after a back-off; past the
// bound the close fails, logged spot_release_failed, the record staying
// Closing. A lease that ended ends the retries at once.
// Reference: PROTOCOL.md §7.9; docs/FAULTS.md (a late write cannot land).
func TestReleaseBacksOffThenGivesUp(t *testing.T) {
	r, _ := newRelease(t)
	step(t, r, LocalClosed{}, "ReadRecord")
	step(t, r, RecordRead{Record: closingRecord(81, nil), Now: t0}, "Delete")
	effects := step(t, r, Deleted{Err: errStore, Now: t0}, "StartTimer")
	require.Equal(t, StartTimer{Timer: TimerRetry, After: 20 * time.Millisecond}, effects[0])
	step(t, r, TimerFired{Timer: TimerRetry, Now: at(20 * time.Millisecond)}, "ReadRecord")
	step(t, r, RecordRead{Err: errStore, Now: at(21 * time.Millisecond)}, "StartTimer")
	effects = step(t, r, TimerFired{Timer: TimerDeadline, Now: t0.Add(30 * time.Second)}, "Log", "Finish")
	require.Equal(t, "spot_release_failed", effects[0].(Log).Event)
	require.Equal(t, loglevel.Error, effects[0].(Log).Level)
	err := effects[1].(Finish).Err
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.ErrorIs(t, err, errStore)
	require.Equal(t, ReleaseFailed, r.Phase())

	r, _ = newRelease(t)
	step(t, r, LocalClosed{}, "ReadRecord")
	step(t, r, RecordRead{Record: closingRecord(81, nil), Now: t0}, "Delete")
	effects = step(t, r, Deleted{Err: location.ErrLeaseEnded, Now: t0}, "Log", "Finish")
	require.ErrorIs(t, effects[1].(Finish).Err, location.ErrLeaseEnded)
}

// A Spot that turned out to be moving when its local close began is put
// back to Ready over the Closing write, and the close ends Unavailable; a
// revert that fails is logged.
// Reference: PROTOCOL.md §7.9 (a Spot that is moving: Unavailable).
func TestReleaseRevertsAMovingSpot(t *testing.T) {
	moving := roamerr.ErrUnavailable
	r, wasReady := newRelease(t)
	effects := step(t, r, LocalClosed{Err: moving}, "CompareAndSet")
	require.Equal(t, CompareAndSet{Key: cartKey, Expected: 81, Record: wasReady}, effects[0])
	require.Equal(t, Reverting, r.Phase())
	effects = step(t, r, WriteAnswered{Version: 82, Now: t0}, "Finish")
	require.ErrorIs(t, effects[0].(Finish).Err, roamerr.ErrUnavailable)
	require.Equal(t, CloseReverted, r.Phase())

	r, _ = newRelease(t)
	step(t, r, LocalClosed{Err: moving}, "CompareAndSet")
	effects = step(t, r, WriteAnswered{Err: location.ErrConflict, Now: t0}, "Log", "Finish")
	require.Equal(t, "spot_close_revert_failed", effects[0].(Log).Event)
	require.ErrorIs(t, effects[1].(Finish).Err, roamerr.ErrUnavailable)
}
