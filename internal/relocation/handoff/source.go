package handoff

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Source is the hand-off of one relocation unit on the node it leaves.
type Source struct {
	cfg      Config
	id       Identity
	phase    Phase
	deadline time.Time

	started, admitting, sealing bool
	// sessionBound: a participant is bound to a client Session; its
	// Session owner seals the binding before this source seals, and is told
	// when the source serves again (docs/SESSIONS.md §2).
	sessionBound    bool
	sealingSessions bool // SealSessions was emitted, SessionsSealed not yet in
	chunkLimit      int
	manifest        envelope.Manifest
	chunks          []envelope.Chunk

	epoch       uint32
	cutoverSent bool
	payloadHeld bool
	reconciling bool
	done        bool // Complete emitted
	followEnded bool

	// After the cutover (FollowOnly) the source holds the payload, the
	// boundary batch and the application instance until the move is
	// decided: confirmed once the store shows the target's commit (or the
	// object is no longer this source's); until then a fence-out can still
	// put the object back here (docs/FAULTS.md, "A target lost after
	// relay-ready").
	confirmed    bool
	windowPassed bool // the resend window after the cutover is over
	followDue    bool // the follow period ended before the move was confirmed

	// While the outcome is unknown (reconciling, or after the cutover until
	// confirmed) the source asks the store one question at a time.
	asking      bool // a Reconcile, ConfirmCommit or FenceOut is unanswered
	fenceOutDue bool // TimerFenceOut fired: the target's deadline is over
	fencing     bool // the open question is a FenceOut
	heldFailed  bool // FailHeld was emitted

	// The boundary batch's wire copy is resent every cutover wait after
	// the cutover (and at once on a connection loss) until the target
	// acknowledges it, the batch goes back into this source's queue
	// (Reinstate), or BoundaryAckPatience passes with the move confirmed.
	boundaryDone bool // ReleaseBoundary was emitted
	giveUpDue    bool // the patience ran out before the move was confirmed
}

// NewSource starts a machine in SourceRunning. restoreDeadline is the
// absolute deadline of the Restore operation (docs/PROTOCOL.md §5.11).
func NewSource(id Identity, cfg Config, restoreDeadline time.Time) *Source {
	return &Source{cfg: cfg, id: id, phase: SourceRunning, deadline: restoreDeadline}
}

// Phase is the current phase.
func (s *Source) Phase() Phase { return s.phase }

// Identity is the move's identity.
func (s *Source) Identity() Identity { return s.id }

// Finished reports whether nothing is left to do: decided, payload
// released and Message Follow ended (or never started).
func (s *Source) Finished() bool {
	return s.done && !s.payloadHeld && (s.phase != FollowOnly || s.followEnded) && (!s.cutoverSent || s.boundaryDone)
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

// Step feeds one event and returns the effects to run, in order. Events
// that do not apply to the current phase change nothing (a late or
// duplicate answer); those worth knowing about come back as a Log effect.
func (s *Source) Step(ev Event) []Effect {
	switch ev := ev.(type) {
	case Start:
		if s.started {
			return nil
		}
		s.started = true
		s.sessionBound = ev.SessionBound
		return []Effect{QueryCapability{}}

	case CapabilityAnswered:
		if !s.started || s.admitting || s.done {
			return nil
		}
		if !ev.Supported {
			// An unusable target never blocks the source (PROTOCOL.md §5.2).
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
		s.admitting = true
		return []Effect{AwaitAdmission{}}

	case Admitted:
		if !s.admitting || s.sealing || s.sealingSessions || s.done {
			return nil
		}
		if s.sessionBound {
			// The Session owner seals first: from then on it holds the
			// client's messages, so none reaches a sealed source.
			s.sealingSessions = true
			return []Effect{SealSessions{}}
		}
		s.sealing = true
		return []Effect{Seal{}}

	case SessionsSealed:
		if !s.sealingSessions || s.sealing || s.done {
			return nil
		}
		s.sealingSessions = false
		if ev.Err != nil {
			// Nothing sealed here: the object serves on. A seal whose
			// reply was lost is released by the abort.
			return []Effect{AbortSessions{}, s.complete(ev.Err)}
		}
		s.sealing = true
		return []Effect{Seal{}}

	case CaptureFailed:
		if !s.sealing || s.phase != SourceRunning || s.done {
			return nil
		}
		// Sealed but nothing left the node: restore and report. A capture
		// that failed is the state's type; one that never came in time (a
		// participant in a long turn) keeps its DeadlineExceeded.
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
		return s.withSessionAbort([]Effect{Unseal{}, s.complete(err)})

	case Captured:
		if !s.sealing || s.phase != SourceRunning || s.done {
			return nil
		}
		m, chunks, err := envelope.SplitStream(ev.Stream, s.chunkLimit)
		if err != nil {
			s.moveTo(SourcePaused)
			s.moveTo(SourceRunning)
			return s.withSessionAbort([]Effect{Unseal{}, s.complete(fmt.Errorf("%w: payload: %w", roamerr.ErrInvalidOperation, err))})
		}
		s.moveTo(SourcePaused)
		s.manifest, s.chunks, s.payloadHeld = m, chunks, true
		return []Effect{
			SendPrepare{Manifest: m, ChunkLimit: s.chunkLimit},
			SendChunks{Chunks: chunks},
			StartTimer{Timer: TimerRestoreDeadline, At: s.deadline},
		}

	case FailedReceived:
		// Also while reconciling: an explicit failure before relay-ready is
		// accepted is exactly the condition for restoring the source.
		if s.phase != SourcePaused {
			if s.phase == RelayReady || s.phase == FollowOnly {
				return []Effect{Log{Level: LevelWarn, Event: "failure_after_relay_ready", Msg: "explicit failure after relay-ready ignored: the boundary is irreversible"}}
			}
			return nil
		}
		// Restore the source queue from memory first, then send the
		// RelocationAbort, one-way (PROTOCOL.md §6.2).
		s.moveTo(SourceRunning)
		s.payloadHeld, s.chunks, s.reconciling = false, nil, false
		return s.completeOnce(s.withSessionAbort([]Effect{
			StopTimer{Timer: TimerRestoreDeadline},
			StopTimer{Timer: TimerReconcile},
			Unseal{},
			SendAbort{Reason: ev.Reason},
			ReleasePayload{},
		}), failureError(ev.Reason, ev.Detail))

	case RelayReadyReceived:
		if s.phase != SourcePaused {
			return nil // duplicate reply
		}
		// A reply that arrives while reconciling still proceeds normally.
		s.reconciling = false
		s.moveTo(RelayReady)
		return []Effect{StopTimer{Timer: TimerRestoreDeadline}, StopTimer{Timer: TimerReconcile}, RelayThenCutover{Epoch: s.epoch}}

	case CutoverSent:
		if s.phase != RelayReady || s.cutoverSent {
			return nil
		}
		s.cutoverSent = true
		s.moveTo(FollowOnly)
		s.asking = true
		return s.completeOnce([]Effect{
			StartTimer{Timer: TimerResendWindow, After: s.cfg.CutoverWaitTimeout},
			StartTimer{Timer: TimerFollow, After: s.cfg.FollowDuration},
			StartTimer{Timer: TimerFenceOut, At: s.fenceOutAt()},
			StartTimer{Timer: TimerBoundaryResend, After: s.cfg.CutoverWaitTimeout},
			StartTimer{Timer: TimerBoundaryGiveUp, After: s.cfg.ackPatience()},
			ConfirmCommit{Until: s.fenceOutAt()},
		}, nil)

	case BoundaryAcked:
		if !s.cutoverSent || s.boundaryDone {
			return nil
		}
		return s.releaseBoundary(false)

	case ConnectionLost:
		switch {
		case s.phase == SourcePaused && !s.reconciling:
			// Prepare or chunks may be lost; the target keeps progress for a
			// repeated Restore request of the same identity (PROTOCOL.md §5.6).
			return []Effect{SendPrepare{Manifest: s.manifest, ChunkLimit: s.chunkLimit}, SendChunks{Chunks: s.chunks}}
		case s.phase == FollowOnly && s.cutoverSent && !s.boundaryDone:
			// The boundary batch may not have reached the target: resend
			// it whole now (TimerBoundaryResend goes on repeating it until
			// the target acknowledges it). The target keeps what it
			// already has (by epoch and index), so repeats are harmless.
			s.epoch++
			return []Effect{ResendBoundary{Epoch: s.epoch}}
		}
		return nil

	case ReconcileRead:
		if !s.undecided() {
			return nil
		}
		s.asking = false
		return s.judge(ev)

	case FenceOutAnswered:
		if !s.undecided() || !s.fencing {
			return nil
		}
		s.asking, s.fencing = false, false
		if ev.Err == nil {
			return s.Step(ReconcileAnswered{FencedOut: true})
		}
		return s.Step(ReconcileAnswered{}) // conflict or unknown: the next read decides

	case ReconcileAnswered:
		s.asking, s.fencing = false, false
		if s.phase == FollowOnly && s.cutoverSent {
			return s.confirm(ev)
		}
		if !s.reconciling || s.phase != SourcePaused {
			return nil
		}
		if ev.SourceEnded {
			// This node's lifecycle ended while the outcome was unknown:
			// nothing here can decide it any more (the store no longer
			// takes this node's writes). The held work goes back into the
			// incarnation, which the ended lifecycle then fails loudly.
			s.moveTo(SourceRunning)
			s.payloadHeld, s.chunks, s.reconciling = false, nil, false
			effects := []Effect{StopTimer{Timer: TimerReconcile}, Unseal{}, ReleasePayload{}}
			if !s.done {
				effects = append(effects, s.complete(fmt.Errorf("%w: the source's owner lease ended while the move's outcome was unknown", roamerr.ErrUnavailable)))
			}
			return effects
		}
		if ev.TargetOwns {
			// The commit is known: the move is confirmed here (the payload
			// goes after the resend window, follow ends after its period).
			s.reconciling = false
			s.confirmed = true
			s.moveTo(FollowOnly)
			effects := []Effect{
				AdoptTargetRoute{},
				StartTimer{Timer: TimerResendWindow, After: s.cfg.CutoverWaitTimeout},
				StartTimer{Timer: TimerFollow, After: s.cfg.FollowDuration},
			}
			if !s.done {
				effects = append(effects, s.complete(nil))
			}
			return effects
		}
		if ev.FencedOut {
			// The target never committed and now never can (the store
			// fences its CAS out): like an explicit failure, the source
			// queue is restored, parked sends first, and the object serves
			// again (PROTOCOL.md §6.4).
			s.moveTo(SourceRunning)
			s.payloadHeld, s.chunks, s.reconciling = false, nil, false
			effects := []Effect{
				StopTimer{Timer: TimerReconcile},
				Log{Level: LevelWarn, Event: "relocation_fenced_out", Msg: "the target did not commit by its restore deadline and is fenced out; the source serves again"},
				Unseal{},
				ReleasePayload{},
			}
			effects = s.withSessionAbort(effects)
			if !s.done {
				effects = append(effects, s.complete(fmt.Errorf("%w: the target did not commit by its restore deadline", roamerr.ErrUnavailable)))
			}
			return effects
		}
		var effects []Effect
		if !s.heldFailed {
			s.heldFailed = true
			effects = append(effects, FailHeld{Err: fmt.Errorf("%w: relocation outcome unknown; the object is unavailable until reconciled", roamerr.ErrUnavailable)})
		}
		if !s.done {
			effects = append(effects, s.complete(fmt.Errorf("%w: relocation outcome unknown (no reply before the restore deadline)", roamerr.ErrUnavailable)))
		}
		return append(effects, StartTimer{Timer: TimerReconcile, After: s.cfg.CutoverWaitTimeout})

	case TimerFired:
		switch ev.Timer {
		case TimerRestoreDeadline:
			if s.phase == SourcePaused && !s.reconciling {
				// No reply: the target may have committed after a lost
				// relay-ready. Never reopen on a guess (PROTOCOL.md §6.4).
				s.reconciling = true
				s.asking = true
				return []Effect{
					Log{Level: LevelWarn, Event: "relocation_reconcile", Msg: "no reply from the target before the restore deadline; reconciling with the store"},
					StartTimer{Timer: TimerFenceOut, At: s.fenceOutAt()},
					Reconcile{},
				}
			}
		case TimerReconcile:
			return s.ask()
		case TimerFenceOut:
			if s.undecided() && !s.fenceOutDue {
				s.fenceOutDue = true
				return s.ask()
			}
		case TimerResendWindow:
			// Only after the cutover: before it the payload is the only
			// copy. Until the move is confirmed it is also what a fence-out
			// would serve from.
			if s.phase == FollowOnly && !s.windowPassed {
				s.windowPassed = true
				return s.releaseIfDecided()
			}
		case TimerBoundaryResend:
			if s.phase == FollowOnly && s.cutoverSent && !s.boundaryDone {
				s.epoch++
				return []Effect{ResendBoundary{Epoch: s.epoch}, StartTimer{Timer: TimerBoundaryResend, After: s.cfg.CutoverWaitTimeout}}
			}
		case TimerBoundaryGiveUp:
			if s.phase == FollowOnly && s.cutoverSent && !s.boundaryDone {
				if !s.confirmed {
					// A fence-out may still put the batch back into this
					// source's queue: decide at the confirmation.
					s.giveUpDue = true
					return nil
				}
				return s.releaseBoundary(true)
			}
		case TimerFollow:
			if s.phase == FollowOnly && !s.followEnded {
				if s.cutoverSent && !s.confirmed {
					s.followDue = true // the move may still come back here
					return nil
				}
				s.followEnded = true
				return []Effect{EndFollow{}}
			}
		}
		return nil
	}
	return nil
}

// fenceOutAt is when a move still undecided may be fenced out: the
// target's restore deadline (it stops trying to commit then, unless its
// CAS outcome is unknown, which the fence-out's version check covers) plus
// one cutover wait for its last answer.
func (s *Source) fenceOutAt() time.Time { return s.deadline.Add(s.cfg.CutoverWaitTimeout) }

// undecided reports whether the move's outcome is unknown to the source:
// reconciling before relay-ready, or after the cutover until confirmed.
func (s *Source) undecided() bool {
	return (s.phase == SourcePaused && s.reconciling) || (s.phase == FollowOnly && s.cutoverSent && !s.confirmed)
}

// ask puts the next question to the store, if none is open: a read while
// reconciling, a read (then watches) after the cutover.
func (s *Source) ask() []Effect {
	if !s.undecided() || s.asking {
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
// longer this source's: drop the instance, and release the payload once
// the resend window is over. The move was fenced out — the target never
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
	if s.confirmed {
		return nil
	}
	switch {
	case ev.TargetOwns || ev.SourceEnded:
		s.confirmed = true
		effects := []Effect{StopTimer{Timer: TimerReconcile}, StartFollow{}, CloseOut{}}
		if ev.SourceEnded {
			// Undecided, and this lifecycle can no longer fence the move
			// out: the target may still commit (its CAS does not depend on
			// this node's lease) and then has everything; if it never
			// does, the object ended with this owner, and the saved work
			// and boundary batch with it. Say so: it cannot be told here.
			effects = append([]Effect{Log{Level: LevelError, Event: "relocation_undecided_at_lease_end",
				Msg: "this node's owner lease ended before the move's commit showed: the saved work and boundary batch are the target's if its commit lands, otherwise lost with this ended owner"}}, effects...)
		}
		effects = append(effects, s.releaseIfDecided()...)
		if s.giveUpDue && !s.boundaryDone {
			effects = append(effects, s.releaseBoundary(true)...)
		}
		if s.followDue && !s.followEnded {
			s.followEnded = true
			effects = append(effects, EndFollow{})
		}
		return effects
	case ev.FencedOut:
		s.moveTo(SourceRunning)
		s.payloadHeld, s.chunks = false, nil
		effects := []Effect{
			StopTimer{Timer: TimerReconcile},
			StopTimer{Timer: TimerFenceOut},
			StopTimer{Timer: TimerResendWindow},
			StopTimer{Timer: TimerFollow},
			Log{Level: LevelWarn, Event: "relocation_fenced_out", Msg: "the target did not commit after relay-ready by its restore deadline and is fenced out; the source serves again from what it held"},
			Reinstate{},
			ReleasePayload{},
		}
		effects = s.withSessionAbort(effects)
		if !s.boundaryDone {
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
	s.boundaryDone = true
	return []Effect{StopTimer{Timer: TimerBoundaryResend}, StopTimer{Timer: TimerBoundaryGiveUp}, ReleaseBoundary{Unacknowledged: unacknowledged}}
}

// releaseIfDecided drops payload and boundary batch once the resend window
// is over and the move is confirmed.
func (s *Source) releaseIfDecided() []Effect {
	if !s.windowPassed || !s.confirmed || !s.payloadHeld {
		return nil
	}
	s.payloadHeld, s.chunks = false, nil
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
