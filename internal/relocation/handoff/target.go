package handoff

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Target is the hand-off of one relocation unit on the node it moves to.
// The driver creates it on the first Restore request (RelocationPrepare)
// of an identity and routes to it only what carries that exact identity
// (docs/PROTOCOL.md §2.3, §5.7).
type Target struct {
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

// NewTarget creates the machine for the first Restore request of id and
// returns its first effects: the temporary queue before anything else
// (PROTOCOL.md §5.7).
func NewTarget(id Identity, cfg Config, p PrepareReceived) (*Target, []Effect) {
	t := &Target{cfg: cfg, id: id, phase: TargetRestoring, manifest: p.Manifest, deadline: p.RestoreDeadline, declared: -1, sessionBound: p.SessionBound}
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
func (t *Target) Phase() Phase { return t.phase }

// Identity is the move's identity.
func (t *Target) Identity() Identity { return t.id }

// FellBack reports whether the move went on without its cutover.
func (t *Target) FellBack() bool { return t.fellBack }

// Acknowledged reports whether this target acknowledged the whole
// boundary batch (its cutover matched, or after the fallback every record
// a late cutover declared arrived).
func (t *Target) Acknowledged() bool { return t.cutoverMatch || t.acked }

// Finished reports whether the machine is terminal.
func (t *Target) Finished() bool { return t.phase == TargetRemoved || t.phase == TargetOpen }

func (t *Target) moveTo(p Phase) { t.phase = mustMove(t.phase, p) }

func (t *Target) complete(err error) Effect {
	t.done = true
	return Complete{Err: err}
}

// remove ends the move on the target: the prepared object, its temporary
// queue and state go; the store is not touched.
func (t *Target) remove(err error, before ...Effect) []Effect {
	t.moveTo(TargetRemoved)
	t.relay = nil
	return append(before, StopTimer{Timer: TimerCutoverWait}, StopTimer{Timer: TimerStoreRetry},
		StopTimer{Timer: TimerRestoreDeadline}, RemoveTarget{}, t.complete(err))
}

func (t *Target) commit() []Effect {
	t.attempt++
	t.inFlight = true
	return []Effect{CommitOwner{Attempt: t.attempt, SettleOnly: t.settling}}
}

// unknown: read until the store answers, then open or remove
// (PROTOCOL.md §3.3, §6.3: an indeterminate answer is settled by a
// consistent read, never by a timeout).
// never by a timeout).
func (t *Target) settle(last error) []Effect {
	t.settling = true
	msg := "restore deadline passed with the owner change's outcome unknown; settling it with a consistent read"
	if last != nil {
		msg += ": " + last.Error()
	}
	return append([]Effect{Log{Level: LevelWarn, Event: "commit_outcome_unknown", Msg: msg}}, t.commit()...)
}

// relayReady crosses to RelayReady once the payload is restored and the
// store backs the prepare, whichever came last.
func (t *Target) relayReady() []Effect {
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
func (t *Target) Step(ev Event) []Effect {
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

func (t *Target) relayRecord(ev RelayRecordReceived) []Effect {
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
func (t *Target) lateCutover(ev CutoverReceivedEvent) []Effect {
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
func (t *Target) ackIfComplete() []Effect {
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

func (t *Target) timer(tm Timer) []Effect {
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

func (t *Target) locationUpdateFailed(last error) []Effect {
	msg := "owner change not confirmed before the restore deadline; target removed"
	if last != nil {
		msg += ": " + last.Error()
	}
	return t.remove(fmt.Errorf("%w: owner change not confirmed before the restore deadline", roamerr.ErrDeadlineExceeded),
		Log{Level: LevelError, Event: "location_update_failed", Msg: msg})
}
