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

// Target is the hand-off of one relocation unit on the node it moves to.
// The driver creates it on the first Restore request (RelocationPrepare)
// of an identity and routes to it only what carries that exact identity
// (docs/PROTOCOL.md §2.3, §5.7).
//
// Like Source, it is state-major: the phase selects the step function
// (stepRestoring, stepRelayReady, stepCommitting, stepCommitted,
// stepOpen). Sub-lives have typed stages: the restore (TargetRestoring),
// the relay's end (from RelayReady on), the CAS and the restore deadline
// (the commit phases).
type Target struct {
	cfg      Config
	id       Identity
	phase    Phase
	manifest envelope.Manifest
	deadline time.Time
	asm      *envelope.Assembler // while restore is restoreAssembling

	received, credited uint64
	// restore is TargetRestoring's sub-phase.
	restore restoreStage
	// verified: the store backs the prepare (SourceVerified without an
	// error). Read in TargetRestoring: relay-ready is sent only when the
	// restore is done and the prepare verified, whichever comes last.
	verified bool

	epoch    uint32
	relay    []any // the boundary batch, until OpenDispatch takes it
	relayIdx []int // batch index of each record in relay (current epoch)
	sum      RelaySum
	// relayEnd is how the boundary relay ended: collecting until the
	// cutover matched or its wait ran out.
	relayEnd relayStage
	// After the fallback: the batch indices this target has (merged or
	// delivered late), and the batch size a late cutover declared.
	known    map[int]bool
	declared int // -1: no cutover seen

	// The commit (CutoverReceived, CutoverFallback, StoreRetry).
	cas     casStage
	overdue overdueStage
	attempt int // CAS attempts so far
	// conflictRetried: a CAS lost to a newer version was tried again at
	// once (only once; later ones back off).
	conflictRetried bool
	// unknown: some CAS of this move had an indeterminate answer and no
	// read has settled it since; the target must not remove itself then.
	unknown bool
	// sessionBound: a participant is bound to a client Session (the first
	// Restore request says so); its Session owner learns the new route
	// once this target opened, never before its commit.
	sessionBound bool
	// announced: relay-ready went out, so the source may follow messages
	// to this incarnation; removed, it answers Unavailable until
	// TimerForget.
	announced bool
}

// restoreStage is TargetRestoring's sub-phase.
type restoreStage int

const (
	restoreAssembling restoreStage = iota // chunks are taken
	restoreRunning                        // RestorePayload emitted
	restoreDone                           // Restored in; relay-ready once verified
)

// relayStage is how the boundary relay ended.
type relayStage int

const (
	relayCollecting relayStage = iota // RelayReady: records join the batch
	// relayMatched: a cutover matched; every later record is a duplicate.
	relayMatched
	// relayFellBack: committed without a cutover (order not guaranteed);
	// a record not known yet is merged or delivered late.
	relayFellBack
	// relayFellBackAcked: after the fallback, every record a late cutover
	// declared is known, and acknowledged.
	relayFellBackAcked
)

// casStage is the target-only CAS's life in the commit phases.
type casStage int

const (
	casIdle       casStage = iota // before the first attempt, or decided
	casAsking                     // a CommitOwner is unanswered: its answer decides
	casBackingOff                 // StoreRetry: TimerStoreRetry starts the next attempt
)

// overdueStage is where the commit is against the restore deadline.
type overdueStage int

const (
	onTime overdueStage = iota
	// pastDeadline: the deadline passed while a CAS was unanswered; its
	// answer decides (a success is not late).
	pastDeadline
	// settling: past the deadline with a CAS outcome unknown: only
	// settling reads, no new owner CAS (PROTOCOL.md §6.3).
	settling
)

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
			Complete{Err: fmt.Errorf("%w: manifest: %w", roamerr.ErrInvalidOperation, err)},
			t.keep(),
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
func (t *Target) FellBack() bool {
	return t.relayEnd == relayFellBack || t.relayEnd == relayFellBackAcked
}

// Acknowledged reports whether this target acknowledged the whole
// boundary batch (its cutover matched, or after the fallback every record
// a late cutover declared arrived).
func (t *Target) Acknowledged() bool {
	return t.relayEnd == relayMatched || t.relayEnd == relayFellBackAcked
}

// Finished reports whether the machine is terminal.
func (t *Target) Finished() bool { return t.phase == TargetRemoved || t.phase == TargetOpen }

func (t *Target) moveTo(p Phase) { t.phase = mustMove(t.phase, p) }

// remove ends the move on the target: the prepared object, its temporary
// queue and state go; the store is not touched.
func (t *Target) remove(err error, before ...Effect) []Effect {
	t.moveTo(TargetRemoved)
	t.relay = nil
	effects := append(before, StopTimer{Timer: TimerCutoverWait}, StopTimer{Timer: TimerStoreRetry},
		StopTimer{Timer: TimerRestoreDeadline}, RemoveTarget{})
	if !t.announced {
		// No source learned of the incarnation, so nothing follows to
		// it: its name is free at once for the next move.
		effects = append(effects, StopIncarnation{})
	}
	return append(effects, Complete{Err: err}, t.keep())
}

// keep starts the finished run's last stretch: FollowDuration, the time
// Message Follow may still send to a removed incarnation; after a commit
// whose boundary batch is not acknowledged yet, as long as the source
// resends it (BoundaryAckPatience, then one resend window), so that a
// resend still finds the run.
func (t *Target) keep() Effect {
	keep := t.cfg.FollowDuration
	if t.phase == TargetOpen && !t.Acknowledged() {
		keep = max(keep, t.cfg.ackPatience()+t.cfg.CutoverWaitTimeout)
	}
	return StartTimer{Timer: TimerForget, After: keep}
}

// forget ends the run's last stretch.
func (t *Target) forget() []Effect {
	if t.phase == TargetRemoved && t.announced {
		return []Effect{StopIncarnation{}, Forget{}}
	}
	return []Effect{Forget{}}
}

func (t *Target) commit() []Effect {
	t.attempt++
	t.cas = casAsking
	return []Effect{CommitOwner{Attempt: t.attempt, SettleOnly: t.overdue == settling}}
}

// settle: the outcome is unknown; read until the store answers, then
// open or remove (PROTOCOL.md §3.3, §6.3: an indeterminate answer is
// settled by a consistent read, never by a timeout).
func (t *Target) settle(last error) []Effect {
	t.overdue = settling
	msg := "restore deadline passed with the owner change's outcome unknown; settling it with a consistent read"
	if last != nil {
		msg += ": " + last.Error()
	}
	return append([]Effect{Log{Level: loglevel.Warn, Event: "commit_outcome_unknown", Msg: msg}}, t.commit()...)
}

// relayReady crosses to RelayReady once the payload is restored and the
// store backs the prepare, whichever came last.
func (t *Target) relayReady() []Effect {
	if t.restore != restoreDone || !t.verified {
		return nil
	}
	t.moveTo(RelayReady)
	t.announced = true
	return []Effect{SendRelayReady{}, StartTimer{Timer: TimerCutoverWait, After: t.cfg.CutoverWaitTimeout}}
}

// Step feeds one event and returns the effects to run, in order. The
// phase's step function handles what the phase expects; everything else
// goes to ignore. A terminal move ignores everything: late answers never
// reactivate it (PROTOCOL.md §6.3).
func (t *Target) Step(ev Event) []Effect {
	switch t.phase {
	case TargetRestoring:
		return t.stepRestoring(ev)
	case RelayReady:
		return t.stepRelayReady(ev)
	case CutoverReceived, CutoverFallback, StoreRetry:
		return t.stepCommitting(ev)
	case OwnerCommitted:
		return t.stepCommitted(ev)
	case TargetOpen:
		return t.stepOpen(ev)
	case TargetRemoved:
		if ev == (TimerFired{Timer: TimerForget}) {
			return t.forget()
		}
	}
	return ignore(ev)
}

// stepRestoring: the temporary queue is installed; the payload is
// assembled and restored while the store is asked whether it backs the
// prepare. Anything that ends the move now is answered with an explicit
// failure, so the source serves again (PROTOCOL.md §6.2).
func (t *Target) stepRestoring(ev Event) []Effect {
	switch ev := ev.(type) {
	case PrepareReceived:
		if ev.Manifest != t.manifest {
			return t.remove(fmt.Errorf("%w: a second Restore request of %s declares another payload", roamerr.ErrConflict, t.id),
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_CONFLICT, Detail: "same relocation identity, different length or checksum"})
		}
		// Same request again: keep the progress (PROTOCOL.md §5.7).
	case ChunkReceived:
		if t.restore == restoreAssembling {
			return t.chunk(ev)
		}
	case Restored:
		if t.restore == restoreRunning {
			t.restore = restoreDone
			return t.relayReady()
		}
	case SourceVerified:
		if !t.verified {
			return t.sourceVerified(ev)
		}
	case RestoreFailed:
		// Also before the payload is complete: installing the temporary
		// queue itself can fail.
		return t.remove(roamerr.Wrap(roamerr.ErrUnavailable, "restore", ev.Err),
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_RESTORE_FAILED, Detail: ev.Err.Error()})
	case NodeStopping, Superseded, AbortReceived:
		return t.refuse(ev)
	case TimerFired:
		if ev.Timer == TimerRestoreDeadline {
			return t.remove(fmt.Errorf("%w: restore deadline passed before relay-ready", roamerr.ErrDeadlineExceeded),
				SendFailed{Reason: messages.FailureReason_FAILURE_REASON_DEADLINE, Detail: "restore deadline passed"})
		}
	}
	return ignore(ev)
}

func (t *Target) chunk(ev ChunkReceived) []Effect {
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
	t.asm = nil
	if err != nil {
		// Never a repaired or partial payload (PROTOCOL.md §5.7, §11).
		reason := messages.FailureReason_FAILURE_REASON_CHECKSUM_MISMATCH
		if errors.Is(err, envelope.ErrLengthMismatch) {
			reason = messages.FailureReason_FAILURE_REASON_LENGTH_MISMATCH
		}
		return t.remove(fmt.Errorf("%w: payload: %w", roamerr.ErrConflict, err),
			append(effects, SendFailed{Reason: reason, Detail: err.Error()})...)
	}
	t.restore = restoreRunning
	return append(effects, RestorePayload{Stream: stream})
}

func (t *Target) sourceVerified(ev SourceVerified) []Effect {
	if errors.Is(ev.Err, roamerr.ErrCapacityExceeded) {
		// The target's capacity slots are all held (PROTOCOL.md §7.12).
		return t.remove(ev.Err,
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_CAPACITY_EXCEEDED, Detail: ev.Err.Error()})
	}
	if ev.Err != nil && ev.Unsettled {
		// The restore deadline passed before the store or the source's
		// node could answer: a deadline, as TimerRestoreDeadline's, not a
		// verdict on the source (seen under load, when the last try's
		// answer came before the deadline timer).
		return t.remove(fmt.Errorf("%w: restore deadline passed before the source could be verified: %w", roamerr.ErrDeadlineExceeded, ev.Err),
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_DEADLINE, Detail: "restore deadline passed before the source could be verified"})
	}
	if ev.Err != nil {
		return t.remove(roamerr.Wrap(roamerr.ErrStale, "the store does not back the Restore request", ev.Err),
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_STALE, Detail: "the source is not the object's owner at the move's fence"},
			Log{Level: loglevel.Warn, Event: "stale_relocation", Msg: "the Restore request's source is not the owner the store names: " + ev.Err.Error() + "; target removed"})
	}
	t.verified = true
	return t.relayReady()
}

// refuse ends a move still restoring that its node, a newer prepare or
// the source itself called off. Past relay-ready the same events are
// ignored: the commit goes on (the node waits for it before it ends its
// lease; newest prepare wins only before relay-ready, PROTOCOL.md §5.7).
func (t *Target) refuse(ev Event) []Effect {
	switch ev := ev.(type) {
	case NodeStopping:
		return t.remove(fmt.Errorf("%w: the target node is stopping", roamerr.ErrUnavailable),
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_STALE, Detail: "the target node is stopping"})
	case Superseded:
		return t.remove(fmt.Errorf("%w: a newer Restore request of the same object arrived", roamerr.ErrConflict),
			SendFailed{Reason: messages.FailureReason_FAILURE_REASON_STALE, Detail: "superseded by a newer Restore request of the same object"},
			Log{Level: loglevel.Warn, Event: "prepare_superseded", Msg: "a newer Restore request of the same object arrived; this one is removed"})
	case AbortReceived:
		return t.remove(fmt.Errorf("%w: aborted by the source (%s)", roamerr.ErrUnavailable, ev.Reason))
	}
	return ignore(ev)
}

// stepRelayReady: relay-ready sent; the boundary relay comes in until
// its cutover matches or the cutover wait runs out.
func (t *Target) stepRelayReady(ev Event) []Effect {
	switch ev := ev.(type) {
	case PrepareReceived:
		if ev.Manifest == t.manifest {
			// The source resent after a lost connection: answer again.
			return []Effect{SendRelayReady{}}
		}
		return prepareConflict()
	case RelayRecordReceived:
		if ev.Epoch >= t.epoch {
			t.collect(ev)
		}
	case CutoverReceivedEvent:
		if ev.Epoch >= t.epoch {
			return t.cutover(ev)
		}
	case TimerFired:
		switch ev.Timer {
		case TimerCutoverWait:
			return t.fallBack()
		case TimerRestoreDeadline:
			// No CAS was sent, so none can be unknown.
			return t.locationUpdateFailed(nil)
		}
	}
	return ignore(ev)
}

// prepareConflict: a Restore request with this identity but another
// manifest, after relay-ready. The move goes on.
func prepareConflict() []Effect {
	return []Effect{Log{Level: loglevel.Warn, Event: "prepare_conflict", Msg: "a Restore request with another manifest after relay-ready; ignored"}}
}

// newEpoch: a resent batch replaces the partial one whole (PROTOCOL.md
// §5.9).
func (t *Target) newEpoch(epoch uint32) {
	if epoch > t.epoch {
		t.epoch, t.relay, t.relayIdx, t.sum = epoch, nil, nil, RelaySum{}
	}
}

func (t *Target) collect(ev RelayRecordReceived) {
	t.newEpoch(ev.Epoch)
	t.relay = append(t.relay, ev.Item)
	t.relayIdx = append(t.relayIdx, ev.Index)
	t.sum = t.sum.Add(ev.Record)
}

func (t *Target) cutover(ev CutoverReceivedEvent) []Effect {
	t.newEpoch(ev.Epoch)
	if ev.Sum != t.sum {
		return []Effect{Log{Level: loglevel.Error, Event: "cutover_mismatch",
			Msg: fmt.Sprintf("cutover declares %d records/crc %08x, received %d/%08x: implementation defect; waiting for a resend or the fallback", ev.Sum.Count, ev.Sum.CRC, t.sum.Count, t.sum.CRC)}}
	}
	t.relayEnd = relayMatched
	t.moveTo(CutoverReceived)
	return append([]Effect{StopTimer{Timer: TimerCutoverWait}, AckBoundary{}}, t.commit()...)
}

func (t *Target) fallBack() []Effect {
	t.moveTo(CutoverFallback)
	t.relayEnd = relayFellBack
	t.known = make(map[int]bool, len(t.relayIdx))
	for _, i := range t.relayIdx {
		t.known[i] = true
	}
	return append([]Effect{Log{Level: loglevel.Warn, Event: "cutover_timeout",
		Msg: "no cutover within RelocationCutoverWaitTimeout; committing without the ordering guarantee"}}, t.commit()...)
}

// stepLate handles what the source still sends once the relay ended and
// until the target opens: resent records and cutovers, and repeated
// Restore requests.
func (t *Target) stepLate(ev Event) []Effect {
	switch ev := ev.(type) {
	case PrepareReceived:
		if ev.Manifest != t.manifest {
			return prepareConflict()
		}
	case RelayRecordReceived:
		return t.lateRecord(ev)
	case CutoverReceivedEvent:
		return t.lateCutover(ev)
	}
	return ignore(ev)
}

// stepCommitting: the target-only CAS, its answers and retries, against
// the restore deadline (PROTOCOL.md §5.11, §6.3).
func (t *Target) stepCommitting(ev Event) []Effect {
	switch ev := ev.(type) {
	case StoreCommitted, StoreRetryable, StoreNotCommitted, StoreStale:
		if t.cas == casAsking {
			t.cas = casIdle
			return t.casAnswered(ev)
		}
		return ignore(ev)
	case TimerFired:
		switch ev.Timer {
		case TimerStoreRetry:
			if t.cas == casBackingOff {
				return t.commit()
			}
		case TimerRestoreDeadline:
			return t.deadlinePassed()
		}
		return ignore(ev)
	}
	return t.stepLate(ev)
}

func (t *Target) casAnswered(ev Event) []Effect {
	switch ev := ev.(type) {
	case StoreCommitted:
		t.moveTo(OwnerCommitted)
		relay := t.relay
		t.relay = nil
		return []Effect{StopTimer{Timer: TimerCutoverWait}, StopTimer{Timer: TimerRestoreDeadline}, OpenDispatch{Relay: relay}}
	case StoreRetryable:
		return t.retryable(ev)
	case StoreNotCommitted:
		t.unknown = false // settled: no CAS of this move applied
		if t.overdue != onTime {
			return t.locationUpdateFailed(nil)
		}
		return t.backOff()
	case StoreStale:
		return t.remove(roamerr.Wrap(roamerr.ErrStale, "another owner or generation is current", ev.Err),
			Log{Level: loglevel.Warn, Event: "stale_relocation", Msg: "another owner or generation is current; target removed"})
	}
	return ignore(ev)
}

func (t *Target) retryable(ev StoreRetryable) []Effect {
	t.unknown = t.unknown || ev.Unknown
	switch {
	case t.overdue != onTime && !t.unknown:
		return t.locationUpdateFailed(ev.Err)
	case t.overdue == pastDeadline:
		return t.settle(ev.Err)
	}
	if ev.Conflict && !t.unknown && !t.conflictRetried {
		// The record moved past the version this attempt wrote at
		// (the version relay-ready carried, or a read that raced a
		// write): a fresh read decides, and waiting would only add to
		// the pause. Once: a record that keeps changing is backed off.
		if t.phase != StoreRetry {
			t.moveTo(StoreRetry)
		}
		t.conflictRetried = true
		return t.commit()
	}
	return t.backOff()
}

// backOff waits StoreRetryBackoff in StoreRetry before the next attempt.
func (t *Target) backOff() []Effect {
	if t.phase != StoreRetry {
		t.moveTo(StoreRetry)
	}
	t.cas = casBackingOff
	return []Effect{StartTimer{Timer: TimerStoreRetry, After: t.cfg.StoreRetryBackoff}}
}

// deadlinePassed: the restore deadline in a commit phase. An unanswered
// CAS decides (a success is not late); an unknown outcome is settled; else
// the move failed.
func (t *Target) deadlinePassed() []Effect {
	if t.overdue == onTime {
		t.overdue = pastDeadline
	}
	switch {
	case t.cas == casAsking:
		return nil
	case t.unknown:
		return t.settle(nil)
	}
	return t.locationUpdateFailed(nil)
}

// stepCommitted: the CAS applied; dispatch opens, backlog first
// (PROTOCOL.md §5.12).
func (t *Target) stepCommitted(ev Event) []Effect {
	if _, ok := ev.(DispatchOpened); !ok {
		return t.stepLate(ev)
	}
	t.moveTo(TargetOpen)
	if t.sessionBound {
		// One-way, after the commit and the open: the Session owner
		// submits what it held to this target, then releases the seal
		// (docs/SESSIONS.md §2, command 43).
		return []Effect{UpdateSessionRoutes{}, Complete{}, t.keep()}
	}
	return []Effect{Complete{}, t.keep()}
}

// stepOpen: the move is done; the source may still resend the boundary
// batch and its cutover until this target's acknowledgement reaches it.
func (t *Target) stepOpen(ev Event) []Effect {
	switch ev := ev.(type) {
	case RelayRecordReceived:
		return t.lateRecord(ev)
	case CutoverReceivedEvent:
		return t.lateCutover(ev)
	case TimerFired:
		if ev.Timer == TimerForget {
			return t.forget()
		}
	}
	return ignore(ev)
}

// lateRecord: a relay record after the relay ended. After a matched
// cutover it is a resend of a batch already merged whole. After the
// fallback, a record this target does not have yet joins the backlog (or,
// once committed, is delivered late; order not guaranteed, PROTOCOL.md
// §5.10). Records are told apart by their batch index, which every resend
// repeats, so a record that arrived in any earlier epoch — or after a gap
// in a broken connection — is never delivered twice.
func (t *Target) lateRecord(ev RelayRecordReceived) []Effect {
	if t.relayEnd == relayMatched || t.known[ev.Index] {
		return ignore(ev)
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
	effects := []Effect{Log{Level: loglevel.Warn, Event: "late_cutover", Msg: "late or duplicate cutover; owner and queue unchanged"}}
	switch t.relayEnd {
	case relayMatched:
		return append(effects, AckBoundary{})
	case relayFellBack, relayFellBackAcked:
		t.declared = max(t.declared, int(ev.Sum.Count))
		t.relayEnd = relayFellBack
		return append(effects, t.ackIfComplete()...)
	}
	return effects
}

// ackIfComplete acknowledges the batch once, after the fallback, when
// every record a cutover declared is known.
func (t *Target) ackIfComplete() []Effect {
	if t.relayEnd == relayFellBackAcked || t.declared < 0 {
		return nil
	}
	for i := range t.declared {
		if !t.known[i] {
			return nil
		}
	}
	t.relayEnd = relayFellBackAcked
	return []Effect{AckBoundary{}}
}

func (t *Target) locationUpdateFailed(last error) []Effect {
	msg := "owner change not confirmed before the restore deadline; target removed"
	if last != nil {
		msg += ": " + last.Error()
	}
	return t.remove(fmt.Errorf("%w: owner change not confirmed before the restore deadline", roamerr.ErrDeadlineExceeded),
		Log{Level: loglevel.Error, Event: "location_update_failed", Msg: msg})
}
