package handoff

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The hand-off of an Actor bound to a client Session (docs/SESSIONS.md §2):
// the Session owner seals before the source seals, learns the target's
// route once the target opened, and is told to release its seal only once
// the source serves again.

// boundSource drives a bound source to where it asks for the Sessions' seal.
func boundSource(t *testing.T) *Source {
	s := NewSource(testID, DefaultConfig(), deadline)
	require.Equal(t, []string{"QueryCapability"}, kinds(s.Step(Start{SessionBound: true})))
	require.Equal(t, []string{"AwaitAdmission"}, kinds(s.Step(CapabilityAnswered{Supported: true, ReceiveChunkLimit: 64 << 10})))
	return s
}

// pausedBoundSource drives a bound source to SourcePaused.
func pausedBoundSource(t *testing.T) *Source {
	s := boundSource(t)
	require.Equal(t, []string{"SealSessions", "StartTimer"}, kinds(s.Step(Admitted{})))
	require.Equal(t, []string{"StopTimer", "Seal"}, kinds(s.Step(SessionsSealed{})))
	s.Step(Captured{Stream: envelope.Whole(stream(1000))})
	require.Equal(t, SourcePaused, s.Phase())
	return s
}

// The Session owner seals the binding before the source stops its
// dispatch: the seal request goes after the capability check and the
// budget, and the source seals only once every Session owner answered
// sealed. An unbound source seals at once.
func TestSessionSealComesBeforeTheSourceSeal(t *testing.T) {
	s := boundSource(t)
	effects := s.Step(Admitted{})
	require.Equal(t, []string{"SealSessions", "StartTimer"}, kinds(effects))
	require.Equal(t, SourceRunning, s.Phase())
	require.Empty(t, s.Step(Admitted{}), "one seal request")
	require.Empty(t, s.Step(Captured{Stream: envelope.Whole(stream(10))}), "no capture before the Sessions sealed")
	require.Equal(t, []string{"StopTimer", "Seal"}, kinds(s.Step(SessionsSealed{})))
	require.Empty(t, s.Step(SessionsSealed{}), "a second answer changes nothing")

	u := NewSource(testID, DefaultConfig(), deadline)
	u.Step(Start{})
	u.Step(CapabilityAnswered{Supported: true})
	require.Equal(t, []string{"Seal"}, kinds(u.Step(Admitted{})), "an unbound source asks no Session owner")
}

// A refused seal request, or none answered in time, ends the move before
// the source seals: the object serves on, the caller gets the refusal's
// class, and the Session owners are told to release a seal that may have
// been installed (its reply lost).
func TestSessionSealRefusedEndsTheMoveBeforeTheSeal(t *testing.T) {
	s := boundSource(t)
	s.Step(Admitted{})
	effects := s.Step(SessionsSealed{Err: roamerr.Wrap(roamerr.ErrConflict, "seal", errors.New("sealed by another move"))})
	require.Equal(t, []string{"StopTimer", "AbortSessions", "Complete"}, kinds(effects))
	require.ErrorIs(t, effects[2].(Complete).Err, roamerr.ErrConflict)
	require.Equal(t, SourceRunning, s.Phase())
	require.False(t, has[Seal](effects))
	require.Empty(t, s.Step(Captured{Stream: envelope.Whole(stream(10))}))
	require.True(t, s.Finished())
}

// An explicit failure before relay-ready restores the source queue first;
// the Session abort (command 44) goes only after that, so what the
// Session owner held runs behind the restored queue.
func TestSessionAbortOnlyAfterTheSourceRestores(t *testing.T) {
	s := pausedBoundSource(t)
	effects := s.Step(FailedReceived{Reason: messages.FailureReason_FAILURE_REASON_CHECKSUM_MISMATCH})
	k := kinds(effects)
	require.Less(t, indexOf(k, "Unseal"), indexOf(k, "AbortSessions"), "%v", k)
	require.Equal(t, 1, count(k, "AbortSessions"))
	require.Equal(t, SourceRunning, s.Phase())

	// A capture that failed: the source was sealed, nothing left.
	s = boundSource(t)
	s.Step(Admitted{})
	s.Step(SessionsSealed{})
	k = kinds(s.Step(CaptureFailed{Err: errors.New("not a protobuf message")}))
	require.Equal(t, []string{"Unseal", "AbortSessions", "Complete"}, k)

	// Fenced out while reconciling (the target never committed and now
	// never can): as an explicit failure.
	s = pausedBoundSource(t)
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	k = kinds(s.Step(ReconcileAnswered{FencedOut: true}))
	require.Less(t, indexOf(k, "Unseal"), indexOf(k, "AbortSessions"), "%v", k)

	// Fenced out after the cutover: the source serves again from what it
	// held, then the Session owner submits to it.
	s = pausedBoundSource(t)
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{})
	k = kinds(s.Step(ReconcileAnswered{FencedOut: true}))
	require.Less(t, indexOf(k, "Reinstate"), indexOf(k, "AbortSessions"), "%v", k)
}

// No Session abort while the target may still commit, nor after
// relay-ready's boundary: the target's route update (or the Session
// owner's seal timeout) decides then. An unbound source never sends one.
func TestNoSessionAbortWhileTheTargetMayCommit(t *testing.T) {
	s := pausedBoundSource(t)
	var all []Effect
	all = append(all, s.Step(TimerFired{Timer: TimerRestoreDeadline})...)
	all = append(all, s.Step(ReconcileAnswered{})...) // undecided
	all = append(all, s.Step(ReconcileAnswered{SourceEnded: true})...)
	require.False(t, has[AbortSessions](all), "the lease ended with the outcome unknown: the target may still commit")

	s = pausedBoundSource(t)
	all = s.Step(RelayReadyReceived{})
	all = append(all, s.Step(FailedReceived{Reason: messages.FailureReason_FAILURE_REASON_CONFLICT})...)
	all = append(all, s.Step(CutoverSent{})...)
	all = append(all, s.Step(ReconcileAnswered{TargetOwns: true})...)
	require.False(t, has[AbortSessions](all), "relay-ready is irreversible")

	s = pausedBoundSource(t)
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.False(t, has[AbortSessions](s.Step(ReconcileAnswered{TargetOwns: true})), "the target committed: its route update comes")

	u, _ := pausedSource(t, stream(100))
	require.False(t, has[AbortSessions](u.Step(FailedReceived{Reason: messages.FailureReason_FAILURE_REASON_CONFLICT})))
}

// The target tells the Session owner its route only after its commit and
// its dispatch open, one-way; a target that never commits (deadline,
// stale, abort, superseded) sends none. An unbound target sends none.
func TestSessionRouteUpdateOnlyAfterCommitAndOpen(t *testing.T) {
	boundTarget := func() *Target {
		m, chunks, err := envelope.Split(stream(300), 100)
		require.NoError(t, err)
		tg, _ := NewTarget(testID, DefaultConfig(), PrepareReceived{SessionBound: true, Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 30})
		tg.Step(SourceVerified{})
		for _, c := range chunks {
			tg.Step(ChunkReceived{Chunk: c})
		}
		tg.Step(Restored{})
		require.Equal(t, RelayReady, tg.Phase())
		return tg
	}
	tg := boundTarget()
	var before []Effect
	before = append(before, tg.Step(CutoverReceivedEvent{})...)
	before = append(before, tg.Step(StoreCommitted{})...)
	require.False(t, has[UpdateSessionRoutes](before), "not before the open")
	effects := tg.Step(DispatchOpened{})
	require.Equal(t, []string{"UpdateSessionRoutes", "Complete", "StartTimer"}, kinds(effects))
	require.Empty(t, tg.Step(DispatchOpened{}), "once")

	for name, fail := range map[string]func(*Target) []Effect{
		"deadline": func(tg *Target) []Effect {
			e := tg.Step(CutoverReceivedEvent{})
			e = append(e, tg.Step(StoreRetryable{Err: errors.New("unavailable")})...)
			return append(e, tg.Step(TimerFired{Timer: TimerRestoreDeadline})...)
		},
		"stale": func(tg *Target) []Effect {
			e := tg.Step(CutoverReceivedEvent{})
			return append(e, tg.Step(StoreStale{Err: errors.New("owner is node-9")})...)
		},
	} {
		tg := boundTarget()
		effects := fail(tg)
		require.True(t, has[RemoveTarget](effects), name)
		effects = append(effects, tg.Step(DispatchOpened{})...)
		require.False(t, has[UpdateSessionRoutes](effects), name)
	}

	u := restored(t, stream(300))
	u.Step(CutoverReceivedEvent{})
	u.Step(StoreCommitted{})
	require.False(t, has[UpdateSessionRoutes](u.Step(DispatchOpened{})))
}

func count(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}
