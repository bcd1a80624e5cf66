package handoff

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Code copied from the machines before the state-major refactor, as the
// reference a differential test compares the new machines against.

// legacySource is the hand-off of one relocation unit on the node it leaves.
type legacySource struct {
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

// newLegacySource starts a machine in SourceRunning. restoreDeadline is the
// absolute deadline of the Restore operation (docs/PROTOCOL.md §5.11).
func newLegacySource(id Identity, cfg Config, restoreDeadline time.Time) *legacySource {
	return &legacySource{cfg: cfg, id: id, phase: SourceRunning, deadline: restoreDeadline}
}

// Phase is the current phase.
func (s *legacySource) Phase() Phase { return s.phase }

// Identity is the move's identity.
func (s *legacySource) Identity() Identity { return s.id }

// Finished reports whether nothing is left to do: decided, payload
// released and Message Follow ended (or never started).
func (s *legacySource) Finished() bool {
	return s.done && !s.payloadHeld && (s.phase != FollowOnly || s.followEnded) && (!s.cutoverSent || s.boundaryDone)
}

func (s *legacySource) moveTo(p Phase) { s.phase = mustMove(s.phase, p) }

func (s *legacySource) complete(err error) Effect {
	s.done = true
	return Complete{Err: err}
}

// completeOnce appends Complete unless the move already completed (an
// unknown outcome completes it with an error; a later decision does not
// complete it again).
func (s *legacySource) completeOnce(effects []Effect, err error) []Effect {
	if s.done {
		return effects
	}
	return append(effects, s.complete(err))
}

// Step feeds one event and returns the effects to run, in order. Events
// that do not apply to the current phase change nothing (a late or
// duplicate answer); those worth knowing about come back as a Log effect.
func (s *legacySource) Step(ev Event) []Effect {
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
func (s *legacySource) fenceOutAt() time.Time { return s.deadline.Add(s.cfg.CutoverWaitTimeout) }

// undecided reports whether the move's outcome is unknown to the source:
// reconciling before relay-ready, or after the cutover until confirmed.
func (s *legacySource) undecided() bool {
	return (s.phase == SourcePaused && s.reconciling) || (s.phase == FollowOnly && s.cutoverSent && !s.confirmed)
}

// ask puts the next question to the store, if none is open: a read while
// reconciling, a read (then watches) after the cutover.
func (s *legacySource) ask() []Effect {
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
func (s *legacySource) judge(ev ReconcileRead) []Effect {
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
func (s *legacySource) confirm(ev ReconcileAnswered) []Effect {
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
func (s *legacySource) withSessionAbort(effects []Effect) []Effect {
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
func (s *legacySource) releaseBoundary(unacknowledged bool) []Effect {
	s.boundaryDone = true
	return []Effect{StopTimer{Timer: TimerBoundaryResend}, StopTimer{Timer: TimerBoundaryGiveUp}, ReleaseBoundary{Unacknowledged: unacknowledged}}
}

// releaseIfDecided drops payload and boundary batch once the resend window
// is over and the move is confirmed.
func (s *legacySource) releaseIfDecided() []Effect {
	if !s.windowPassed || !s.confirmed || !s.payloadHeld {
		return nil
	}
	s.payloadHeld, s.chunks = false, nil
	return []Effect{ReleasePayload{}}
}

// legacyTarget is the hand-off of one relocation unit on the node it moves to.
// The driver creates it on the first Restore request (RelocationPrepare)
// of an identity and routes to it only what carries that exact identity
// (docs/PROTOCOL.md §2.3, §5.7).
type legacyTarget struct {
	cfg      Config
	id       Identity
	phase    Phase
	manifest envelope.Manifest
	deadline time.Time
	asm      *envelope.Assembler

	received, credited uint64
	restoring          bool
	// verified: the store backs the prepare (SourceVerified without an
	// error). Relay-ready is sent only when both restored and verified.
	verified, restored bool

	epoch        uint32
	relay        []any
	relayIdx     []int // batch index of each record in relay (current epoch)
	sum          RelaySum
	cutoverMatch bool // a cutover matched: every later relay record is a duplicate
	fellBack     bool // committed without a cutover (order not guaranteed)
	// After the fallback: the batch indices this target has (merged or
	// delivered late), and the batch size a late cutover declared.
	known    map[int]bool
	declared int  // -1: no cutover seen
	acked    bool // every declared record is known; acknowledged
	attempt  int  // CAS attempts so far
	// conflictRetried: a CAS lost to a newer version was tried again at
	// once (only once; later ones back off).
	conflictRetried bool
	inFlight        bool // a CommitOwner is running
	deadlineHit     bool // the restore deadline passed while a CAS was in flight
	// unknown: some CAS of this move had an indeterminate answer and no
	// read has settled it since; the target must not remove itself then.
	unknown  bool
	settling bool // past the deadline: only settling reads, no new CAS
	done     bool // Complete emitted
	// sessionBound: a participant is bound to a client Session (the first
	// Restore request says so); its Session owner learns the new route
	// once this target opened, never before its commit.
	sessionBound bool
}

// newLegacyTarget creates the machine for the first Restore request of id and
// returns its first effects: the temporary queue before anything else
// (PROTOCOL.md §5.7).
func newLegacyTarget(id Identity, cfg Config, p PrepareReceived) (*legacyTarget, []Effect) {
	t := &legacyTarget{cfg: cfg, id: id, phase: TargetRestoring, manifest: p.Manifest, deadline: p.RestoreDeadline, declared: -1, sessionBound: p.SessionBound}
	asm, err := envelope.NewAssembler(p.Manifest, p.MaxPayloadLength)
	if err != nil {
		t.moveTo(TargetRemoved)
		return t, []Effect{
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_LENGTH_MISMATCH, Detail: err.Error()},
			t.complete(fmt.Errorf("%w: manifest: %w", roamerr.ErrInvalidOperation, err)),
		}
	}
	t.asm = asm
	return t, []Effect{InstallStaging{}, VerifySource{}, StartTimer{Timer: TimerRestoreDeadline, At: p.RestoreDeadline}}
}

// Phase is the current phase.
func (t *legacyTarget) Phase() Phase { return t.phase }

// Identity is the move's identity.
func (t *legacyTarget) Identity() Identity { return t.id }

// FellBack reports whether the move went on without its cutover.
func (t *legacyTarget) FellBack() bool { return t.fellBack }

// Acknowledged reports whether this target acknowledged the whole
// boundary batch (its cutover matched, or after the fallback every record
// a late cutover declared arrived).
func (t *legacyTarget) Acknowledged() bool { return t.cutoverMatch || t.acked }

// Finished reports whether the machine is terminal.
func (t *legacyTarget) Finished() bool { return t.phase == TargetRemoved || t.phase == TargetOpen }

func (t *legacyTarget) moveTo(p Phase) { t.phase = mustMove(t.phase, p) }

func (t *legacyTarget) complete(err error) Effect {
	t.done = true
	return Complete{Err: err}
}

// remove ends the move on the target: the prepared object, its temporary
// queue and state go; the store is not touched.
func (t *legacyTarget) remove(err error, before ...Effect) []Effect {
	t.moveTo(TargetRemoved)
	t.relay = nil
	return append(before, StopTimer{Timer: TimerCutoverWait}, StopTimer{Timer: TimerStoreRetry},
		StopTimer{Timer: TimerRestoreDeadline}, RemoveTarget{}, t.complete(err))
}

func (t *legacyTarget) commit() []Effect {
	t.attempt++
	t.inFlight = true
	return []Effect{CommitOwner{Attempt: t.attempt, SettleOnly: t.settling}}
}

// unknown: read until the store answers, then open or remove
// (PROTOCOL.md §3.3, §6.3: an indeterminate answer is settled by a
// consistent read, never by a timeout).
// never by a timeout).
func (t *legacyTarget) settle(last error) []Effect {
	t.settling = true
	msg := "restore deadline passed with the owner change's outcome unknown; settling it with a consistent read"
	if last != nil {
		msg += ": " + last.Error()
	}
	return append([]Effect{Log{Level: LevelWarn, Event: "commit_outcome_unknown", Msg: msg}}, t.commit()...)
}

// relayReady crosses to RelayReady once the payload is restored and the
// store backs the prepare, whichever came last.
func (t *legacyTarget) relayReady() []Effect {
	if !t.restored || !t.verified {
		return nil
	}
	t.restoring = false
	t.moveTo(RelayReady)
	return []Effect{SendRelayReady{}, StartTimer{Timer: TimerCutoverWait, After: t.cfg.CutoverWaitTimeout}}
}

// Step feeds one event and returns the effects to run, in order. Events
// that do not apply to the phase change nothing; late answers of a
// terminal move never reactivate it (PROTOCOL.md §6.3).
func (t *legacyTarget) Step(ev Event) []Effect {
	switch t.phase {
	case TargetRemoved:
		return nil
	case TargetOpen:
		switch ev := ev.(type) {
		case CutoverReceivedEvent:
			return t.lateCutover(ev)
		case RelayRecordReceived:
			return t.relayRecord(ev)
		}
		return nil
	}
	switch ev := ev.(type) {
	case PrepareReceived:
		if ev.Manifest != t.manifest {
			if t.phase == TargetRestoring {
				return t.remove(fmt.Errorf("%w: a second Restore request of %s declares another payload", roamerr.ErrConflict, t.id),
					SendFailed{Reason: messages.FailureReason_FAILURE_REASON_CONFLICT, Detail: "same relocation identity, different length or checksum"})
			}
			return []Effect{Log{Level: LevelWarn, Event: "prepare_conflict", Msg: "a Restore request with another manifest after relay-ready; ignored"}}
		}
		if t.phase == RelayReady && !t.restoring {
			// The source resent after a lost connection: answer again.
			return []Effect{SendRelayReady{}}
		}
		return nil // same request again: keep the progress (PROTOCOL.md §5.7)

	case ChunkReceived:
		if t.phase != TargetRestoring || t.restoring {
			return nil
		}
		if err := t.asm.Add(ev.Chunk); err != nil {
			reason := messages.FailureReason_FAILURE_REASON_CONFLICT
			if errors.Is(err, envelope.ErrLengthMismatch) {
				reason = messages.FailureReason_FAILURE_REASON_LENGTH_MISMATCH
			}
			return t.remove(fmt.Errorf("%w: chunk %d: %w", roamerr.ErrConflict, ev.Chunk.Index, err),
				SendFailed{Reason: reason, Detail: err.Error()})
		}
		t.received += uint64(len(ev.Chunk.Data))
		var effects []Effect
		if !t.asm.Complete() {
			if t.received-t.credited >= t.cfg.CreditStep {
				t.credited = t.received
				effects = append(effects, SendCredit{ReceivedBytes: t.received})
			}
			return effects
		}
		// The last chunk is never credited: relay-ready, or the failure
		// that ends the move, answers the whole payload, so a payload of
		// one chunk (most moves) costs no credit message. State chunks are
		// one-way; credits only let a payload larger than the source's
		// in-flight budget flow (PROTOCOL.md §5.6).
		stream, err := t.asm.Take() // the assembler is dropped right after
		if err != nil {
			// Never a repaired or partial payload (PROTOCOL.md §5.7, §11).
			reason := messages.FailureReason_FAILURE_REASON_CHECKSUM_MISMATCH
			if errors.Is(err, envelope.ErrLengthMismatch) {
				reason = messages.FailureReason_FAILURE_REASON_LENGTH_MISMATCH
			}
			t.asm = nil
			return t.remove(fmt.Errorf("%w: payload: %w", roamerr.ErrConflict, err),
				append(effects, SendFailed{Reason: reason, Detail: err.Error()})...)
		}
		t.asm = nil
		t.restoring = true
		return append(effects, RestorePayload{Stream: stream})

	case Restored:
		if t.phase != TargetRestoring || !t.restoring || t.restored {
			return nil
		}
		t.restored = true
		return t.relayReady()

	case SourceVerified:
		if t.phase != TargetRestoring || t.verified {
			return nil
		}
		if errors.Is(ev.Err, roamerr.ErrCapacityExceeded) {
			// The target's capacity slots are all held (PROTOCOL.md §7.12).
			return t.remove(ev.Err,
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_CAPACITY_EXCEEDED, Detail: ev.Err.Error()})
		}
		if ev.Err != nil {
			return t.remove(roamerr.Wrap(roamerr.ErrStale, "the store does not back the Restore request", ev.Err),
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_STALE, Detail: "the source is not the object's owner at the move's fence"},
				Log{Level: LevelWarn, Event: "stale_relocation", Msg: "the Restore request's source is not the owner the store names: " + ev.Err.Error() + "; target removed"})
		}
		t.verified = true
		return t.relayReady()

	case RestoreFailed:
		// Also before the payload is complete: installing the temporary
		// queue itself can fail.
		if t.phase != TargetRestoring {
			return nil
		}
		return t.remove(roamerr.Wrap(roamerr.ErrUnavailable, "restore", ev.Err),
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_RESTORE_FAILED, Detail: ev.Err.Error()})

	case RelayRecordReceived:
		return t.relayRecord(ev)

	case CutoverReceivedEvent:
		if t.phase != RelayReady {
			if t.phase == TargetRestoring {
				return nil
			}
			return t.lateCutover(ev)
		}
		if ev.Epoch < t.epoch {
			return nil // the cutover of a batch already replaced
		}
		if ev.Epoch > t.epoch {
			t.epoch, t.relay, t.relayIdx, t.sum = ev.Epoch, nil, nil, RelaySum{}
		}
		if ev.Sum != t.sum {
			return []Effect{Log{Level: LevelError, Event: "cutover_mismatch",
				Msg: fmt.Sprintf("cutover declares %d records/crc %08x, received %d/%08x: implementation defect; waiting for a resend or the fallback", ev.Sum.Count, ev.Sum.CRC, t.sum.Count, t.sum.CRC)}}
		}
		t.cutoverMatch = true
		t.moveTo(CutoverReceived)
		return append([]Effect{StopTimer{Timer: TimerCutoverWait}, AckBoundary{}}, t.commit()...)

	case NodeStopping:
		if t.phase == TargetRestoring {
			return t.remove(fmt.Errorf("%w: the target node is stopping", roamerr.ErrUnavailable),
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_STALE, Detail: "the target node is stopping"})
		}
		return nil // past relay-ready: the commit goes on

	case Superseded:
		if t.phase == TargetRestoring {
			return t.remove(fmt.Errorf("%w: a newer Restore request of the same object arrived", roamerr.ErrConflict),
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_STALE, Detail: "superseded by a newer Restore request of the same object"},
				Log{Level: LevelWarn, Event: "prepare_superseded", Msg: "a newer Restore request of the same object arrived; this one is removed"})
		}
		return nil

	case AbortReceived:
		if t.phase == TargetRestoring {
			return t.remove(fmt.Errorf("%w: aborted by the source (%s)", roamerr.ErrUnavailable, ev.Reason))
		}
		return nil

	case StoreCommitted:
		if !t.inFlight {
			return nil
		}
		t.inFlight = false
		t.moveTo(OwnerCommitted)
		relay := t.relay
		t.relay = nil
		return []Effect{StopTimer{Timer: TimerCutoverWait}, StopTimer{Timer: TimerRestoreDeadline}, OpenDispatch{Relay: relay}}

	case StoreRetryable:
		if !t.inFlight {
			return nil
		}
		t.inFlight = false
		t.unknown = t.unknown || ev.Unknown
		if t.deadlineHit && !t.unknown {
			return t.locationUpdateFailed(ev.Err)
		}
		if t.deadlineHit && !t.settling {
			return t.settle(ev.Err)
		}
		if t.phase != StoreRetry {
			t.moveTo(StoreRetry)
		}
		if ev.Conflict && !t.unknown && !t.conflictRetried {
			// The record moved past the version this attempt wrote at
			// (the version relay-ready carried, or a read that raced a
			// write): a fresh read decides, and waiting would only add to
			// the pause. Once: a record that keeps changing is backed off.
			t.conflictRetried = true
			return t.commit()
		}
		return []Effect{StartTimer{Timer: TimerStoreRetry, After: t.cfg.StoreRetryBackoff}}

	case StoreNotCommitted:
		if !t.inFlight {
			return nil
		}
		t.inFlight = false
		t.unknown = false // settled: no CAS of this move applied
		if t.deadlineHit {
			return t.locationUpdateFailed(nil)
		}
		if t.phase != StoreRetry {
			t.moveTo(StoreRetry)
		}
		return []Effect{StartTimer{Timer: TimerStoreRetry, After: t.cfg.StoreRetryBackoff}}

	case StoreStale:
		if !t.inFlight {
			return nil
		}
		t.inFlight = false
		return t.remove(roamerr.Wrap(roamerr.ErrStale, "another owner or generation is current", ev.Err),
			Log{Level: LevelWarn, Event: "stale_relocation", Msg: "another owner or generation is current; target removed"})

	case DispatchOpened:
		if t.phase != OwnerCommitted {
			return nil
		}
		t.moveTo(TargetOpen)
		if t.sessionBound {
			// One-way, after the commit and the open: the Session owner
			// submits what it held to this target, then releases the seal
			// (docs/SESSIONS.md §2, command 43).
			return []Effect{UpdateSessionRoutes{}, t.complete(nil)}
		}
		return []Effect{t.complete(nil)}

	case TimerFired:
		return t.timer(ev.Timer)
	}
	return nil
}

func (t *legacyTarget) relayRecord(ev RelayRecordReceived) []Effect {
	switch {
	case t.phase == TargetRestoring:
		return nil // the source relays only after relay-ready
	case t.phase == RelayReady:
		if ev.Epoch < t.epoch {
			return nil
		}
		if ev.Epoch > t.epoch {
			// A resent batch replaces the partial one whole (PROTOCOL.md §5.9).
			t.epoch, t.relay, t.relayIdx, t.sum = ev.Epoch, nil, nil, RelaySum{}
		}
		t.relay = append(t.relay, ev.Item)
		t.relayIdx = append(t.relayIdx, ev.Index)
		t.sum = t.sum.Add(ev.Record)
		return nil
	case t.cutoverMatch:
		return nil // a resend of a batch already merged whole
	}
	// After the fallback: a record this target does not have yet joins the
	// backlog (or, once open, is delivered late; order not guaranteed,
	// PROTOCOL.md §5.10). Records are told apart by their batch index, which every
	// resend repeats, so a record that arrived in any earlier epoch — or
	// after a gap in a broken connection — is never delivered twice.
	if t.known[ev.Index] {
		return nil
	}
	t.known[ev.Index] = true
	var effects []Effect
	if t.phase == OwnerCommitted || t.phase == TargetOpen {
		effects = append(effects, DeliverLate{Item: ev.Item})
	} else {
		t.relay = append(t.relay, ev.Item)
	}
	return append(effects, t.ackIfComplete()...)
}

// lateCutover handles a cutover after the one that matched, or after the
// fallback (PROTOCOL.md §5.10: it changes neither owner nor queue). It is also how the
// source asks again for the acknowledgement: a target that holds the whole
// batch acknowledges every time, since an acknowledgement can be lost too.
func (t *legacyTarget) lateCutover(ev CutoverReceivedEvent) []Effect {
	effects := []Effect{Log{Level: LevelWarn, Event: "late_cutover", Msg: "late or duplicate cutover; owner and queue unchanged"}}
	switch {
	case t.cutoverMatch:
		return append(effects, AckBoundary{})
	case t.fellBack:
		t.declared = max(t.declared, int(ev.Sum.Count))
		t.acked = false
		return append(effects, t.ackIfComplete()...)
	}
	return effects
}

// ackIfComplete acknowledges the batch once, after the fallback, when
// every record a cutover declared is known.
func (t *legacyTarget) ackIfComplete() []Effect {
	if t.acked || t.declared < 0 {
		return nil
	}
	for i := range t.declared {
		if !t.known[i] {
			return nil
		}
	}
	t.acked = true
	return []Effect{AckBoundary{}}
}

func (t *legacyTarget) timer(tm Timer) []Effect {
	switch tm {
	case TimerCutoverWait:
		if t.phase != RelayReady {
			return nil
		}
		t.moveTo(CutoverFallback)
		t.fellBack = true
		t.known = make(map[int]bool, len(t.relayIdx))
		for _, i := range t.relayIdx {
			t.known[i] = true
		}
		return append([]Effect{Log{Level: LevelWarn, Event: "cutover_timeout",
			Msg: "no cutover within RelocationCutoverWaitTimeout; committing without the ordering guarantee"}}, t.commit()...)
	case TimerStoreRetry:
		if t.phase != StoreRetry || t.inFlight {
			return nil
		}
		return t.commit()
	case TimerRestoreDeadline:
		switch t.phase {
		case TargetRestoring:
			return t.remove(fmt.Errorf("%w: restore deadline passed before relay-ready", roamerr.ErrDeadlineExceeded),
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_DEADLINE, Detail: "restore deadline passed"})
		case RelayReady, CutoverReceived, CutoverFallback, StoreRetry:
			t.deadlineHit = true
			if t.inFlight {
				return nil // the answer in flight decides; a success is not late
			}
			if t.unknown {
				return t.settle(nil)
			}
			return t.locationUpdateFailed(nil)
		}
	}
	return nil
}

func (t *legacyTarget) locationUpdateFailed(last error) []Effect {
	msg := "owner change not confirmed before the restore deadline; target removed"
	if last != nil {
		msg += ": " + last.Error()
	}
	return t.remove(fmt.Errorf("%w: owner change not confirmed before the restore deadline", roamerr.ErrDeadlineExceeded),
		Log{Level: LevelError, Event: "location_update_failed", Msg: msg})
}

// The differential test: random event sequences, richer than
// TestRandomEventsKeepTheInvariants's, drive a new and a legacy machine side
// by side; every step must give the same effects, phase and reports.

// diffSourceEvent is a random source event. Once the source is sealed
// (phase not SourceRunning), two times in three it is one of those after
// the capture, so that random runs reach the cutover and its confirmation.
func diffSourceEvent(r *rand.Rand, phase Phase, payload []byte) Event {
	n := r.IntN(16)
	if r.IntN(3) > 0 {
		var ns []int
		switch phase {
		case SourceRunning:
			return []Event{Start{SessionBound: r.IntN(2) == 0}, SessionsSealed{}, CapabilityAnswered{Supported: true},
				Admitted{}, Captured{Stream: envelope.Whole(payload)}}[r.IntN(5)]
		case SourcePaused:
			ns = []int{5, 8, 10, 11, 11, 12, 13, 14, 14, 14}
		case RelayReady:
			ns = []int{6, 7, 10, 11, 13, 14}
		default:
			ns = []int{6, 8, 9, 10, 11, 12, 13, 14, 14, 14}
		}
		n = ns[r.IntN(len(ns))]
	}
	switch n {
	case 0:
		return Start{SessionBound: r.IntN(2) == 0}
	case 1:
		return SessionsSealed{Err: []error{nil, nil, roamerr.ErrConflict}[r.IntN(3)]}
	case 2:
		switch r.IntN(4) {
		case 0:
			return CapabilityAnswered{Supported: false, Reason: "no", Code: []string{"", "stale"}[r.IntN(2)]}
		default:
			return CapabilityAnswered{Supported: true, ReceiveChunkLimit: uint32(r.IntN(3) * 64)}
		}
	case 3:
		return Admitted{}
	case 4:
		if r.IntN(4) == 0 {
			return CaptureFailed{Err: []error{errors.New("x"), roamerr.ErrDeadlineExceeded, roamerr.ErrBusy}[r.IntN(3)]}
		}
		if r.IntN(8) == 0 {
			return Captured{Stream: envelope.Whole(nil)}
		}
		return Captured{Stream: envelope.Whole(payload)}
	case 5:
		return RelayReadyReceived{}
	case 6:
		return FailedReceived{Reason: messages.FailureReason(r.IntN(8)), Detail: "d"}
	case 7:
		return CutoverSent{Sum: RelaySum{Count: uint64(r.IntN(3))}}
	case 8:
		return ConnectionLost{}
	case 9:
		return BoundaryAcked{}
	case 10:
		return ReconcileAnswered{TargetOwns: r.IntN(3) == 0, FencedOut: r.IntN(3) == 0, SourceEnded: r.IntN(6) == 0}
	case 11, 12:
		v := RecordView{Present: r.IntN(10) > 0, Version: uint64(r.IntN(9)), OwnerNodeRid: testID.Fence.NodeRid, OwnerNodeGeneration: testID.Fence.NodeGeneration,
			OwnerGeneration: testID.Fence.OwnerGeneration, ObjectGeneration: 1}
		switch r.IntN(7) {
		case 0:
			v.OwnerNodeRid, v.RelocationID = "tgt", testID.RelocationID
		case 1:
			v.RelocationID = testID.RelocationID
		case 2:
			v.OwnerGeneration++
		case 3:
			v.OwnerNodeRid = "other"
		}
		var err error
		if r.IntN(6) == 0 {
			err = roamerr.ErrDeadlineExceeded
		}
		return ReconcileRead{Record: v, Target: "tgt", ObjectGeneration: uint64(1 + r.IntN(5)/4), Err: err, SourceEnded: r.IntN(6) == 0}
	case 13:
		if r.IntN(2) == 0 {
			return FenceOutAnswered{}
		}
		return FenceOutAnswered{Err: errors.New("conflict")}
	default:
		if phase == SourcePaused && r.IntN(2) == 0 {
			return TimerFired{Timer: []Timer{TimerRestoreDeadline, TimerFenceOut, TimerReconcile}[r.IntN(3)]}
		}
		return TimerFired{Timer: Timer(1 + r.IntN(9))}
	}
}

// diffTargetProgress is, most of the time, an event that moves a target in
// phase on, so that random runs reach the commit and its answers.
func diffTargetProgress(r *rand.Rand, phase Phase, chunks []envelope.Chunk, sums []RelaySum) Event {
	switch phase {
	case TargetRestoring:
		switch r.IntN(4) {
		case 0:
			return SourceVerified{}
		case 1:
			return Restored{}
		}
		c := chunks[r.IntN(len(chunks))]
		switch r.IntN(12) {
		case 0:
			c.Data = append([]byte{^c.Data[0]}, c.Data[1:]...)
		case 1:
			c.Data = append(c.Data[:len(c.Data):len(c.Data)], 1)
		}
		return ChunkReceived{Chunk: c}
	case RelayReady:
		switch r.IntN(6) {
		case 0:
			return CutoverReceivedEvent{Epoch: uint32(r.IntN(2)), Sum: sums[r.IntN(len(sums))]}
		case 1:
			return TimerFired{Timer: TimerCutoverWait}
		}
		return RelayRecordReceived{Epoch: uint32(r.IntN(2)), Index: r.IntN(3), Record: []byte("r"), Item: r.IntN(3)}
	case CutoverReceived, CutoverFallback, StoreRetry:
		switch r.IntN(7) {
		case 0:
			return StoreCommitted{}
		case 1:
			return StoreNotCommitted{}
		case 2:
			return TimerFired{Timer: TimerStoreRetry}
		case 3:
			return TimerFired{Timer: TimerRestoreDeadline}
		case 4:
			return CutoverReceivedEvent{Epoch: uint32(r.IntN(2)), Sum: sums[r.IntN(len(sums))]}
		}
		return StoreRetryable{Err: errors.New("r"), Unknown: r.IntN(2) == 0, Conflict: r.IntN(2) == 0}
	case OwnerCommitted, TargetOpen:
		switch r.IntN(3) {
		case 0:
			return DispatchOpened{}
		case 1:
			return CutoverReceivedEvent{Epoch: uint32(r.IntN(3)), Sum: sums[r.IntN(len(sums))]}
		}
		return RelayRecordReceived{Epoch: uint32(r.IntN(3)), Index: r.IntN(3), Record: []byte("r"), Item: r.IntN(3)}
	}
	return Restored{}
}

func diffTargetEvent(r *rand.Rand, m envelope.Manifest, chunks []envelope.Chunk, sums []RelaySum) Event {
	switch r.IntN(20) {
	case 0, 1:
		c := chunks[r.IntN(len(chunks))]
		if r.IntN(10) == 0 {
			c.Data = []byte("bad")
		}
		return ChunkReceived{Chunk: c}
	case 2:
		return SourceVerified{Err: []error{nil, nil, nil, errors.New("not the owner"), roamerr.ErrCapacityExceeded}[r.IntN(5)]}
	case 3:
		return Restored{}
	case 4:
		if r.IntN(3) == 0 {
			return RestoreFailed{Err: errors.New("x")}
		}
		return Restored{}
	case 5, 6:
		return RelayRecordReceived{Epoch: uint32(r.IntN(3)), Index: r.IntN(3), Record: []byte("r"), Item: r.IntN(3)}
	case 7:
		return CutoverReceivedEvent{Epoch: uint32(r.IntN(3)), Sum: sums[r.IntN(len(sums))]}
	case 8:
		return AbortReceived{Reason: messages.FailureReason(r.IntN(3))}
	case 9:
		return StoreCommitted{}
	case 10:
		return StoreRetryable{Err: errors.New("r"), Unknown: r.IntN(3) == 0, Conflict: r.IntN(3) == 0}
	case 11:
		return StoreStale{Err: errors.New("s")}
	case 12:
		return StoreNotCommitted{}
	case 13:
		return DispatchOpened{}
	case 14:
		if r.IntN(5) == 0 {
			m2 := m
			m2.TotalLength++
			return PrepareReceived{Manifest: m2}
		}
		return PrepareReceived{Manifest: m, MaxPayloadLength: 1 << 20}
	case 15:
		if r.IntN(2) == 0 {
			return NodeStopping{}
		}
		return Superseded{}
	default:
		return TimerFired{Timer: Timer(1 + r.IntN(9))}
	}
}

func TestDifferentialAgainstLegacy(t *testing.T) {
	seeds := uint64(20000)
	payload := stream(400)
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		cfg := DefaultConfig()
		if seed%3 == 0 {
			cfg.ChunkLimit = 100
		}
		s, l := NewSource(testID, cfg, deadline), newLegacySource(testID, cfg, deadline)
		var trace []string
		for i, over := 0, 0; i < 120 && over < 5; i++ {
			if l.done && l.phase == SourceRunning {
				over++ // a few more events for a source that serves again
			}
			ev := diffSourceEvent(r, l.Phase(), payload)
			trace = append(trace, fmt.Sprintf("%T%+v", ev, ev))
			got, want := s.Step(ev), l.Step(ev)
			if !reflect.DeepEqual(got, want) || s.Phase() != l.Phase() || s.Finished() != l.Finished() {
				t.Fatalf("source seed %d step %d: %s\n got %s %v finished %v\nwant %s %v finished %v", seed, i, strings.Join(trace, "\n  "),
					s.Phase(), got, s.Finished(), l.Phase(), want, l.Finished())
			}
		}
	}
	m, chunks, err := envelope.Split(payload, 100)
	require.NoError(t, err)
	sums := []RelaySum{{}}
	for k := 1; k <= 3; k++ {
		sums = append(sums, sums[k-1].Add([]byte("r")))
	}
	sums = append(sums, RelaySum{Count: 2, CRC: 1})
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 4))
		cfg := DefaultConfig()
		if seed%2 == 0 {
			cfg.CreditStep = 150
		}
		p := PrepareReceived{Manifest: m, RestoreDeadline: deadline, MaxPayloadLength: 1 << 20, SessionBound: seed%3 == 0}
		if seed%97 == 0 {
			p.MaxPayloadLength = 10
		}
		tg, got := NewTarget(testID, cfg, p)
		lg, want := newLegacyTarget(testID, cfg, p)
		require.Equal(t, want, got)
		var trace []string
		for i := 0; i < 80; i++ {
			ev := diffTargetEvent(r, m, chunks, sums)
			if r.IntN(3) > 0 {
				ev = diffTargetProgress(r, lg.Phase(), chunks, sums)
			}
			trace = append(trace, fmt.Sprintf("%T%+v", ev, ev))
			got, want := tg.Step(ev), lg.Step(ev)
			if !reflect.DeepEqual(got, want) || tg.Phase() != lg.Phase() || tg.Finished() != lg.Finished() ||
				tg.FellBack() != lg.FellBack() || tg.Acknowledged() != lg.Acknowledged() {
				t.Fatalf("target seed %d step %d: %s\n got %s %v\nwant %s %v", seed, i, strings.Join(trace, "\n  "), tg.Phase(), got, lg.Phase(), want)
			}
		}
	}
}
