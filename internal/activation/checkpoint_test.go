package activation

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

var checkpointed = Kind{Registered: true, PreservesState: true, Checkpointed: true}

// An ended owner's stateful Spot of a kind that checkpoints is recovered
// by its next call: the reservation replaces the ended record, the
// checkpoint is claimed with the new incarnation's generations, the
// incarnation is staged with the claimed state and committed Ready saying
// that it preserves state; the call's message runs first.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestEndedOwnersCheckpointedSpotIsRecoveredByItsCall(t *testing.T) {
	ended := record(30, ready, other, nil)
	read := AuthorityRead{Authority: Authority{Versioned: ended, OwnerEnded: true}, Now: t0}
	a, _ := NewActivation(cfg, start(checkpointed))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	effects := step(t, a, read, "Log", "AdmitCapacity")
	require.Equal(t, []string{"spot_recovering"}, logEvents(effects))
	step(t, a, CapacityAdmitted{}, "PutRoot")
	effects = step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op, Size: 10}}, "Reserve")
	res := effects[0].(Reserve)
	require.EqualValues(t, 30, res.Expected, "over the ended owner's record")
	require.Greater(t, res.Record.GetObjectGeneration(), ended.Record.GetObjectGeneration())

	effects = step(t, a, WriteAnswered{Version: 31, Now: t0}, "ClaimCheckpoint")
	require.Equal(t, ClaimingCheckpoint, a.Phase())
	require.Equal(t, ClaimCheckpoint{Key: cartKey, StableType: "cart", Generation: res.Record.GetObjectGeneration(), OwnerGeneration: 1}, effects[0])
	effects = step(t, a, CheckpointClaimed{State: []byte("41"), Restore: true}, "Stage")
	st := effects[0].(Stage)
	require.True(t, st.Restore)
	require.Equal(t, []byte("41"), st.State)
	effects = step(t, a, Staged{}, "CompareAndSet")
	require.True(t, effects[0].(CompareAndSet).Record.GetPreservesState())
	effects = step(t, a, WriteAnswered{Version: 32, Now: t0}, "Open")
	require.Equal(t, []any{"first"}, effects[0].(Open).Messages)
}

// A claim that fails releases the reservation and fails the call: nothing
// starts without the state it should have, and the record goes Missing,
// from which the next call activates it from the same checkpoint.
func TestFailedClaimStagesNothing(t *testing.T) {
	a, _ := NewActivation(cfg, start(checkpointed))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	step(t, a, missing(t0), "AdmitCapacity")
	step(t, a, CapacityAdmitted{}, "PutRoot")
	step(t, a, RootPut{Ref: location.RootRef{Key: "activation-" + op}}, "Reserve")
	step(t, a, WriteAnswered{Version: 5, Now: t0}, "ClaimCheckpoint")
	effects := step(t, a, CheckpointClaimed{Err: location.ErrUnavailable}, "Log", "AbortReservation")
	require.Equal(t, []string{"checkpoint_claim_failed"}, logEvents(effects))
	effects = step(t, a, AbortAnswered{}, "DeleteRoot", "ReleaseCapacity", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
	require.ErrorIs(t, failedWith(t, a, effects), roamerr.ErrUnavailable)
}

// With RecoverByOperator, or without checkpoints, an ended owner's
// stateful Spot still waits for the operator.
func TestRecoverByOperatorWaits(t *testing.T) {
	ended := record(30, ready, other, nil)
	read := AuthorityRead{Authority: Authority{Versioned: ended, OwnerEnded: true}, Now: t0}
	k := checkpointed
	k.RecoverByOperator = true
	a, _ := NewActivation(cfg, start(k))
	step(t, a, KeyLocked{Now: t0}, "ReadAuthority")
	effects := step(t, a, read, "Log", "UnlockKey", "Measure", "RespondFailure", "Log", "Finish")
	require.Equal(t, "reactivation_refused", effects[0].(Log).Event)
}

// A live node's pass over the Spots recovers an ended owner's stateful
// Ready Spot without a call: it takes the record over (same generation,
// next owner generation), claims the checkpoint, stages with its state,
// commits Ready and opens with no first message.
// Reference: docs/FAULTS.md, "Checkpoints and recovery".
func TestRecoveryFromCheckpointWithoutACall(t *testing.T) {
	scanned := record(80, ready, other, nil)
	scanned.Record.PreservesState = true
	rec := Recover{Scanned: scanned, Kind: checkpointed, Deadline: at(time.Minute), Now: t0}

	a, effects := NewRecovery(cfg, rec)
	require.Equal(t, []string{"StartTimer", "ReadOwner"}, names(effects))
	step(t, a, OwnerRead{Alive: false}, "LockKey")
	step(t, a, KeyLocked{Now: t0}, "ReadRecord")
	effects = step(t, a, RecordRead{Record: scanned, Now: t0}, "CompareAndSet")
	took := effects[0].(CompareAndSet)
	require.EqualValues(t, 80, took.Expected)
	require.Equal(t, scanned.Record.GetObjectGeneration(), took.Record.GetObjectGeneration())
	require.EqualValues(t, 3, took.Record.GetAuthorityOwnerGeneration())
	require.Equal(t, self.GetNodeRid(), took.Record.GetOwner().GetNodeRid())
	require.Equal(t, creating, took.Record.GetState())

	effects = step(t, a, WriteAnswered{Version: 81, Now: t0}, "Log", "ClaimCheckpoint")
	require.Equal(t, []string{"spot_recovering"}, logEvents(effects))
	require.EqualValues(t, 3, effects[1].(ClaimCheckpoint).OwnerGeneration)
	step(t, a, CheckpointClaimed{State: []byte("7"), Restore: true}, "Stage")
	step(t, a, Staged{}, "CompareAndSet")
	effects = step(t, a, WriteAnswered{Version: 82, Now: t0}, "Open")
	open := effects[0].(Open)
	require.Empty(t, open.Messages)
	require.Empty(t, open.FirstOperation, "no first message, so no recovery pointer to remove")
	effects = step(t, a, Opened{}, "Measure", "Log", "UnlockKey", "Finish")
	require.Equal(t, "spot_recovered", effects[1].(Log).Event)
	require.Equal(t, Activated, a.Phase())

	t.Run("a claim that fails releases the takeover", func(t *testing.T) {
		a, _ := NewRecovery(cfg, rec)
		step(t, a, OwnerRead{}, "LockKey")
		step(t, a, KeyLocked{Now: t0}, "ReadRecord")
		step(t, a, RecordRead{Record: scanned, Now: t0}, "CompareAndSet")
		step(t, a, WriteAnswered{Version: 81, Now: t0}, "Log", "ClaimCheckpoint")
		effects := step(t, a, CheckpointClaimed{Err: location.ErrUnavailable}, "Log", "AbortReservation")
		require.EqualValues(t, 81, effects[1].(AbortReservation).Version)
	})

	t.Run("not for this node", func(t *testing.T) {
		for _, k := range []Kind{preserved, {Registered: true, PreservesState: true, Checkpointed: true, RecoverByOperator: true}, {}} {
			a, effects := NewRecovery(cfg, Recover{Scanned: scanned, Kind: k, Now: t0})
			require.Equal(t, []string{"Finish"}, names(effects), "%+v", k)
			require.Equal(t, Untouched, a.Phase())
		}
	})
}
