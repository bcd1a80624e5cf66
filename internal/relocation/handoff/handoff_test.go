package handoff

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var testID = Identity{RelocationID: 7, TargetAttemptGeneration: 1, Fence: Fence{NodeRid: "src", NodeGeneration: 1, OwnerGeneration: 3}}

var deadline = time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)

func stream(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// kinds lists the dynamic types of effects, for order assertions.
func kinds(effects []Effect) []string {
	var out []string
	for _, e := range effects {
		out = append(out, typeName(e))
	}
	return out
}

func typeName(e Effect) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", e), "handoff.")
}

func find[T Effect](effects []Effect) (T, bool) {
	for _, e := range effects {
		if t, ok := e.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

func has[T Effect](effects []Effect) bool {
	_, ok := find[T](effects)
	return ok
}

func logEvent(effects []Effect) []string {
	var out []string
	for _, e := range effects {
		if l, ok := e.(Log); ok {
			out = append(out, l.Event)
		}
	}
	return out
}

// pausedSource drives a source to SourcePaused with a captured stream.
func pausedSource(t *testing.T, payload []byte) (*Source, []Effect) {
	s := NewSource(testID, DefaultConfig(), deadline)
	require.Equal(t, []string{"QueryCapability"}, kinds(s.Step(Start{})))
	require.Equal(t, []string{"AwaitAdmission"}, kinds(s.Step(CapabilityAnswered{Supported: true, ReceiveChunkLimit: 64 << 10})))
	require.Equal(t, []string{"Seal"}, kinds(s.Step(Admitted{})))
	effects := s.Step(Captured{Stream: envelope.Whole(payload)})
	require.Equal(t, SourcePaused, s.Phase())
	return s, effects
}

// The capability check comes before any seal; a target that cannot host the
// object fails the operation with Unavailable and never seals the source.
// Reference: docs/PROTOCOL.md §5.2, §6.1 (first row).
func TestCapabilityCheckedBeforeSeal(t *testing.T) {
	s := NewSource(testID, DefaultConfig(), deadline)
	require.Equal(t, []string{"QueryCapability"}, kinds(s.Step(Start{})))
	effects := s.Step(CapabilityAnswered{Supported: false, Reason: "kind not registered"})
	require.Equal(t, []string{"Complete"}, kinds(effects))
	require.ErrorIs(t, effects[0].(Complete).Err, roamerr.ErrUnavailable)
	require.Equal(t, SourceRunning, s.Phase())
	require.Empty(t, s.Step(Admitted{}), "no seal after a refused capability")
}

// With the in-flight budget full, a new unit waits before its seal and keeps
// serving; the seal comes only with admission.
// Reference: PROTOCOL.md §5.3.
func TestBudgetWaitedOnBeforeSeal(t *testing.T) {
	s := NewSource(testID, DefaultConfig(), deadline)
	s.Step(Start{})
	effects := s.Step(CapabilityAnswered{Supported: true, ReceiveChunkLimit: 1 << 20})
	require.Equal(t, []string{"AwaitAdmission"}, kinds(effects))
	require.Equal(t, SourceRunning, s.Phase())
	require.Equal(t, []string{"Seal"}, kinds(s.Step(Admitted{})))
	require.Empty(t, s.Step(Admitted{}), "one seal only")
}

// A target that checks the source before the seal is asked after the
// admission; only its answer that the store backs the source seals. An
// answer that it does not, or could not tell, or none by the restore
// deadline, ends the move with the object serving: nothing was sealed.
// Reference: PROTOCOL.md §5.2.
func TestSourceCheckedBeforeSeal(t *testing.T) {
	checking := func() *Source {
		s := NewSource(testID, DefaultConfig(), deadline)
		s.Step(Start{})
		require.Equal(t, []string{"AwaitAdmission"}, kinds(s.Step(CapabilityAnswered{Supported: true, ReceiveChunkLimit: 1 << 20, SourceCheck: true})))
		effects := s.Step(Admitted{})
		require.Equal(t, []string{"CheckSource", "StartTimer"}, kinds(effects))
		require.Equal(t, StartTimer{Timer: TimerSourceCheck, At: deadline}, effects[1])
		return s
	}
	s := checking()
	require.Equal(t, []string{"StopTimer", "Seal"}, kinds(s.Step(SourceChecked{})))
	require.Empty(t, s.Step(SourceChecked{}), "one seal only")

	for _, tc := range []struct {
		ev   Event
		want error
	}{
		{SourceChecked{Err: fmt.Errorf("%w: not the owner", roamerr.ErrStale)}, roamerr.ErrStale},
		{SourceChecked{Err: fmt.Errorf("%w: store", roamerr.ErrUnavailable)}, roamerr.ErrUnavailable},
		{TimerFired{Timer: TimerSourceCheck}, roamerr.ErrDeadlineExceeded},
	} {
		s := checking()
		effects := s.Step(tc.ev)
		c, ok := find[Complete](effects)
		require.True(t, ok, "%v", tc.ev)
		require.ErrorIs(t, c.Err, tc.want)
		require.NotContains(t, kinds(effects), "Seal")
		require.Equal(t, SourceRunning, s.Phase())
		require.Empty(t, s.Step(SourceChecked{}), "a late answer seals nothing")
	}

	// A Session-bound source checks first, then has its Sessions sealed.
	s = NewSource(testID, DefaultConfig(), deadline)
	s.Step(Start{SessionBound: true})
	s.Step(CapabilityAnswered{Supported: true, SourceCheck: true})
	require.Equal(t, []string{"CheckSource", "StartTimer"}, kinds(s.Step(Admitted{})))
	require.Equal(t, []string{"StopTimer", "SealSessions", "StartTimer"}, kinds(s.Step(SourceChecked{})))
}

// The chunk size is the least of the configured limit and the target's
// announced receive limit, or 32 KiB when none was announced.
// Reference: PROTOCOL.md §5.6.
func TestChunkLimitIsTheLeastOfConfigAndTarget(t *testing.T) {
	for announced, want := range map[uint32]int{0: 32 << 10, 64 << 10: 64 << 10, 1 << 20: 256 << 10} {
		s := NewSource(testID, DefaultConfig(), deadline)
		s.Step(Start{})
		s.Step(CapabilityAnswered{Supported: true, ReceiveChunkLimit: announced})
		s.Step(Admitted{})
		effects := s.Step(Captured{Stream: envelope.Whole(stream(300 << 10))})
		p, ok := find[SendPrepare](effects)
		require.True(t, ok)
		require.Equal(t, want, p.ChunkLimit, "announced %d", announced)
		c, _ := find[SendChunks](effects)
		for _, ch := range c.Chunks {
			require.LessOrEqual(t, len(ch.Data), want)
		}
	}
}

// After capture the source sends the Restore request (RelocationPrepare)
// with a manifest of the whole stream, then the chunks, which reassemble to
// exactly the stream.
// Reference: PROTOCOL.md §5.6.
func TestPrepareThenChunksDescribeTheStream(t *testing.T) {
	payload := stream(200 << 10)
	_, effects := pausedSource(t, payload)
	require.Equal(t, []string{"SendPrepare", "SendChunks", "StartTimer"}, kinds(effects))
	p := effects[0].(SendPrepare)
	require.EqualValues(t, len(payload), p.Manifest.TotalLength)
	require.Equal(t, envelope.Checksum(payload), p.Manifest.ChecksumCRC32C)
	var joined []byte
	for _, c := range effects[1].(SendChunks).Chunks {
		joined = append(joined, c.Data...)
	}
	require.Equal(t, payload, joined)
}

// An explicit failure before relay-ready restores the source queue from
// memory first and only then sends RelocationAbort; the machine takes the single
// backward edge to SourceRunning.
// Reference: PROTOCOL.md §6.2, §6.7, §12.1 item 25.
func TestExplicitFailureBeforeRelayReadyRestoresSourceThenAborts(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	effects := s.Step(FailedReceived{Reason: messages.FailureReason_FAILURE_REASON_CHECKSUM_MISMATCH})
	k := kinds(effects)
	require.Less(t, indexOf(k, "Unseal"), indexOf(k, "SendAbort"))
	require.Equal(t, SourceRunning, s.Phase())
	c, _ := find[Complete](effects)
	require.ErrorIs(t, c.Err, roamerr.ErrConflict)
	require.True(t, s.Finished())
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// Nothing is relayed before the target's relay-ready reply; its acceptance
// makes the move irreversible: a later failure reply reopens nothing.
// Reference: PROTOCOL.md §5.8, §6.1, §12.1 item 3 (relay-ready before
// ingress-hold relay).
func TestRelayReadyIsTheIrreversibleBoundary(t *testing.T) {
	s, effects := pausedSource(t, stream(1000))
	require.False(t, has[RelayThenCutover](effects))
	effects = s.Step(RelayReadyReceived{})
	require.True(t, has[RelayThenCutover](effects))
	require.Equal(t, RelayReady, s.Phase())
	effects = s.Step(FailedReceived{Reason: messages.FailureReason_FAILURE_REASON_RESTORE_FAILED})
	require.False(t, has[Unseal](effects))
	require.Equal(t, []string{"failure_after_relay_ready"}, logEvent(effects))
	require.Equal(t, RelayReady, s.Phase())
	require.Empty(t, s.Step(RelayReadyReceived{}), "a duplicate reply changes nothing")
}

// After the cutover the source only follows; it keeps the payload and batch
// for the resend window and until the store shows the target's commit, and
// releases them exactly once; the application instance is dropped once the
// commit is confirmed.
// Reference: PROTOCOL.md §5.13, §12.1 item 14 (released exactly once).
func TestPayloadReleasedOnceAfterResendWindow(t *testing.T) {
	for _, confirmFirst := range []bool{false, true} {
		s, _ := pausedSource(t, stream(1000))
		s.Step(RelayReadyReceived{})
		effects := s.Step(CutoverSent{Sum: RelaySum{Count: 2, CRC: 9}})
		require.Equal(t, FollowOnly, s.Phase())
		c, ok := find[Complete](effects)
		require.True(t, ok)
		require.NoError(t, c.Err)
		require.True(t, has[ConfirmCommit](effects), "the source watches for the commit")
		require.False(t, has[CloseOut](effects), "the instance is kept until the commit shows")
		if confirmFirst {
			effects = s.Step(ReconcileAnswered{TargetOwns: true})
			require.True(t, has[CloseOut](effects))
			require.False(t, has[ReleasePayload](effects), "kept for the resend window")
			require.Equal(t, []string{"ReleasePayload"}, kinds(s.Step(TimerFired{Timer: TimerResendWindow})))
		} else {
			require.Empty(t, s.Step(TimerFired{Timer: TimerResendWindow}), "not released before the commit shows")
			effects = s.Step(ReconcileAnswered{TargetOwns: true})
			require.Equal(t, []string{"StopTimer", "CloseOut", "ReleasePayload"}, kinds(effects))
		}
		require.Empty(t, s.Step(TimerFired{Timer: TimerResendWindow}))
		require.Empty(t, s.Step(ReconcileAnswered{TargetOwns: true}), "decided once")
		require.Equal(t, []string{"StartFollow", "EndFollow", "StartTimer"}, kinds(s.Step(TimerFired{Timer: TimerFollow})),
			"unacknowledged: what was held follows before follow ends")
		require.False(t, s.Finished(), "the boundary batch is not acknowledged yet")
		require.Equal(t, []string{"StopTimer", "StopTimer", "ReleaseBoundary"}, kinds(s.Step(BoundaryAcked{})))
		require.True(t, s.Finished())
		require.Empty(t, s.Step(ConnectionLost{}), "no resend once Message Follow ended")
	}
}

// After the cutover the source resends the whole boundary batch, each time
// under a new epoch, every cutover wait and at once on a connection loss,
// until the target acknowledges it — also past Message Follow: a cut
// across the cutover that outlasts follow would otherwise lose the batch of
// a target that committed by its fallback (the simulation found it). The
// acknowledgement ends the resends and drops the wire copy, once.
// Reference: PROTOCOL.md §5.9 (resent until acknowledged; cutover lost).
func TestBoundaryBatchIsResentUntilAcknowledged(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	effects := s.Step(CutoverSent{})
	var timers []Timer
	for _, e := range effects {
		if st, ok := e.(StartTimer); ok {
			timers = append(timers, st.Timer)
		}
	}
	require.Contains(t, timers, TimerBoundaryResend)
	require.Contains(t, timers, TimerBoundaryGiveUp)
	r, ok := find[ResendBoundary](s.Step(TimerFired{Timer: TimerBoundaryResend}))
	require.True(t, ok, "no acknowledgement within a cutover wait: resend")
	require.EqualValues(t, 1, r.Epoch)
	s.Step(TimerFired{Timer: TimerResendWindow})
	s.Step(ReconcileAnswered{TargetOwns: true})
	r, _ = find[ResendBoundary](s.Step(ConnectionLost{}))
	require.EqualValues(t, 2, r.Epoch)
	require.Equal(t, []string{"EndFollow", "StartTimer"}, kinds(s.Step(TimerFired{Timer: TimerFollow})))
	r, ok = find[ResendBoundary](s.Step(TimerFired{Timer: TimerBoundaryResend}))
	require.True(t, ok, "resends go on after Message Follow ended")
	require.EqualValues(t, 3, r.Epoch)
	require.False(t, s.Finished())
	effects = s.Step(BoundaryAcked{})
	rb, ok := find[ReleaseBoundary](effects)
	require.True(t, ok)
	require.False(t, rb.Unacknowledged)
	require.True(t, s.Finished())
	require.Empty(t, s.Step(TimerFired{Timer: TimerBoundaryResend}))
	require.Empty(t, s.Step(ConnectionLost{}))
	require.Empty(t, s.Step(BoundaryAcked{}), "released once")
}

// A target silent for BoundaryAckPatience: the batch is dropped and
// reported lost (ReleaseBoundary Unacknowledged) — but only once the move
// is confirmed, since a fence-out would still put the batch back into the
// source's queue, and then nothing is lost.
// Reference: docs/FAULTS.md (boundary batch).
func TestUnacknowledgedBoundaryBatchIsDroppedLoudlyOnlyOnceConfirmed(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{})
	require.Empty(t, s.Step(TimerFired{Timer: TimerBoundaryGiveUp}), "undecided: the batch may come back here")
	effects := s.Step(ReconcileAnswered{TargetOwns: true})
	rb, ok := find[ReleaseBoundary](effects)
	require.True(t, ok)
	require.True(t, rb.Unacknowledged)
	require.Empty(t, s.Step(TimerFired{Timer: TimerBoundaryResend}), "no resend after the give-up")

	s, _ = pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{})
	effects = s.Step(ReconcileAnswered{FencedOut: true})
	rb, ok = find[ReleaseBoundary](effects)
	require.True(t, ok, "the batch is back in the source's queue")
	require.False(t, rb.Unacknowledged)
	require.Empty(t, s.Step(TimerFired{Timer: TimerBoundaryGiveUp}))
}

// Messages arriving after the cutover are held until the move is decided:
// forwarded (StartFollow) once the commit shows, never before — a
// fenced-out move then has nothing stranded at its removed target.
// Reference: docs/FAULTS.md (a target lost after relay-ready).
func TestFollowStartsOnlyOnceTheCommitShows(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	effects := s.Step(CutoverSent{})
	require.False(t, has[StartFollow](effects))
	require.False(t, has[StartFollow](s.Step(TimerFired{Timer: TimerFollow})))
	k := kinds(s.Step(ReconcileAnswered{TargetOwns: true}))
	require.Less(t, indexOf(k, "StartFollow"), indexOf(k, "EndFollow"), "held messages follow before follow ends")
}

// The held messages follow only once the commit shows and the target has
// acknowledged the boundary batch: after its cutover fallback the target
// delivers the records it lacked late, and a caller's message that
// followed before them would be handled before its earlier relayed ones.
// Without the acknowledgement they follow when the connection to the
// target is lost, when the batch is given up on, or when the follow period
// ends; a source whose lease ended cannot wait.
// Reference: PROTOCOL.md §5.9, §5.10, §5.13.
func TestFollowWaitsForTheBoundaryAcknowledgement(t *testing.T) {
	cutover := func() *Source {
		s, _ := pausedSource(t, stream(1000))
		s.Step(RelayReadyReceived{})
		s.Step(CutoverSent{Sum: RelaySum{Count: 2, CRC: 9}})
		return s
	}

	s := cutover()
	effects := s.Step(ReconcileAnswered{TargetOwns: true})
	require.True(t, has[CloseOut](effects))
	require.False(t, has[StartFollow](effects), "the target has not acknowledged the batch")
	require.Equal(t, []string{"StopTimer", "StopTimer", "ReleaseBoundary", "StartFollow"}, kinds(s.Step(BoundaryAcked{})))
	require.Equal(t, []string{"EndFollow", "StartTimer"}, kinds(s.Step(TimerFired{Timer: TimerFollow})), "followed once")

	s = cutover()
	s.Step(BoundaryAcked{})
	require.True(t, has[StartFollow](s.Step(ReconcileAnswered{TargetOwns: true})), "acknowledged first: follow at the commit")

	s = cutover()
	s.Step(ReconcileAnswered{TargetOwns: true})
	require.Equal(t, []string{"ResendBoundary", "StartFollow"}, kinds(s.Step(ConnectionLost{})))
	require.False(t, has[StartFollow](s.Step(BoundaryAcked{})), "followed once")

	s = cutover()
	s.Step(ConnectionLost{})
	require.True(t, has[StartFollow](s.Step(ReconcileAnswered{TargetOwns: true})), "the link was lost: no waiting")

	s = cutover()
	s.Step(ReconcileAnswered{TargetOwns: true})
	effects = s.Step(TimerFired{Timer: TimerBoundaryGiveUp})
	rb, ok := find[ReleaseBoundary](effects)
	require.True(t, ok)
	require.True(t, rb.Unacknowledged)
	require.Less(t, indexOf(kinds(effects), "ReleaseBoundary"), indexOf(kinds(effects), "StartFollow"))

	s = cutover()
	s.Step(TimerFired{Timer: TimerBoundaryGiveUp})
	k := kinds(s.Step(ReconcileAnswered{TargetOwns: true}))
	require.Less(t, indexOf(k, "ReleaseBoundary"), indexOf(k, "StartFollow"), "overdue: released and followed at the commit")

	s = cutover()
	require.True(t, has[StartFollow](s.Step(ReconcileAnswered{SourceEnded: true})))
}

// A target lost between relay-ready and its commit (crashed, removed at
// its deadline, its CAS refused) never commits: once the store shows the
// move fenced out, the source serves again from what it held — saved work
// and boundary batch first — and releases the payload; nothing is released
// or closed before that, whatever the timers say, and follow does not end
// while the move may still come back.
// Reference: PROTOCOL.md §6.5 (a target lost after relay-ready), docs/FAULTS.md.
func TestFenceOutAfterCutoverReinstatesTheSource(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{Sum: RelaySum{Count: 1, CRC: 3}})
	require.Empty(t, s.Step(TimerFired{Timer: TimerResendWindow}))
	effects := s.Step(ReconcileAnswered{})
	st, ok := find[StartTimer](effects)
	require.True(t, ok)
	require.Equal(t, TimerReconcile, st.Timer)
	require.Equal(t, []string{"ConfirmCommit"}, kinds(s.Step(TimerFired{Timer: TimerReconcile})))
	require.Empty(t, s.Step(TimerFired{Timer: TimerFollow}), "follow goes on while undecided")
	effects = s.Step(ReconcileAnswered{FencedOut: true})
	k := kinds(effects)
	require.Less(t, indexOf(k, "Reinstate"), indexOf(k, "ReleasePayload"), "served from the payload before it is dropped")
	require.False(t, has[CloseOut](effects))
	require.Equal(t, []string{"relocation_fenced_out"}, logEvent(effects))
	require.Equal(t, SourceRunning, s.Phase())
	require.True(t, s.Finished())
	require.Empty(t, s.Step(ReconcileAnswered{TargetOwns: true}), "a late answer changes nothing")
	require.Empty(t, s.Step(TimerFired{Timer: TimerFollow}))
}

// A source whose own lease ended with the move's outcome unknown decides
// nothing more: before relay-ready its held work goes back to the
// incarnation (which the ended lifecycle fails loudly), after the cutover
// the instance and payload are released.
// Reference: PROTOCOL.md §6.5 (the source's own lease ends), docs/FAULTS.md.
func TestSourceLeaseEndedEndsTheUndecidedMove(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	effects := s.Step(ReconcileAnswered{SourceEnded: true})
	require.True(t, has[Unseal](effects))
	require.Equal(t, SourceRunning, s.Phase())
	require.True(t, s.Finished())

	s, _ = pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{})
	s.Step(TimerFired{Timer: TimerResendWindow})
	effects = s.Step(ReconcileAnswered{SourceEnded: true})
	require.True(t, has[CloseOut](effects))
	require.True(t, has[ReleasePayload](effects))
	require.False(t, has[Reinstate](effects))
	require.Equal(t, []string{"relocation_undecided_at_lease_end"}, logEvent(effects), "what may be lost is said loudly")
	s.Step(TimerFired{Timer: TimerFollow})
	s.Step(BoundaryAcked{})
	require.True(t, s.Finished())
}

// A lost connection inside the resend window makes the source resend the
// whole boundary batch and cutover under a new epoch.
// Reference: PROTOCOL.md §5.9 (cutover lost, source running).
func TestConnectionLossResendsWholeBoundaryBatch(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{Sum: RelaySum{Count: 2, CRC: 9}})
	r, ok := find[ResendBoundary](s.Step(ConnectionLost{}))
	require.True(t, ok)
	require.EqualValues(t, 1, r.Epoch)
	r, _ = find[ResendBoundary](s.Step(ConnectionLost{}))
	require.EqualValues(t, 2, r.Epoch)
}

// A lost connection before relay-ready resends the same Restore request
// and chunks; the target keeps its progress for the same identity. At
// relay-ready the payload's share of the budget returns.
// Reference: PROTOCOL.md §5.3, §5.6, §5.7.
func TestConnectionLossBeforeRelayReadyResendsPrepare(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	require.Equal(t, []string{"SendPrepare", "SendChunks"}, kinds(s.Step(ConnectionLost{})))
	require.Equal(t, ReturnBudget{}, s.Step(RelayReadyReceived{})[0])
}

// With no reply by the restore deadline the source does not guess: it
// reconciles with the store, fails waiters Unavailable while the store
// shows no commit, and adopts the target route once it does — never
// reopening the source.
// Reference: PROTOCOL.md §6.4.
func TestNoReplyReconcilesAndNeverReopens(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	effects := s.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.True(t, has[Reconcile](effects))
	effects = s.Step(ReconcileAnswered{TargetOwns: false})
	require.False(t, has[Unseal](effects))
	f, ok := find[FailHeld](effects)
	require.True(t, ok)
	require.ErrorIs(t, f.Err, roamerr.ErrUnavailable)
	require.True(t, has[Reconcile](s.Step(TimerFired{Timer: TimerReconcile})))
	effects = s.Step(ReconcileAnswered{TargetOwns: true})
	require.True(t, has[AdoptTargetRoute](effects))
	require.Equal(t, FollowOnly, s.Phase())
}

// While reconciling, a move the store shows fenced out (past the target's
// restore deadline, the source still at its fence) can never commit: the
// source queue is restored (parked sends first) and the object serves
// again, as after an explicit failure; the phase goes back to
// SourceRunning, the one backward edge.
// Reference: PROTOCOL.md §6.4, §6.5, §6.7 (SourcePaused → SourceRunning).
func TestReconcileRestoresTheSourceWhenTheMoveIsFencedOut(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	require.True(t, has[Reconcile](s.Step(TimerFired{Timer: TimerRestoreDeadline})))
	require.False(t, has[Unseal](s.Step(ReconcileAnswered{TargetOwns: false})), "a target that may still commit is waited for")
	require.True(t, has[Reconcile](s.Step(TimerFired{Timer: TimerReconcile})))
	effects := s.Step(ReconcileAnswered{FencedOut: true})
	require.True(t, has[Unseal](effects))
	require.True(t, has[ReleasePayload](effects))
	require.Equal(t, SourceRunning, s.Phase())
	require.True(t, s.Finished())
	require.Empty(t, s.Step(ReconcileAnswered{TargetOwns: true}), "a late answer changes nothing")
}

// A capture that cannot be encoded (a queued message that cannot cross
// nodes) unseals at once with TypeMismatch; nothing was sent.
// Reference: PROTOCOL.md §5.5, §10 (bad input gets a typed error and changes nothing).
func TestCaptureFailureUnseals(t *testing.T) {
	s := NewSource(testID, DefaultConfig(), deadline)
	s.Step(Start{})
	s.Step(CapabilityAnswered{Supported: true})
	s.Step(Admitted{})
	effects := s.Step(CaptureFailed{Err: errors.New("not a protobuf message")})
	require.Equal(t, []string{"Unseal", "Complete"}, kinds(effects))
	require.ErrorIs(t, effects[1].(Complete).Err, roamerr.ErrTypeMismatch)
	require.Equal(t, SourceRunning, s.Phase())
}

// An idle-only move whose seal found the object busy unseals with the
// busy error in its own class (Unavailable refined by ErrBusy), not as a
// capture's TypeMismatch: the caller retries when the object is idle.
// Reference: docs/PLACEMENT.md §3.
func TestBusyAtTheSealUnsealsAsBusy(t *testing.T) {
	s := NewSource(testID, DefaultConfig(), deadline)
	s.Step(Start{})
	s.Step(CapabilityAnswered{Supported: true})
	s.Step(Admitted{})
	effects := s.Step(CaptureFailed{Err: fmt.Errorf("%w: %w: 2 messages queued", roamerr.ErrUnavailable, roamerr.ErrBusy)})
	require.Equal(t, []string{"Unseal", "Complete"}, kinds(effects))
	roamerrtest.AssertOneClass(t, effects[1].(Complete).Err, roamerr.ErrBusy)
	require.True(t, s.Finished())
}

// ---- target ----

func prepared(t *testing.T, payload []byte, limit int) (*Target, []envelope.Chunk) {
	m, chunks, err := envelope.Split(payload, limit)
	require.NoError(t, err)
	tg, effects := NewTarget(testID, DefaultConfig(), PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 30})
	require.Equal(t, "InstallStaging", typeName(effects[0]), "temporary queue first")
	require.True(t, has[VerifySource](effects), "the store must back the prepare")
	require.Equal(t, TargetRestoring, tg.Phase())
	require.Empty(t, tg.Step(SourceVerified{}))
	return tg, chunks
}

// Relay-ready waits for the store to back the prepare when the restore
// is quicker; a prepare the store does not back (its source is not the
// owner at the fence) is refused stale, the target removed, no CAS.
// Reference: PROTOCOL.md §2.3 (the coordinator fence), §5.7.
func TestRelayReadyWaitsForTheSourceCheck(t *testing.T) {
	payload := stream(300)
	m, chunks, err := envelope.Split(payload, 100)
	require.NoError(t, err)
	for _, backed := range []bool{true, false} {
		tg, _ := NewTarget(testID, DefaultConfig(), PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20})
		for _, c := range chunks {
			tg.Step(ChunkReceived{Chunk: c})
		}
		require.Empty(t, tg.Step(Restored{}), "restored, not yet verified")
		require.Equal(t, TargetRestoring, tg.Phase())
		if backed {
			require.Equal(t, []string{"SendRelayReady", "StartTimer"}, kinds(tg.Step(SourceVerified{})))
			require.Equal(t, RelayReady, tg.Phase())
			continue
		}
		effects := tg.Step(SourceVerified{Err: errors.New("owner is node-9")})
		f, ok := find[SendFailed](effects)
		require.True(t, ok)
		require.Equal(t, messages.FailureReason_FAILURE_REASON_STALE, f.Reason)
		require.NotContains(t, f.Detail, "node-9", "the refusal tells the sender nothing it did not send")
		c, _ := find[Complete](effects)
		require.ErrorIs(t, c.Err, roamerr.ErrStale)
		require.True(t, has[RemoveTarget](effects))
		require.False(t, has[SendRelayReady](effects))
		require.Equal(t, TargetRemoved, tg.Phase())
	}
}

// A source check whose tries ran out at the restore deadline with answers
// that said nothing of the source (the store unavailable) fails the move
// as a deadline, not as stale: the source is told DEADLINE, and its caller
// gets DeadlineExceeded. Before, such a check answered STALE ("the source
// is not the object's owner"), seen under load in the SpotWide fault test.
// Reference: PROTOCOL.md §5.7.
func TestAnUnsettledSourceCheckIsADeadlineNotStale(t *testing.T) {
	payload := stream(100)
	m, chunks, err := envelope.Split(payload, 100)
	require.NoError(t, err)
	tg, _ := NewTarget(testID, DefaultConfig(), PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20})
	for _, c := range chunks {
		tg.Step(ChunkReceived{Chunk: c})
	}
	require.Empty(t, tg.Step(Restored{}))
	effects := tg.Step(SourceVerified{Err: fmt.Errorf("%w: read timed out", roamerr.ErrUnavailable), Unsettled: true})
	f, ok := find[SendFailed](effects)
	require.True(t, ok)
	require.Equal(t, messages.FailureReason_FAILURE_REASON_DEADLINE, f.Reason)
	c, _ := find[Complete](effects)
	require.ErrorIs(t, c.Err, roamerr.ErrDeadlineExceeded)
	require.False(t, errors.Is(c.Err, roamerr.ErrStale))
	require.True(t, has[RemoveTarget](effects))
	require.Equal(t, TargetRemoved, tg.Phase())
	require.ErrorIs(t, failureError(f.Reason, f.Detail), roamerr.ErrDeadlineExceeded, "what the source's caller gets")
}

// Chunks are one-way: the target credits each chunk but the last (with
// the default step of one byte), whose bytes relay-ready answers, so a
// payload of one chunk costs no credit message.
// Reference: PROTOCOL.md §5.3.
func TestTheLastChunkIsNeverCredited(t *testing.T) {
	for _, n := range []int{1, 3} {
		tg, chunks := prepared(t, stream(100*n), 100)
		require.Len(t, chunks, n)
		var credits []uint64
		for _, c := range chunks {
			for _, e := range tg.Step(ChunkReceived{Chunk: c}) {
				if cr, ok := e.(SendCredit); ok {
					credits = append(credits, cr.ReceivedBytes)
				}
			}
		}
		want := []uint64{}
		for i := 1; i < n; i++ {
			want = append(want, uint64(100*i))
		}
		require.Equal(t, want, append([]uint64{}, credits...), "%d chunks", n)
	}
}

// restored feeds every chunk and the Restored answer.
func restored(t *testing.T, payload []byte) *Target {
	tg, chunks := prepared(t, payload, 100)
	var effects []Effect
	for _, c := range chunks {
		effects = append(effects, tg.Step(ChunkReceived{Chunk: c})...)
	}
	r, ok := find[RestorePayload](effects)
	require.True(t, ok)
	require.Equal(t, payload, r.Stream)
	require.False(t, has[SendRelayReady](effects), "relay-ready only after the restore")
	effects = tg.Step(Restored{})
	require.Equal(t, []string{"SendRelayReady", "StartTimer"}, kinds(effects))
	require.Equal(t, RelayReady, tg.Phase())
	return tg
}

// record is a relayed record whose batch index is its letter's place in
// the alphabet ("a" is 0).
func record(s string) RelayRecordReceived {
	return RelayRecordReceived{Index: int(s[0] - 'a'), Record: []byte(s), Item: s}
}

func sumOf(items ...string) RelaySum {
	var s RelaySum
	for _, it := range items {
		s = s.Add([]byte(it))
	}
	return s
}

// The target installs its temporary queue before any chunk, assembles
// chunks in any order, restores only a verified payload, and replies
// relay-ready without touching the store.
// Reference: PROTOCOL.md §5.7, §12.1 item 15 (no store write before restore).
func TestTargetRestoresVerifiedPayloadBeforeRelayReady(t *testing.T) {
	payload := stream(1000)
	tg, chunks := prepared(t, payload, 64)
	rand.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	var effects []Effect
	for _, c := range chunks {
		effects = append(effects, tg.Step(ChunkReceived{Chunk: c})...)
	}
	require.False(t, has[CommitOwner](effects))
	r, ok := find[RestorePayload](effects)
	require.True(t, ok)
	require.True(t, bytes.Equal(payload, r.Stream))
	require.Equal(t, []string{"SendRelayReady", "StartTimer"}, kinds(tg.Step(Restored{})))
}

// A payload whose checksum does not match is never restored: an explicit
// failure reply, the target removed, no CAS.
// Reference: PROTOCOL.md §5.7, §6.2, §12.1 item 10.
func TestChecksumMismatchIsAnExplicitFailure(t *testing.T) {
	payload := stream(500)
	tg, chunks := prepared(t, payload, 100)
	chunks[2].Data = append([]byte(nil), chunks[2].Data...)
	chunks[2].Data[5] ^= 0xff
	var effects []Effect
	for _, c := range chunks {
		effects = append(effects, tg.Step(ChunkReceived{Chunk: c})...)
	}
	f, ok := find[SendFailed](effects)
	require.True(t, ok)
	require.Equal(t, messages.FailureReason_FAILURE_REASON_CHECKSUM_MISMATCH, f.Reason)
	require.False(t, has[RestorePayload](effects))
	require.False(t, has[CommitOwner](effects))
	require.True(t, has[RemoveTarget](effects))
	require.Equal(t, TargetRemoved, tg.Phase())
}

// The same Restore request again reuses the progress (no second temporary
// queue); one with another length or checksum ends in an explicit conflict
// and never touches the existing assembly.
// Reference: PROTOCOL.md §5.7, §12.1 item 9.
func TestRepeatedAndConflictingRestoreRequests(t *testing.T) {
	payload := stream(500)
	m, _, err := envelope.Split(payload, 100)
	require.NoError(t, err)
	tg, chunks := prepared(t, payload, 100)
	tg.Step(ChunkReceived{Chunk: chunks[0]})
	require.Empty(t, tg.Step(PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 30}))

	other := m
	other.ChecksumCRC32C++
	effects := tg.Step(PrepareReceived{Manifest: other, RestoreDeadline: deadline, MaxPayloadLength: 1 << 30})
	f, ok := find[SendFailed](effects)
	require.True(t, ok)
	require.Equal(t, messages.FailureReason_FAILURE_REASON_CONFLICT, f.Reason)
	require.Equal(t, TargetRemoved, tg.Phase())
	require.Empty(t, tg.Step(ChunkReceived{Chunk: chunks[1]}))
}

// The cutover with a matching count and CRC starts the target-only CAS;
// the backlog is saved work, then the relay in order; dispatch opens only
// after the commit.
// Reference: PROTOCOL.md §5.9, §5.11, §5.12.
func TestCutoverStartsCASAndCommitOpensBacklog(t *testing.T) {
	tg := restored(t, stream(300))
	for _, r := range []string{"a", "b", "c"} {
		require.Empty(t, tg.Step(record(r)))
	}
	effects := tg.Step(CutoverReceivedEvent{Sum: sumOf("a", "b", "c")})
	require.Equal(t, []string{"StopTimer", "AckBoundary", "CommitOwner"}, kinds(effects))
	require.Equal(t, CutoverReceived, tg.Phase())
	require.False(t, tg.FellBack())
	effects = tg.Step(StoreCommitted{})
	o, ok := find[OpenDispatch](effects)
	require.True(t, ok)
	require.Equal(t, []any{"a", "b", "c"}, o.Relay)
	require.Equal(t, OwnerCommitted, tg.Phase())
	c, _ := find[Complete](tg.Step(DispatchOpened{}))
	require.NoError(t, c.Err)
	require.Equal(t, TargetOpen, tg.Phase())
}

// A cutover whose count or CRC differs is an Error (an implementation
// defect); the target waits for a resend or the fallback.
// Reference: PROTOCOL.md §5.9.
func TestCutoverMismatchIsAnError(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(record("a"))
	effects := tg.Step(CutoverReceivedEvent{Sum: sumOf("a", "b")})
	require.Equal(t, []string{"cutover_mismatch"}, logEvent(effects))
	require.False(t, has[CommitOwner](effects))
	require.Equal(t, RelayReady, tg.Phase())
}

// Without a cutover within RelocationCutoverWaitTimeout the target logs
// cutover_timeout and commits anyway.
// Reference: PROTOCOL.md §5.10.
func TestCutoverTimeoutFallsBack(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(record("a"))
	effects := tg.Step(TimerFired{Timer: TimerCutoverWait})
	require.Equal(t, []string{"cutover_timeout"}, logEvent(effects))
	require.True(t, has[CommitOwner](effects))
	require.Equal(t, CutoverFallback, tg.Phase())
	require.True(t, tg.FellBack())
}

// A late or duplicate cutover changes neither owner nor queue: it logs
// late_cutover, and acknowledges the batch only when every record it
// declares has arrived.
// Reference: PROTOCOL.md §5.10, §12.1 item 24.
func TestLateCutoverOnlyWarns(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(TimerFired{Timer: TimerCutoverWait})
	effects := tg.Step(CutoverReceivedEvent{Sum: sumOf("a")})
	require.Equal(t, []string{"late_cutover"}, logEvent(effects))
	require.Len(t, effects, 1, "record 0 is missing: no acknowledgement")
	tg.Step(StoreCommitted{})
	tg.Step(DispatchOpened{})
	effects = tg.Step(CutoverReceivedEvent{Sum: sumOf("a")})
	require.Equal(t, []string{"late_cutover"}, logEvent(effects))
	require.Len(t, effects, 1)
}

// A resent batch (new epoch) replaces the partial batch whole: the backlog
// holds each record once, in batch order.
// Reference: PROTOCOL.md §5.9, §12.1 item 13 (a resend replaces staging whole).
func TestResentBatchReplacesPartialBatchWhole(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(record("a"))
	tg.Step(record("b"))
	for _, r := range []string{"a", "b", "c"} {
		rr := record(r)
		rr.Epoch = 1
		tg.Step(rr)
	}
	stale := record("x")
	require.Empty(t, tg.Step(stale), "a record of a replaced epoch is dropped")
	tg.Step(CutoverReceivedEvent{Epoch: 1, Sum: sumOf("a", "b", "c")})
	o, _ := find[OpenDispatch](tg.Step(StoreCommitted{}))
	require.Equal(t, []any{"a", "b", "c"}, o.Relay)
	// A resend that crosses the matched cutover is a duplicate whole.
	rr := record("a")
	rr.Epoch = 2
	require.Empty(t, tg.Step(rr))
}

// After the fallback, a resend repeats the prefix the backlog already has;
// only the records beyond it are delivered, late.
// Reference: PROTOCOL.md §5.10 (fallback: order not guaranteed, nothing lost).
func TestFallbackThenResendDeliversOnlyNewRecords(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(record("a"))
	tg.Step(record("b"))
	tg.Step(TimerFired{Timer: TimerCutoverWait})
	o, _ := find[OpenDispatch](tg.Step(StoreCommitted{}))
	require.Equal(t, []any{"a", "b"}, o.Relay)
	tg.Step(DispatchOpened{})
	var late []any
	for _, r := range []string{"a", "b", "c", "d"} {
		rr := record(r)
		rr.Epoch = 1
		for _, e := range tg.Step(rr) {
			if d, ok := e.(DeliverLate); ok {
				late = append(late, d.Item)
			}
		}
	}
	require.Equal(t, []any{"c", "d"}, late)
}

// After the fallback, records are told apart by batch index, not by
// position in an epoch: a batch whose connection broke with a gap (b lost,
// c arrived on the next connection) gets exactly the missing record from a
// resend, and the resent cutover is acknowledged — again on a duplicate,
// since an acknowledgement can be lost.
// Reference: PROTOCOL.md §5.9, §5.10 (cutover lost).
func TestFallbackRecordsAreDeduplicatedByIndexAndAcknowledged(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(record("a"))
	tg.Step(record("c"))
	tg.Step(TimerFired{Timer: TimerCutoverWait})
	o, _ := find[OpenDispatch](tg.Step(StoreCommitted{}))
	require.Equal(t, []any{"a", "c"}, o.Relay)
	tg.Step(DispatchOpened{})
	var late []any
	acks := 0
	step := func(ev Event) {
		for _, e := range tg.Step(ev) {
			switch e := e.(type) {
			case DeliverLate:
				late = append(late, e.Item)
			case AckBoundary:
				acks++
			}
		}
	}
	for _, r := range []string{"a", "b", "c"} {
		rr := record(r)
		rr.Epoch = 1
		step(rr)
	}
	require.Zero(t, acks, "no cutover declared the batch yet")
	step(CutoverReceivedEvent{Epoch: 1, Sum: sumOf("a", "b", "c")})
	require.Equal(t, []any{"b"}, late)
	require.Equal(t, 1, acks)
	step(CutoverReceivedEvent{Epoch: 2, Sum: sumOf("a", "b", "c")})
	require.Equal(t, 2, acks, "a repeated cutover is acknowledged again")
	require.Equal(t, []any{"b"}, late)
}

// Retryable and indeterminate store answers retry the same CAS until the
// owner is confirmed.
// Reference: PROTOCOL.md §5.11, §12.1 item 19.
func TestStoreRetryConvergesOnCommit(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	effects := tg.Step(StoreRetryable{Err: errors.New("indeterminate")})
	require.Equal(t, StoreRetry, tg.Phase())
	require.Equal(t, []string{"StartTimer"}, kinds(effects))
	c, ok := find[CommitOwner](tg.Step(TimerFired{Timer: TimerStoreRetry}))
	require.True(t, ok)
	require.Equal(t, 2, c.Attempt)
	require.True(t, has[OpenDispatch](tg.Step(StoreCommitted{})))
}

// A CAS that lost to a newer version of a record still backing the move
// is tried again at once, reading the record afresh — once; a second
// conflict backs off like any retryable answer.
// Reference: PROTOCOL.md §5.11.
func TestAConflictIsRetriedAtOnceOnce(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	c, ok := find[CommitOwner](tg.Step(StoreRetryable{Err: errors.New("conflict"), Conflict: true}))
	require.True(t, ok, "no wait before the second attempt")
	require.Equal(t, 2, c.Attempt)
	require.Equal(t, []string{"StartTimer"}, kinds(tg.Step(StoreRetryable{Err: errors.New("conflict"), Conflict: true})))
	c, ok = find[CommitOwner](tg.Step(TimerFired{Timer: TimerStoreRetry}))
	require.True(t, ok)
	require.Equal(t, 3, c.Attempt)
	require.True(t, has[OpenDispatch](tg.Step(StoreCommitted{})))
}

// If the owner change is not confirmed by the restore deadline the target
// logs location_update_failed and removes what it prepared; it never opens.
// Reference: PROTOCOL.md §5.11, §6.3, §12.1 item 20.
func TestDeadlineWithoutCommitRemovesTarget(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	tg.Step(StoreRetryable{Err: errors.New("unavailable")})
	effects := tg.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.Equal(t, []string{"location_update_failed"}, logEvent(effects))
	require.True(t, has[RemoveTarget](effects))
	c, _ := find[Complete](effects)
	require.ErrorIs(t, c.Err, roamerr.ErrDeadlineExceeded)
	require.Equal(t, TargetRemoved, tg.Phase())
	// A late store answer never reactivates the move.
	require.Empty(t, tg.Step(StoreCommitted{}))
	require.Empty(t, tg.Step(TimerFired{Timer: TimerStoreRetry}))
}

// A deadline that passes while a CAS is in flight waits for its answer: a
// success is not late; a retryable answer ends the move.
// Reference: PROTOCOL.md §5.11, §6.3.
func TestDeadlineDuringInFlightCASWaitsForTheAnswer(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	require.Empty(t, tg.Step(TimerFired{Timer: TimerRestoreDeadline}))
	require.True(t, has[OpenDispatch](tg.Step(StoreCommitted{})))

	tg = restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	tg.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.Equal(t, []string{"location_update_failed"}, logEvent(tg.Step(StoreRetryable{})))
}

// Another valid owner or generation ends the move at once as stale.
// Reference: PROTOCOL.md §5.11 (stale).
func TestStaleOwnerRemovesAtOnce(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	effects := tg.Step(StoreStale{Err: errors.New("owner is node-9")})
	require.True(t, has[RemoveTarget](effects))
	c, _ := find[Complete](effects)
	require.ErrorIs(t, c.Err, roamerr.ErrStale)
	require.False(t, has[OpenDispatch](effects))
}

// A RelocationAbort before relay-ready removes the staging target.
// Reference: PROTOCOL.md §6.2.
func TestAbortBeforeRelayReadyRemovesTarget(t *testing.T) {
	tg, _ := prepared(t, stream(300), 100)
	require.True(t, has[RemoveTarget](tg.Step(AbortReceived{})))
	require.Equal(t, TargetRemoved, tg.Phase())
}

// Newest prepare wins (PROTOCOL.md §5.7): a newer Restore request of the
// same object removes a run still restoring, with an explicit failure its
// source restores itself on; past relay-ready the run is kept (the driver
// refuses the newer request instead).
// Reference: PROTOCOL.md §12.1 (two prewarm prepares never coexist).
func TestSupersededPrepareIsRemovedOnlyBeforeRelayReady(t *testing.T) {
	tg, _ := prepared(t, stream(300), 100)
	effects := tg.Step(Superseded{})
	require.True(t, has[SendFailed](effects))
	require.True(t, has[RemoveTarget](effects))
	require.Equal(t, TargetRemoved, tg.Phase())

	tg = restored(t, stream(300))
	require.Empty(t, tg.Step(Superseded{}))
	require.Equal(t, RelayReady, tg.Phase())
	require.True(t, has[CommitOwner](tg.Step(CutoverReceivedEvent{})))
	require.Empty(t, tg.Step(Superseded{}))
	require.True(t, has[OpenDispatch](tg.Step(StoreCommitted{})))
}

// Random event sequences never take an edge outside PROTOCOL.md §6.7 (the
// machine panics if it would), never CAS before relay-ready, and never
// open dispatch before a commit.
// Reference: PROTOCOL.md §6.7, §12.1 items 15–16.
func TestRandomEventsKeepTheInvariants(t *testing.T) {
	payload := stream(400)
	m, chunks, err := envelope.Split(payload, 100)
	require.NoError(t, err)
	targetEvents := func(r *rand.Rand) Event {
		switch r.IntN(15) {
		case 0:
			return ChunkReceived{Chunk: chunks[r.IntN(len(chunks))]}
		case 11:
			if r.IntN(4) == 0 {
				return SourceVerified{Err: errors.New("not the owner")}
			}
			return SourceVerified{}
		case 1:
			return Restored{}
		case 2:
			return RestoreFailed{Err: errors.New("x")}
		case 3:
			rr := record("r")
			rr.Epoch = uint32(r.IntN(3))
			return rr
		case 4:
			return CutoverReceivedEvent{Epoch: uint32(r.IntN(3)), Sum: RelaySum{Count: uint64(r.IntN(3))}}
		case 5:
			return AbortReceived{}
		case 6:
			return StoreCommitted{}
		case 7:
			return StoreRetryable{}
		case 8:
			return StoreStale{}
		case 9:
			return DispatchOpened{}
		case 10:
			return PrepareReceived{Manifest: m, MaxPayloadLength: 1 << 20}
		case 12:
			return Superseded{}
		default:
			return TimerFired{Timer: Timer(1 + r.IntN(5))}
		}
	}
	for seed := uint64(0); seed < 2000; seed++ {
		r := rand.New(rand.NewPCG(seed, 1))
		tg, _ := NewTarget(testID, DefaultConfig(), PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20})
		relayReady, committed, backed := false, false, false
		for i := 0; i < 60; i++ {
			ev := targetEvents(r)
			if v, ok := ev.(SourceVerified); ok && v.Err == nil && tg.Phase() == TargetRestoring {
				backed = true
			}
			for _, e := range tg.Step(ev) {
				switch e.(type) {
				case SendRelayReady:
					require.True(t, backed, "seed %d: relay-ready to a prepare the store did not back", seed)
					relayReady = true
				case CommitOwner:
					require.True(t, relayReady, "seed %d: CAS before relay-ready", seed)
				case OpenDispatch:
					require.False(t, committed, "seed %d: opened twice", seed)
					committed = true
					require.Equal(t, OwnerCommitted, tg.Phase())
				}
			}
		}
	}
	sourceEvents := func(r *rand.Rand, bound bool) Event {
		switch r.IntN(11) {
		case 0:
			return Start{SessionBound: bound}
		case 9:
			if r.IntN(3) == 0 {
				return SessionsSealed{Err: roamerr.ErrConflict}
			}
			return SessionsSealed{}
		case 1:
			return CapabilityAnswered{Supported: r.IntN(4) > 0}
		case 2:
			return Admitted{}
		case 3:
			return Captured{Stream: envelope.Whole(payload)}
		case 4:
			return RelayReadyReceived{}
		case 5:
			return FailedReceived{}
		case 6:
			return CutoverSent{}
		case 7:
			return ConnectionLost{}
		case 8:
			switch r.IntN(3) {
			case 0:
				return ReconcileAnswered{TargetOwns: r.IntN(2) == 0, FencedOut: r.IntN(3) == 0, SourceEnded: r.IntN(8) == 0}
			case 1:
				v := RecordView{Present: true, Version: uint64(r.IntN(9)), OwnerNodeRid: testID.Fence.NodeRid, OwnerNodeGeneration: testID.Fence.NodeGeneration,
					OwnerGeneration: testID.Fence.OwnerGeneration, ObjectGeneration: 1}
				switch r.IntN(4) {
				case 0:
					v.OwnerNodeRid, v.RelocationID = "tgt", testID.RelocationID
				case 1:
					v.RelocationID = testID.RelocationID
				case 2:
					v.OwnerGeneration++
				}
				return ReconcileRead{Record: v, Target: "tgt", ObjectGeneration: 1, SourceEnded: r.IntN(8) == 0}
			default:
				if r.IntN(2) == 0 {
					return FenceOutAnswered{}
				}
				return FenceOutAnswered{Err: errors.New("conflict")}
			}
		default:
			return TimerFired{Timer: Timer(1 + r.IntN(7))}
		}
	}
	for seed := uint64(0); seed < 2000; seed++ {
		r := rand.New(rand.NewPCG(seed, 2))
		s := NewSource(testID, DefaultConfig(), deadline)
		relayed, releases, closed, reinstated, completes := false, 0, false, false, 0
		bound := seed%2 == 1
		sessionsSealed, sealed, sessionAborts := false, false, 0
		for i := 0; i < 60; i++ {
			ev := sourceEvents(r, bound)
			restoredNow := false // this step's effects restored the source queue so far
			if ss, ok := ev.(SessionsSealed); ok && ss.Err == nil {
				sessionsSealed = true
			}
			for _, e := range s.Step(ev) {
				switch e.(type) {
				case SealSessions:
					require.True(t, bound, "seed %d: an unbound source asked a Session owner", seed)
				case Seal:
					require.True(t, !bound || sessionsSealed, "seed %d: sealed before the Session owner did", seed)
					sealed = true
				case AbortSessions:
					sessionAborts++
					require.True(t, bound, "seed %d: a Session abort of an unbound source", seed)
					refused := false
					if ss, ok := ev.(SessionsSealed); ok && ss.Err != nil && !sealed {
						refused = true
					}
					require.True(t, restoredNow || refused, "seed %d: a Session abort before the source's queue was restored", seed)
				case Unseal:
					restoredNow = true
				case Reinstate:
					restoredNow = true
				}
				switch e.(type) {
				case RelayThenCutover:
					relayed = true
				case Unseal:
					require.False(t, relayed, "seed %d: source reopened after relay-ready", seed)
				case Reinstate:
					// Only a fence-out answer after the cutover, and never
					// once the instance was closed.
					fenced := false
					switch a := ev.(type) {
					case ReconcileAnswered:
						fenced = a.FencedOut
					case ReconcileRead:
						fenced = a.Record.RelocationID == testID.RelocationID && a.Record.OwnerNodeRid == testID.Fence.NodeRid
					case FenceOutAnswered:
						fenced = a.Err == nil
					}
					require.True(t, fenced && relayed && !closed, "seed %d: reinstated without a fence-out", seed)
					reinstated = true
				case CloseOut:
					require.False(t, reinstated, "seed %d: closed a reinstated instance", seed)
					closed = true
				case ReleasePayload:
					releases++
				case Complete:
					completes++
				}
			}
		}
		require.LessOrEqual(t, releases, 1, "seed %d: payload released twice", seed)
		require.LessOrEqual(t, completes, 1, "seed %d: completed twice", seed)
		require.LessOrEqual(t, sessionAborts, 1, "seed %d: two Session aborts", seed)
	}
}

// An explicit failure or a relay-ready reply that arrives after
// reconciliation began is still handled as such: the failure restores the
// source (it is before relay-ready was accepted), the reply proceeds.
// Reference: PROTOCOL.md §6.2, §6.4.
func TestLateReplyDuringReconciliation(t *testing.T) {
	s, _ := pausedSource(t, stream(1000))
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	effects := s.Step(FailedReceived{Reason: messages.FailureReason_FAILURE_REASON_DEADLINE})
	require.True(t, has[Unseal](effects))
	require.Equal(t, SourceRunning, s.Phase())
	require.Empty(t, s.Step(ReconcileAnswered{TargetOwns: true}))

	s, _ = pausedSource(t, stream(1000))
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.True(t, has[RelayThenCutover](s.Step(RelayReadyReceived{})))
	require.Empty(t, s.Step(ReconcileAnswered{TargetOwns: false}))
}

// A target whose CAS outcome is unknown (an indeterminate answer: the
// write may have applied) never removes itself at the restore deadline on
// a timeout: it settles with reads only — no new CAS — until the store
// answers, then opens if the record names it, or removes itself if the
// record is still at the source's fence.
// Reference: PROTOCOL.md §3.3, §6.3 (indeterminate outcomes), §12.1 item 19.
func TestUnknownCommitOutcomeIsSettledByAReadNotATimeout(t *testing.T) {
	for _, outcome := range []string{"applied", "not applied"} {
		tg := restored(t, stream(300))
		tg.Step(CutoverReceivedEvent{})
		tg.Step(StoreRetryable{Err: errors.New("EOF"), Unknown: true})
		effects := tg.Step(TimerFired{Timer: TimerRestoreDeadline})
		require.False(t, has[RemoveTarget](effects), outcome)
		require.Equal(t, []string{"commit_outcome_unknown"}, logEvent(effects))
		c, ok := find[CommitOwner](effects)
		require.True(t, ok)
		require.True(t, c.SettleOnly, "past the deadline only reads")
		// The store is still unreachable: keep reading, never remove.
		effects = tg.Step(StoreRetryable{Err: errors.New("unavailable")})
		require.False(t, has[RemoveTarget](effects))
		c, ok = find[CommitOwner](tg.Step(TimerFired{Timer: TimerStoreRetry}))
		require.True(t, ok)
		require.True(t, c.SettleOnly)
		if outcome == "applied" {
			require.True(t, has[OpenDispatch](tg.Step(StoreCommitted{})))
			continue
		}
		effects = tg.Step(StoreNotCommitted{})
		require.True(t, has[RemoveTarget](effects))
		require.Equal(t, []string{"location_update_failed"}, logEvent(effects))
	}
}

// An unknown outcome that a later read settled as "not applied" lets the
// deadline remove the target as usual.
// Reference: PROTOCOL.md §6.3.
func TestSettledUnknownOutcomeAllowsRemovalAtTheDeadline(t *testing.T) {
	tg := restored(t, stream(300))
	tg.Step(CutoverReceivedEvent{})
	tg.Step(StoreRetryable{Err: errors.New("EOF"), Unknown: true})
	tg.Step(TimerFired{Timer: TimerStoreRetry})
	tg.Step(StoreNotCommitted{}) // the retry's read: still at the fence
	require.Equal(t, StoreRetry, tg.Phase())
	effects := tg.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.True(t, has[RemoveTarget](effects))
}

// A target whose node stops gracefully refuses a move still restoring with
// an explicit failure (its source serves again), and lets a move past
// relay-ready — which its source can no longer take back — go on to its
// commit.
// Reference: PROTOCOL.md §6.1, §6.2 (explicit failure before relay-ready), §6.3.
func TestNodeStoppingRefusesRestoringMovesAndKeepsCommittingOnes(t *testing.T) {
	tg, _ := prepared(t, stream(300), 100)
	effects := tg.Step(NodeStopping{})
	require.True(t, has[SendFailed](effects))
	require.True(t, has[RemoveTarget](effects))
	require.Equal(t, TargetRemoved, tg.Phase())

	tg = restored(t, stream(300))
	require.Empty(t, tg.Step(NodeStopping{}))
	require.Equal(t, RelayReady, tg.Phase())
	require.True(t, has[CommitOwner](tg.Step(CutoverReceivedEvent{})))
	require.True(t, has[OpenDispatch](tg.Step(StoreCommitted{})))
}

// The source's reading of a record while its move's outcome is unknown is
// decided in the machine: a record still at the fence waits (watched after
// the cutover) until the target's restore deadline plus a cutover wait,
// then is fenced out by a CAS on the version read; one question to the
// store at a time; a record changed elsewhere decides nothing before the
// cutover and confirms the target's commit after it.
// Reference: PROTOCOL.md §6.4, §6.5, docs/FAULTS.md (the fence-out).
func TestReconcileReadsAreJudgedInTheMachine(t *testing.T) {
	const target = "target-rid"
	atFence := RecordView{Present: true, Version: 7, OwnerNodeRid: testID.Fence.NodeRid, OwnerNodeGeneration: testID.Fence.NodeGeneration,
		OwnerGeneration: testID.Fence.OwnerGeneration, ObjectGeneration: 1}
	read := func(v RecordView) ReconcileRead { return ReconcileRead{Record: v, Target: target, ObjectGeneration: 1} }

	// Before relay-ready.
	s, _ := pausedSource(t, stream(100))
	effects := s.Step(TimerFired{Timer: TimerRestoreDeadline})
	st, _ := find[StartTimer](effects)
	require.Equal(t, TimerFenceOut, st.Timer)
	require.Equal(t, deadline.Add(DefaultConfig().CutoverWaitTimeout), st.At)
	effects = s.Step(read(atFence))
	require.True(t, has[FailHeld](effects))
	require.False(t, has[FenceOut](effects), "not before the target's deadline")
	elsewhere := atFence
	elsewhere.OwnerNodeRid = "someone-else"
	require.Equal(t, []string{"Reconcile"}, kinds(s.Step(TimerFired{Timer: TimerFenceOut})))
	require.Empty(t, s.Step(TimerFired{Timer: TimerReconcile}), "one question at a time")
	f, ok := find[FenceOut](s.Step(read(atFence)))
	require.True(t, ok)
	require.EqualValues(t, 7, f.Version)
	require.True(t, has[StartTimer](s.Step(FenceOutAnswered{Err: errors.New("conflict")})), "a failed fence-out asks again later")
	require.True(t, has[Reconcile](s.Step(TimerFired{Timer: TimerReconcile})))
	fenced := atFence
	fenced.RelocationID = testID.RelocationID
	require.True(t, has[Unseal](s.Step(read(fenced))), "an earlier fence-out landed")
	require.Equal(t, SourceRunning, s.Phase())

	// A record moved from the fence means the target committed (only its
	// CAS can move it while this lifecycle lives), also before the cutover:
	// the held sends follow it.
	s, _ = pausedSource(t, stream(100))
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	effects = s.Step(read(elsewhere))
	require.True(t, has[AdoptTargetRoute](effects))
	require.Equal(t, FollowOnly, s.Phase())
	require.Equal(t, []string{"ReleasePayload"}, kinds(s.Step(TimerFired{Timer: TimerResendWindow})), "confirmed: released after the window")
	require.Equal(t, []string{"EndFollow", "StartTimer"}, kinds(s.Step(TimerFired{Timer: TimerFollow})))
	require.True(t, s.Finished())

	// An unknown answer completes the move with an error; a later commit
	// found does not complete it a second time.
	s, _ = pausedSource(t, stream(100))
	s.Step(TimerFired{Timer: TimerRestoreDeadline})
	require.True(t, has[Complete](s.Step(read(atFence))))
	s.Step(TimerFired{Timer: TimerReconcile})
	mine := atFence
	mine.OwnerNodeRid, mine.RelocationID = target, testID.RelocationID
	effects = s.Step(read(mine))
	require.True(t, has[AdoptTargetRoute](effects))
	require.False(t, has[Complete](effects), "completed once")

	// After the cutover.
	s, _ = pausedSource(t, stream(100))
	s.Step(RelayReadyReceived{})
	c, ok := find[ConfirmCommit](s.Step(CutoverSent{}))
	require.True(t, ok)
	require.Zero(t, c.After, "a read first")
	c, ok = find[ConfirmCommit](s.Step(read(atFence)))
	require.True(t, ok)
	require.EqualValues(t, 7, c.After, "then a watch for the next change")
	require.Empty(t, s.Step(TimerFired{Timer: TimerReconcile}))
	require.True(t, has[CloseOut](s.Step(read(elsewhere))), "a record moved from the fence means the target committed")

	s, _ = pausedSource(t, stream(100))
	s.Step(RelayReadyReceived{})
	s.Step(CutoverSent{})
	require.Empty(t, s.Step(TimerFired{Timer: TimerFenceOut}), "the watch is still open")
	require.True(t, has[StartTimer](s.Step(ReconcileRead{Err: errors.New("watch deadline"), Target: target, ObjectGeneration: 1})),
		"an error asks again later")
	require.True(t, has[ConfirmCommit](s.Step(TimerFired{Timer: TimerReconcile})))
	require.True(t, has[FenceOut](s.Step(read(atFence))))
	require.True(t, has[Reinstate](s.Step(FenceOutAnswered{})))
}

// The target's reading of the record around its CAS.
// Reference: PROTOCOL.md §5.11.
func TestJudgeCommit(t *testing.T) {
	base := RecordView{Present: true, Version: 3, OwnerNodeRid: testID.Fence.NodeRid, OwnerNodeGeneration: testID.Fence.NodeGeneration,
		OwnerGeneration: testID.Fence.OwnerGeneration, ObjectGeneration: 1}
	require.Nil(t, testID.JudgeCommit(base, "me", 9, 1), "still at the fence: go on")
	mine := base
	mine.OwnerNodeRid, mine.OwnerGeneration, mine.RelocationID = "me", 9, testID.RelocationID
	require.IsType(t, StoreCommitted{}, testID.JudgeCommit(mine, "me", 9, 1))
	fenced := base
	fenced.RelocationID = testID.RelocationID
	require.IsType(t, StoreStale{}, testID.JudgeCommit(fenced, "me", 9, 1), "fenced out by the source")
	other := base
	other.OwnerGeneration++
	require.IsType(t, StoreStale{}, testID.JudgeCommit(other, "me", 9, 1))
	require.IsType(t, StoreStale{}, testID.JudgeCommit(base, "me", 9, 2), "another object generation")
	require.IsType(t, StoreStale{}, testID.JudgeCommit(RecordView{}, "me", 9, 1))
}

// The owner CAS waits for a Closing record to be Ready again; a Ready one
// goes on.
func TestJudgeOwnerChange(t *testing.T) {
	v := RecordView{Present: true, Version: 3, State: messages.LifecycleState_LIFECYCLE_STATE_CLOSING}
	ev := testID.JudgeOwnerChange(v)
	require.IsType(t, StoreRetryable{}, ev, "never an owner over a Closing record")
	require.False(t, ev.(StoreRetryable).Unknown, "nothing was written")
	require.IsType(t, StoreRetryable{}, testID.JudgeOwnerChange(RecordView{Present: true}), "no state is not Ready")
	v.State = messages.LifecycleState_LIFECYCLE_STATE_READY
	require.Nil(t, testID.JudgeOwnerChange(v))
}
