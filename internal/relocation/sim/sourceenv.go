package sim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/sourcerun"
)

// sourceEnv is this world's primitives for a move's source interpreter
// (sourcerun.Env): the incarnation's mailbox modes, the network's
// packets, the simulated store and the scheduler's timers. The
// interpreter's choreography is the driver's own; the checks at effects
// (released-twice, completed-twice, unacknowledged batches) live here,
// where the primitives see them.
type sourceEnv struct{ r *SourceRun }

var _ sourcerun.Env[*Msg, Record] = sourceEnv{}

func (e sourceEnv) Gone() bool { return e.r.dead }

func (e sourceEnv) Stepped(ev handoff.Event, effects []handoff.Effect) {
	r := e.r
	if r.w.Tracing() {
		r.w.tracef("%s src #%d %s → %s %s", r.node.name, r.mv.id, eventString(ev), r.m.Phase(), effectsString(effects))
	}
}

func (e sourceEnv) Before(eff handoff.Effect) { e.r.w.beforeSourceEffect(e.r, eff) }

// Seal takes effect after the turn in progress, on the object's
// goroutine; the capture comes back to the driver later. Like
// mailbox.Seal, it is refused at once unless the mailbox is Open.
func (e sourceEnv) Seal(i int) error {
	r, w, inc := e.r, e.r.w, e.r.incs[i]
	if inc.mode != mOpen {
		return fmt.Errorf("%w: seal in mode %s", errSim, incModeNames[inc.mode])
	}
	w.after(w.randDur(50*time.Microsecond, 2*time.Millisecond), "seal", func() {
		if r.dead {
			return
		}
		if inc.mode != mOpen {
			// The seal never took: nothing to undo if no capture is awaited.
			if r.run.Awaiting() {
				r.run.Captured(i, nil, fmt.Errorf("%w: seal in mode %s", errSim, incModeNames[inc.mode]))
			}
			return
		}
		saved := inc.queue
		inc.queue = nil
		w.setMode(inc, mSealed)
		r.run.Captured(i, saved, nil)
	})
	return nil
}

func (e sourceEnv) Unseal(i int, front []*Msg) error {
	return e.r.w.reopen(e.r.incs[i], mSealed, front)
}

func (e sourceEnv) Reopen(i int, front func() []*Msg) error {
	inc := e.r.incs[i]
	if inc.mode != mRedirect {
		return fmt.Errorf("%w: reopen from %s in mode %s", errSim, incModeNames[mRedirect], incModeNames[inc.mode])
	}
	return e.r.w.reopen(inc, mRedirect, front())
}

func (e sourceEnv) Redirect(i int, sink func(*Msg)) error { return e.r.w.redirect(e.r.incs[i], sink) }

func (e sourceEnv) Leaving(i int) { e.r.incs[i].state = sLeaving }
func (e sourceEnv) Serving(i int) { e.r.incs[i].state = sServing }

func (e sourceEnv) Unsealed(i int) {
	if i == 0 {
		e.r.w.stats.SourceServesAgain++
	}
	e.r.w.nowServing(e.r.incs[i])
}

func (e sourceEnv) Following(i int) { e.r.incs[i].state = sFollowing }

func (e sourceEnv) Unregister(i int) {
	n, inc := e.r.node, e.r.incs[i]
	if n.objects[inc.key.obj] == inc {
		delete(n.objects, inc.key.obj)
	}
}

func (e sourceEnv) Conflict(i int) bool {
	inc := e.r.incs[i]
	cur := e.r.node.objects[inc.key.obj]
	return cur != nil && cur != inc
}

func (e sourceEnv) Reinstated(i int) {
	r, inc := e.r, e.r.incs[i]
	if i == 0 {
		r.mv.reinstated = true
		r.w.stats.Reinstated++
	}
	r.node.objects[inc.key.obj] = inc
	r.w.nowServing(inc)
}

func (e sourceEnv) FollowSink(i int) func(*Msg) { return e.r.w.followSink(e.r, i) }

func (e sourceEnv) EndFollow(i int) func(*Msg) {
	inc := e.r.incs[i]
	inc.state = sEnded
	return e.r.w.unavailableSink(inc, "the object moved away and Message Follow has ended")
}

// CloseOut: the target's commit freed the slot the object held here
// (the driver's closeOut: the view reads the slots again before its next
// take).
func (e sourceEnv) CloseOut(i int) {
	r := e.r
	r.incs[i].inst = false
	if r.node.bounded() {
		r.node.view.Unread()
	}
}
func (e sourceEnv) StopIncarnation(i int) { e.r.w.stopInc(e.r.incs[i]) }

func (e sourceEnv) LateSealUndone(i int, err error) {
	if err != nil {
		e.Problem(i, "unseal_failed", err, "")
		return
	}
	e.r.w.tracef("%s late_seal_undone: move #%d gave up waiting for the seal; it serves again", e.r.node.name, e.r.mv.id)
}

func (e sourceEnv) IsRequest(m *Msg) bool { return m.request }

func (e sourceEnv) Refuse(i int, m *Msg, why sourcerun.Refusal) {
	reason := "the object is moving and its outcome is being reconciled"
	if why == sourcerun.RefuseOverflow {
		reason = "the object is moving and too many messages wait for its outcome"
	}
	e.r.w.failLoud(m, e.r.incs[i], reason)
}

func (e sourceEnv) QueryCapability() handoff.Event {
	r, w, n := e.r, e.r.w, e.r.node
	w.tok++
	req := w.tok
	n.capWait[req] = r
	n.send(r.target.idx, &packet{kind: pCapQuery, capReq: req})
	w.after(w.cfg.CapabilityTimeout, "capability-timeout", func() {
		if n.capWait[req] == r {
			delete(n.capWait, req)
			w.stepSource(r, handoff.CapabilityAnswered{Reason: "capability query timed out"})
		}
	})
	return nil
}

func (e sourceEnv) Admit() handoff.Event {
	if e.r.node.budget.Admit(e.r.target.name, e.r.m.Identity().RelocationID) {
		return handoff.Admitted{}
	}
	e.r.w.stats.BudgetWaits++
	return nil // budgetOut steps it when admitted
}

func (e sourceEnv) CheckSource() {
	r := e.r
	r.node.send(r.target.idx, &packet{kind: pSourceCheck, id: r.m.Identity(), prep: &prepare{obj: r.inc.key.obj, objGen: 1, deadline: r.deadline, source: r.node.idx}})
}

func (e sourceEnv) EncodePayload() (envelope.Stream, error) {
	r := e.r
	versions, saved := make([]int, len(r.incs)), make([][]*Msg, len(r.incs))
	for i, inc := range r.incs {
		versions[i], saved[i] = inc.version, r.part(i).Saved
	}
	return envelope.Whole(payload(r.m.Identity().RelocationID, versions, saved)), nil
}

func (e sourceEnv) SendPrepare(p handoff.SendPrepare) {
	r, inc := e.r, e.r.inc
	var members []prepMember
	for i, m := range r.incs[1:] {
		members = append(members, prepMember{obj: m.key.obj, ownerGen: m.key.ownerGen, newOwner: r.owners[i+1]})
	}
	r.node.send(r.target.idx, &packet{kind: pPrepare, id: r.m.Identity(), prep: &prepare{obj: inc.key.obj, objGen: 1, manifest: p.Manifest,
		deadline: r.deadline, newOwner: r.newOwner, source: r.node.idx, members: members, join: r.join}})
}

func (e sourceEnv) SendChunks(c handoff.SendChunks) {
	n := e.r.node
	out := n.budget.Submit(e.r.target.name, e.r.m.Identity().RelocationID, c.Chunks)
	e.r.w.stats.ChunksQueued += len(c.Chunks) - len(out.Chunks)
	n.budgetOut(out)
	if r := e.r; r.w.cfg.Sabotage == SabotageCutoverBeforeRelayReady {
		// The source takes its own payload's departure for relay-ready.
		r.w.after(0, "sabotage", func() { r.w.stepSource(r, handoff.RelayReadyReceived{}) })
	}
}

func (e sourceEnv) SendAbort(a handoff.SendAbort) {
	e.r.node.send(e.r.target.idx, &packet{kind: pAbort, id: e.r.m.Identity(), reason: a.Reason})
}

func (e sourceEnv) EncodeRelay(_ int, m *Msg) ([]byte, any, error) {
	e.r.mv.relayedEver = append(e.r.mv.relayedEver, m)
	return msgRecord(m), nil, nil
}

func (e sourceEnv) RelayRefused(int, *Msg, error) {} // every simulated message crosses nodes

func (e sourceEnv) SendRelay(b sourcerun.Relayed[*Msg], epoch uint32, _ bool) {
	r := e.r
	r.node.send(r.target.idx, &packet{kind: pRelay, id: r.m.Identity(), epoch: epoch, index: b.Index, msg: b.Msg, record: b.Record})
}

func (e sourceEnv) SendCutover(epoch uint32, sum handoff.RelaySum) {
	r := e.r
	r.mv.cutoverSent = true
	r.node.send(r.target.idx, &packet{kind: pCutover, id: r.m.Identity(), epoch: epoch, sum: sum})
}

// BoundTo: the object is bound to its client's Session; the client's
// endpoint is its Session owner. A SpotWide member is not bound here.
func (e sourceEnv) BoundTo(i int) (owner, actor string) {
	r, w := e.r, e.r.w
	o := r.incs[i].key.obj
	if c := w.boundTo(o); c >= 0 && !r.unbound && i == 0 {
		return w.endpointName(w.cfg.Nodes + c), actorName(o)
	}
	return "", actorName(o)
}

// SendSessionSeal sends command 42; SabotageSkipSessionSeal is a faulty
// Session owner that answers sealed without sealing.
func (e sourceEnv) SendSessionSeal(int) {
	r, w := e.r, e.r.w
	id, o := r.m.Identity(), r.inc.key.obj
	gw := w.cfg.Nodes + w.boundTo(o)
	if w.cfg.Sabotage == SabotageSkipSessionSeal {
		w.net.send(&packet{from: gw, to: r.node.idx, kind: pSessionSealReply, id: id, obj: o})
		return
	}
	r.node.send(gw, &packet{kind: pSessionSeal, id: id, obj: o, route: w.routeOf(r.node, r.inc.key.ownerGen)})
}

// SendSessionAbort sends command 44, one-way.
func (e sourceEnv) SendSessionAbort(int) {
	r, w := e.r, e.r.w
	o := r.inc.key.obj
	r.node.send(w.cfg.Nodes+w.boundTo(o), &packet{kind: pSessionAbort, id: r.m.Identity(), obj: o})
}

func (e sourceEnv) DropBinding(_ int, why string) {
	e.r.unbound = true
	e.r.w.tracef("%s session_binding_dropped: o%d moves unbound (%s)", e.r.node.name, e.r.inc.key.obj, why)
}

// SessionOwnersGone: a client's Session owner never leaves the mesh here.
func (e sourceEnv) SessionOwnersGone([]string) (map[string]bool, bool) { return nil, true }

// Reconcile is one read with a context of a cutover wait.
func (e sourceEnv) Reconcile() {
	r, w := e.r, e.r.w
	w.store.call(r.node, storeOp{kind: opRead, obj: r.inc.key.obj, why: fmt.Sprintf("reconcile #%d", r.mv.id)}, w.Now()+w.cfg.Handoff.CutoverWaitTimeout,
		e.answerRead)
}

// ConfirmCommit watches the record until its version is past after or
// until passes (after 0: a read).
func (e sourceEnv) ConfirmCommit(after uint64, until time.Time) {
	if after == 0 {
		e.Reconcile()
		return
	}
	r, w := e.r, e.r.w
	w.store.call(r.node, storeOp{kind: opWatch, obj: r.inc.key.obj, after: after, why: fmt.Sprintf("confirm #%d", r.mv.id)}, w.logical(until),
		e.answerRead)
}

func (e sourceEnv) answerRead(res storeRes) {
	r := e.r
	ev := handoff.ReconcileRead{Target: r.target.name, ObjectGeneration: 1, SourceEnded: r.node.ended}
	if res.err != errNone {
		ev.Err = fmt.Errorf("%w: %s", errSim, res.err)
	} else {
		ev.Record = recordView(res.rec)
	}
	r.run.Read(ev, res.rec)
}

// FenceOut writes the move's RelocationId into read by CAS, owner
// unchanged; SabotageSkipFenceOut is a faulty store that answers success
// without writing.
func (e sourceEnv) FenceOut(read Record, version uint64) {
	r, w := e.r, e.r.w
	id := r.m.Identity()
	if w.cfg.Sabotage == SabotageSkipFenceOut {
		w.after(time.Millisecond, "sabotage", func() { w.stepSource(r, handoff.FenceOutAnswered{}) })
		return
	}
	next := read
	next.RelocID = id.RelocationID
	w.store.call(r.node, storeOp{kind: opCAS, obj: r.inc.key.obj, expected: version, next: next, why: fmt.Sprintf("fence-out #%d", id.RelocationID)},
		w.Now()+w.cfg.Handoff.CutoverWaitTimeout, func(res storeRes) {
			var err error
			if res.err != errNone {
				err = fmt.Errorf("%w: %s", errSim, res.err)
			}
			w.stepSource(r, handoff.FenceOutAnswered{Err: err})
		})
}

func (e sourceEnv) NoFenceOutRead(version uint64) {
	r, w := e.r, e.r.w
	w.after(0, "fence-out", func() {
		w.stepSource(r, handoff.FenceOutAnswered{Err: fmt.Errorf("%w: no record read at version %d", errSim, version)})
	})
}

func (e sourceEnv) StartTimer(st handoff.StartTimer) {
	r, w := e.r, e.r.w
	at := w.Now() + st.After
	if !st.At.IsZero() {
		at = w.logical(st.At)
	}
	w.tok++
	tok := w.tok
	r.timers[st.Timer] = tok
	w.at(at, "timer", func() {
		if r.dead || r.run.Forgotten() || r.timers[st.Timer] != tok {
			return
		}
		delete(r.timers, st.Timer)
		w.stepSource(r, handoff.TimerFired{Timer: st.Timer})
	})
}

func (e sourceEnv) StopTimer(t handoff.Timer) { delete(e.r.timers, t) }

func (e sourceEnv) StopTimers(keep handoff.Timer) {
	for t := range e.r.timers {
		if t != keep {
			delete(e.r.timers, t)
		}
	}
}

func (e sourceEnv) PayloadReleased() {
	r := e.r
	if r.releases++; r.releases > 1 {
		r.w.violateO(r.mv.obj, "released-twice", "%s released its payload %d times", r.mv, r.releases)
	}
}

// BoundaryUnacknowledged: boundary_batch_unacknowledged is logged and
// counted, loudly, for every message of the batch not ended yet.
func (e sourceEnv) BoundaryUnacknowledged(batch []sourcerun.Relayed[*Msg]) {
	for _, b := range batch {
		if m := b.Msg; m.handled == 0 && m.failed == 0 {
			e.r.w.failLoud(m, e.r.incs[b.Part], "the target never acknowledged the boundary batch")
		}
	}
}

func (e sourceEnv) Log(l handoff.Log) {
	if l.Event == "relocation_fenced_out" {
		e.r.w.stats.FencedOut++
		e.r.mv.fencedOut = true
	}
}

func (e sourceEnv) Problem(_ int, event string, err error, _ string) {
	e.r.w.tracef("%s DRIVER ERROR %s: %v", e.r.node.name, event, err)
}

func (e sourceEnv) Complete(err error) {
	r := e.r
	r.w.checkClass(r.mv.obj, r.mv.String()+" source", err)
	if r.completes++; r.completes > 1 {
		r.w.violateO(r.mv.obj, "completed-twice", "%s source completed %d times", r.mv, r.completes)
	}
}

// Ended is Driver.endSource: the move is over; only TimerStub may still
// run.
func (e sourceEnv) ReturnBudget() {
	n := e.r.node
	n.budgetOut(n.budget.Return(e.r.m.Identity().RelocationID))
}

func (e sourceEnv) Ended() {
	r, n := e.r, e.r.node
	defer n.budgetOut(n.budget.End(r.m.Identity().RelocationID))
	for i, s := range n.sources {
		if s == r {
			n.sources = append(n.sources[:i:i], n.sources[i+1:]...)
			break
		}
	}
	for _, inc := range r.incs {
		if inc.out == r {
			inc.out = nil
		}
	}
	r.w.tracef("%s src #%d finished (phase %s)", n.name, r.mv.id, r.m.Phase())
}

func (e sourceEnv) Forgotten() {}
