package relocation

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/sourcerun"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// sourceEnv is the driver's primitives for a move's source interpreter
// (sourcerun.Env): Proto.Actor messages, roam's mailbox, the Location
// Store and the driver's named timers. Every call runs on the driver
// goroutine, but IsRequest and Refuse, which a hold's sink calls under
// the mailbox's lock.
type sourceEnv struct {
	d *Driver
	r *sourceRun
}

var _ sourcerun.Env[any, location.Versioned] = sourceEnv{}

func (e sourceEnv) obj(i int) *object { return e.r.parts[i].obj }

func (e sourceEnv) Gone() bool { return false }

func (e sourceEnv) Stepped(ev handoff.Event, effects []handoff.Effect) {
	if l := e.d.log.Debug(); l.Enabled() { // the type name costs, even unlogged
		r := e.r
		l.Str("side", "source").Uint64("relocation_id", r.m.Identity().RelocationID).Str("event", fmt.Sprintf("%T", ev)).
			Str("phase", r.m.Phase().String()).Int("effects", len(effects)).Msg("step")
	}
}

// Before keeps the run's own account of what an effect starts.
func (e sourceEnv) Before(eff handoff.Effect) {
	d, r := e.d, e.r
	switch eff := eff.(type) {
	case handoff.Seal:
		r.captures = make([]capturedPart, len(r.parts))
	case handoff.RelayThenCutover:
		r.outcome.RelayReady = d.clock.Now()
	case handoff.StartFollow:
		d.lastFollow.Store(d.clock.Now().UnixNano()) // FollowQuiet counts from here too
	case handoff.FailHeld:
		d.log.Warn().Str("event", "relocation_unavailable").Str("object_id", r.obj.key.ID).Err(eff.Err).Msg("object unavailable until reconciled: requests fail, sends wait")
	}
}

// Seal seals participant i after its current turn; it captures on its own
// goroutine and hands the capture to the run on the driver's.
func (e sourceEnv) Seal(i int) error {
	d, r := e.d, e.r
	id := r.m.Identity()
	obj, participant := e.obj(i), uint32(i+1)
	idleOnly, idleFor := r.idleOnly, r.idleFor
	return obj.mb.Seal(func(saved []any) {
		// On the object's goroutine, between turns: exclusive access.
		sealedAt := d.clock.Now()
		var c capturedPart
		err := busyAtSeal(obj, saved, idleOnly, idleFor, sealedAt)
		if err == nil {
			c, err = safeCapture(obj, saved, participant)
		}
		d.loop.Post(func() {
			if cur := d.sources[id.RelocationID]; cur == r && r.run.Awaiting() {
				if r.outcome.Sealed.IsZero() || sealedAt.Before(r.outcome.Sealed) {
					r.outcome.Sealed = sealedAt
				}
				r.captures[i] = c
				r.parts[i].checkpoint = c.checkpoint
				r.run.Captured(i, saved, err)
				return
			}
			// The move gave up waiting for this seal: undo it.
			r.run.UnsealLate(i, saved)
		})
	})
}

func (e sourceEnv) Unseal(i int, front []any) error { return e.obj(i).mb.Unseal(front) }

func (e sourceEnv) Reopen(i int, front func() []any) error { return e.obj(i).mb.Reopen(front) }

func (e sourceEnv) Redirect(i int, sink func(any)) error {
	_, err := e.obj(i).mb.Redirect(sink)
	return err
}

func (e sourceEnv) Leaving(i int) { e.d.setState(e.obj(i), leaving) }
func (e sourceEnv) Serving(i int) { e.d.setState(e.obj(i), serving) }

// Unsealed re-arms the participant's timers and marks it serving.
func (e sourceEnv) Unsealed(i int) {
	obj := e.obj(i)
	_ = obj.mb.Do(func() {
		if obj.tm != nil {
			obj.tm.resume()
		}
	})
	e.d.nowServing(obj)
}

func (e sourceEnv) Following(i int) {
	p := e.r.parts[i]
	e.d.setState(p.obj, following)
}

func (e sourceEnv) Unregister(i int) {
	// Only this run's incarnation: the object may have moved back here
	// meanwhile, and its new incarnation is registered under the same key
	// (the simulation found that schedule).
	e.d.dropObject(e.obj(i))
}

func (e sourceEnv) Conflict(i int) bool {
	obj := e.obj(i)
	cur := e.d.objects[obj.key]
	return cur != nil && cur != obj
}

// Reinstated re-arms the timers of a fenced-out move's participant,
// registers it and marks it serving. The application instance was kept
// until the move was decided.
func (e sourceEnv) Reinstated(i int) {
	obj := e.obj(i)
	_ = obj.mb.Do(func() {
		if obj.tm != nil {
			obj.tm.resume()
		}
	})
	e.d.putObject(obj)
	e.d.nowServing(obj)
}

func (e sourceEnv) FollowSink(i int) func(any) {
	p := e.r.parts[i]
	return e.d.followSink(p.obj, p.next, p.nextRid)
}

func (e sourceEnv) EndFollow(i int) func(any) {
	obj := e.obj(i)
	e.d.setState(obj, ended)
	return e.d.unavailableSink(obj, "the object moved away and Message Follow has ended")
}

func (e sourceEnv) CloseOut(i int)        { e.d.closeOut(e.obj(i)) }
func (e sourceEnv) StopIncarnation(i int) { e.d.stop(e.obj(i)) }

// LateSealUndone: the participant's queue is back (or as back as it will
// get) and its held Session abort sent.
func (e sourceEnv) LateSealUndone(i int, err error) {
	p := e.r.parts[i]
	if err != nil {
		e.d.log.Error().Str("event", "unseal_failed").Str("object_id", p.obj.key.ID).Err(err).Msg("restoring the source queue after a late seal failed")
		return
	}
	e.d.log.Warn().Str("event", "late_seal_undone").Str("object_id", p.obj.key.ID).Msg("a participant sealed after its move gave up waiting; it serves again")
}

func (e sourceEnv) IsRequest(msg any) bool {
	_, _, sender := actor.UnwrapEnvelope(msg)
	return sender != nil
}

// Refuse answers a refused request Unavailable; a send past the hold's
// bound is counted and logged.
func (e sourceEnv) Refuse(i int, msg any, why sourcerun.Refusal) {
	d, obj := e.d, e.obj(i)
	_, m, sender := actor.UnwrapEnvelope(msg)
	switch {
	case why == sourcerun.RefuseReconciling:
		respondFailure(d.sys, sender, m, roamerr.CodeUnavailable, obj.key.ID, "the object is moving and its outcome is being reconciled")
	case sender != nil:
		respondFailure(d.sys, sender, m, roamerr.CodeUnavailable, obj.key.ID, "the object is moving and too many messages wait for its outcome")
	default:
		d.metrics.sendUndelivered("send_parked_overflow")
		d.log.Warn().Str("event", "send_parked_overflow").Str("object_id", obj.key.ID).Str("message_type", typeName(m)).
			Int("parked", sourcerun.MaxParked).Msg("a send to an object whose move is being reconciled was refused: too many sends wait already")
	}
}

func (e sourceEnv) QueryCapability() handoff.Event {
	d, r := e.d, e.r
	id := r.m.Identity()
	ev, gen, ticket, now := d.capabilityFor(r, func(ev handoff.CapabilityAnswered, gen uint64, ticket []byte) bool {
		if cur := d.sources[id.RelocationID]; cur != r {
			return false
		}
		r.target.NodeGeneration, r.ticket = gen, ticket
		d.stepSource(r, ev)
		return true
	})
	if !now {
		return nil
	}
	r.target.NodeGeneration, r.ticket = gen, ticket
	return ev
}

func (e sourceEnv) Admit() handoff.Event {
	d, r := e.d, e.r
	// Admitted later: budgetOut steps the move.
	if d.budget.Admit(r.target.GetAddress(), r.m.Identity().RelocationID) {
		return handoff.Admitted{}
	}
	return nil
}

func (e sourceEnv) EncodePayload() (envelope.Stream, error) {
	stream, err := e.d.encodePayload(e.r)
	e.r.captures = nil
	return stream, err
}

func (e sourceEnv) SendPrepare(p handoff.SendPrepare) {
	d, r := e.d, e.r
	key := r.obj.key
	r.prepareSent = true
	r.outcome.Bytes, r.outcome.Chunks = p.Manifest.TotalLength, p.Manifest.ChunkCount
	d.send(r.targetPID, &messages.RelocationPrepare{
		Identity: r.wire.of(r.m.Identity()),
		Object:   &messages.ObjectRef{Kind: key.Kind, Id: key.ID, ObjectGeneration: r.obj.generation, StableType: r.obj.kind.StableType},
		Manifest: &messages.PayloadManifest{
			PayloadTotalLength: p.Manifest.TotalLength, PayloadChunkCount: p.Manifest.ChunkCount, PayloadChecksumCrc32C: p.Manifest.ChecksumCRC32C,
		},
		ChunkLimit:                uint32(p.ChunkLimit),
		Source:                    d.selfRef(),
		RestoreDeadlineUnixMillis: r.deadline.UnixMilli(),
		NewOwnerGeneration:        r.parts[0].newOwner,
		SealedAtUnixNanos:         r.outcome.Sealed.UnixNano(),
		MoveTicket:                r.ticket,
		Join:                      r.join,
		Members:                   r.members(),
		Session:                   r.obj.r().session,
		Checkpoint:                r.parts[0].checkpoint,
	})
}

func (e sourceEnv) SendChunks(c handoff.SendChunks) {
	d, r := e.d, e.r
	d.budgetOut(d.budget.Submit(r.target.GetAddress(), r.m.Identity().RelocationID, c.Chunks))
}

func (e sourceEnv) SendAbort(a handoff.SendAbort) {
	e.d.send(e.r.targetPID, &messages.RelocationAbort{Identity: e.r.wire.of(e.r.m.Identity()), Reason: a.Reason})
}

// EncodeRelay makes a relayed record's envelope; the relay sum covers its
// deterministic encoding.
func (e sourceEnv) EncodeRelay(i int, msg any) ([]byte, any, error) {
	env, err := toWire(e.r.parts[i].next.Id, msg)
	if err != nil {
		return nil, nil, err
	}
	b, _ := deterministic.Marshal(env)
	return b, env, nil
}

func (e sourceEnv) RelayRefused(i int, msg any, err error) {
	obj := e.obj(i)
	_, m, sender := actor.UnwrapEnvelope(msg)
	respondFailure(e.d.sys, sender, m, roamerr.CodeInvalidOperation, obj.key.ID, err.Error())
	e.d.log.Error().Str("event", "relay_type_mismatch").Str("object_id", obj.key.ID).Err(err).Msg("message cannot cross nodes; not relayed")
}

func (e sourceEnv) SendRelay(b sourcerun.Relayed[any], epoch uint32, again bool) {
	env := b.Wire.(*messages.Envelope)
	if again {
		// The first copy went to the target (in process: the very message).
		env = proto.Clone(env).(*messages.Envelope)
	}
	rec := &messages.RelayedRecord{Identity: e.r.wire.of(e.r.m.Identity()), ResendEpoch: epoch, Envelope: env, Index: uint32(b.Index)}
	if b.Part > 0 {
		rec.Participant = uint32(b.Part + 1)
	}
	e.d.send(e.r.targetPID, rec)
}

func (e sourceEnv) SendCutover(epoch uint32, sum handoff.RelaySum) {
	e.d.send(e.r.targetPID, &messages.Cutover{Identity: e.r.wire.of(e.r.m.Identity()), ResendEpoch: epoch, RelayRecordCount: sum.Count, RelayCrc32C: sum.CRC})
}

func (e sourceEnv) Reconcile() { go e.d.reconcileRead(e.r, e.r.m.Identity()) }

func (e sourceEnv) ConfirmCommit(after uint64, until time.Time) {
	d, r := e.d, e.r
	id := r.m.Identity()
	if after == 0 && r.versionHint != 0 {
		// The first confirmation (once only: a later one after an error
		// reads at once).
		hint := r.versionHint
		r.versionHint = 0
		committed := make(chan struct{})
		r.committed = committed
		machine.Go(func() { d.firstConfirm(r, id, hint, committed, until) })
		return
	}
	machine.Go(func() { d.confirmWatch(r, id, after, until) })
}

func (e sourceEnv) FenceOut(read location.Versioned, version uint64) {
	d, r, ident := e.d, e.r, e.r.m.Identity()
	machine.Go(func() { d.fenceOut(r, ident, read, version) })
}

func (e sourceEnv) NoFenceOutRead(version uint64) {
	e.d.later(e.r.m.Identity().RelocationID, handoff.FenceOutAnswered{Err: fmt.Errorf("%w: no record read at version %d", location.ErrConflict, version)})
}

func (e sourceEnv) StartTimer(t handoff.StartTimer) {
	e.d.startTimer(timerKey{source: e.r.m.Identity().RelocationID, timer: t.Timer}, t)
}

func (e sourceEnv) StopTimer(t handoff.Timer) {
	e.d.stopTimer(timerKey{source: e.r.m.Identity().RelocationID, timer: t})
}

func (e sourceEnv) StopTimers(keep handoff.Timer) {
	id := e.r.m.Identity().RelocationID
	e.d.stopTimers(func(k timerKey) bool { return !k.isTarget && k.source == id && (keep == 0 || k.timer != keep) })
}

func (e sourceEnv) PayloadReleased() {}

func (e sourceEnv) ReturnBudget() { e.d.budgetOut(e.d.budget.Return(e.r.m.Identity().RelocationID)) }

func (e sourceEnv) BoundaryUnacknowledged(batch []sourcerun.Relayed[any]) {
	d, r := e.d, e.r
	d.metrics.sendsUndeliveredN("boundary_batch_unacknowledged", len(batch))
	d.log.Error().Str("event", "boundary_batch_unacknowledged").Str("object_id", r.obj.key.ID).Uint64("relocation_id", r.m.Identity().RelocationID).
		Str("target_node_rid", r.target.GetNodeRid()).Int("records", len(batch)).Dur("patience", d.cfg.Handoff.AckPatience()).
		Msg("the target never acknowledged the boundary batch; its messages may be lost (the target's node is gone or unreachable)")
}

func (e sourceEnv) Log(l handoff.Log) { e.d.logEffect(l, e.r.obj.key, e.r.m.Identity()) }

func (e sourceEnv) Problem(i int, event string, err error, msg string) {
	e.d.log.Error().Str("event", event).Str("object_id", e.obj(i).key.ID).Err(err).Msg(msg)
}

func (e sourceEnv) Complete(err error) {
	r := e.r
	if err == nil {
		r.outcome.CutoverSent = e.d.clock.Now()
	}
	select {
	case r.waiter <- sourceResult{outcome: r.outcome, err: err, decided: r.decided}:
	default: // decided once; the machine completes once (never block the driver)
	}
}

func (e sourceEnv) Ended() { e.d.endSource(e.r) }

func (e sourceEnv) Forgotten() {
	if id := e.r.m.Identity().RelocationID; e.d.sources[id] == e.r {
		delete(e.d.sources, id)
	}
}
