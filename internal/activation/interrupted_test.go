package activation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// A reservation that never committed Ready (Creating, without recovery
// pointer) under an ended owner — or this node's own with no incarnation
// behind it — is replaced like an abandoned reservation, whatever the
// kind: no incarnation ever served it, so no state ended with its owner
// and the refusal of PROTOCOL.md §7.10 does not apply. A Ready record still is refused.
// Found by the simulation (internal/spotsim, KnownPointerlessCreating):
// such a Spot stayed Unavailable for a PreserveStateWith kind, for good
// while its owner lived.
// Reference: docs/PROTOCOL.md §7.10, §7.7.
func TestNeverReadyReservationIsReplacedWhateverTheKind(t *testing.T) {
	for _, c := range []struct {
		name string
		auth Authority
	}{
		{"ended owner", Authority{Versioned: record(30, creating, other, nil), OwnerEnded: true}},
		{"own, no incarnation", Authority{Versioned: record(30, creating, self, nil), Address: "n1:9000"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, _ := NewActivation(cfg, start(preserved))
			step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
			step(t, a, AuthorityRead{Authority: c.auth, Now: t0}, "AdmitCapacity")
			step(t, a, CapacityAdmitted{}, "PutRoot")
			effects := step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op}}, "Reserve")
			require.EqualValues(t, 30, effects[0].(Reserve).Expected, "the reservation is replaced with its fence")
		})
	}

	a, _ := NewActivation(cfg, start(preserved))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	effects := step(t, a, AuthorityRead{Authority: Authority{Versioned: record(30, ready, other, nil), OwnerEnded: true}, Now: t0},
		"Log", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
	require.Equal(t, []string{"reactivation_refused", "activation_failed"}, logEvents(effects), "a Ready record may have had state")
}

// An interrupted reservation whose recovery root is gone (its activation
// failed and deleted the root, and the reservation landed anyway, or its
// abort did not) has nothing to resume: the activation reserves over it
// with its own first message instead of dropping the pointer. Dropping
// it left a Creating record without pointer, which no node may take over
// while its owner lives (it is no longer abandoned: the deadline was the
// pointer's), so activations elsewhere watched it until their deadline.
// The start-up scan, which has no first message, releases it with its
// fence instead. A Ready record whose root is gone still only loses its
// pointer (the first handler ran). Found by the simulation
// (internal/spotsim, KnownPointerlessCreating).
// Reference: PROTOCOL.md §7.7.
func TestReservationWithoutRootIsReplaced(t *testing.T) {
	abandoned := record(50, creating, other, receipt(t0.Add(-time.Minute)))
	a, _ := NewActivation(cfg, start(stateless))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, AuthorityRead{Authority: Authority{Versioned: abandoned, Address: "n2:9000"}, Now: t0}, "GetRoot")
	step(t, a, RootGot{Err: location.ErrNotFound}, "AdmitCapacity")
	step(t, a, CapacityAdmitted{}, "PutRoot")
	effects := step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op}}, "Reserve")
	res := effects[0].(Reserve)
	require.EqualValues(t, 50, res.Expected)
	require.Equal(t, op, res.Record.GetActivationRecovery().GetOperationId(), "this activation's own root and first message")
	require.Greater(t, res.Record.GetObjectGeneration(), uint64(40), "a new generation")

	r, effects := NewRecovery(cfg, Recover{Scanned: abandoned, Kind: stateless, Now: t0})
	require.Equal(t, []string{"LockKey"}, names(effects))
	step(t, r, KeyLocked{Now: t0}, "ReadRecord")
	step(t, r, RecordRead{Record: abandoned, Now: t0}, "GetRoot")
	effects = step(t, r, RootGot{Err: location.ErrNotFound}, "Delete")
	require.Equal(t, Delete{Key: cartKey, Version: 50, Record: abandoned.Record}, effects[0], "the scan releases it with its fence")
	effects = step(t, r, Deleted{Now: t0}, "Log", "UnlockKey", "Finish")
	require.Equal(t, "reservation_released", effects[0].(Log).Event)
	require.Equal(t, ReservationReleased, r.Phase())
	require.NoError(t, effects[2].(Finish).Err)
}

// An activation that fails while a reservation holding its own recovery
// root may remain — its abort did not land, or its Ready commit was lost
// (the reservation still there) and the next attempt failed — does not
// answer that its first message was not delivered: that reservation is
// resumed later (by the owner's next activation, an abandoned-reservation
// takeover or the start-up scan) and runs the message. The failure says
// the outcome is unknown (DeadlineExceeded, as for a write whose answer
// never came). A failure after the reservation was released keeps its
// class. Found by the simulation (internal/spotsim,
// KnownFailedThenResumed): a caller told Unavailable ("retrying later may
// succeed") saw its message run later, and a retry ran it twice.
// Reference: PROTOCOL.md §7.5, §7.7, §7.4.
func TestFailureThatLeavesItsReservationIsUnknown(t *testing.T) {
	t.Run("abort does not land", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{Err: roamerr.ErrUnavailable}, "AbortReservation")
		effects := step(t, a, AbortAnswered{Err: errStore}, "Log", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		err := failedWith(t, a, effects)
		require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
		require.NotErrorIs(t, err, roamerr.ErrUnavailable)
		require.Equal(t, roamerr.CodeDeadlineExceeded, roamerr.Code(err))
		require.Contains(t, err.Error(), "may remain")
		require.Equal(t, Measure{Outcome: roamerr.CodeDeadlineExceeded}, effects[3])
		require.Contains(t, effects[5].(Log).Msg, "may remain")
	})

	t.Run("commit lost, then the next read fails", func(t *testing.T) {
		a, res := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{}, "CompareAndSet")
		step(t, a, WriteAnswered{Err: location.ErrIndeterminate, Now: t0}, "ReadRecord")
		ours := location.Versioned{Key: cartKey, Version: 7, Record: res.Record}
		step(t, a, RecordRead{Record: ours, Now: t0}, "DiscardStaged", "ReleaseCapacity", "ReadAuthority")
		effects := step(t, a, AuthorityRead{Err: roamerr.ErrUnavailable, Now: t0}, "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		err := failedWith(t, a, effects)
		require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
		require.Equal(t, roamerr.CodeDeadlineExceeded, roamerr.Code(err))
	})

	t.Run("abort lands", func(t *testing.T) {
		a, _ := toReserve(t)
		step(t, a, WriteAnswered{Version: 7, Now: t0}, "Stage")
		step(t, a, Staged{Err: roamerr.ErrUnavailable}, "AbortReservation")
		effects := step(t, a, AbortAnswered{}, "DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		err := failedWith(t, a, effects)
		require.ErrorIs(t, err, roamerr.ErrUnavailable, "released: the message cannot run any more")
		require.Equal(t, "the first message of a cold activation was not delivered", effects[5].(Log).Msg)
	})
}

// A resume that fails before its Ready commit (the stage fails, the
// commit fails) does not release the record it took over the way a
// cold activation releases its own reservation: that record holds the
// interrupted activation's recovery root, and the root is its first
// message's only copy. Deleting them lost that message without a word,
// and an ended owner's record with them, so that a PreserveStateWith
// Spot then started empty on the next call instead of being refused. The
// record stays Creating under this node with its pointer (its deadline
// the interrupted activation's, passed as a rule): this node's next
// activation, an abandoned-reservation takeover or the start-up scan
// resumes it again. Found by the simulation (internal/spotsim,
// KnownTakeoverReleased).
// Reference: PROTOCOL.md §7.7, §7.10.
func TestFailedTakeoverIsLeftToBeResumed(t *testing.T) {
	ended := record(30, ready, other, receipt(time.Time{}))
	toTakeover := func(t *testing.T, kind Kind) *Activation {
		a, _ := NewActivation(cfg, start(kind))
		step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
		step(t, a, AuthorityRead{Authority: Authority{Versioned: ended, OwnerEnded: true}, Now: t0}, "GetRoot")
		step(t, a, RootGot{Ref: storedRef, Operation: storedOp, First: "stored"}, "CompareAndSet")
		step(t, a, WriteAnswered{Version: 31, Now: t0}, "Log", "Stage")
		return a
	}

	t.Run("stage fails", func(t *testing.T) {
		a := toTakeover(t, preserved)
		effects := step(t, a, Staged{Err: roamerr.ErrUnavailable}, "Log", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.Equal(t, "activation_resume_failed", effects[0].(Log).Event)
		require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrUnavailable, "this activation's own message is not in that root")
	})

	t.Run("commit fails", func(t *testing.T) {
		a := toTakeover(t, stateless)
		step(t, a, Staged{}, "CompareAndSet")
		effects := step(t, a, WriteAnswered{Err: errStore, Now: t0}, "DiscardStaged", "Log", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.Equal(t, "activation_resume_failed", effects[1].(Log).Event)
		failedWith(t, a, effects)
	})

	t.Run("the start-up scan", func(t *testing.T) {
		r, _ := NewRecovery(cfg, Recover{Scanned: ended, Kind: stateless, Now: t0})
		step(t, r, OwnerRead{}, "LockKey")
		step(t, r, KeyLocked{Now: t0}, "ReadRecord")
		step(t, r, RecordRead{Record: ended, Now: t0}, "GetRoot")
		step(t, r, RootGot{Ref: storedRef, Operation: storedOp, First: "stored"}, "CompareAndSet")
		step(t, r, WriteAnswered{Version: 31, Now: t0}, "Log", "Stage")
		effects := step(t, r, Staged{Err: roamerr.ErrUnavailable}, "Log", "UnlockKey", "Finish")
		require.Error(t, effects[2].(Finish).Err)
	})

	t.Run("its own root", func(t *testing.T) {
		own := record(30, creating, self, receipt(deadline))
		own.Record.ActivationRecovery.OperationId = op
		own.Record.ActivationRecovery.RecoveryKey = "activation-" + op
		a, _ := NewActivation(cfg, start(stateless))
		step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
		step(t, a, AuthorityRead{Authority: Authority{Versioned: own, Address: "n1:9000"}, Now: t0}, "GetRoot")
		ref := location.RootRef{Key: "activation-" + op, SHA256: storedRef.SHA256, Size: storedRef.Size}
		step(t, a, RootGot{Ref: ref, Operation: op, First: "first"}, "CompareAndSet")
		step(t, a, WriteAnswered{Version: 31, Now: t0}, "Log", "Stage")
		effects := step(t, a, Staged{Err: roamerr.ErrUnavailable}, "Log", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
		require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrDeadlineExceeded, "the left record runs this activation's own message when resumed")
	})
}
