package handoff

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Source is the hand-off of one relocation unit on the node it leaves.
//
// It is state-major, the way etcd's raft steps a node: the phase selects
// one step function (stepRunning, stepPaused, stepRelayReady,
// stepFollowing), and a phase with a life of its own keeps it in a
// sub-phase that only that phase reads (prep, paused, follow). Three lives
// cross phases and have their own fields: the payload copy, the boundary
// batch and the question put to the store while the outcome is unknown.
type Source struct {
	cfg      Config
	id       Identity
	phase    Phase
	deadline time.Time

	// prep is SourceRunning's sub-phase: how far the move got before the
	// seal. It is prepOver from the capture on, so a source that serves
	// again after a move ignores everything.
	prep prepStage
	// paused is SourcePaused's sub-phase: waiting for the target's reply,
	// or reconciling with the store after none came by the restore
	// deadline (PROTOCOL.md §6.4).
	paused pausedStage
	// follow is FollowOnly's sub-phase: whether the move is confirmed and
	// whether Message Follow ended.
	follow followStage

	payload  payloadStage
	boundary boundaryStage

	// sessionBound: a participant is bound to a client Session; its
	// Session owner seals the binding before this source seals, and is told
	// when the source serves again (docs/SESSIONS.md §2). Set by Start.
	sessionBound bool
	// checkFirst: the target checks this source before the seal
	// (CapabilityAnswered.SourceCheck), so the store read that backs the
	// move is off its pause. Set by CapabilityAnswered.
	checkFirst bool
	// several: the unit has more than one participant, whose captures
	// come one by one; TimerSealPatience bounds the wait for them. Set by
	// Start.
	several bool
	// done: Complete was emitted. Always true in FollowOnly and once the
	// source serves again after a move; in SourcePaused and RelayReady it
	// is true when a reconciliation already answered "outcome unknown".
	done       bool
	chunkLimit int
	manifest   envelope.Manifest
	chunks     []envelope.Chunk // the payload's chunks while payload is held
	epoch      uint32           // the boundary batch's resend epoch

	// The store question, while the outcome is unknown (reconciling in
	// SourcePaused, or unconfirmed in FollowOnly): one question at a time.
	// It is not reset when the phase changes: a question put while
	// reconciling is still answered after relay-ready, and that answer is
	// judged after the cutover.
	//
	// asking: a Reconcile, ConfirmCommit or FenceOut is unanswered; no new
	// question is put. Cleared by any answer (a read answers it even when
	// a FenceOut is also out).
	asking bool
	// fencing: a FenceOut is unanswered; only then is FenceOutAnswered
	// judged. Cleared by its answer or by a judged outcome.
	fencing bool
	// fenceOutDue: TimerFenceOut fired (the target's deadline is over): a
	// record still at the source's fence is fenced out. Never cleared.
	fenceOutDue bool
	// heldFailed: FailHeld was emitted (once, at the first "outcome
	// unknown" while reconciling in SourcePaused).
	heldFailed bool
}

// prepStage is how far a move is before the seal (SourceRunning).
type prepStage int

const (
	prepIdle            prepStage = iota // Start not yet in
	prepQuerying                         // QueryCapability emitted
	prepAdmitting                        // AwaitAdmission emitted
	prepChecking                         // CheckSource emitted (checkFirst)
	prepSealingSessions                  // SealSessions emitted (sessionBound)
	prepSealing                          // Seal emitted: capture awaited
	prepOver                             // captured, or the move ended before
)

// pausedStage is SourcePaused's sub-phase.
type pausedStage int

const (
	pausedAwaitingReply pausedStage = iota // relay-ready or a failure may still come
	pausedReconciling                      // the restore deadline passed without a reply
)

// followStage is FollowOnly's sub-phase. After the cutover the source
// holds the payload, the boundary batch and the application instance
// until the move is decided: confirmed once the store shows the target's
// commit (or the object is no longer this source's); until then a
// fence-out can still put the object back here (docs/FAULTS.md, "A target
// lost after relay-ready"). A source that adopted the target's route while
// reconciling starts confirmed.
type followStage int

const (
	followUnconfirmed followStage = iota
	// followUnconfirmedExpired: the follow period ended before the move
	// was confirmed; Message Follow ends at the confirmation.
	followUnconfirmedExpired
	// followHolding: confirmed, but what was held since the cutover waits
	// for the target to acknowledge the boundary batch before it follows
	// (StartFollow). After a cutover fallback the target delivers the
	// records it lacked late, through its driver, while followed messages
	// go straight to the object's queue: followed before the
	// acknowledgement, a caller's later messages could be handled before
	// its earlier relayed ones. Left when the batch is acknowledged, given
	// up on or no longer holds follow (boundaryStage.holdsFollow), or when
	// the follow period ends.
	followHolding
	followConfirmed // confirmed and following
	followEnded     // EndFollow was emitted; TimerStub runs
	// followStopped: StopIncarnation was emitted, one follow period
	// after EndFollow.
	followStopped
)

// payloadStage is the payload copy's life: held from the capture until
// ReleasePayload. Before the cutover it is the only copy; after it, until
// the move is confirmed, it is what a fence-out would serve from.
type payloadStage int

const (
	payloadNone payloadStage = iota // not captured yet, or released
	payloadHeld
	// payloadKept: the resend window after the cutover is over; the copy
	// goes once the move is confirmed.
	payloadKept
)

// boundaryStage is the boundary batch's life after the cutover. Its wire
// copy is resent every cutover wait (and at once on a connection loss)
// until the target acknowledges it, the batch goes back into this
// source's queue (Reinstate), or BoundaryAckPatience passes with the move
// confirmed. Resending or overdue only in FollowOnly.
type boundaryStage int

const (
	boundaryNone boundaryStage = iota // no cutover sent
	boundaryResending
	// boundaryUnlinked: resending, but the connection to the target was
	// lost since the cutover. The acknowledgement may then never come (a
	// target gone after its commit), so what was held follows without it,
	// and the follow sink finds the owner as on any lost route.
	boundaryUnlinked
	// boundaryOverdue: the patience ran out before the move was confirmed;
	// the batch is dropped, unacknowledged, at the confirmation.
	boundaryOverdue
	boundaryReleased // ReleaseBoundary was emitted
)

func (b boundaryStage) held() bool {
	return b == boundaryResending || b == boundaryUnlinked || b == boundaryOverdue
}

// holdsFollow: what was held since the cutover waits for this batch (see
// followHolding). An overdue batch holds it only until the confirmation,
// which releases the batch.
func (b boundaryStage) holdsFollow() bool { return b == boundaryResending || b == boundaryOverdue }

// NewSource starts a machine in SourceRunning. restoreDeadline is the
// absolute deadline of the Restore operation (docs/PROTOCOL.md §5.11).
func NewSource(id Identity, cfg Config, restoreDeadline time.Time) *Source {
	return &Source{cfg: cfg, id: id, phase: SourceRunning, deadline: restoreDeadline}
}

// Phase is the current phase.
func (s *Source) Phase() Phase { return s.phase }

// Identity is the move's identity.
func (s *Source) Identity() Identity { return s.id }

// Finished reports whether the move is over: decided, payload released
// and Message Follow ended (or never started). The incarnation that
// moved away may still answer Unavailable until Forgettable.
func (s *Source) Finished() bool {
	return s.done && s.payload == payloadNone && (s.phase != FollowOnly || s.follow >= followEnded) && !s.boundary.held()
}

// Forgettable reports whether nothing at all is left: Finished, and no
// incarnation waits for its StopIncarnation.
func (s *Source) Forgettable() bool {
	return s.Finished() && (s.phase != FollowOnly || s.follow == followStopped)
}

// endFollow ends Message Follow; the incarnation answers Unavailable for
// one more follow period, then stops.
func (s *Source) endFollow() []Effect {
	holding := s.follow == followHolding
	s.follow = followEnded
	var effects []Effect
	if holding {
		// Still no acknowledgement a follow period after the commit: what
		// was held follows before Message Follow ends, or it would be
		// stranded in the hold.
		effects = append(effects, StartFollow{})
	}
	return append(effects, EndFollow{}, StartTimer{Timer: TimerStub, After: s.cfg.FollowDuration})
}

// followIfDue leaves followHolding once the boundary batch no longer
// holds follow: acknowledged, given up on, or the connection to the
// target lost.
func (s *Source) followIfDue() []Effect {
	if s.follow != followHolding || s.boundary.holdsFollow() {
		return nil
	}
	s.follow = followConfirmed
	return []Effect{StartFollow{}}
}

func (s *Source) moveTo(p Phase) { s.phase = mustMove(s.phase, p) }

func (s *Source) complete(err error) Effect {
	s.done = true
	return Complete{Err: err}
}

// completeOnce appends Complete unless the move already completed (an
// unknown outcome completes it with an error; a later decision does not
// complete it again).
func (s *Source) completeOnce(effects []Effect, err error) []Effect {
	if s.done {
		return effects
	}
	return append(effects, s.complete(err))
}

// serveAgain takes a backward edge to SourceRunning. The payload copy is
// gone after it: the effects that follow restore the queue from it
// (Unseal, Reinstate) before their ReleasePayload.
func (s *Source) serveAgain() {
	s.moveTo(SourceRunning)
	s.payload, s.chunks = payloadNone, nil
}

// Step feeds one event and returns the effects to run, in order. The
// phase's step function handles what the phase expects; everything else
// goes to ignore.
func (s *Source) Step(ev Event) []Effect {
	switch s.phase {
	case SourceRunning:
		return s.stepRunning(ev)
	case SourcePaused:
		return s.stepPaused(ev)
	case RelayReady:
		return s.stepRelayReady(ev)
	case FollowOnly:
		return s.stepFollowing(ev)
	}
	panic(fmt.Sprintf("handoff: a source in %s", s.phase))
}

// ignore is where every event a phase of either machine does not expect
// ends: a late or duplicate answer, a timer of an earlier stretch that was
// not stopped, or an event of a step the move is past. None changes
// anything and none is worth a log; the late events that are (a failure
// reply after relay-ready, a conflicting Restore request, a late cutover)
// are handled by the phases that receive them.
func ignore(Event) []Effect { return nil }

// stepRunning: before the seal (prep), and after a move that ended with
// the source serving again (prepOver: everything is ignored).
func (s *Source) stepRunning(ev Event) []Effect {
	switch ev := ev.(type) {
	case Start:
		if s.prep == prepIdle {
			s.prep = prepQuerying
			s.sessionBound = ev.SessionBound
			s.several = ev.Participants > 1
			return []Effect{QueryCapability{}}
		}
	case CapabilityAnswered:
		if s.prep == prepQuerying {
			return s.capabilityAnswered(ev)
		}
	case Admitted:
		if s.prep == prepAdmitting {
			return s.admitted()
		}
	case SourceChecked:
		if s.prep == prepChecking {
			return append([]Effect{StopTimer{Timer: TimerSourceCheck}}, s.sourceChecked(ev.Err)...)
		}
	case SessionsSealed:
		if s.prep == prepSealingSessions {
			return append([]Effect{StopTimer{Timer: TimerSessionSeal}}, s.sessionsSealed(ev)...)
		}
	case SessionOwnersLooked:
		if s.prep == prepSealingSessions {
			return s.sessionsSealed(s.sessionOwnersLooked(ev))
		}
	case CaptureFailed:
		if s.prep == prepSealing {
			return s.captureFailed(ev)
		}
	case TimerFired:
		if ev.Timer == TimerSessionSeal && s.prep == prepSealingSessions {
			return []Effect{LookUpSessionOwners{}}
		}
		if ev.Timer == TimerSourceCheck && s.prep == prepChecking {
			return s.sourceChecked(fmt.Errorf("%w: the target did not answer the source check before the restore deadline", roamerr.ErrDeadlineExceeded))
		}
		if ev.Timer == TimerSealPatience && s.prep == prepSealing {
			// The captures that did come are unsealed; the seals still
			// pending are undone as they take effect.
			return s.captureFailed(CaptureFailed{Err: fmt.Errorf("%w: a participant of the move did not finish its turn within %v",
				roamerr.ErrDeadlineExceeded, s.cfg.sealPatience())})
		}
	case Captured:
		if s.prep == prepSealing {
			return s.captured(ev)
		}
	}
	return ignore(ev)
}

func (s *Source) capabilityAnswered(ev CapabilityAnswered) []Effect {
	if !ev.Supported {
		// An unusable target never blocks the source (PROTOCOL.md §5.2).
		s.prep = prepOver
		if ev.Code != "" {
			return []Effect{s.complete(roamerr.FromCode(ev.Code, "target cannot host the object: "+ev.Reason))}
		}
		return []Effect{s.complete(fmt.Errorf("%w: target cannot host the object: %s", roamerr.ErrUnavailable, ev.Reason))}
	}
	s.chunkLimit = s.cfg.ChunkLimit
	switch {
	case ev.ReceiveChunkLimit == 0:
		s.chunkLimit = min(s.chunkLimit, s.cfg.UnnegotiatedChunkLimit)
	case int(ev.ReceiveChunkLimit) < s.chunkLimit:
		s.chunkLimit = int(ev.ReceiveChunkLimit)
	}
	s.checkFirst = ev.SourceCheck
	s.prep = prepAdmitting
	return []Effect{AwaitAdmission{}}
}

func (s *Source) admitted() []Effect {
	if s.checkFirst {
		// Checked after the admission, right before the seal: a move that
		// waited long for budget is checked as it is when it seals.
		s.prep = prepChecking
		return []Effect{CheckSource{}, StartTimer{Timer: TimerSourceCheck, At: s.deadline}}
	}
	return s.sealSessionsFirst()
}

// sourceChecked: a target that does not back the source, or that could not
// tell, ends the move before anything is sealed — the object serves on
// and the caller sees why (PROTOCOL.md §5.2). A move that the store would
// not let commit is never paused for.
func (s *Source) sourceChecked(err error) []Effect {
	if err != nil {
		s.prep = prepOver
		return []Effect{s.complete(err)}
	}
	return s.sealSessionsFirst()
}

// sealSessionsFirst seals the Session bindings, if any, then the source.
func (s *Source) sealSessionsFirst() []Effect {
	if s.sessionBound {
		// The Session owner seals first: from then on it holds the
		// client's messages, so none reaches a sealed source.
		s.prep = prepSealingSessions
		return []Effect{SealSessions{}, StartTimer{Timer: TimerSessionSeal, After: s.cfg.sessionSealWait()}}
	}
	return s.seal()
}

// seal stops dispatch on every participant; with more than one, their
// captures are awaited for SealPatience at most.
func (s *Source) seal() []Effect {
	s.prep = prepSealing
	if s.several {
		return []Effect{Seal{}, StartTimer{Timer: TimerSealPatience, After: s.cfg.sealPatience()}}
	}
	return []Effect{Seal{}}
}

// sealed ends the wait for the captures.
func (s *Source) sealed(effects []Effect) []Effect {
	if s.several {
		return append([]Effect{StopTimer{Timer: TimerSealPatience}}, effects...)
	}
	return effects
}

// sessionOwnersLooked: past the seal wait, a Session owner whose node is
// gone had its binding dropped (the move goes on unbound); one that may be
// alive and stays silent ends the move before the source seals.
func (s *Source) sessionOwnersLooked(ev SessionOwnersLooked) SessionsSealed {
	if !ev.Silent {
		return SessionsSealed{}
	}
	return SessionsSealed{Err: fmt.Errorf("%w: a Session owner did not answer the seal request within %v",
		roamerr.ErrDeadlineExceeded, s.cfg.sessionSealWait())}
}

func (s *Source) sessionsSealed(ev SessionsSealed) []Effect {
	if ev.Err != nil {
		// Nothing sealed here: the object serves on. A seal whose
		// reply was lost is released by the abort.
		s.prep = prepOver
		return []Effect{AbortSessions{}, s.complete(ev.Err)}
	}
	return s.seal()
}

func (s *Source) captureFailed(ev CaptureFailed) []Effect {
	// Sealed but nothing left the node: restore and report. A capture
	// that failed is the state's type; one that never came in time (a
	// participant in a long turn) keeps its DeadlineExceeded.
	s.prep = prepOver
	s.moveTo(SourcePaused)
	s.moveTo(SourceRunning)
	err := roamerr.Wrap(roamerr.ErrTypeMismatch, "capture", ev.Err)
	switch {
	case errors.Is(ev.Err, roamerr.ErrDeadlineExceeded):
		err = roamerr.Keep(roamerr.ErrDeadlineExceeded, "capture", ev.Err)
	case errors.Is(ev.Err, roamerr.ErrBusy):
		// An idle-only move found the object busy at its seal: it
		// serves on, nothing captured (RelocateIfIdle).
		err = roamerr.Keep(roamerr.ErrUnavailable, "capture", ev.Err)
	}
	return s.sealed(s.withSessionAbort([]Effect{Unseal{}, s.complete(err)}))
}

func (s *Source) captured(ev Captured) []Effect {
	s.prep = prepOver
	m, chunks, err := envelope.SplitStream(ev.Stream, s.chunkLimit)
	if err != nil {
		s.moveTo(SourcePaused)
		s.moveTo(SourceRunning)
		return s.sealed(s.withSessionAbort([]Effect{Unseal{}, s.complete(fmt.Errorf("%w: payload: %w", roamerr.ErrInvalidOperation, err))}))
	}
	s.moveTo(SourcePaused)
	s.paused = pausedAwaitingReply
	s.manifest, s.chunks, s.payload = m, chunks, payloadHeld
	return s.sealed([]Effect{
		SendPrepare{Manifest: m, ChunkLimit: s.chunkLimit},
		SendChunks{Chunks: chunks},
		StartTimer{Timer: TimerRestoreDeadline, At: s.deadline},
	})
}

// stepPaused: sealed, the payload on its way. The target's reply decides
// the move whether or not the source is reconciling: an explicit failure
// before relay-ready is accepted is exactly the condition for restoring
// the source, and a relay-ready that arrives while reconciling proceeds
// normally (PROTOCOL.md §6.4).
func (s *Source) stepPaused(ev Event) []Effect {
	switch ev := ev.(type) {
	case FailedReceived:
		return s.failedBeforeRelayReady(ev)
	case RelayReadyReceived:
		s.moveTo(RelayReady)
		return []Effect{ReturnBudget{}, StopTimer{Timer: TimerRestoreDeadline}, StopTimer{Timer: TimerReconcile}, RelayThenCutover{Epoch: s.epoch}}
	}
	if s.paused == pausedReconciling {
		return s.stepUndecided(ev, s.reconciled)
	}
	switch ev := ev.(type) {
	case ConnectionLost:
		// Prepare or chunks may be lost; the target keeps progress for a
		// repeated Restore request of the same identity (PROTOCOL.md §5.6).
		// What was in flight went back to the budget with the connection
		// (sourcerun.ConnectionLost).
		return []Effect{SendPrepare{Manifest: s.manifest, ChunkLimit: s.chunkLimit}, SendChunks{Chunks: s.chunks}}
	case TimerFired:
		if ev.Timer == TimerRestoreDeadline {
			// No reply: the target may have committed after a lost
			// relay-ready. Never reopen on a guess (PROTOCOL.md §6.4).
			s.paused = pausedReconciling
			s.asking = true
			return []Effect{
				Log{Level: loglevel.Warn, Event: "relocation_reconcile", Msg: "no reply from the target before the restore deadline; reconciling with the store"},
				StartTimer{Timer: TimerFenceOut, At: s.fenceOutAt()},
				Reconcile{},
			}
		}
	}
	return ignore(ev)
}

// failedBeforeRelayReady restores the source queue from memory first,
// then sends the RelocationAbort, one-way (PROTOCOL.md §6.2).
func (s *Source) failedBeforeRelayReady(ev FailedReceived) []Effect {
	s.serveAgain()
	return s.completeOnce(s.withSessionAbort([]Effect{
		StopTimer{Timer: TimerRestoreDeadline},
		StopTimer{Timer: TimerReconcile},
		Unseal{},
		SendAbort{Reason: ev.Reason},
		ReleasePayload{},
	}), failureError(ev.Reason, ev.Detail))
}

// failureAfterRelayReady: accepting relay-ready ended the source's
// ability to restore itself on the target's word (PROTOCOL.md §6.1).
func failureAfterRelayReady() []Effect {
	return []Effect{Log{Level: loglevel.Warn, Event: "failure_after_relay_ready", Msg: "explicit failure after relay-ready ignored: the boundary is irreversible"}}
}

// stepUndecided is the store question's life, shared by reconciling
// (SourcePaused) and the unconfirmed stretch after the cutover
// (FollowOnly): the answers to the questions put to the store, and the
// timers that put the next one. decide takes a judged outcome.
func (s *Source) stepUndecided(ev Event, decide func(ReconcileAnswered) []Effect) []Effect {
	switch ev := ev.(type) {
	case ReconcileRead:
		s.asking = false
		return s.judge(ev)
	case FenceOutAnswered:
		if !s.fencing {
			break
		}
		s.asking, s.fencing = false, false
		if ev.Err == nil {
			return s.Step(ReconcileAnswered{FencedOut: true})
		}
		return s.Step(ReconcileAnswered{}) // conflict or unknown: the next read decides
	case ReconcileAnswered:
		s.asking, s.fencing = false, false
		return decide(ev)
	case TimerFired:
		switch ev.Timer {
		case TimerReconcile:
			return s.ask()
		case TimerFenceOut:
			if !s.fenceOutDue {
				s.fenceOutDue = true
				return s.ask()
			}
		}
	}
	return ignore(ev)
}

// reconciled decides a move whose target did not reply by the restore
// deadline from a judged outcome (PROTOCOL.md §6.4).
func (s *Source) reconciled(ev ReconcileAnswered) []Effect {
	switch {
	case ev.SourceEnded:
		// This node's lifecycle ended while the outcome was unknown:
		// nothing here can decide it any more (the store no longer
		// takes this node's writes). The held work goes back into the
		// incarnation, which the ended lifecycle then fails loudly.
		s.serveAgain()
		return s.completeOnce([]Effect{StopTimer{Timer: TimerReconcile}, Unseal{}, ReleasePayload{}},
			fmt.Errorf("%w: the source's owner lease ended while the move's outcome was unknown", roamerr.ErrUnavailable))
	case ev.TargetOwns:
		// The commit is known: the move is confirmed here (the payload
		// goes after the resend window, follow ends after its period).
		s.moveTo(FollowOnly)
		s.follow = followConfirmed
		return s.completeOnce([]Effect{
			AdoptTargetRoute{},
			StartTimer{Timer: TimerResendWindow, After: s.cfg.CutoverWaitTimeout},
			StartTimer{Timer: TimerFollow, After: s.cfg.FollowDuration},
		}, nil)
	case ev.FencedOut:
		// The target never committed and now never can (the store
		// fences its CAS out): like an explicit failure, the source
		// queue is restored, parked sends first, and the object serves
		// again (PROTOCOL.md §6.4).
		s.serveAgain()
		return s.completeOnce(s.withSessionAbort([]Effect{
			StopTimer{Timer: TimerReconcile},
			Log{Level: loglevel.Warn, Event: "relocation_fenced_out", Msg: "the target did not commit by its restore deadline and is fenced out; the source serves again"},
			Unseal{},
			ReleasePayload{},
		}), fmt.Errorf("%w: the target did not commit by its restore deadline", roamerr.ErrUnavailable))
	}
	var effects []Effect
	if !s.heldFailed {
		s.heldFailed = true
		effects = append(effects, FailHeld{Err: fmt.Errorf("%w: relocation outcome unknown; the object is unavailable until reconciled", roamerr.ErrUnavailable)})
	}
	effects = s.completeOnce(effects, fmt.Errorf("%w: relocation outcome unknown (no reply before the restore deadline)", roamerr.ErrUnavailable))
	return append(effects, StartTimer{Timer: TimerReconcile, After: s.cfg.CutoverWaitTimeout})
}

// stepRelayReady: relay-ready accepted, the relay and the cutover going
// out.
func (s *Source) stepRelayReady(ev Event) []Effect {
	switch ev.(type) {
	case CutoverSent:
		s.moveTo(FollowOnly)
		s.follow = followUnconfirmed
		s.boundary = boundaryResending
		s.asking = true
		return s.completeOnce([]Effect{
			StartTimer{Timer: TimerResendWindow, After: s.cfg.CutoverWaitTimeout},
			StartTimer{Timer: TimerFollow, After: s.cfg.FollowDuration},
			StartTimer{Timer: TimerFenceOut, At: s.fenceOutAt()},
			StartTimer{Timer: TimerBoundaryResend, After: s.cfg.CutoverWaitTimeout},
			StartTimer{Timer: TimerBoundaryGiveUp, After: s.cfg.ackPatience()},
			ConfirmCommit{Until: s.fenceOutAt()},
		}, nil)
	case FailedReceived:
		return failureAfterRelayReady()
	case ReconcileAnswered:
		// The answer to a question put while reconciling closes it; the
		// move itself goes on from relay-ready.
		s.asking, s.fencing = false, false
	}
	return ignore(ev)
}

// stepFollowing: after the cutover (or the reconciliation that found the
// target committed). The payload, the boundary batch and Message Follow
// each end on their own timer, and, while the move is unconfirmed, the
// store question goes on.
func (s *Source) stepFollowing(ev Event) []Effect {
	switch ev := ev.(type) {
	case FailedReceived:
		return failureAfterRelayReady()
	case BoundaryAcked:
		if s.boundary.held() {
			return append(s.releaseBoundary(false), s.followIfDue()...)
		}
		return ignore(ev)
	case ConnectionLost:
		if s.boundary.held() {
			// The boundary batch may not have reached the target: resend
			// it whole now (TimerBoundaryResend goes on repeating it until
			// the target acknowledges it). The target keeps what it
			// already has (by epoch and index), so repeats are harmless.
			s.epoch++
			if s.boundary == boundaryResending {
				s.boundary = boundaryUnlinked
			}
			return append([]Effect{ResendBoundary{Epoch: s.epoch}}, s.followIfDue()...)
		}
		return ignore(ev)
	case TimerFired:
		switch ev.Timer {
		case TimerResendWindow, TimerFollow:
			return s.followTimer(ev.Timer)
		case TimerBoundaryResend, TimerBoundaryGiveUp:
			return s.boundaryTimer(ev.Timer)
		case TimerStub:
			if s.follow == followEnded {
				s.follow = followStopped
				return []Effect{StopIncarnation{}}
			}
			return ignore(ev)
		}
	}
	if s.unconfirmed() {
		return s.stepUndecided(ev, s.confirm)
	}
	return ignore(ev)
}

func (s *Source) unconfirmed() bool {
	return s.follow == followUnconfirmed || s.follow == followUnconfirmedExpired
}

// followTimer: the resend window and the follow period, after the cutover
// (or the adoption of the target's route).
func (s *Source) followTimer(tm Timer) []Effect {
	switch tm {
	case TimerResendWindow:
		// Only after the cutover: before it the payload is the only
		// copy. Until the move is confirmed it is also what a fence-out
		// would serve from.
		if s.payload == payloadHeld {
			s.payload = payloadKept
			return s.releaseIfDecided()
		}
	case TimerFollow:
		switch s.follow {
		case followUnconfirmed:
			s.follow = followUnconfirmedExpired // the move may still come back here
		case followHolding, followConfirmed:
			return s.endFollow()
		}
	}
	return nil
}

// boundaryTimer: the boundary batch's resends after the cutover, until
// the target acknowledges it or the patience runs out.
func (s *Source) boundaryTimer(tm Timer) []Effect {
	switch {
	case !s.boundary.held():
		return nil
	case tm == TimerBoundaryResend:
		s.epoch++
		return []Effect{ResendBoundary{Epoch: s.epoch}, StartTimer{Timer: TimerBoundaryResend, After: s.cfg.CutoverWaitTimeout}}
	case s.unconfirmed():
		// A fence-out may still put the batch back into this source's
		// queue: decide at the confirmation.
		s.boundary = boundaryOverdue
		return nil
	}
	return append(s.releaseBoundary(true), s.followIfDue()...)
}

// fenceOutAt is when a move still undecided may be fenced out: the
// target's restore deadline (it stops trying to commit then, unless its
// CAS outcome is unknown, which the fence-out's version check covers) plus
// one cutover wait for its last answer.
func (s *Source) fenceOutAt() time.Time { return s.deadline.Add(s.cfg.CutoverWaitTimeout) }

// ask puts the next question to the store, if none is open: a read while
// reconciling, a read (then watches) after the cutover.
func (s *Source) ask() []Effect {
	if s.asking {
		return nil
	}
	s.asking = true
	if s.phase == SourcePaused {
		return []Effect{Reconcile{}}
	}
	return []Effect{ConfirmCommit{Until: s.fenceOutAt()}}
}

// judge decides what a record read means for a move whose outcome the
// source does not know (PROTOCOL.md §6.4, §6.5; docs/FAULTS.md, the
// fence-out). The target's commit, or an earlier fence-out, decides it. A
// record no longer at the source's fence means the target committed: while
// this lifecycle lives only its CAS moves the record from that fence. A
// record still at the fence is fenced out once TimerFenceOut fired; before
// that, after the cutover, the source watches for the next change.
func (s *Source) judge(ev ReconcileRead) []Effect {
	afterCutover := s.phase == FollowOnly
	if ev.Err == nil {
		switch s.id.judgeForSource(ev.Record, ev.Target, ev.ObjectGeneration) {
		case targetOwns:
			return s.Step(ReconcileAnswered{TargetOwns: true})
		case fencedOut:
			return s.Step(ReconcileAnswered{FencedOut: true})
		case changedElsewhere:
			// While this lifecycle lives only the target's CAS moves the
			// record from the source's fence (the source is sealed, and no
			// one releases a live owner's record): the target committed,
			// and the object may have moved on since. Before the cutover
			// too — waiting would park the sends for good.
			if !ev.SourceEnded {
				return s.Step(ReconcileAnswered{TargetOwns: true})
			}
		case atSourceFence:
			switch {
			case ev.SourceEnded:
			case s.fenceOutDue:
				s.asking, s.fencing = true, true
				return []Effect{FenceOut{Version: ev.Record.Version}}
			case afterCutover:
				s.asking = true
				return []Effect{ConfirmCommit{After: ev.Record.Version, Until: s.fenceOutAt()}}
			}
		}
	}
	if ev.SourceEnded {
		return s.Step(ReconcileAnswered{SourceEnded: true})
	}
	return s.Step(ReconcileAnswered{})
}

// confirm decides a move after its cutover from what the store shows
// (ConfirmCommit's answer). The target committed, or the object is no
// longer this source's: drop the instance, release the payload once the
// resend window is over, and follow once the target acknowledged the
// boundary batch. The move was fenced out — the target never
// committed by its restore deadline and now never can, because the record
// carries the move's RelocationId at the source's fence — so the source
// serves again from what it held: saved work, then the boundary batch,
// then the messages held since the cutover (nothing follows to the target
// before its commit is known, so none is stranded there), then what
// arrives next. Otherwise ask again later. This reverses relay-ready's
// boundary, which a source never crosses back on the target's word
// (PROTOCOL.md §6.1); the fence-out is what makes it safe
// (PROTOCOL.md §6.5; docs/FAULTS.md, "A target lost after relay-ready").
func (s *Source) confirm(ev ReconcileAnswered) []Effect {
	switch {
	case ev.TargetOwns || ev.SourceEnded:
		followDue := s.follow == followUnconfirmedExpired
		effects := []Effect{StopTimer{Timer: TimerReconcile}}
		if ev.SourceEnded {
			// Nothing here can wait for the target any more.
			s.follow = followConfirmed
			effects = append(effects, StartFollow{})
		} else {
			s.follow = followHolding
			effects = append(effects, s.followIfDue()...)
		}
		effects = append(effects, CloseOut{})
		if ev.SourceEnded {
			// Undecided, and this lifecycle can no longer fence the move
			// out: the target may still commit (its CAS does not depend on
			// this node's lease) and then has everything; if it never
			// does, the object ended with this owner, and the saved work
			// and boundary batch with it. Say so: it cannot be told here.
			effects = append([]Effect{Log{Level: loglevel.Error, Event: "relocation_undecided_at_lease_end",
				Msg: "this node's owner lease ended before the move's commit showed: the saved work and boundary batch are the target's if its commit lands, otherwise lost with this ended owner"}}, effects...)
		}
		effects = append(effects, s.releaseIfDecided()...)
		if s.boundary == boundaryOverdue {
			effects = append(effects, s.releaseBoundary(true)...)
			effects = append(effects, s.followIfDue()...)
		}
		if followDue {
			effects = append(effects, s.endFollow()...)
		}
		return effects
	case ev.FencedOut:
		s.serveAgain()
		effects := []Effect{
			StopTimer{Timer: TimerReconcile},
			StopTimer{Timer: TimerFenceOut},
			StopTimer{Timer: TimerResendWindow},
			StopTimer{Timer: TimerFollow},
			Log{Level: loglevel.Warn, Event: "relocation_fenced_out", Msg: "the target did not commit after relay-ready by its restore deadline and is fenced out; the source serves again from what it held"},
			Reinstate{},
			ReleasePayload{},
		}
		effects = s.withSessionAbort(effects)
		if s.boundary.held() {
			// The batch is back in this source's queue: no resends.
			effects = append(effects, s.releaseBoundary(false)...)
		}
		return effects
	}
	return []Effect{StartTimer{Timer: TimerReconcile, After: s.cfg.CutoverWaitTimeout}}
}

// withSessionAbort puts AbortSessions right after the effect that
// restores the source's queue (Unseal, Reinstate) when a participant is
// bound to a Session: the Session owner submits what it held to the
// source route only once the source serves again, behind the restored
// queue (docs/SESSIONS.md §2, command 44).
func (s *Source) withSessionAbort(effects []Effect) []Effect {
	if !s.sessionBound {
		return effects
	}
	for i, e := range effects {
		switch e.(type) {
		case Unseal, Reinstate:
			out := make([]Effect, 0, len(effects)+1)
			out = append(out, effects[:i+1]...)
			out = append(out, AbortSessions{})
			return append(out, effects[i+1:]...)
		}
	}
	panic("handoff: a Session abort without the source's restore")
}

// releaseBoundary stops the boundary batch's resends and drops its wire
// copy, once.
func (s *Source) releaseBoundary(unacknowledged bool) []Effect {
	s.boundary = boundaryReleased
	return []Effect{StopTimer{Timer: TimerBoundaryResend}, StopTimer{Timer: TimerBoundaryGiveUp}, ReleaseBoundary{Unacknowledged: unacknowledged}}
}

// releaseIfDecided drops the payload copy once the resend window is over
// and the move is confirmed.
func (s *Source) releaseIfDecided() []Effect {
	if s.payload != payloadKept || s.unconfirmed() {
		return nil
	}
	s.payload, s.chunks = payloadNone, nil
	return []Effect{ReleasePayload{}}
}

// failureError maps an explicit failure reply onto roam's error classes.
func failureError(r messages.FailureReason, detail string) error {
	class := roamerr.ErrUnavailable
	switch r {
	case messages.FailureReason_FAILURE_REASON_CONFLICT, messages.FailureReason_FAILURE_REASON_CHECKSUM_MISMATCH,
		messages.FailureReason_FAILURE_REASON_LENGTH_MISMATCH:
		class = roamerr.ErrConflict
	case messages.FailureReason_FAILURE_REASON_STALE:
		class = roamerr.ErrStale
	case messages.FailureReason_FAILURE_REASON_DEADLINE:
		class = roamerr.ErrDeadlineExceeded
	case messages.FailureReason_FAILURE_REASON_CAPACITY_EXCEEDED:
		class = roamerr.ErrCapacityExceeded
	case messages.FailureReason_FAILURE_REASON_NODE_DRAINING:
		return fmt.Errorf("%w: %w: target failed the relocation (%s): %s", roamerr.ErrUnavailable, roamerr.ErrNodeDraining, r, detail)
	}
	return fmt.Errorf("%w: target failed the relocation (%s): %s", class, r, detail)
}
