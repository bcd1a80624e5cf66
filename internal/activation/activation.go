package activation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// first is a message an activation dispatches ahead of everything.
type first struct {
	op  string
	msg any
}

// Activation is the target side of one SpotActivation
// (docs/PROTOCOL.md §7.5 steps 8–12, §7.6): deliver the first message to
// the current owner, or obtain
// creation authority and activate the Spot here with that message handled
// first. Started with NewRecovery it is the start-up scan's handling of
// one record instead (PROTOCOL.md §7.7).
//
// Each attempt reads the authority and decides by what it finds:
//   - Missing: cold activation — a creation slot, the envelope stored as
//     the recovery root, the reservation (→ Creating) with its receipt,
//     staging, the Ready commit, and dispatch with the first message first;
//   - Ready under a live owner: the first message goes to that owner, once;
//   - an ended owner's record, or an activation abandoned past its
//     deadline plus AbandonGrace: resumed from its recovery root if it has
//     one (the stored first message first), else reactivated empty — or,
//     for a PreserveStateWith kind without ReactivateEmpty, refused
//     Unavailable (PROTOCOL.md §7.10);
//   - Creating or Closing under a live owner: watch the record, then read
//     again.
//
// A lost write (a conflict, or a settled write that was not ours) starts
// the next attempt; the deadline ends the attempts.
type Activation struct {
	cfg      Config
	recovery bool
	env      *messages.SpotActivation
	spotID   string
	op       string
	first    any
	kind     Kind
	deadline time.Time
	now      time.Time
	expired  bool
	scanned  location.Versioned
	// The Ready commit being settled past the deadline (SettlingCommit):
	// the record it wrote, its error, and the settle's own bound.
	ready       *location.Record
	settleErr   error
	settleUntil time.Time

	phase    Phase
	locked   bool
	capacity bool
	// reserveFirst: the source read the ID Missing just before sending,
	// so the first attempt reserves without reading the authority; the
	// reservation's own absence check decides, and a lost one reads.
	reserveFirst bool
	// unread: the current attempt has not read the authority (it came
	// from reserveFirst).
	unread bool
	// checkpointFound: a reservation's check found a checkpoint of the
	// ID; the later ones do not check, and the incarnation claims it.
	checkpointFound bool

	// the current attempt
	prev    location.Versioned // the record a reservation replaces
	resumed location.Versioned // the interrupted activation's record
	origOp  string
	origMsg any
	rootKey string
	rec     *location.Record // the reservation or taken-over record
	version location.StoreVersion
	firsts  []first
	write   *Write
	// noCheckpoint: the reservation landed with its check that the ID
	// has no checkpoint, so there is none to claim.
	noCheckpoint bool
	pending      error // the failure an abort precedes
	err          error
	finished     bool
	// leftReservation: a reservation (or takeover) holding this
	// activation's own recovery root may remain in the store (a lost
	// Ready commit, an abort that did not land): its first message may
	// still run when that reservation is resumed, so a failure must not
	// say it was not delivered.
	leftReservation bool
}

// NewActivation starts the machine for a SpotActivation. It checks the
// envelope first (route kind 2, operation, first message, Spot ID, this
// node's lifecycle as its target fence), then takes the Spot ID's lock.
func NewActivation(cfg Config, s Start) (*Activation, []Effect) {
	env := s.Envelope
	a := &Activation{
		cfg: cfg, env: env, spotID: env.GetSpotId(), op: env.GetOperationId(), first: s.First, kind: s.Kind,
		deadline: time.Unix(0, env.GetDeadlineUnixNanos()), now: s.Now, phase: Locking,
		reserveFirst: env.GetSourceReadMissing(),
	}
	var err error
	switch {
	case env.GetRouteKind() != 2 || env.GetOperationId() == "" || env.GetFirst() == nil:
		err = fmt.Errorf("%w: malformed activation envelope", roamerr.ErrInvalidOperation)
	case s.IDErr != nil:
		err = s.IDErr
	case env.GetTargetNodeRid() != cfg.Self.GetNodeRid() || env.GetTargetNodeGeneration() != cfg.Self.GetNodeGeneration():
		// Meant for another lifecycle (a process restarted on the same
		// address): the envelope's target fence does not match
		// (PROTOCOL.md §7.5 step 8).
		err = fmt.Errorf("%w: command 39 for node %s reached %s", roamerr.ErrUnavailable, env.GetTargetNodeRid(), cfg.Self.GetNodeRid())
	case s.FirstErr != nil:
		err = s.FirstErr
	}
	if err != nil {
		return a, a.fail(err)
	}
	return a, []Effect{StartTimer{Timer: TimerDeadline, At: a.deadline}, LockKey{SpotID: a.spotID}}
}

// NewRecovery starts the machine for one record of the start-up authority
// scan (PROTOCOL.md §7.7): an Instance Spot activation whose owner ended
// (or that was abandoned) while its recovery pointer was set is resumed
// here if this node hosts its type; an ended owner's User Spot
// reservation is released with its fence. Anything else is left alone.
func NewRecovery(cfg Config, r Recover) (*Activation, []Effect) {
	a := &Activation{
		cfg: cfg, recovery: true, spotID: r.Scanned.Key.ID, kind: r.Kind, deadline: r.Deadline, now: r.Now,
		scanned: r.Scanned, phase: CheckingOwner,
	}
	var effects []Effect
	if !r.Deadline.IsZero() {
		effects = append(effects, StartTimer{Timer: TimerDeadline, At: r.Deadline})
	}
	rec := r.Scanned.Record
	if !Recoverable(r.Scanned) && !(RecoverableFromCheckpoint(r.Scanned) && r.Kind.Registered && r.Kind.Checkpointed && !r.Kind.RecoverByOperator) {
		return a, append(effects, a.finish(Untouched)...)
	}
	if (a.creatingUser() && AbandonedCreation(rec, r.Now)) || Abandoned(rec, r.Now) {
		// released or resumed like an ended owner's reservation
		return a, append(effects, a.recoverEnded()...)
	}
	return a, append(effects, ReadOwner{Owner: rec.GetOwner()})
}

// Phase is the current phase.
func (a *Activation) Phase() Phase { return a.phase }

// Finished reports whether the machine has emitted Finish.
func (a *Activation) Finished() bool { return a.finished }

// Err is the machine's result once finished.
func (a *Activation) Err() error { return a.err }

// Recoverable reports whether the start-up scan has anything to do with
// a record (NewRecovery leaves every other one Untouched): one with a
// recovery pointer, or a User Spot reservation (Creating).
func Recoverable(v location.Versioned) bool {
	rec := v.Record
	return rec.GetActivationRecovery() != nil ||
		(v.Key.Kind == location.KindUserSpot && rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING)
}

// RecoverableFromCheckpoint reports whether a record may be an ended
// owner's stateful Instance Spot that a live node recovers from its
// checkpoint without waiting for a call: Ready, with no recovery pointer,
// of a kind that preserves state (whether its owner ended, and whether
// the kind checkpoints, the recovery then checks).
func RecoverableFromCheckpoint(v location.Versioned) bool {
	rec := v.Record
	return v.Key.Kind == location.KindInstanceSpot && rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY &&
		rec.GetActivationRecovery() == nil && rec.GetPreservesState()
}

func (a *Activation) creatingUser() bool {
	return a.scanned.Key.Kind == location.KindUserSpot &&
		a.scanned.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING
}

func (a *Activation) key() location.AuthorityKey {
	return location.Key(location.KindInstanceSpot, a.spotID)
}

// Step feeds one event and returns the effects to run, in order. Events
// that are not for the current phase change nothing.
func (a *Activation) Step(ev Event) []Effect {
	if a.finished {
		return nil
	}
	if now, ok := nowOf(ev); ok && !now.IsZero() {
		a.now = now
	}
	if t, ok := ev.(TimerFired); ok && t.Timer == TimerDeadline {
		a.expired = true
	}
	switch a.phase {
	case Locking:
		if _, ok := ev.(KeyLocked); ok {
			a.locked = true
			if a.recovery {
				a.phase = Rereading
				return []Effect{ReadRecord{Key: a.scanned.Key}}
			}
			return a.resolve()
		}
	case Resolving:
		if ev, ok := ev.(AuthorityRead); ok {
			return a.decide(ev)
		}
	case Watching:
		if ev, ok := ev.(Watched); ok {
			if ev.Err != nil {
				return a.fail(ev.Err)
			}
			return a.retry()
		}
	case Admitting:
		if ev, ok := ev.(CapacityAdmitted); ok {
			return a.admitted(ev)
		}
	case StoringRoot:
		if ev, ok := ev.(RootPut); ok {
			return a.rootStored(ev)
		}
	case ReadingRoot:
		if ev, ok := ev.(RootGot); ok {
			return a.rootRead(ev)
		}
	case Reserving, TakingOver, DroppingPointer, Committing:
		return a.writing(ev)
	case SettlingCommit:
		return a.settlingCommit(ev)
	case ClaimingCheckpoint:
		if ev, ok := ev.(CheckpointClaimed); ok {
			return a.claimed(ev)
		}
	case Staging:
		if ev, ok := ev.(Staged); ok {
			return a.staged(ev)
		}
	case Opening:
		if ev, ok := ev.(Opened); ok {
			return a.opened(ev)
		}
	case Aborting:
		if ev, ok := ev.(AbortAnswered); ok {
			var effects []Effect
			if ev.Err == nil || errors.Is(ev.Err, location.ErrConflict) {
				effects = append(effects, DeleteRoot{RootKey: a.rootKey})
			} else {
				effects = append(effects, Log{Level: loglevel.Warn, Event: "reservation_abort_failed", SpotID: a.spotID, Err: ev.Err,
					Msg: "the reservation stays until its owner's lease ends"})
				if a.rootKey == a.ownRoot() {
					a.leftReservation = true // with its root: it is resumed later
				}
			}
			return a.fail(a.pending, effects...)
		}
	case PassingOn:
		if ev, ok := ev.(PassedOn); ok {
			if ev.OK {
				return a.finish(HandedOn)
			}
			return a.failed()
		}
	case CheckingOwner:
		if ev, ok := ev.(OwnerRead); ok {
			switch {
			case ev.Err != nil:
				return a.fail(ev.Err)
			case ev.Alive:
				return a.finish(Untouched)
			}
			return a.recoverEnded()
		}
	case Rereading:
		if ev, ok := ev.(RecordRead); ok {
			if ev.Err != nil || ev.Record.Version != a.scanned.Version {
				return a.finish(Untouched) // changed meanwhile: whoever changed it carries on
			}
			if ev.Record.Record.GetActivationRecovery() == nil {
				a.resumed = ev.Record
				return a.takeOver(ev.Record)
			}
			return a.resume(ev.Record)
		}
	case ReleasingReservation:
		if ev, ok := ev.(Deleted); ok {
			switch {
			case ev.Err == nil:
				var effects []Effect
				if ref := a.scanned.Record.GetCreationIntent().GetContentRef(); ref != "" {
					effects = append(effects, DeleteRoot{RootKey: ref})
				}
				msg := "an ended owner's User Spot reservation was released"
				if a.scanned.Key.Kind == location.KindInstanceSpot {
					msg = "an interrupted Instance Spot reservation whose recovery root is gone was released"
				}
				effects = append(effects, Log{Level: loglevel.Info, Event: "reservation_released", SpotID: a.spotID, Msg: msg})
				return a.finish(ReservationReleased, effects...)
			case errors.Is(ev.Err, location.ErrConflict):
				return a.finish(Untouched)
			}
			return a.fail(StoreError("release "+a.scanned.Key.String(), ev.Err))
		}
	}
	return nil
}

// expiredNow reports whether the deadline has passed, by its timer or by
// the time of the last answer.
func (a *Activation) expiredNow() bool { return a.expired || passed(a.deadline, a.now) }

// resolve starts an attempt: read the authority, unless the deadline has
// passed.
func (a *Activation) resolve() []Effect {
	if a.expiredNow() {
		return a.fail(fmt.Errorf("%w: activation of Spot %q: %w", roamerr.ErrDeadlineExceeded, a.spotID, context.DeadlineExceeded))
	}
	a.prev, a.resumed, a.origOp, a.origMsg, a.rootKey, a.rec, a.version, a.firsts, a.write =
		location.Versioned{}, location.Versioned{}, "", nil, "", nil, 0, nil, nil
	if a.reserveFirst {
		// The source's read is the attempt's read (PROTOCOL.md §7.5): a
		// reservation only lands on an absent ID, so reading again first
		// would decide nothing the reservation does not. A local
		// incarnation of an ID the store has no record of is stale and
		// never gets the message either way.
		a.reserveFirst, a.unread = false, true
		return a.coldActivate(location.Versioned{Key: a.key()})
	}
	a.unread = false
	a.phase = Resolving
	return []Effect{ReadAuthority{SpotID: a.spotID}}
}

// retry ends the attempt (the store changed under it) after before: the
// next attempt reads the authority again. A recovery leaves the record to
// whoever changed it.
func (a *Activation) retry(before ...Effect) []Effect {
	effects := a.releaseCapacity(before)
	if a.recovery {
		return a.finish(Untouched, effects...)
	}
	return append(effects, a.resolve()...)
}

func (a *Activation) releaseCapacity(effects []Effect) []Effect {
	if a.capacity {
		a.capacity = false
		effects = append(effects, ReleaseCapacity{})
	}
	return effects
}

func (a *Activation) typeMismatch(rec *location.Record) error {
	return fmt.Errorf("%w: Spot %q has stable type %q, the activation names %q", roamerr.ErrTypeMismatch, a.spotID, rec.GetStableType(), a.env.GetStableType())
}

// decide picks the attempt's branch from the authority read.
func (a *Activation) decide(ev AuthorityRead) []Effect {
	if ev.Err != nil {
		return a.fail(ev.Err)
	}
	auth := ev.Authority
	v := auth.Versioned
	rec := v.Record
	if v.Present() && v.Key.Kind != location.KindInstanceSpot {
		return a.fail(fmt.Errorf("%w: Spot %q is a User Spot", roamerr.ErrTypeMismatch, a.spotID))
	}
	ended := auth.OwnerEnded
	if v.Present() && !ended && SameOwner(rec.GetOwner(), a.cfg.Self) && !auth.Hosted {
		// Our own record with no incarnation behind it and no activation
		// of ours in progress (we hold the key): an earlier attempt here
		// lost its answer from the store. It resumes like an ended owner's.
		ended = true
	}
	ready := v.Present() && rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY
	switch {
	case !v.Present():
		return a.coldActivate(v)
	case ready && !ended:
		if rec.GetStableType() != a.env.GetStableType() {
			return a.fail(a.typeMismatch(rec))
		}
		// Ready already: the first message goes, once, to the current
		// owner's queue (PROTOCOL.md §7.6); a local incarnation that is not
		// the store's current one never gets it.
		return a.finish(Forwarded, Forward{Address: auth.Address, Key: v.Key, Record: rec}, Measure{Outcome: "forwarded"})
	case ended || Abandoned(rec, a.now):
		if rec.GetStableType() != a.env.GetStableType() {
			return a.fail(a.typeMismatch(rec))
		}
		if rec.GetActivationRecovery() != nil {
			return a.resume(v)
		}
		if rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING {
			// A reservation that never committed Ready: no incarnation
			// ever served it, so no state ended with its owner. It is
			// replaced like an abandoned reservation, whatever the kind.
			return a.coldActivate(v)
		}
		if a.kind.Registered && a.kind.PreservesState && a.kind.Checkpointed && !a.kind.RecoverByOperator {
			// Recovered from its last checkpoint: the reservation below,
			// then the claim before staging (open).
			return append([]Effect{Log{Level: loglevel.Warn, Event: "spot_recovering", SpotID: a.spotID, ObjectGeneration: rec.GetObjectGeneration(),
				OwnerNodeRid: rec.GetOwner().GetNodeRid(),
				Msg:          "the owner of an Instance Spot ended; it is recovered here from its last checkpoint (what it handled after that is lost)"}},
				a.coldActivate(v)...)
		}
		if a.kind.Registered && a.kind.PreservesState {
			if !a.kind.ReactivateEmpty {
				// The state ended with its owner (PROTOCOL.md §7.10); only an
				// operator (or a kind that opted in) may accept the loss.
				return a.fail(fmt.Errorf("%w: Spot %q: its owner node %s ended and its in-memory state with it; Spots().ReleaseEnded accepts the loss and lets it start empty",
					roamerr.ErrUnavailable, a.spotID, rec.GetOwner().GetNodeRid()),
					Log{Level: loglevel.Warn, Event: "reactivation_refused", SpotID: a.spotID, OwnerNodeRid: rec.GetOwner().GetNodeRid(),
						Msg: "the owner of an Instance Spot ended with its in-memory state; it stays unavailable until ReleaseEnded accepts the loss"})
			}
			return append([]Effect{Log{Level: loglevel.Warn, Event: "spot_reactivated", SpotID: a.spotID, ObjectGeneration: rec.GetObjectGeneration(),
				Msg: "the owner of an Instance Spot ended; a new incarnation starts without the old one's in-memory state"}},
				a.coldActivate(v)...) // reactivation (PROTOCOL.md §7.10)
		}
		return a.coldActivate(v) // reactivation (PROTOCOL.md §7.10)
	}
	// Creating or Closing under a live owner: wait for its outcome.
	a.phase = Watching
	return []Effect{Watch{Key: v.Key, After: v.Version}}
}

// coldActivate starts a reservation that replaces prev (Missing, or an
// ended owner's record): a creation slot first.
func (a *Activation) coldActivate(prev location.Versioned) []Effect {
	if !a.kind.Registered {
		return a.fail(fmt.Errorf("%w: Instance Spot type %q is not registered on node %s", roamerr.ErrNotFound, a.env.GetStableType(), a.cfg.Self.GetNodeRid()))
	}
	a.prev = prev
	a.phase = Admitting
	return []Effect{AdmitCapacity{}}
}

func (a *Activation) admitted(ev CapacityAdmitted) []Effect {
	if ev.Err != nil && a.unread {
		// No slot (a full or draining node), but the ID may be Ready by
		// now (a concurrent first message won it here): a message for an
		// existing Spot needs no slot. Read, and decide as usual.
		a.unread = false
		a.phase = Resolving
		return []Effect{ReadAuthority{SpotID: a.spotID}}
	}
	if ev.Err != nil {
		return a.fail(ev.Err)
	}
	a.capacity = true
	a.rootKey = a.ownRoot()
	a.phase = StoringRoot
	return []Effect{PutRoot{RootKey: a.rootKey}}
}

// rootStored reserves the Spot with the recovery receipt, in one
// transaction that also checks the ID is not a User Spot
// (PROTOCOL.md §7.5 step 9, §7.10).
func (a *Activation) rootStored(ev RootPut) []Effect {
	if ev.Err != nil {
		return a.fail(StoreError("store the recovery root", ev.Err))
	}
	gen := NewGeneration(a.prev.Record.GetObjectGeneration(), a.now)
	a.rec = &location.Record{
		ObjectGeneration:         gen,
		AuthorityOwnerGeneration: 1,
		State:                    messages.LifecycleState_LIFECYCLE_STATE_CREATING,
		Owner:                    proto.Clone(a.cfg.Self).(*messages.Owner),
		StableType:               a.env.GetStableType(),
		SpotKind:                 messages.SpotKind_SPOT_KIND_INSTANCE,
		ActivationRecovery: &messages.ActivationRecovery{
			RecoveryKey: a.rootKey, RootSha256: ev.Ref.SHA256[:], RootSize: ev.Ref.Size, OperationId: a.op,
			DeadlineUnixNanos: a.env.GetDeadlineUnixNanos(), ReservationFence: gen,
		},
	}
	return a.reserve()
}

// reserve sends the reservation a.rec. Over a Missing record of a kind
// whose checkpoints the Location Store keeps, it also checks that the ID
// has no checkpoint: most first messages are for new IDs, and one that
// lands so proves there is nothing to claim (docs/FAULTS.md,
// "Checkpoints and recovery"), which saves the claim's read and write
// on the way to the first message.
func (a *Activation) reserve() []Effect {
	op := a.op
	a.write = NewReserve(a.cfg, a.key(), a.prev.Version, a.rec, location.KindUserSpot,
		func(r *location.Record) bool { return r.GetActivationRecovery().GetOperationId() == op }, a.deadline).Replacing(a.prev.Record, 0)
	a.noCheckpoint = a.kind.Checkpointed && a.kind.CheckpointsInStore && a.prev.Version == 0 && !a.checkpointFound
	if a.noCheckpoint {
		a.write.CheckingNoCheckpoint()
	}
	a.phase = Reserving
	return a.write.Start()
}

// writing feeds the current write and acts on its outcome.
func (a *Activation) writing(ev Event) []Effect {
	effects := a.write.Step(ev)
	if !a.write.Done() {
		return effects
	}
	outcome, version, err := a.write.Result()
	switch a.phase {
	case Reserving:
		switch outcome {
		case Applied:
			return append(effects, a.open(version, a.rec, []first{{a.op, a.first}}, a.rootKey)...)
		case CheckpointFound:
			// Nothing applied, the root included when it was to go in the
			// same transaction: reserve again, and claim it once reserved.
			a.checkpointFound = true
			return append(effects, a.reserve()...)
		case Lost:
			return a.retry(append(effects, DeleteRoot{RootKey: a.rootKey})...)
		}
		return a.fail(err, append(effects, DeleteRoot{RootKey: a.rootKey})...)
	case TakingOver:
		switch outcome {
		case Applied:
			if a.resumed.Record.GetActivationRecovery() == nil {
				// A Ready Spot of an ended owner, recovered from its
				// checkpoint by a live node without waiting for a call.
				effects = append(effects, Log{Level: loglevel.Warn, Event: "spot_recovering", SpotID: a.spotID, ObjectGeneration: a.rec.GetObjectGeneration(),
					OwnerNodeRid: a.resumed.Record.GetOwner().GetNodeRid(),
					Msg:          "the owner of an Instance Spot ended; it is recovered here from its last checkpoint (what it handled after that is lost)"})
				return append(effects, a.open(version, a.rec, nil, "")...)
			}
			firsts := []first{{a.origOp, a.origMsg}}
			if !a.recovery && a.op != a.origOp {
				firsts = append(firsts, first{a.op, a.first})
			}
			// Warn: the ended owner may have run the first message's
			// handler before its lifecycle ended and before the pointer's
			// removal landed; the replay is then a second run
			// (docs/FAULTS.md, repeated first message). Nothing else in the
			// store can tell the two apart.
			effects = append(effects, Log{Level: loglevel.Warn, Event: "activation_resumed", SpotID: a.spotID, OperationID: a.origOp,
				Msg: "an activation whose owner ended is resumed here from its recovery root; its first message runs here, a second time if the ended owner had already handled it"})
			return append(effects, a.open(version, a.rec, firsts, a.resumed.Record.GetActivationRecovery().GetRecoveryKey())...)
		case Lost:
			if a.resumed.Record.GetActivationRecovery().GetRecoveryKey() == a.ownRoot() {
				a.leftReservation = true // our own reservation, changed by someone who may resume it
			}
			return a.retry(effects...)
		}
		return a.fail(err, effects...)
	case DroppingPointer:
		if outcome == WriteFailed {
			return a.fail(err, effects...)
		}
		return a.retry(effects...)
	case Committing:
		switch outcome {
		case Applied:
			return append(effects, a.openCommitted(version)...)
		case Lost:
			if a.rootKey == a.ownRoot() {
				a.leftReservation = true // the commit did not land; the reservation may still
			}
			return a.retry(append(effects, DiscardStaged{})...)
		}
		if errors.Is(err, roamerr.ErrDeadlineExceeded) {
			// Unknown: the commit may have landed, and then a discarded
			// incarnation left a Ready record naming this node that no
			// incarnation serves, until its lease ends.
			a.phase, a.settleErr, a.settleUntil = SettlingCommit, err, a.now.Add(a.cfg.ReleaseFor)
			return append(effects, ReadRecord{Key: a.key(), Settle: true})
		}
		return a.abort(err, append(effects, DiscardStaged{})...)
	}
	return effects
}

// open stages the incarnation of the reservation at version, to commit
// Ready keeping the recovery pointer and open dispatch with firsts at the
// head of its queue; the pointer goes once the first handler has completed
// (PROTOCOL.md §7.5 steps 10–12). On any failure before the commit the
// reservation is released with the same fence.
func (a *Activation) open(version location.StoreVersion, rec *location.Record, firsts []first, rootKey string) []Effect {
	a.version, a.rec, a.firsts, a.rootKey = version, rec, firsts, rootKey
	if a.phase == Reserving && a.noCheckpoint {
		// The reservation landed with its check: no checkpoint is stored,
		// and none of an earlier incarnation can land later (a closed or
		// released one leaves a tombstone; a recovery, its claim).
		return a.stage(nil, false, true)
	}
	if a.kind.Checkpointed {
		// Every incarnation of a kind that checkpoints starts from the
		// last checkpoint: after an ended owner, after a resumed or
		// aborted activation, after a recovery that failed half-way
		// (its reservation released, the record Missing again).
		a.phase = ClaimingCheckpoint
		return []Effect{ClaimCheckpoint{Key: a.key(), StableType: rec.GetStableType(), Generation: rec.GetObjectGeneration(), OwnerGeneration: rec.GetAuthorityOwnerGeneration()}}
	}
	return a.stage(nil, false, false)
}

// stage stages the incarnation, with a claimed state to restore, or
// (noCheckpoint) with none because the reservation proved none stored.
func (a *Activation) stage(state []byte, restore, noCheckpoint bool) []Effect {
	rec := a.rec
	a.phase = Staging
	return []Effect{Stage{Key: a.key(), StableType: rec.GetStableType(), Generation: rec.GetObjectGeneration(), OwnerGeneration: rec.GetAuthorityOwnerGeneration(),
		State: state, Restore: restore, NoCheckpoint: noCheckpoint}}
}

// claimed stages the incarnation with the checkpoint's state; a claim
// that failed (the store, or a corrupt checkpoint) fails the activation
// before anything is staged: nothing starts without the state it should
// have.
func (a *Activation) claimed(ev CheckpointClaimed) []Effect {
	if ev.Err != nil {
		return a.abort(StoreError("claim the Spot's checkpoint", ev.Err), Log{Level: loglevel.Warn, Event: "checkpoint_claim_failed", SpotID: a.spotID, Err: ev.Err,
			Msg: "the Spot's last checkpoint could not be taken over; it does not start without it"})
	}
	return a.stage(ev.State, ev.Restore, false)
}

func (a *Activation) staged(ev Staged) []Effect {
	if ev.Err != nil {
		return a.abort(ev.Err)
	}
	ready := proto.Clone(a.rec).(*location.Record)
	ready.State = messages.LifecycleState_LIFECYCLE_STATE_READY
	ready.PreservesState = a.kind.PreservesState
	a.ready = ready
	a.write = NewCompareAndSet(a.cfg, a.key(), a.version, ready, a.deadline)
	a.phase = Committing
	return a.write.Start()
}

// openCommitted opens dispatch once the Ready commit is known to have
// landed at version.
func (a *Activation) openCommitted(version location.StoreVersion) []Effect {
	a.phase = Opening
	msgs := make([]any, len(a.firsts))
	for i, f := range a.firsts {
		msgs[i] = f.msg
	}
	return []Effect{Open{Key: a.key(), Messages: msgs, FirstOperation: a.firstOp(), RootKey: a.rootKey,
		Committed: location.Versioned{Key: a.key(), Version: version, Record: a.ready}}}
}

// firstOp is the operation of the first message dispatched ("" for a
// recovery from a checkpoint, which has none).
func (a *Activation) firstOp() string {
	if len(a.firsts) == 0 {
		return ""
	}
	return a.firsts[0].op
}

// settlingCommit settles a Ready commit whose outcome the deadline left
// unknown, on its own bound (the deadline is spent, but the staged
// incarnation and the reservation are this node's to decide): the record
// is this commit's — open; still the reservation at its version — fence
// it with a compare-and-set of the same record, so the commit can never
// land, then abort as for a failed commit; anything else — discard.
func (a *Activation) settlingCommit(ev Event) []Effect {
	switch ev := ev.(type) {
	case RecordRead:
		switch {
		case ev.Err == nil && ev.Record.Version == a.version:
			return []Effect{CompareAndSet{Key: a.key(), Expected: a.version, Record: a.rec, Settle: true}}
		case ev.Err == nil && proto.Equal(ev.Record.Record, a.ready):
			return a.openCommitted(ev.Record.Version)
		case ev.Err == nil, errors.Is(ev.Err, location.ErrNotFound):
			// Taken over or released by another: this commit did not land
			// and never can; the first message's outcome is another's
			// (a resumed reservation runs it), so the failure stays
			// "outcome unknown".
			return a.fail(a.settleErr, DiscardStaged{})
		}
		return a.settleAgain(ev.Err)
	case WriteAnswered:
		switch {
		case ev.Err == nil:
			a.version = ev.Version // fenced: the commit cannot land any more
			return a.abort(a.settleErr, DiscardStaged{})
		case errors.Is(ev.Err, location.ErrConflict):
			return []Effect{ReadRecord{Key: a.key(), Settle: true}}
		}
		return a.settleAgain(ev.Err)
	case TimerFired:
		if ev.Timer == TimerSettle {
			return []Effect{ReadRecord{Key: a.key(), Settle: true}}
		}
	}
	return nil
}

// settleAgain reads again after a pause, or gives up at the settle's
// bound: loudly, since a commit that landed leaves the Spot unserved.
func (a *Activation) settleAgain(err error) []Effect {
	if passed(a.settleUntil, a.now) {
		return a.fail(a.settleErr, DiscardStaged{}, Log{Level: loglevel.Error, Event: "spot_commit_unsettled", SpotID: a.spotID, Err: err,
			Msg: "an Instance Spot's Ready commit stayed unsettled; if it landed, the Spot answers Stale until this node's lease ends"})
	}
	return []Effect{StartTimer{Timer: TimerSettle, After: a.cfg.SettleBackoff}}
}

func (a *Activation) opened(ev Opened) []Effect {
	if ev.Err != nil {
		// Ready with the pointer kept: the start-up scan of a live node
		// resumes it (PROTOCOL.md §7.7) once this lifecycle ends, and runs the first
		// message then — so its outcome is unknown here, not a failure.
		a.leftReservation = true
		return a.fail(ev.Err, DiscardStaged{})
	}
	if len(a.firsts) == 0 {
		return a.finish(Activated, Measure{Outcome: "recovered", Activated: true},
			Log{Level: loglevel.Info, Event: "spot_recovered", SpotID: a.spotID, ObjectGeneration: a.rec.GetObjectGeneration(),
				StableType: a.rec.GetStableType(), Msg: "Instance Spot of an ended owner recovered from its last checkpoint without waiting for a call"})
	}
	return a.finish(Activated, Measure{Outcome: "ok", Activated: true},
		Log{Level: loglevel.Info, Event: "spot_activated", SpotID: a.spotID, ObjectGeneration: a.rec.GetObjectGeneration(),
			OperationID: a.firsts[0].op, StableType: a.rec.GetStableType(), Msg: "Instance Spot activated by its first message"})
}

// abort releases this node's reservation with its fence (its version) and
// deletes its root, then fails with err. A takeover is not released: its
// record holds the interrupted activation's recovery root (and, for an
// ended owner's Ready record, what is left of the Spot); deleting them
// lost that activation's first message without a word and let a
// PreserveStateWith Spot start empty. The taken-over record stays under
// this node (Creating, unless a commit whose answer was lost landed) with
// the recovery pointer and its deadline, which has passed as a rule:
// abandoned, it is resumed again by the next activation (this node's own
// at once) or the start-up scan.
func (a *Activation) abort(err error, before ...Effect) []Effect {
	// A recovery from a checkpoint (a takeover without a recovery pointer)
	// is released like a reservation: the record goes Missing, and the
	// Spot's next call activates it from the same checkpoint.
	if a.resumed.Present() && a.resumed.Record.GetActivationRecovery() != nil {
		if a.rootKey == a.ownRoot() {
			a.leftReservation = true
		}
		return a.fail(err, append(before, Log{Level: loglevel.Warn, Event: "activation_resume_failed", SpotID: a.spotID, OperationID: a.origOp, Err: err,
			Msg: "a resumed activation failed before its Ready commit; the record keeps its recovery pointer and is resumed again"})...)
	}
	a.pending = err
	a.phase = Aborting
	return append(before, AbortReservation{Key: a.key(), Version: a.version, Record: a.rec})
}

// resume continues an activation whose owner ended after its reservation
// or its Ready commit (PROTOCOL.md §7.7): it takes the record over with the
// same ObjectGeneration and the next owner generation, restores the first
// record from the recovery root, and dispatches it before anything else —
// then this activation's first message, if that is another operation.
func (a *Activation) resume(v location.Versioned) []Effect {
	a.resumed = v
	a.phase = ReadingRoot
	return []Effect{GetRoot{RootKey: v.Record.GetActivationRecovery().GetRecoveryKey()}}
}

func (a *Activation) rootRead(ev RootGot) []Effect {
	v := a.resumed
	rec := v.Record
	rr := rec.GetActivationRecovery()
	switch {
	case errors.Is(ev.Err, location.ErrNotFound) && rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING:
		// An interrupted reservation whose root is gone (the activation
		// that made it failed and deleted it): nothing to resume, and a
		// Creating record without its pointer could no longer be taken
		// over while its owner lives. An activation reserves over it; the
		// start-up scan, which has no first message, releases it with its
		// fence.
		if a.recovery {
			a.phase = ReleasingReservation
			return []Effect{Delete{Key: v.Key, Version: v.Version, Record: v.Record}}
		}
		a.resumed = location.Versioned{}
		return a.coldActivate(v)
	case errors.Is(ev.Err, location.ErrNotFound):
		return a.dropPointer(v)
	case ev.Err != nil:
		return a.fail(StoreError("read the recovery root", ev.Err))
	case !bytes.Equal(ev.Ref.SHA256[:], rr.GetRootSha256()) || ev.Ref.Size != rr.GetRootSize():
		return a.fail(fmt.Errorf("%w: recovery root of Spot %q does not match its receipt", roamerr.ErrConflict, v.Key.ID))
	case ev.DecodeErr != nil:
		return a.fail(fmt.Errorf("%w: recovery root of Spot %q: %w", roamerr.ErrConflict, v.Key.ID, ev.DecodeErr))
	case !a.kind.Registered:
		return a.fail(fmt.Errorf("%w: Instance Spot type %q is not registered on node %s", roamerr.ErrUnavailable, rec.GetStableType(), a.cfg.Self.GetNodeRid()))
	case ev.FirstErr != nil:
		return a.fail(ev.FirstErr)
	}
	a.origOp, a.origMsg = ev.Operation, ev.First
	return a.takeOver(v)
}

// takeOver writes the record v of an ended owner (or an abandoned
// activation) with this node as owner and the next owner generation,
// Creating, by compare-and-set: the resume of an interrupted activation,
// or the recovery of a Ready Spot from its checkpoint (no first message).
func (a *Activation) takeOver(v location.Versioned) []Effect {
	rec := v.Record
	took := proto.Clone(rec).(*location.Record)
	took.Owner = proto.Clone(a.cfg.Self).(*messages.Owner)
	if rec.GetOwner().GetNodeRid() != a.cfg.Self.GetNodeRid() {
		// Another node's record: the take-over takes one of this node's
		// capacity slots and frees the one the record names (gone with
		// an ended owner's lease; held by a live owner of an abandoned
		// reservation). This node's own record keeps its slot
		// (PROTOCOL.md §7.12).
		took.CapacitySlot = 0
	}
	took.AuthorityOwnerGeneration++
	took.State = messages.LifecycleState_LIFECYCLE_STATE_CREATING
	a.rec = took
	a.write = NewCompareAndSet(a.cfg, v.Key, v.Version, took, a.deadline).Replacing(rec, 0)
	a.phase = TakingOver
	return a.write.Start()
}

// dropPointer clears a recovery pointer whose root is gone (the first
// handler completed and the root was deleted, but the pointer's removal
// was not seen): the record is an ended owner's Ready record again, and
// the authority is read again.
func (a *Activation) dropPointer(v location.Versioned) []Effect {
	rec := proto.Clone(v.Record).(*location.Record)
	rec.ActivationRecovery = nil
	a.write = NewCompareAndSet(a.cfg, v.Key, v.Version, rec, a.deadline)
	a.phase = DroppingPointer
	return a.write.Start()
}

// recoverEnded handles a scanned record whose owner ended (or that was
// abandoned).
func (a *Activation) recoverEnded() []Effect {
	if a.creatingUser() {
		a.phase = ReleasingReservation
		return []Effect{Delete{Key: a.scanned.Key, Version: a.scanned.Version, Record: a.scanned.Record}}
	}
	if !a.kind.Registered {
		return a.finish(Untouched)
	}
	a.phase = Locking
	return []Effect{LockKey{SpotID: a.spotID}}
}

// fail ends the machine with err after before. A SpotActivation that found
// this node full is first passed on to another candidate
// (PROTOCOL.md §7.5 step 9), as is one that found it draining; otherwise its failure is measured, answered to the first
// message's sender and logged.
func (a *Activation) fail(err error, before ...Effect) []Effect {
	effects := a.release(before)
	if a.leftReservation && !a.recovery && !errors.Is(err, roamerr.ErrCapacityExceeded) && !errors.Is(err, roamerr.ErrDeadlineExceeded) {
		// The outcome is unknown, as for a write whose answer never came:
		// the first message may still run (PROTOCOL.md §7.4).
		err = fmt.Errorf("%w: Spot %q: %v; a reservation holding the first message's recovery root may remain, and the message runs when it is resumed",
			roamerr.ErrDeadlineExceeded, a.spotID, err)
	}
	a.err = err
	if !a.recovery && (errors.Is(err, roamerr.ErrCapacityExceeded) || errors.Is(err, roamerr.ErrNodeDraining)) {
		a.phase = PassingOn
		return append(effects, PassOn{})
	}
	if a.recovery {
		a.phase = Failed
		a.finished = true
		return append(effects, Finish{Err: err})
	}
	return append(effects, a.failed()...)
}

func (a *Activation) failed() []Effect {
	a.phase = Failed
	a.finished = true
	msg := "the first message of a cold activation was not delivered"
	if a.leftReservation {
		msg = "the first message of a cold activation was not delivered by this activation; its reservation may remain and deliver it when resumed"
	}
	return []Effect{
		Measure{Outcome: roamerr.Code(a.err)},
		RespondFailure{Err: a.err},
		Log{Level: loglevel.Warn, Event: "activation_failed", SpotID: a.spotID, OperationID: a.op, Err: a.err, Msg: msg},
		Finish{Err: a.err},
	}
}

// ownRoot is the key of this activation's own recovery root.
func (a *Activation) ownRoot() string { return "activation-" + a.op }

// release gives back what the machine holds: the creation slot, then the
// Spot ID's lock.
func (a *Activation) release(effects []Effect) []Effect {
	effects = a.releaseCapacity(effects)
	if a.locked {
		a.locked = false
		effects = append(effects, UnlockKey{})
	}
	return effects
}

// finish ends the machine in the terminal phase p after before.
func (a *Activation) finish(p Phase, before ...Effect) []Effect {
	effects := a.release(before)
	a.phase = p
	a.finished = true
	return append(effects, Finish{})
}

// nowOf is the time an answer carries, if it carries one.
func nowOf(ev Event) (time.Time, bool) {
	switch ev := ev.(type) {
	case KeyLocked:
		return ev.Now, true
	case AuthorityRead:
		return ev.Now, true
	case Watched:
		return ev.Now, true
	case WriteAnswered:
		return ev.Now, true
	case RecordRead:
		return ev.Now, true
	case Deleted:
		return ev.Now, true
	case TimerFired:
		return ev.Now, true
	}
	return time.Time{}, false
}
