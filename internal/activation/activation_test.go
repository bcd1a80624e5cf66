package activation

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// A Missing Spot is activated here: the envelope is stored as the recovery
// root, the Spot reserved (Missing → Creating) with the root's receipt in
// one transaction that checks the ID is no User Spot, staged, committed
// Ready keeping the pointer, and opened with the first message at the
// head; the pointer's removal is tied to that message's operation.
// Reference: docs/PROTOCOL.md §7.5 steps 8–12.
func TestColdActivationHappyPath(t *testing.T) {
	a, res := toReserve(t)
	require.Equal(t, cartKey, res.Key)
	require.Zero(t, res.Expected, "created only if absent")
	require.Equal(t, location.KindUserSpot, res.Other, "the same ID must not be a User Spot")
	rec := res.Record
	require.Equal(t, creating, rec.GetState())
	require.Equal(t, NewGeneration(0, at(time.Millisecond)), rec.GetObjectGeneration(), "generation from the read's time")
	require.EqualValues(t, 1, rec.GetAuthorityOwnerGeneration())
	require.True(t, proto.Equal(self, rec.GetOwner()))
	rr := rec.GetActivationRecovery()
	require.Equal(t, "activation-"+op, rr.GetRecoveryKey())
	require.Equal(t, op, rr.GetOperationId())
	require.Equal(t, deadline.UnixNano(), rr.GetDeadlineUnixNanos())
	require.Equal(t, rec.GetObjectGeneration(), rr.GetReservationFence())
	require.EqualValues(t, 10, rr.GetRootSize())

	effects := step(t, a, WriteAnswered{Version: 7, Now: at(2 * time.Millisecond)}, "Stage")
	st := effects[0].(Stage)
	require.Equal(t, Stage{Key: cartKey, StableType: "cart", Generation: rec.GetObjectGeneration(), OwnerGeneration: 1}, st)

	effects = step(t, a, Staged{}, "CompareAndSet")
	cas := effects[0].(CompareAndSet)
	require.EqualValues(t, 7, cas.Expected, "Ready over the reservation's version")
	require.Equal(t, ready, cas.Record.GetState())
	require.NotNil(t, cas.Record.GetActivationRecovery(), "Ready keeps the recovery pointer")

	effects = step(t, a, WriteAnswered{Version: 8, Now: at(3 * time.Millisecond)}, "Open")
	open := effects[0].(Open)
	require.Equal(t, []any{"first"}, open.Messages)
	require.Equal(t, op, open.FirstOperation)
	require.Equal(t, "activation-"+op, open.RootKey)

	effects = step(t, a, Opened{}, "Measure", "Log", "ReleaseCapacity", "UnlockKey", "Finish")
	require.Equal(t, Measure{Outcome: "ok", Activated: true}, effects[0])
	require.Equal(t, "spot_activated", effects[1].(Log).Event)
	require.NoError(t, effects[4].(Finish).Err)
	require.Equal(t, Activated, a.Phase())
	require.Empty(t, a.Step(Opened{}), "a finished machine ignores late answers")
}

// When the source read the ID Missing just before sending, the target
// reserves at once, without reading the authority again: the reservation
// lands only on an absent ID. Lost, it reads and decides as usual (here:
// another node's Ready record, which gets the first message); a second
// attempt always reads first.
// Reference: docs/PROTOCOL.md §7.5 steps 8–9.
func TestSourceReadMissingReservesWithoutARead(t *testing.T) {
	s := start(stateless)
	s.Envelope.SourceReadMissing = true
	a, effects := NewActivation(cfg, s)
	require.Equal(t, []string{"StartTimer", "LockKey"}, names(effects))
	step(t, a, KeyLocked{Now: t0}, "AdmitCapacity")
	step(t, a, CapacityAdmitted{}, "PutRoot")
	effects = step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op, SHA256: [32]byte{9}, Size: 10}}, "Reserve")
	res := effects[0].(Reserve)
	require.Zero(t, res.Expected, "created only if absent")
	require.Equal(t, location.KindUserSpot, res.Other)
	require.Equal(t, NewGeneration(0, t0), res.Record.GetObjectGeneration())

	step(t, a, WriteAnswered{Err: &location.ConflictError{Op: "txn"}, Now: at(time.Millisecond)}, "DeleteRoot", "ReleaseCapacity", "ReadAuthority")
	winner := record(12, ready, other, nil)
	effects = step(t, a, AuthorityRead{Authority: Authority{Versioned: winner, Address: "n2:9000"}, Now: at(time.Millisecond)},
		"Forward", "Measure", "UnlockKey", "Finish")
	require.Equal(t, Forward{Address: "n2:9000", Key: cartKey, Record: winner.Record}, effects[0])

	// Refused a creation slot on that attempt (a full or draining node),
	// it reads: the Spot may be Ready by now, and its message needs no slot.
	s = start(stateless)
	s.Envelope.SourceReadMissing = true
	a, _ = NewActivation(cfg, s)
	step(t, a, KeyLocked{Now: t0}, "AdmitCapacity")
	step(t, a, CapacityAdmitted{Err: roamerr.ErrCapacityExceeded}, "ReadAuthority")
	effects = step(t, a, AuthorityRead{Authority: Authority{Versioned: winner, Address: "n2:9000"}, Now: at(time.Millisecond)},
		"Forward", "Measure", "UnlockKey", "Finish")
	require.Equal(t, Forward{Address: "n2:9000", Key: cartKey, Record: winner.Record}, effects[0])

	// Without the flag (a reactivation, a wait on a Creating owner) the
	// first attempt reads.
	a, _ = NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
}

// A reservation that loses its race (conflict) deletes its root, gives its
// creation slot back and reads again; the winner is Ready under a live
// owner, so the first message is forwarded to it, once.
// Reference: PROTOCOL.md §7.6.
func TestConflictOnReserveReadsAgainAndForwards(t *testing.T) {
	a, _ := toReserve(t)
	effects := step(t, a, WriteAnswered{Err: &location.ConflictError{Op: "txn"}, Now: at(time.Second)}, "DeleteRoot", "ReleaseCapacity", "ReadAuthority")
	require.Equal(t, "activation-"+op, effects[0].(DeleteRoot).RootKey)
	require.Equal(t, Resolving, a.Phase())

	winner := record(12, ready, other, nil)
	effects = step(t, a, AuthorityRead{Authority: Authority{Versioned: winner, Address: "n2:9000"}, Now: at(time.Second)},
		"Forward", "Measure", "UnlockKey", "Finish")
	require.Equal(t, Forward{Address: "n2:9000", Key: cartKey, Record: winner.Record}, effects[0])
	require.Equal(t, Measure{Outcome: "forwarded"}, effects[1])
	require.Equal(t, Forwarded, a.Phase())
}

// An indeterminate reservation is settled by consistent re-reads: the
// attempt's own mark means it applied; another activation's record, or
// none, means it did not (read again); a store that keeps failing leaves
// it unknown until the deadline, which fails DeadlineExceeded — the
// pauses are the machine's timers.
// Reference: PROTOCOL.md §7.5 step 9, §3.3 (an indeterminate outcome is
// settled by a consistent read).
func TestIndeterminateReserveIsSettled(t *testing.T) {
	indeterminate := WriteAnswered{Err: location.ErrIndeterminate, Now: at(time.Second)}

	t.Run("own mark", func(t *testing.T) {
		a, res := toReserve(t)
		effects := step(t, a, indeterminate, "ReadRecord")
		require.Equal(t, ReadRecord{Key: cartKey}, effects[0])
		step(t, a, RecordRead{Record: location.Versioned{Key: cartKey, Version: 21, Record: res.Record}, Now: at(time.Second)}, "Stage")
		effects = step(t, a, Staged{}, "CompareAndSet")
		require.EqualValues(t, 21, effects[0].(CompareAndSet).Expected, "the settled version")
	})

	t.Run("another's record", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, indeterminate, "ReadRecord")
		theirs := record(22, creating, other, &messages.ActivationRecovery{OperationId: "op-theirs"})
		step(t, a, RecordRead{Record: theirs, Now: at(time.Second)}, "DeleteRoot", "ReleaseCapacity", "ReadAuthority")
	})

	t.Run("no record", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, indeterminate, "ReadRecord")
		step(t, a, RecordRead{Err: location.ErrNotFound, Now: at(time.Second)}, "DeleteRoot", "ReleaseCapacity", "ReadAuthority")
	})

	t.Run("reads fail until the deadline", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, indeterminate, "ReadRecord")
		effects := step(t, a, RecordRead{Err: errStore, Now: at(time.Second)}, "StartTimer")
		require.Equal(t, StartTimer{Timer: TimerSettle, After: 20 * time.Millisecond}, effects[0])
		require.Equal(t, Reserving, a.Phase())
		step(t, a, TimerFired{Timer: TimerSettle, Now: at(time.Second + 20*time.Millisecond)}, "ReadRecord")
		step(t, a, RecordRead{Err: errStore, Now: at(time.Second + 21*time.Millisecond)}, "StartTimer")
		effects = step(t, a, TimerFired{Timer: TimerDeadline, Now: deadline},
			"StopTimer", "DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		err := failedWith(t, a, effects)
		require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
		require.ErrorIs(t, err, errStore, "the last error is kept")
		require.Contains(t, err.Error(), "outcome of a write to instance_spot")
		require.Equal(t, Measure{Outcome: roamerr.Code(err)}, effects[4])
	})

	t.Run("a read fails past the deadline", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, indeterminate, "ReadRecord")
		effects := step(t, a, RecordRead{Err: errStore, Now: deadline},
			"DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrDeadlineExceeded)
	})

	t.Run("a late settle timer changes nothing", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, TimerFired{Timer: TimerSettle, Now: at(time.Second)})
		require.Equal(t, Reserving, a.Phase())
	})
}

// An attempt that must read again after the deadline fails
// DeadlineExceeded instead of reading.
// Reference: PROTOCOL.md §7.4 (one deadline across resolve and activation).
func TestNoAttemptAfterTheDeadline(t *testing.T) {
	a, _ := toReserve(t)
	effects := step(t, a, WriteAnswered{Err: location.ErrConflict, Now: deadline},
		"DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
	err := failedWith(t, a, effects)
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	require.Contains(t, err.Error(), `activation of Spot "cart-1"`)
}

// An Instance Spot whose owner ended with its recovery pointer set is
// resumed here: the record is taken over (same generation, next owner
// generation, this node as owner, Creating), and the stored first message
// is dispatched first, then the current one; the resumption warns that the
// stored message may run a second time.
// Reference: PROTOCOL.md §7.7, §7.10.
func TestEndedOwnerWithRecoveryPointerIsResumed(t *testing.T) {
	for _, c := range []struct {
		name    string
		current string
		want    []any
	}{
		{"another operation", op, []any{"stored-first", "first"}},
		{"the same operation", storedOp, []any{"stored-first"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := start(stateless)
			s.Envelope.OperationId = c.current
			a, _ := NewActivation(cfg, s)
			step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
			ended := record(30, ready, other, receipt(time.Time{}))
			effects := step(t, a, AuthorityRead{Authority: Authority{Versioned: ended, OwnerEnded: true}, Now: t0}, "GetRoot")
			require.Equal(t, GetRoot{RootKey: storedRef.Key}, effects[0])
			require.Equal(t, ReadingRoot, a.Phase())

			effects = step(t, a, RootGot{Ref: storedRef, Operation: storedOp, First: "stored-first"}, "CompareAndSet")
			took := effects[0].(CompareAndSet)
			require.EqualValues(t, 30, took.Expected)
			require.EqualValues(t, 40, took.Record.GetObjectGeneration(), "the same generation")
			require.EqualValues(t, 3, took.Record.GetAuthorityOwnerGeneration(), "the next owner generation")
			require.True(t, proto.Equal(self, took.Record.GetOwner()))
			require.Equal(t, creating, took.Record.GetState())
			require.Equal(t, TakingOver, a.Phase())

			effects = step(t, a, WriteAnswered{Version: 31, Now: t0}, "Log", "Stage")
			l := effects[0].(Log)
			require.Equal(t, "activation_resumed", l.Event)
			require.Equal(t, loglevel.Warn, l.Level)
			require.Equal(t, storedOp, l.OperationID)
			require.EqualValues(t, 3, effects[1].(Stage).OwnerGeneration)

			step(t, a, Staged{}, "CompareAndSet")
			effects = step(t, a, WriteAnswered{Version: 32, Now: t0}, "Open")
			open := effects[0].(Open)
			require.Equal(t, c.want, open.Messages)
			require.Equal(t, storedOp, open.FirstOperation)
			require.Equal(t, storedRef.Key, open.RootKey)
			step(t, a, Opened{}, "Measure", "Log", "UnlockKey", "Finish")
			require.Equal(t, Activated, a.Phase())
		})
	}
}

// A recovery pointer whose root is gone (the first handler completed and
// the root was deleted, but the pointer's removal was not seen) is
// dropped, and the authority read again: the record is then an ended
// owner's Ready record, reactivated empty.
// Reference: PROTOCOL.md §7.5 step 12, §7.10.
func TestMissingRootDropsThePointer(t *testing.T) {
	a, _ := NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	ended := record(30, ready, other, receipt(time.Time{}))
	step(t, a, AuthorityRead{Authority: Authority{Versioned: ended, OwnerEnded: true}, Now: t0}, "GetRoot")
	effects := step(t, a, RootGot{Err: location.ErrNotFound}, "CompareAndSet")
	drop := effects[0].(CompareAndSet)
	require.EqualValues(t, 30, drop.Expected)
	require.Nil(t, drop.Record.GetActivationRecovery())
	require.Equal(t, ready, drop.Record.GetState())
	require.Equal(t, DroppingPointer, a.Phase())
	step(t, a, WriteAnswered{Version: 31, Now: t0}, "ReadAuthority")

	dropped := record(31, ready, other, nil)
	step(t, a, AuthorityRead{Authority: Authority{Versioned: dropped, OwnerEnded: true}, Now: t0}, "AdmitCapacity")
	step(t, a, CapacityAdmitted{}, "PutRoot")
	effects = step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op}}, "Reserve")
	res := effects[0].(Reserve)
	require.EqualValues(t, 31, res.Expected, "the ended owner's record is replaced with its fence")
	require.Greater(t, res.Record.GetObjectGeneration(), uint64(40), "a new generation")
}

// A PreserveStateWith kind is not reactivated empty after its owner ended
// unless it opted in (ReactivateEmpty): the call answers Unavailable naming
// ReleaseEnded, logged reactivation_refused; with the opt-in it is
// reactivated (spot_reactivated).
// Reference: PROTOCOL.md §7.10 (automatic release only where no state is lost).
func TestPreservedStateIsNotReactivatedWithoutOptIn(t *testing.T) {
	ended := record(30, ready, other, nil)
	read := AuthorityRead{Authority: Authority{Versioned: ended, OwnerEnded: true}, Now: t0}

	a, _ := NewActivation(cfg, start(preserved))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	effects := step(t, a, read, "Log", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
	require.Equal(t, "reactivation_refused", effects[0].(Log).Event)
	require.Equal(t, "n2", effects[0].(Log).OwnerNodeRid)
	err := failedWith(t, a, effects)
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.Contains(t, err.Error(), "ReleaseEnded")

	optIn := preserved
	optIn.ReactivateEmpty = true
	a, _ = NewActivation(cfg, start(optIn))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	effects = step(t, a, read, "Log", "AdmitCapacity")
	require.Equal(t, []string{"spot_reactivated"}, logEvents(effects))
}

// Creating or Closing under a live owner is waited for: the machine
// watches the record from the version it read, then reads again; a watch
// that fails ends the activation with its error.
// Reference: PROTOCOL.md §7.5 step 8 (a Creating record under a live owner
// is waited for).
func TestCreatingUnderALiveOwnerIsWatched(t *testing.T) {
	for _, state := range []messages.LifecycleState{creating, closing} {
		t.Run(state.String(), func(t *testing.T) {
			a, _ := NewActivation(cfg, start(stateless))
			step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
			busy := record(50, state, other, receipt(deadline))
			effects := step(t, a, AuthorityRead{Authority: Authority{Versioned: busy, Address: "n2:9000"}, Now: t0}, "Watch")
			require.Equal(t, Watch{Key: cartKey, After: 50}, effects[0])
			require.Equal(t, Watching, a.Phase())
			step(t, a, Watched{Now: at(time.Second)}, "ReadAuthority")
			step(t, a, AuthorityRead{Authority: Authority{Versioned: busy, Address: "n2:9000"}, Now: at(time.Second)}, "Watch")
			watchErr := roamerr.ErrDeadlineExceeded
			effects = step(t, a, Watched{Err: watchErr, Now: deadline}, "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
			require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrDeadlineExceeded)
		})
	}
}

// A reservation still Creating AbandonGrace after its activation's
// deadline is treated like an ended owner's, even under a live owner: it
// is resumed from its root. Until then it is waited for. The rule reads
// the time the authority read carries.
// Reference: PROTOCOL.md §7.7, §7.2 (no authority stays Creating forever).
func TestAbandonedReservationIsTreatedAsEnded(t *testing.T) {
	recDeadline := t0.Add(-time.Minute)
	stuck := record(50, creating, other, receipt(recDeadline))
	for _, c := range []struct {
		name string
		now  time.Time
		want string
	}{
		{"within the grace", recDeadline.Add(AbandonGrace), "Watch"},
		{"past the grace", recDeadline.Add(AbandonGrace + time.Nanosecond), "GetRoot"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := start(stateless)
			s.Now = c.now
			s.Envelope.DeadlineUnixNanos = c.now.Add(5 * time.Second).UnixNano()
			a, _ := NewActivation(cfg, s)
			step(t, a, KeyLocked{Now: c.now}, "ReadAuthority")
			step(t, a, AuthorityRead{Authority: Authority{Versioned: stuck, Address: "n2:9000"}, Now: c.now}, c.want)
		})
	}
	require.False(t, Abandoned(stuck.Record, recDeadline.Add(AbandonGrace)))
	require.True(t, Abandoned(stuck.Record, recDeadline.Add(AbandonGrace+time.Nanosecond)))
	require.False(t, Abandoned(record(50, ready, other, receipt(recDeadline)).Record, t0), "only a Creating record")
	require.False(t, Abandoned(record(50, creating, other, receipt(time.Time{})).Record, t0), "only with a deadline")
}

// A record of this node's own with no incarnation behind it (an earlier
// attempt here lost its answer from the store) is resumed like an ended
// owner's; one that this node hosts is a live owner's.
// Reference: PROTOCOL.md §7.7.
func TestStrandedOwnRecordIsResumed(t *testing.T) {
	own := record(60, creating, self, receipt(deadline))
	a, _ := NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, AuthorityRead{Authority: Authority{Versioned: own, Address: "n1:9000"}, Now: t0}, "GetRoot")

	a, _ = NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, AuthorityRead{Authority: Authority{Versioned: own, Address: "n1:9000", Hosted: true}, Now: t0}, "Watch")
}

// A failure of the incarnation's open after the Ready commit keeps the
// pointer (a live node's scan resumes it once this lifecycle ends): no
// abort, no discard. Failures before the commit release the reservation
// with its fence and delete the root; a lost commit only discards.
// Reference: PROTOCOL.md §7.5 steps 10–12, §7.7.
func TestFailuresAroundTheReadyCommit(t *testing.T) {
	openErr := roamerr.ErrUnavailable

	t.Run("open fails after Ready", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		step(t, a, WriteAnswered{Version: 8, Now: t0}, "Open")
		// Ready with the pointer kept: a live node resumes the activation
		// and runs the first message, so its outcome is unknown here.
		effects := step(t, a, Opened{Err: openErr}, "DiscardStaged", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrDeadlineExceeded)
	})

	t.Run("commit unsettled at the deadline, still the reservation: fenced, then aborted", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		late := t0.Add(time.Hour)
		effects := step(t, a, WriteAnswered{Err: context.DeadlineExceeded, Now: late}, "ReadRecord")
		require.Equal(t, SettlingCommit, a.Phase())
		require.True(t, effects[0].(ReadRecord).Settle, "past the deadline: a timeout of its own")
		rec := a.rec
		effects = step(t, a, RecordRead{Record: location.Versioned{Key: cartKey, Version: 7, Record: rec}, Now: late}, "CompareAndSet")
		require.Equal(t, CompareAndSet{Key: cartKey, Expected: 7, Record: rec, Settle: true}, effects[0], "the same reservation: the commit can no longer land")
		effects = step(t, a, WriteAnswered{Version: 9, Now: late}, "DiscardStaged", "AbortReservation")
		require.Equal(t, AbortReservation{Key: cartKey, Version: 9, Record: a.rec}, effects[1])
	})

	t.Run("commit unsettled at the deadline, landed: opened", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		late := t0.Add(time.Hour)
		step(t, a, WriteAnswered{Err: context.DeadlineExceeded, Now: late}, "ReadRecord")
		step(t, a, RecordRead{Record: location.Versioned{Key: cartKey, Version: 8, Record: a.ready}, Now: late}, "Open")
		step(t, a, Opened{}, "Measure", "Log", "ReleaseCapacity", "UnlockKey", "Finish")
		require.Equal(t, Activated, a.Phase())
	})

	t.Run("stage fails", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		effects := step(t, a, Staged{Err: openErr}, "AbortReservation")
		require.Equal(t, AbortReservation{Key: cartKey, Version: 7, Record: a.rec}, effects[0])
		require.Equal(t, Aborting, a.Phase())
		effects = step(t, a, AbortAnswered{}, "DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrUnavailable)
	})

	t.Run("commit fails", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		step(t, a, WriteAnswered{Err: errStore, Now: t0}, "DiscardStaged", "AbortReservation")
		effects := step(t, a, AbortAnswered{Err: location.ErrConflict}, "DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		err := failedWith(t, a, effects)
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		require.Contains(t, err.Error(), "commit instance_spot")
	})

	t.Run("abort fails", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{Err: openErr}, "AbortReservation")
		effects := step(t, a, AbortAnswered{Err: errStore}, "Log", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.Equal(t, []string{"reservation_abort_failed", "activation_failed"}, logEvents(effects), "the root stays with the reservation")
	})

	t.Run("commit lost", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		step(t, a, WriteAnswered{Err: location.ErrConflict, Now: t0}, "DiscardStaged", "ReleaseCapacity", "ReadAuthority")
	})
}

// The envelope is checked before anything is locked or read: a malformed
// one is InvalidOperation, one meant for another lifecycle of this address
// Unavailable, and an invalid Spot ID its own error.
// Reference: PROTOCOL.md §7.5 steps 7–8 (route kind 2, target descriptor fence).
func TestEnvelopeIsCheckedFirst(t *testing.T) {
	badID := errors.New("invalid id")
	for _, c := range []struct {
		name   string
		change func(*Start)
		want   error
	}{
		{"route kind", func(s *Start) { s.Envelope.RouteKind = 1 }, roamerr.ErrInvalidOperation},
		{"no operation", func(s *Start) { s.Envelope.OperationId = "" }, roamerr.ErrInvalidOperation},
		{"no first message", func(s *Start) { s.Envelope.First = nil }, roamerr.ErrInvalidOperation},
		{"invalid id", func(s *Start) { s.IDErr = badID }, badID},
		{"another lifecycle", func(s *Start) { s.Envelope.TargetNodeGeneration = 2 }, roamerr.ErrUnavailable},
		{"undecodable first", func(s *Start) { s.FirstErr = roamerr.ErrTypeMismatch }, roamerr.ErrTypeMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := start(stateless)
			c.change(&s)
			a, effects := NewActivation(cfg, s)
			require.Equal(t, []string{"Measure", "RespondFailure", "Log", "Finish"}, names(effects))
			require.ErrorIs(t, failedWith(t, a, effects), c.want)
		})
	}
}

// Instance intent to a User Spot, or naming another stable type than the
// stored one, is TypeMismatch; a type this node does not host cannot be
// cold-activated here (NotFound).
// Reference: PROTOCOL.md §7.5 steps 2 and 8.
func TestTypeChecks(t *testing.T) {
	user := location.Versioned{Key: location.Key(location.KindUserSpot, cartKey.ID), Version: 3, Record: &location.Record{State: ready, Owner: other}}
	otherType := record(4, ready, other, nil)
	otherType.Record.StableType = "vault"
	for _, c := range []struct {
		name string
		kind Kind
		read AuthorityRead
		want error
	}{
		{"User Spot", stateless, AuthorityRead{Authority: Authority{Versioned: user}, Now: t0}, roamerr.ErrTypeMismatch},
		{"other type", stateless, AuthorityRead{Authority: Authority{Versioned: otherType}, Now: t0}, roamerr.ErrTypeMismatch},
		{"not hosted here", Kind{}, missing(t0), roamerr.ErrNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, _ := NewActivation(cfg, start(c.kind))
			step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
			effects := a.Step(c.read)
			require.ErrorIs(t, failedWith(t, a, effects), c.want)
		})
	}
}

// A node full for a new Spot passes the envelope on to another candidate
// (nothing reserved here); only when no candidate is left does the call
// end CapacityExceeded.
// Reference: PROTOCOL.md §7.5 step 9.
func TestFullNodePassesOn(t *testing.T) {
	full := roamerr.ErrCapacityExceeded
	a, _ := NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, missing(t0), "AdmitCapacity")
	step(t, a, CapacityAdmitted{Err: full}, "UnlockKey", "PassOn")
	require.Equal(t, PassingOn, a.Phase())
	step(t, a, PassedOn{OK: true}, "Finish")
	require.Equal(t, HandedOn, a.Phase())

	a, _ = NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, missing(t0), "AdmitCapacity")
	step(t, a, CapacityAdmitted{Err: full}, "UnlockKey", "PassOn")
	effects := step(t, a, PassedOn{}, "Measure", "RespondFailure", "Log", "Finish")
	require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrCapacityExceeded)
}

// The start-up scan resumes an interrupted activation of an ended owner
// under the Spot ID's lock, only if the record is still the one it
// listed, with only the stored first message; anything that changed is
// left to whoever changed it. A live owner's, or a record without a
// pointer, is left alone.
// Reference: PROTOCOL.md §7.7.
func TestRecoveryResumesAnInterruptedActivation(t *testing.T) {
	interrupted := record(70, creating, other, receipt(time.Time{}))
	rec := Recover{Scanned: interrupted, Kind: stateless, Deadline: at(time.Minute), Now: t0}

	t.Run("owner ended", func(t *testing.T) {
		a, effects := NewRecovery(cfg, rec)
		require.Equal(t, []string{"StartTimer", "ReadOwner"}, names(effects))
		step(t, a, OwnerRead{Alive: false}, "LockKey")
		effects = step(t, a, KeyLocked{Now: t0}, "ReadRecord")
		require.Equal(t, ReadRecord{Key: cartKey}, effects[0])
		step(t, a, RecordRead{Record: interrupted, Now: t0}, "GetRoot")
		step(t, a, RootGot{Ref: storedRef, Operation: storedOp, First: "stored-first"}, "CompareAndSet")
		step(t, a, WriteAnswered{Version: 71, Now: t0}, "Log", "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		effects = step(t, a, WriteAnswered{Version: 72, Now: t0}, "Open")
		require.Equal(t, []any{"stored-first"}, effects[0].(Open).Messages)
		step(t, a, Opened{}, "Measure", "Log", "UnlockKey", "Finish")
		require.Equal(t, Activated, a.Phase())
		require.NoError(t, a.Err())
	})

	t.Run("takeover lost", func(t *testing.T) {
		a, _ := NewRecovery(cfg, rec)
		step(t, a, OwnerRead{}, "LockKey")
		step(t, a, KeyLocked{Now: t0}, "ReadRecord")
		step(t, a, RecordRead{Record: interrupted, Now: t0}, "GetRoot")
		step(t, a, RootGot{Ref: storedRef, Operation: storedOp, First: "stored-first"}, "CompareAndSet")
		step(t, a, WriteAnswered{Err: location.ErrConflict, Now: t0}, "UnlockKey", "Finish")
		require.Equal(t, Untouched, a.Phase(), "no second read: whoever changed it carries on")
	})

	t.Run("changed since the scan", func(t *testing.T) {
		a, _ := NewRecovery(cfg, rec)
		step(t, a, OwnerRead{}, "LockKey")
		step(t, a, KeyLocked{Now: t0}, "ReadRecord")
		step(t, a, RecordRead{Record: record(75, ready, self, nil), Now: t0}, "UnlockKey", "Finish")
		require.Equal(t, Untouched, a.Phase())
	})

	t.Run("owner alive", func(t *testing.T) {
		a, _ := NewRecovery(cfg, rec)
		step(t, a, OwnerRead{Alive: true}, "Finish")
		require.Equal(t, Untouched, a.Phase())
	})

	t.Run("owner unknown", func(t *testing.T) {
		a, _ := NewRecovery(cfg, rec)
		effects := step(t, a, OwnerRead{Err: roamerr.ErrUnavailable}, "Finish")
		require.ErrorIs(t, effects[0].(Finish).Err, roamerr.ErrUnavailable)
		require.Equal(t, Failed, a.Phase())
	})

	t.Run("abandoned under a live owner", func(t *testing.T) {
		r := rec
		r.Scanned = record(70, creating, other, receipt(t0.Add(-time.Hour)))
		_, effects := NewRecovery(cfg, r)
		require.Equal(t, []string{"StartTimer", "LockKey"}, names(effects), "no liveness check")
	})

	t.Run("nothing to do", func(t *testing.T) {
		for _, r := range []Recover{
			{Scanned: record(70, ready, other, nil), Kind: stateless, Now: t0},                         // no pointer
			{Scanned: record(70, creating, other, receipt(t0.Add(-time.Hour))), Kind: Kind{}, Now: t0}, // type not hosted here
		} {
			a, effects := NewRecovery(cfg, r)
			require.Equal(t, []string{"Finish"}, names(effects))
			require.Equal(t, Untouched, a.Phase())
		}
	})
}

// The scan releases an ended owner's User Spot reservation with its fence
// and deletes its creation request.
// Reference: PROTOCOL.md §7.2, §7.7, §7.10.
func TestRecoveryReleasesAnEndedOwnersUserReservation(t *testing.T) {
	key := location.Key(location.KindUserSpot, "room-1")
	v := location.Versioned{Key: key, Version: 9, Record: &location.Record{State: creating, Owner: other, StableType: "room",
		CreationIntent: &messages.CreationIntent{OperationId: "op-create", ContentRef: "create-op-create"}}}
	a, effects := NewRecovery(cfg, Recover{Scanned: v, Kind: Kind{Registered: true}, Now: t0})
	require.Equal(t, []string{"ReadOwner"}, names(effects))
	effects = step(t, a, OwnerRead{}, "Delete")
	require.Equal(t, Delete{Key: key, Version: 9, Record: v.Record}, effects[0])
	effects = step(t, a, Deleted{Now: t0}, "DeleteRoot", "Log", "Finish")
	require.Equal(t, DeleteRoot{RootKey: "create-op-create"}, effects[0])
	require.Equal(t, "reservation_released", effects[1].(Log).Event)
	require.Equal(t, ReservationReleased, a.Phase())

	a, _ = NewRecovery(cfg, Recover{Scanned: v, Now: t0})
	step(t, a, OwnerRead{}, "Delete")
	step(t, a, Deleted{Err: location.ErrConflict, Now: t0}, "Finish")
	require.Equal(t, Untouched, a.Phase())
}
