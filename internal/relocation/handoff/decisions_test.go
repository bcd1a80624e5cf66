package handoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/roamerr"
)

// sealing drives a source of participants objects to its seal and returns
// the seal's effects.
func sealing(t *testing.T, cfg Config, participants int) (*Source, []Effect) {
	s := NewSource(testID, cfg, deadline)
	require.Equal(t, []string{"QueryCapability"}, kinds(s.Step(Start{Participants: participants})))
	require.Equal(t, []string{"AwaitAdmission"}, kinds(s.Step(CapabilityAnswered{Supported: true, ReceiveChunkLimit: 64 << 10})))
	return s, s.Step(Admitted{})
}

// A move of several participants waits SealPatience for their captures:
// past it, the move fails DeadlineExceeded and unseals, so one participant
// in a long turn does not keep the others sealed.
func TestSealPatienceEndsAMoveOfSeveralParticipants(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SealPatience = 3 * time.Second
	s, effects := sealing(t, cfg, 2)
	require.Equal(t, []Effect{Seal{}, StartTimer{Timer: TimerSealPatience, After: 3 * time.Second}}, effects)
	effects = s.Step(TimerFired{Timer: TimerSealPatience})
	require.Equal(t, []string{"StopTimer", "Unseal", "Complete"}, kinds(effects))
	err := effects[2].(Complete).Err
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
	require.Contains(t, err.Error(), "did not finish its turn within 3s")
	require.Equal(t, SourceRunning, s.Phase())
	require.True(t, s.Finished())
	require.Empty(t, s.Step(Captured{Stream: envelope.Whole(stream(10))}), "a capture after the patience is the driver's to undo")
}

// The captures that all come in time stop the patience timer; a late fire
// of it changes nothing.
func TestSealPatienceStopsWithTheCaptures(t *testing.T) {
	s, _ := sealing(t, DefaultConfig(), 3)
	effects := s.Step(Captured{Stream: envelope.Whole(stream(10))})
	require.Equal(t, StopTimer{Timer: TimerSealPatience}, effects[0])
	require.Equal(t, SourcePaused, s.Phase())
	require.Empty(t, s.Step(TimerFired{Timer: TimerSealPatience}))
	require.Equal(t, SourcePaused, s.Phase())

	s, _ = sealing(t, DefaultConfig(), 2)
	effects = s.Step(CaptureFailed{Err: roamerr.ErrTypeMismatch})
	require.Equal(t, []string{"StopTimer", "Unseal", "Complete"}, kinds(effects))
	require.ErrorIs(t, effects[2].(Complete).Err, roamerr.ErrTypeMismatch)
}

// One participant captures on its own turn's end: no patience timer, and
// SealPatience zero takes its default.
func TestSealPatienceOnlyForSeveralParticipants(t *testing.T) {
	for _, n := range []int{0, 1} {
		_, effects := sealing(t, DefaultConfig(), n)
		require.Equal(t, []Effect{Seal{}}, effects, "%d participants", n)
	}
	_, effects := sealing(t, DefaultConfig(), 2)
	require.Equal(t, StartTimer{Timer: TimerSealPatience, After: 5 * time.Second}, effects[1])
}

// A Session-bound move of several participants seals once its Session
// owners sealed, and waits for the captures from then.
func TestSealPatienceAfterTheSessionSeal(t *testing.T) {
	s := NewSource(testID, DefaultConfig(), deadline)
	s.Step(Start{SessionBound: true, Participants: 2})
	s.Step(CapabilityAnswered{Supported: true})
	require.Equal(t, "SealSessions", kinds(s.Step(Admitted{}))[0])
	require.Equal(t, []string{"StopTimer", "Seal", "StartTimer"}, kinds(s.Step(SessionsSealed{})))
	effects := s.Step(TimerFired{Timer: TimerSealPatience})
	require.Equal(t, []string{"StopTimer", "Unseal", "AbortSessions", "Complete"}, kinds(effects))
}

// A target that opened with its boundary batch acknowledged is kept one
// FollowDuration for the source's late resends, then forgotten.
func TestOpenTargetIsForgottenAfterTheFollowPeriod(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(record("a"))
	tg.Step(CutoverReceivedEvent{Sum: sumOf("a")})
	tg.Step(StoreCommitted{})
	effects := tg.Step(DispatchOpened{})
	require.Equal(t, []Effect{Complete{}, StartTimer{Timer: TimerForget, After: DefaultConfig().FollowDuration}}, effects)
	require.Equal(t, []Effect{AckBoundary{}}, tg.Step(CutoverReceivedEvent{Sum: sumOf("a")})[1:], "a resend is still answered")
	require.Equal(t, []Effect{Forget{}}, tg.Step(TimerFired{Timer: TimerForget}))
}

// After the fallback, a target whose batch is not acknowledged yet is kept
// as long as the source resends it: BoundaryAckPatience and one resend
// window past it.
func TestUnacknowledgedTargetIsKeptWhileTheSourceResends(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BoundaryAckPatience = 200 * time.Second
	m, chunks, err := envelope.Split(stream(300), 100)
	require.NoError(t, err)
	tg, _ := NewTarget(testID, cfg, PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 30})
	tg.Step(SourceVerified{})
	for _, c := range chunks {
		tg.Step(ChunkReceived{Chunk: c})
	}
	tg.Step(Restored{})
	tg.Step(TimerFired{Timer: TimerCutoverWait})
	tg.Step(StoreCommitted{})
	require.False(t, tg.Acknowledged())
	effects := tg.Step(DispatchOpened{})
	require.Equal(t, StartTimer{Timer: TimerForget, After: 201 * time.Second}, effects[len(effects)-1])
	require.Equal(t, []Effect{Forget{}}, tg.Step(TimerFired{Timer: TimerForget}))
}

// A target removed before relay-ready stops its incarnation at once (no
// source knows it; its name is free for the next move); one removed after
// relay-ready answers Unavailable for FollowDuration, then stops.
func TestRemovedTargetStopsItsIncarnation(t *testing.T) {
	tg, _ := prepared(t, stream(300), 100)
	effects := tg.Step(AbortReceived{})
	require.Equal(t, []string{"StopTimer", "StopTimer", "StopTimer", "RemoveTarget", "StopIncarnation", "Complete", "StartTimer"}, kinds(effects))
	require.Equal(t, StartTimer{Timer: TimerForget, After: DefaultConfig().FollowDuration}, effects[6])
	require.Equal(t, []Effect{Forget{}}, tg.Step(TimerFired{Timer: TimerForget}))

	tg = restored(t, stream(300))
	effects = tg.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.Equal(t, TargetRemoved, tg.Phase())
	require.True(t, has[RemoveTarget](effects))
	require.False(t, has[StopIncarnation](effects), "the source may follow to it until the follow period ends")
	require.Equal(t, StartTimer{Timer: TimerForget, After: DefaultConfig().FollowDuration}, effects[len(effects)-1])
	require.Empty(t, tg.Step(TimerFired{Timer: TimerStoreRetry}))
	require.Equal(t, []Effect{StopIncarnation{}, Forget{}}, tg.Step(TimerFired{Timer: TimerForget}))
}

// A Restore request whose manifest cannot be taken installs nothing and is
// forgotten like any removed run.
func TestRefusedManifestIsForgotten(t *testing.T) {
	m, _, err := envelope.Split(stream(300), 100)
	require.NoError(t, err)
	tg, effects := NewTarget(testID, DefaultConfig(), PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 10})
	require.Equal(t, []string{"SendFailed", "Complete", "StartTimer"}, kinds(effects))
	require.Equal(t, []Effect{Forget{}}, tg.Step(TimerFired{Timer: TimerForget}))
}

// The seal wait runs out: the Session owners still silent are looked up;
// when the silent ones' nodes were gone (their bindings dropped) the move
// seals, else it ends DeadlineExceeded before the source seals and the
// Session owners are told to release what they may have sealed.
func TestSessionSealWaitEndsInALookUp(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SessionSealWait = 2 * time.Second
	for _, silent := range []bool{false, true} {
		s := NewSource(testID, cfg, deadline)
		s.Step(Start{SessionBound: true})
		s.Step(CapabilityAnswered{Supported: true})
		require.Equal(t, []Effect{SealSessions{}, StartTimer{Timer: TimerSessionSeal, After: 2 * time.Second}}, s.Step(Admitted{}))
		require.Empty(t, s.Step(TimerFired{Timer: TimerSealPatience}), "not this stretch's timer")
		require.Equal(t, []Effect{LookUpSessionOwners{}}, s.Step(TimerFired{Timer: TimerSessionSeal}))
		effects := s.Step(SessionOwnersLooked{Silent: silent})
		if !silent {
			require.Equal(t, []Effect{Seal{}}, effects)
			require.Empty(t, s.Step(SessionOwnersLooked{}), "once")
			continue
		}
		require.Equal(t, []string{"AbortSessions", "Complete"}, kinds(effects))
		err := effects[1].(Complete).Err
		require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
		require.Contains(t, err.Error(), "within 2s")
		require.True(t, s.Finished())
		require.Empty(t, s.Step(SessionsSealed{}), "a late reply changes nothing")
	}
}

// A reply that completes the seal while the look-up is out wins; the
// look-up's answer is then ignored.
func TestSessionSealedWhileLookingUp(t *testing.T) {
	s := NewSource(testID, DefaultConfig(), deadline)
	s.Step(Start{SessionBound: true})
	s.Step(CapabilityAnswered{Supported: true})
	s.Step(Admitted{})
	s.Step(TimerFired{Timer: TimerSessionSeal})
	require.Equal(t, []string{"StopTimer", "Seal"}, kinds(s.Step(SessionsSealed{})))
	require.Empty(t, s.Step(SessionOwnersLooked{Silent: true}))
	require.Equal(t, SourceRunning, s.Phase())
	require.False(t, s.Finished())
}

// After Message Follow ends, the incarnation that moved away answers
// Unavailable for one more follow period, then the machine stops it: the
// move is Finished at EndFollow, Forgettable only after StopIncarnation.
func TestStubStopsOneFollowPeriodAfterEndFollow(t *testing.T) {
	s, _ := pausedSource(t, stream(100))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{})
	s.Step(BoundaryAcked{})
	s.Step(ReconcileAnswered{TargetOwns: true})
	s.Step(TimerFired{Timer: TimerResendWindow})
	require.Empty(t, s.Step(TimerFired{Timer: TimerStub}), "no stub before Message Follow ended")
	effects := s.Step(TimerFired{Timer: TimerFollow})
	require.Equal(t, []Effect{EndFollow{}, StartTimer{Timer: TimerStub, After: DefaultConfig().FollowDuration}}, effects)
	require.True(t, s.Finished())
	require.False(t, s.Forgettable(), "the stub still answers")
	require.Equal(t, []Effect{StopIncarnation{}}, s.Step(TimerFired{Timer: TimerStub}))
	require.True(t, s.Forgettable())
	require.Empty(t, s.Step(TimerFired{Timer: TimerStub}), "once")
}

// A source that serves again keeps its incarnation: nothing to stop.
func TestServingAgainLeavesNoStub(t *testing.T) {
	s, _ := pausedSource(t, stream(100))
	effects := s.Step(FailedReceived{})
	require.False(t, has[StopIncarnation](effects))
	require.True(t, s.Forgettable())
}
