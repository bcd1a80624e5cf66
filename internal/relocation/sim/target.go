package sim

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// TargetRun is the driver's targetRun: one move into a node.
type TargetRun struct {
	w        *World
	node     *Node
	mv       *Move
	m        *handoff.Target
	source   *Node
	obj      ObjID
	newOwner uint64
	deadline time.Duration
	inc      *Inc
	saved    []*Msg
	version  int
	timers   map[handoff.Timer]uint64
	relayed  []*Msg // relay records received (the machine's relay buffer, over-approximated)

	dead      bool
	completes int
}

func containsMsg(ms []*Msg, m *Msg) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

func (w *World) moveByID(id uint64) *Move {
	for _, mv := range w.moves {
		if mv.id == id {
			return mv
		}
	}
	return nil
}

// onPrepare is Driver.onPrepare: a known identity steps its run (only
// from its source); a new one is checked and gets a Target machine.
func (w *World) onPrepare(n *Node, p *packet) {
	id := p.id
	for _, t := range n.targets {
		if t.m.Identity() == id && !t.dead {
			if t.source.idx == p.from {
				w.stepTarget(t, w.prepareEvent(p))
			}
			return
		}
	}
	fail := func(reason messages.FailureReason, detail string) {
		w.tracef("%s refuses %s: %s", n.name, idString(id), detail)
		n.send(p.from, &packet{kind: pFailed, id: id, reason: reason, detail: detail})
	}
	switch {
	case !n.valid() || n.stopping:
		fail(reasonStale, "the target node's owner lease is not in force, or it is stopping")
		return
	case !id.Valid():
		fail(messages.FailureReason_FAILURE_REASON_CONFLICT, "relocation identity has a zero id or attempt")
		return
	}
	mv := w.moveByID(id.RelocationID)
	t := &TargetRun{w: w, node: n, mv: mv, source: w.nodes[p.from], obj: p.prep.obj, newOwner: p.prep.newOwner,
		deadline: p.prep.deadline, timers: map[handoff.Timer]uint64{}}
	m, effects := handoff.NewTarget(id, w.cfg.Handoff, w.prepareEvent(p))
	t.m = m
	if mv.tgt == nil {
		mv.tgt = t
	}
	n.targets = append(n.targets, t)
	if w.Tracing() {
		w.tracef("%s tgt #%d created → %s %s", n.name, id.RelocationID, m.Phase(), effectsString(effects))
	}
	w.runTarget(t, effects)
}

func (w *World) prepareEvent(p *packet) handoff.PrepareReceived {
	return handoff.PrepareReceived{Manifest: p.prep.manifest, RestoreDeadline: w.wall(p.prep.deadline), MaxPayloadLength: 1 << 20,
		SessionBound: w.boundTo(p.prep.obj) >= 0}
}

// stepTarget feeds ev and runs the effects (Driver.stepTarget).
func (w *World) stepTarget(t *TargetRun, ev handoff.Event) {
	if t.dead {
		return
	}
	effects := t.m.Step(ev)
	if w.Tracing() {
		w.tracef("%s tgt #%d %s → %s %s", t.node.name, t.mv.id, eventString(ev), t.m.Phase(), effectsString(effects))
	}
	w.runTarget(t, effects)
}

// runTarget runs effects; events they produce at once are fed after them.
func (w *World) runTarget(t *TargetRun, effects []handoff.Effect) {
	for len(effects) > 0 {
		var next []handoff.Event
		for _, e := range effects {
			w.beforeTargetEffect(t, e)
			if t.dead {
				return
			}
			if ev := w.targetEffect(t, e); ev != nil {
				next = append(next, ev)
			}
		}
		effects = nil
		for _, ev := range next {
			more := t.m.Step(ev)
			if w.Tracing() {
				w.tracef("%s tgt #%d %s → %s %s", t.node.name, t.mv.id, eventString(ev), t.m.Phase(), effectsString(more))
			}
			effects = append(effects, more...)
		}
	}
}

func (w *World) startTargetTimer(t *TargetRun, st handoff.StartTimer) {
	at := w.Now() + st.After
	if !st.At.IsZero() {
		at = w.logical(st.At)
	}
	w.tok++
	tok := w.tok
	t.timers[st.Timer] = tok
	w.at(at, "timer", func() {
		if t.dead || t.timers[st.Timer] != tok {
			return
		}
		delete(t.timers, st.Timer)
		w.stepTarget(t, handoff.TimerFired{Timer: st.Timer})
	})
}

// targetEffect runs one target effect the way Driver.targetEffect does
// (internal/relocation/target_run.go).
func (w *World) targetEffect(t *TargetRun, e handoff.Effect) handoff.Event {
	n := t.node
	id := t.m.Identity()
	switch e := e.(type) {
	case handoff.InstallStaging:
		key := incKey{obj: t.obj, ownerGen: t.newOwner}
		if cur := n.incs[key]; cur != nil && !cur.stopped {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: install temporary queue: %s exists", errSim, cur)}
		}
		inc := n.newInc(key, mStaging, sStaging)
		inc.target = t
		inc.closed = w.unavailableSink(inc, "the relocation target was removed before it opened")
		t.inc = inc

	case handoff.VerifySource:
		w.verifySource(t, id)

	case handoff.SendCredit:
		// The in-flight budget is not modelled: chunks are sent at once.

	case handoff.RestorePayload:
		b := e.Stream
		if len(b) < 20 || binary.BigEndian.Uint64(b) != id.RelocationID {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: payload describes another move", errSim)}
		}
		t.version = int(binary.BigEndian.Uint64(b[8:]))
		k := int(binary.BigEndian.Uint32(b[16:]))
		t.saved = nil
		for i := 0; i < k; i++ {
			mid := binary.BigEndian.Uint64(b[20+8*i:])
			m := w.msgs[mid-1]
			w.place(m, n)
			t.saved = append(t.saved, m)
		}
		if t.inc.mode == mClosed {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: restore: mailbox closed", errSim)}
		}
		// The state is restored on the object's goroutine; the answer comes
		// back to the driver later.
		w.after(w.randDur(50*time.Microsecond, 2*time.Millisecond), "restored", func() { w.stepTarget(t, handoff.Restored{}) })

	case handoff.SendFailed:
		n.send(t.source.idx, &packet{kind: pFailed, id: id, reason: e.Reason, detail: e.Detail})

	case handoff.AckBoundary:
		n.send(t.source.idx, &packet{kind: pBoundaryAck, id: id})

	case handoff.SendRelayReady:
		t.mv.relayReadySent = true
		n.send(t.source.idx, &packet{kind: pRelayReady, id: id})

	case handoff.CommitOwner:
		w.commitOwner(t, id, e.SettleOnly, func(ev handoff.Event) { w.stepTarget(t, ev) })

	case handoff.OpenDispatch:
		inc := t.inc
		backlog := append([]*Msg(nil), t.saved...)
		for _, it := range e.Relay {
			backlog = append(backlog, it.(*Msg))
		}
		t.saved = nil
		if t.m.FellBack() {
			w.stats.Fallbacks++
			inc.fellBack = true
			for _, m := range backlog[len(backlog)-len(e.Relay):] {
				m.exempt = true
			}
			for _, m := range inc.queue {
				m.exempt = true
			}
		}
		if inc.mode != mStaging {
			w.tracef("%s DRIVER ERROR open_failed: mode %s", n.name, incModeNames[inc.mode])
		} else {
			inc.inst, inc.version = true, t.version
			if err := w.reopen(inc, mStaging, backlog); err != nil {
				w.tracef("%s DRIVER ERROR open_failed: %v", n.name, err)
			}
		}
		n.objects[t.obj] = inc
		t.mv.opened = true
		w.stats.Committed++
		w.nowServing(inc)
		return handoff.DispatchOpened{}

	case handoff.UpdateSessionRoutes:
		w.updateSessionRoutes(t)

	case handoff.DeliverLate:
		m := e.Item.(*Msg)
		m.exempt = true
		if t.inc.stopped {
			w.lostMsg(m, lossDeadLetter, "late relay record to a stopped incarnation")
			break
		}
		w.post(t.inc, m)

	case handoff.RemoveTarget:
		t.mv.targetRemoved = true
		// The machine drops its relay buffer and the restored saved work
		// silently: the source's payload and batch are the copies left, if
		// it still holds them.
		for _, m := range append(append([]*Msg(nil), t.saved...), t.relayed...) {
			if m.at != n || m.handled > 0 || m.failed > 0 {
				continue
			}
			r := t.mv.src
			switch {
			case r != nil && !r.dead && (containsMsg(r.part().Relayed, m) || containsMsg(r.part().Saved, m)):
				m.at = r.node
			case r != nil && r.dead:
				w.lostMsg(m, r.node.downKind, "its source went down with its copy; the removed target discarded its own")
			default:
				w.lostMsg(m, lossTransit, "discarded by the removed target")
			}
		}
		t.saved = nil
		if inc := t.inc; inc != nil {
			var held []*Msg
			switch inc.mode {
			case mStaging, mSealed, mRedirect:
				held = inc.queue
				inc.queue = nil
				inc.sink = nil
				w.setMode(inc, mClosed)
			}
			removed := w.unavailableSink(inc, "the relocation target was removed")
			for _, m := range held {
				removed(m)
			}
			inc.state = sEnded
		}

	case handoff.StopIncarnation:
		if inc := t.inc; inc != nil {
			w.stopInc(inc)
		}

	case handoff.Forget:
		clear(t.timers)
		for i, x := range n.targets {
			if x == t {
				n.targets = append(n.targets[:i:i], n.targets[i+1:]...)
				break
			}
		}

	case handoff.StartTimer:
		w.startTargetTimer(t, e)

	case handoff.StopTimer:
		delete(t.timers, e.Timer)

	case handoff.Log:

	case handoff.Complete:
		w.checkClass(t.mv.obj, t.mv.String()+" target", e.Err)
		t.completes++
		if t.completes > 1 {
			w.violateO(t.mv.obj, "completed-twice", "%s target completed %d times", t.mv, t.completes)
		}
		if e.Err == nil {
			t.mv.committed = true
		}

	default:
		panic(fmt.Sprintf("sim: the driver model does not run target effect %T; add it to targetEffect (target.go)", e))
	}
	return nil
}

// commitOwner runs one attempt of the owner commit as the driver does
// (Driver.commitOwner, target_run.go), on the core's decisions
// (handoff.Commit): a consistent read judged, and the CAS it composes —
// the target-only owner change naming this target with the move's
// RelocationId, or with settleOnly the fence-out (the move's RelocationId,
// owner unchanged). Its context ends at the restore deadline (settling: a
// restore timeout from now).
func (w *World) commitOwner(t *TargetRun, id handoff.Identity, settleOnly bool, done func(handoff.Event)) {
	n := t.node
	ctx := t.deadline
	if settleOnly {
		ctx = w.Now() + w.cfg.RestoreTimeout
	}
	if w.cfg.Sabotage == SabotageOpenWithoutCommit && !settleOnly {
		w.after(time.Millisecond, "sabotage", func() { done(handoff.StoreCommitted{}) })
		return
	}
	c := &handoff.Commit{
		ID: id, Key: location.Key(location.KindActor, t.obj.name()), Owner: &messages.Owner{NodeRid: n.name, NodeGeneration: n.gen},
		NewOwnerGeneration: t.newOwner, ObjectGeneration: 1, SettleOnly: settleOnly,
		Session: &messages.SessionBinding{}, IsEntrySpot: func(string) bool { return false }, // the sim models neither
	}
	w.store.call(n, storeOp{kind: opRead, obj: t.obj, why: fmt.Sprintf("commit #%d", id.RelocationID)}, ctx, func(res storeRes) {
		if res.err != errNone {
			done(handoff.StoreRetryable{Err: fmt.Errorf("%w: read: %s", errSim, res.err)})
			return
		}
		read := versionedOf(c.Key, res.rec)
		if ev, _ := c.Read(read); ev != nil {
			done(ev)
			return
		}
		op, why, applied := c.FenceOut(read), "settle fence-out", handoff.Event(handoff.StoreNotCommitted{})
		if !settleOnly {
			ops, _ := c.Txn(read).Ops()
			op, why, applied = ops[0], "commit", handoff.StoreCommitted{}
		}
		next := recordOf(op.Record, uint64(op.Version))
		w.store.call(n, storeOp{kind: opCAS, obj: t.obj, expected: uint64(op.Version), next: next, why: fmt.Sprintf("%s #%d", why, id.RelocationID)}, ctx, func(res storeRes) {
			done(casAnswer(t, id, res, applied))
		})
	})
}

// versionedOf is the sim's record as the Location Store holds it.
func versionedOf(key location.AuthorityKey, r Record) location.Versioned {
	return location.Versioned{Key: key, Version: location.StoreVersion(r.Version), Record: &location.Record{
		Owner: &messages.Owner{NodeRid: r.OwnerNode, NodeGeneration: r.OwnerNodeGen}, AuthorityOwnerGeneration: r.OwnerGen,
		ObjectGeneration: r.ObjectGen, RelocationId: r.RelocID,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY, // the sim models no Close
	}}
}

// recordOf is a Location Store record as the sim holds it, at version.
func recordOf(r *location.Record, version uint64) Record {
	return Record{Version: version, OwnerNode: r.GetOwner().GetNodeRid(), OwnerNodeGen: r.GetOwner().GetNodeGeneration(),
		OwnerGen: r.GetAuthorityOwnerGeneration(), ObjectGen: r.GetObjectGeneration(), RelocID: r.GetRelocationId()}
}

// verifySource is Driver.verifySource (target_run.go): the record must
// name the move's source at its fence; a read that fails is retried until
// the restore deadline.
func (w *World) verifySource(t *TargetRun, id handoff.Identity) {
	w.store.call(t.node, storeOp{kind: opRead, obj: t.obj, why: fmt.Sprintf("verify source #%d", id.RelocationID)}, t.deadline, func(res storeRes) {
		if t.dead {
			return
		}
		if res.err != errNone {
			if w.Now() < t.deadline {
				w.after(w.randDur(time.Millisecond, 20*time.Millisecond), "verify retry", func() {
					if !t.dead {
						w.verifySource(t, id)
					}
				})
			}
			return
		}
		w.stepTarget(t, handoff.SourceVerified{Err: id.JudgeSource(recordView(res.rec), 1)})
	})
}

// casAnswer judges a CAS's answer with the driver's judgement
// (handoff.Identity.JudgeWrite): res.err classed as the driver classes a
// Location Store error (handoff.WriteOutcomeOf).
func casAnswer(t *TargetRun, id handoff.Identity, res storeRes, applied handoff.Event) handoff.Event {
	o, cur := handoff.WriteFailed, handoff.RecordView{}
	switch res.err {
	case errNone:
		o = handoff.WriteApplied
	case errConflict:
		o, cur = handoff.WriteConflict, recordView(res.rec)
	case errLeaseEnded:
		o = handoff.WriteLeaseEnded
	case errIndeterminate, errDeadline:
		o = handoff.WriteUnknown
	}
	var err error
	switch o {
	case handoff.WriteLeaseEnded:
		err = fmt.Errorf("%w: lease ended", errSim)
	case handoff.WriteApplied:
	default:
		err = fmt.Errorf("%w: %s", errSim, res.err)
	}
	return id.JudgeWrite(o, err, cur, t.node.name, t.newOwner, 1, applied)
}
