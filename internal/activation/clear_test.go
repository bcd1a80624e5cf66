package activation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// withPointer is cart-1's Ready record with the current activation's
// recovery pointer.
func withPointer(v location.StoreVersion) location.Versioned {
	return record(v, ready, self, &messages.ActivationRecovery{RecoveryKey: "activation-" + op, OperationId: op})
}

// Once the first handler returned, the pointer is removed by
// compare-and-set on the version read, then a read confirms it is gone and
// the root is deleted.
// Reference: docs/PROTOCOL.md §7.5 step 12.
func TestClearRemovesThePointerThenTheRoot(t *testing.T) {
	c, effects := NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	require.Equal(t, []string{"StartTimer", "ReadRecord"}, names(effects))
	require.Equal(t, StartTimer{Timer: TimerDeadline, At: t0.Add(10 * time.Minute)}, effects[0])

	effects = step(t, c, RecordRead{Record: withPointer(40), Now: t0}, "CompareAndSet")
	cas := effects[0].(CompareAndSet)
	require.EqualValues(t, 40, cas.Expected)
	require.Nil(t, cas.Record.GetActivationRecovery())
	require.Equal(t, ready, cas.Record.GetState())

	// An unclear answer is settled by the next read, like a success.
	step(t, c, WriteAnswered{Err: location.ErrIndeterminate, Now: t0}, "ReadRecord")
	step(t, c, RecordRead{Record: record(41, ready, self, nil), Now: t0}, "DeleteRoot", "Finish")
	require.Equal(t, PointerCleared, c.Phase())
}

// Knowing the record it committed Ready, the activation's clear writes
// over it at once: landed, the pointer is gone and the root goes; lost or
// unclear, it reads and carries on as above.
// Reference: docs/PROTOCOL.md §7.5 step 12.
func TestClearWritesOverTheCommittedRecordFirst(t *testing.T) {
	c, effects := NewClear(cfg, cartKey, op, "activation-"+op, withPointer(40), t0)
	require.Equal(t, []string{"StartTimer", "CompareAndSet"}, names(effects))
	cas := effects[1].(CompareAndSet)
	require.EqualValues(t, 40, cas.Expected)
	require.Nil(t, cas.Record.GetActivationRecovery())
	step(t, c, WriteAnswered{Version: 41, Now: t0}, "DeleteRoot", "Finish")
	require.Equal(t, PointerCleared, c.Phase())

	for _, err := range []error{location.ErrConflict, location.ErrIndeterminate} {
		c, _ = NewClear(cfg, cartKey, op, "activation-"+op, withPointer(40), t0)
		step(t, c, WriteAnswered{Err: err, Now: t0}, "ReadRecord")
		// a write after the read that lands is confirmed by a read again
		step(t, c, RecordRead{Record: withPointer(43), Now: t0}, "CompareAndSet")
		step(t, c, WriteAnswered{Version: 44, Now: t0}, "ReadRecord")
	}

	// A record committed for another operation is not written blind.
	other := withPointer(40)
	other.Record.ActivationRecovery.OperationId = "another"
	_, effects = NewClear(cfg, cartKey, op, "activation-"+op, other, t0)
	require.Equal(t, []string{"StartTimer", "ReadRecord"}, names(effects))
}

// A record that moved on (rewritten by a move, or naming another
// activation) is re-read before each attempt; a Closing one is left to
// its release, which removes record and root together.
// Reference: PROTOCOL.md §7.5 step 12, §7.9.
func TestClearFollowsTheRecord(t *testing.T) {
	c, _ := NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	step(t, c, RecordRead{Record: withPointer(40), Now: t0}, "CompareAndSet")
	step(t, c, WriteAnswered{Err: location.ErrConflict, Now: t0}, "ReadRecord")
	moved := withPointer(44)
	moved.Record.Owner = other
	effects := step(t, c, RecordRead{Record: moved, Now: t0}, "CompareAndSet")
	require.EqualValues(t, 44, effects[0].(CompareAndSet).Expected)

	c, _ = NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	closingRec := withPointer(45)
	closingRec.Record.State = closing
	step(t, c, RecordRead{Record: closingRec, Now: t0}, "Finish")
	require.Equal(t, PointerLeftToRelease, c.Phase())

	c, _ = NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	step(t, c, RecordRead{Err: location.ErrNotFound, Now: t0}, "DeleteRoot", "Finish")
	require.Equal(t, PointerCleared, c.Phase())
}

// Failed reads and writes are tried again after a back-off (the machine's
// retry timer); once the bound passes under a live lease the pointer
// stays, logged activation_recovery_clear_failed at error: the Spot serves
// on, and a resume after its owner's end would lose what it did since.
// Reference: PROTOCOL.md §7.5 step 12; docs/FAULTS.md (repeated first
// message).
func TestClearBacksOffThenGivesUp(t *testing.T) {
	c, _ := NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	step(t, c, RecordRead{Record: withPointer(40), Now: t0}, "CompareAndSet")
	effects := step(t, c, WriteAnswered{Err: errStore, Now: t0}, "StartTimer")
	require.Equal(t, StartTimer{Timer: TimerRetry, After: 50 * time.Millisecond}, effects[0])
	require.Equal(t, ClearWaiting, c.Phase())
	step(t, c, TimerFired{Timer: TimerSettle, Now: at(50 * time.Millisecond)}) // not its timer
	step(t, c, TimerFired{Timer: TimerRetry, Now: at(50 * time.Millisecond)}, "ReadRecord")
	step(t, c, RecordRead{Err: errStore, Now: at(51 * time.Millisecond)}, "StartTimer")

	effects = step(t, c, TimerFired{Timer: TimerDeadline, Now: t0.Add(10 * time.Minute)}, "Log", "Finish")
	l := effects[0].(Log)
	require.Equal(t, "activation_recovery_clear_failed", l.Event)
	require.Equal(t, loglevel.Error, l.Level)
	require.Equal(t, cartKey.ID, l.SpotID)
	require.Equal(t, ClearGaveUp, c.Phase())
	require.Empty(t, c.Step(TimerFired{Timer: TimerRetry, Now: t0.Add(11 * time.Minute)}))

	// An answer that comes after the bound ends the removal too.
	c, _ = NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	step(t, c, RecordRead{Record: withPointer(40), Now: t0}, "CompareAndSet")
	step(t, c, WriteAnswered{Now: t0.Add(10 * time.Minute)}, "Log", "Finish")
	require.Equal(t, ClearGaveUp, c.Phase())
}

// A node whose lease has ended can never write the removal (its writes
// are refused, and must not be retried under that lease): the machine
// gives up at once instead of retrying for ten minutes.
// Reference: docs/FAULTS.md (a late write cannot land).
func TestClearGivesUpWhenTheLeaseEnded(t *testing.T) {
	c, _ := NewClear(cfg, cartKey, op, "activation-"+op, location.Versioned{}, t0)
	step(t, c, RecordRead{Record: withPointer(40), Now: t0}, "CompareAndSet")
	effects := step(t, c, WriteAnswered{Err: location.ErrLeaseEnded, Now: t0}, "Log", "Finish")
	require.Equal(t, "activation_recovery_clear_failed", effects[0].(Log).Event)
	require.Equal(t, loglevel.Warn, effects[0].(Log).Level, "nothing runs on an ended lifecycle: only the replay is to come")
	require.Equal(t, ClearGaveUp, c.Phase())
}
