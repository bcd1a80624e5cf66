package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/messages"
)

// Move is one relocation the sim started, with both sides' runs.
type Move struct {
	id       uint64
	obj      ObjID
	from, to *Node
	started  time.Duration
	src      *SourceRun
	tgt      *TargetRun
	// what happened, for the report and the known-defect classification
	relayReadySent, cutoverSent, committed, opened, fencedOut, reinstated bool
	targetRemoved                                                         bool
	// committedInStore: the store took this move's owner change.
	committedInStore bool
	relayedEver      []*Msg
}

func (mv *Move) String() string {
	return fmt.Sprintf("move #%d o%d %s→%s", mv.id, mv.obj, mv.from.name, mv.to.name)
}

// SourceRun is the driver's sourceRun: one move out of a node.
type SourceRun struct {
	w        *World
	node     *Node
	mv       *Move
	m        *handoff.Source
	inc      *Inc
	target   *Node
	newOwner uint64
	deadline time.Duration
	saved    []*Msg // saved-work prefix (for Unseal)
	batch    []*Msg // boundary batch (for ResendBoundary)
	records  [][]byte
	relayed  []*Msg // the boundary batch as posted (for Reinstate)
	sum      handoff.RelaySum
	parked   *parked
	held     *parked // after the cutover, until StartFollow or Reinstate
	timers   map[handoff.Timer]uint64
	lastRead Record // the last record read, for a FenceOut of its version
	haveRead bool
	sealWait *sealWait // SealSessions asked, not answered yet

	dead      bool // its node went down
	ended     bool // endSource ran
	forgotten bool // the machine is Forgettable: the run is dropped
	releases  int
	completes int
}

// parked is the driver's parkedSink: while a move's outcome is unknown,
// sends wait in order; requests fail at once before relay-ready and wait
// with the sends after the cutover (holdRequests).
type parked struct {
	w            *World
	inc          *Inc
	holdRequests bool
	sends        []*Msg
	forward      func(*Msg)
}

func (p *parked) sink(m *Msg) {
	if p.forward != nil {
		p.forward(m)
		return
	}
	if m.request && !p.holdRequests {
		p.w.failLoud(m, p.inc, "the object is moving and its outcome is being reconciled")
		return
	}
	p.sends = append(p.sends, m)
}

func (p *parked) release(to func(*Msg)) {
	for _, m := range p.sends {
		to(m)
	}
	p.sends, p.forward = nil, to
}

func (p *parked) take() []*Msg {
	out := p.sends
	p.sends = nil
	return out
}

// StartMove starts a move of o from the node serving it to dst, as
// Driver.Relocate does; it reports false when the driver would refuse.
func (w *World) StartMove(o ObjID, dst *Node) bool {
	var src *Node
	for _, n := range w.nodes {
		if inc := n.objects[o]; inc != nil && n.alive {
			src = n
		}
	}
	if src == nil || !src.valid() || dst == src {
		return false
	}
	inc := src.objects[o]
	if inc.state != sServing || inc.out != nil || inc.mode != mOpen {
		return false
	}
	w.nextRelocID++
	id := handoff.Identity{RelocationID: w.nextRelocID, TargetAttemptGeneration: 1,
		Fence: handoff.Fence{NodeRid: src.name, NodeGeneration: src.gen, OwnerGeneration: inc.key.ownerGen}}
	deadline := w.Now() + w.cfg.RestoreTimeout
	inc.offered = max(inc.key.ownerGen, inc.offered) + 1
	r := &SourceRun{w: w, node: src, inc: inc, target: dst, newOwner: inc.offered, deadline: deadline,
		m: handoff.NewSource(id, w.cfg.Handoff, w.wall(deadline)), timers: map[handoff.Timer]uint64{}}
	mv := &Move{id: id.RelocationID, obj: o, from: src, to: dst, started: w.Now(), src: r}
	r.mv = mv
	w.moves = append(w.moves, mv)
	w.stats.Moves++
	src.sources = append(src.sources, r)
	inc.out = r
	w.tracef("%s starts %s (fence og%d, deadline %s)", src.name, mv, inc.key.ownerGen, deadline)
	w.stepSource(r, handoff.Start{SessionBound: w.boundTo(o) >= 0})
	return true
}

// stepSource feeds ev and runs the effects; events the effects produce at
// once are fed after the current effects, in order (Driver.stepSource).
func (w *World) stepSource(r *SourceRun, ev handoff.Event) {
	if r.dead || r.forgotten {
		return
	}
	queue := []handoff.Event{ev}
	for len(queue) > 0 {
		ev, queue = queue[0], queue[1:]
		effects := r.m.Step(ev)
		if w.Tracing() {
			w.tracef("%s src #%d %s → %s %s", r.node.name, r.mv.id, eventString(ev), r.m.Phase(), effectsString(effects))
		}
		for _, e := range effects {
			w.beforeSourceEffect(r, e)
			if r.dead {
				return
			}
			if next := w.sourceEffect(r, e); next != nil {
				queue = append(queue, next)
			}
		}
	}
	if r.m.Finished() {
		w.endSource(r)
	}
	if r.m.Forgettable() {
		r.forgotten = true
		clear(r.timers)
	}
}

// endSource is Driver.endSource: the move is over; only TimerStub may
// still run.
func (w *World) endSource(r *SourceRun) {
	if r.ended {
		return
	}
	r.ended = true
	for tm := range r.timers {
		if tm != handoff.TimerStub {
			delete(r.timers, tm)
		}
	}
	n := r.node
	for i, s := range n.sources {
		if s == r {
			n.sources = append(n.sources[:i:i], n.sources[i+1:]...)
			break
		}
	}
	if r.inc.out == r {
		r.inc.out = nil
	}
	w.tracef("%s src #%d finished (phase %s)", n.name, r.mv.id, r.m.Phase())
}

func (w *World) startSourceTimer(r *SourceRun, st handoff.StartTimer) {
	at := w.Now() + st.After
	if !st.At.IsZero() {
		at = w.logical(st.At)
	}
	w.tok++
	tok := w.tok
	r.timers[st.Timer] = tok
	w.at(at, "timer", func() {
		if r.dead || r.forgotten || r.timers[st.Timer] != tok {
			return
		}
		delete(r.timers, st.Timer)
		w.stepSource(r, handoff.TimerFired{Timer: st.Timer})
	})
}

// payload encodes what a capture carries here: the move, the state (the
// history length) and the saved work, padded so that it spans chunks.
func payload(relocID uint64, version int, saved []*Msg) []byte {
	b := make([]byte, 0, 24+8*len(saved)+40)
	b = binary.BigEndian.AppendUint64(b, relocID)
	b = binary.BigEndian.AppendUint64(b, uint64(version))
	b = binary.BigEndian.AppendUint32(b, uint32(len(saved)))
	for _, m := range saved {
		b = binary.BigEndian.AppendUint64(b, m.id)
	}
	return append(b, make([]byte, 40)...)
}

func msgRecord(m *Msg) []byte { return binary.BigEndian.AppendUint64(nil, m.id) }

var errSim = errors.New("sim")

// sourceEffect runs one source effect the way Driver.sourceEffect does
// (internal/relocation/source_run.go). An effect this model does not know
// panics: a new effect of the machine must be modelled here.
func (w *World) sourceEffect(r *SourceRun, e handoff.Effect) handoff.Event {
	n, inc := r.node, r.inc
	id := r.m.Identity()
	switch e := e.(type) {
	case handoff.QueryCapability:
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

	case handoff.AwaitAdmission:
		return handoff.Admitted{}

	case handoff.SealSessions:
		if w.cfg.Sabotage == SabotageSkipSessionSeal {
			return handoff.SessionsSealed{}
		}
		w.sealSessions(r)

	case handoff.LookUpSessionOwners:
		return w.lookUpSessionOwners(r)

	case handoff.AbortSessions:
		r.sealWait = nil // no seal reply is awaited once the owner is told to release
		w.abortSessions(r)

	case handoff.Seal:
		inc.state = sLeaving
		// The seal takes effect after the turn in progress, on the object's
		// goroutine; the capture comes back to the driver later.
		w.after(w.randDur(50*time.Microsecond, 2*time.Millisecond), "seal", func() {
			if r.dead || r.ended {
				return
			}
			if inc.mode != mOpen {
				w.stepSource(r, handoff.CaptureFailed{Err: fmt.Errorf("%w: seal in mode %s", errSim, incModeNames[inc.mode])})
				return
			}
			r.saved = inc.queue
			inc.queue = nil
			w.setMode(inc, mSealed)
			w.stepSource(r, handoff.Captured{Stream: envelope.Whole(payload(id.RelocationID, inc.version, r.saved))})
		})

	case handoff.SendPrepare:
		n.send(r.target.idx, &packet{kind: pPrepare, id: id, prep: &prepare{obj: inc.key.obj, objGen: 1, manifest: e.Manifest,
			deadline: r.deadline, newOwner: r.newOwner, source: n.idx}})

	case handoff.SendChunks:
		for _, c := range e.Chunks {
			n.send(r.target.idx, &packet{kind: pChunk, id: id, chunk: c})
		}

	case handoff.Unseal:
		var err error
		if p := r.parked; p != nil {
			err = w.reopen(inc, mRedirect, append(r.saved, p.take()...))
			r.parked = nil
		} else {
			err = w.reopen(inc, mSealed, r.saved)
		}
		if err != nil {
			w.tracef("%s DRIVER ERROR unseal_failed: %v", n.name, err)
		}
		r.saved = nil
		w.stats.SourceServesAgain++
		w.nowServing(inc)

	case handoff.SendAbort:
		n.send(r.target.idx, &packet{kind: pAbort, id: id, reason: e.Reason})

	case handoff.RelayThenCutover:
		return w.relayThenCutover(r, e.Epoch)

	case handoff.ResendBoundary:
		for i, m := range r.batch {
			n.send(r.target.idx, &packet{kind: pRelay, id: id, epoch: e.Epoch, index: i, msg: m, record: r.records[i]})
		}
		n.send(r.target.idx, &packet{kind: pCutover, id: id, epoch: e.Epoch, sum: r.sum})

	case handoff.ReleasePayload:
		r.releases++
		if r.releases > 1 {
			w.violateO(r.mv.obj, "released-twice", "%s released its payload %d times", r.mv, r.releases)
		}
		r.saved, r.relayed = nil, nil // the batch's wire copy stays for resends until ReleaseBoundary (source_run.go)

	case handoff.ReleaseBoundary:
		if e.Unacknowledged {
			// boundary_batch_unacknowledged: logged and counted, loudly.
			for _, m := range r.batch {
				if m.handled == 0 && m.failed == 0 {
					w.failLoud(m, inc, "the target never acknowledged the boundary batch")
				}
			}
		}
		r.batch, r.records = nil, nil

	case handoff.StartFollow:
		inc.state = sFollowing
		follow := w.followSink(r)
		if r.held != nil {
			r.held.release(follow)
			r.held = nil
		}
		if err := w.redirect(inc, follow); err != nil {
			w.tracef("%s DRIVER ERROR follow_failed: %v", n.name, err)
		}

	case handoff.ConfirmCommit:
		w.confirmWatch(r, e.After, e.Until)

	case handoff.FenceOut:
		w.fenceOut(r, id, e.Version)

	case handoff.CloseOut:
		inc.inst = false

	case handoff.Reinstate:
		w.reinstate(r)

	case handoff.EndFollow:
		inc.state = sEnded
		if err := w.redirect(inc, w.unavailableSink(inc, "the object moved away and Message Follow has ended")); err != nil {
			w.tracef("%s DRIVER ERROR end_follow_failed: %v", n.name, err)
		}

	case handoff.StopIncarnation:
		w.stopInc(inc)

	case handoff.Reconcile:
		w.reconcileRead(r)

	case handoff.AdoptTargetRoute:
		inc.state = sFollowing
		follow := w.followSink(r)
		if r.parked != nil {
			r.parked.release(follow)
		}
		if err := w.redirect(inc, follow); err != nil {
			w.tracef("%s DRIVER ERROR adopt_route_failed: %v", n.name, err)
		}
		if n.objects[inc.key.obj] == inc {
			delete(n.objects, inc.key.obj)
		}
		inc.inst = false // closeOut

	case handoff.FailHeld:
		if r.parked == nil {
			r.parked = &parked{w: w, inc: inc}
			if err := w.redirect(inc, r.parked.sink); err != nil {
				w.tracef("%s DRIVER ERROR park_failed: %v", n.name, err)
			}
		}

	case handoff.StartTimer:
		w.startSourceTimer(r, e)

	case handoff.StopTimer:
		delete(r.timers, e.Timer)

	case handoff.Log:
		if e.Event == "relocation_fenced_out" {
			w.stats.FencedOut++
			r.mv.fencedOut = true
		}

	case handoff.Complete:
		w.checkClass(r.mv.obj, r.mv.String()+" source", e.Err)
		r.completes++
		if r.completes > 1 {
			w.violateO(r.mv.obj, "completed-twice", "%s source completed %d times", r.mv, r.completes)
		}

	default:
		panic(fmt.Sprintf("sim: the driver model does not run source effect %T; add it to sourceEffect (source.go)", e))
	}
	return nil
}

// relayThenCutover is Driver.relayThenCutover: relay the ingress hold (the
// parked sends first) in order, switch later messages to Message Follow,
// and send the cutover after the last relayed record.
func (w *World) relayThenCutover(r *SourceRun, epoch uint32) handoff.Event {
	n, inc := r.node, r.inc
	id := r.m.Identity()
	r.mv.cutoverSent = true
	relay := func(m *Msg) {
		rec := msgRecord(m)
		r.sum = r.sum.Add(rec)
		index := len(r.batch)
		r.batch = append(r.batch, m)
		r.records = append(r.records, rec)
		r.relayed = append(r.relayed, m)
		r.mv.relayedEver = append(r.mv.relayedEver, m)
		n.send(r.target.idx, &packet{kind: pRelay, id: id, epoch: epoch, index: index, msg: m, record: rec})
	}
	if r.parked != nil {
		r.parked.release(relay)
		r.parked = nil
	}
	if err := w.redirect(inc, relay); err != nil {
		w.tracef("%s DRIVER ERROR relay_failed: %v", n.name, err)
	}
	inc.state = sFollowing
	r.held = &parked{w: w, inc: inc, holdRequests: true}
	if err := w.redirect(inc, r.held.sink); err != nil {
		w.tracef("%s DRIVER ERROR hold_failed: %v", n.name, err)
	}
	if n.objects[inc.key.obj] == inc {
		delete(n.objects, inc.key.obj)
	}
	n.send(r.target.idx, &packet{kind: pCutover, id: id, epoch: epoch, sum: r.sum})
	return handoff.CutoverSent{Sum: r.sum}
}

// followSink forwards a message to the target incarnation (Message Follow);
// the sender's node drops its cached route (Config.OnFollow).
func (w *World) followSink(r *SourceRun) func(*Msg) {
	next := incKey{obj: r.inc.key.obj, ownerGen: r.newOwner}
	return func(m *Msg) {
		if w.Tracing() {
			w.tracef("%s follow m%d → %s", r.node.name, m.id, r.target.name)
		}
		r.node.send(r.target.idx, &packet{kind: pFollow, msg: m, inc: next})
		w.clients[m.client].stale(m.obj)
	}
}

// reinstate is Driver.reinstate: after a fence-out that followed the
// cutover, serve on the source again with the saved work, then the
// boundary batch, ahead of everything posted later.
func (w *World) reinstate(r *SourceRun) {
	n, inc := r.node, r.inc
	if cur := n.objects[inc.key.obj]; cur != nil && cur != inc {
		w.tracef("%s DRIVER ERROR reinstate_conflict: another incarnation %s is registered", n.name, cur)
		return
	}
	backlog := append(append([]*Msg(nil), r.saved...), r.relayed...)
	if r.held != nil {
		backlog = append(backlog, r.held.take()...)
		r.held = nil
	}
	if err := w.reopen(inc, mRedirect, backlog); err != nil {
		w.tracef("%s DRIVER ERROR reinstate_failed: %v", n.name, err)
		return
	}
	r.mv.reinstated = true
	w.stats.Reinstated++
	n.objects[inc.key.obj] = inc
	w.nowServing(inc)
}

// reopen is the mailbox's way back to Open (Unseal from Sealed, Reopen
// from Redirecting): front goes ahead of everything held.
func (w *World) reopen(inc *Inc, from incMode, front []*Msg) error {
	if inc.mode != from {
		return fmt.Errorf("%w: reopen from %s in mode %s", errSim, incModeNames[from], incModeNames[inc.mode])
	}
	for _, m := range front {
		w.place(m, inc.node)
	}
	inc.queue = append(append([]*Msg(nil), front...), inc.queue...)
	inc.sink = nil
	w.setMode(inc, mOpen)
	return nil
}

// redirect is mailbox.Redirect: from Sealed, hand every held message to
// sink in order, then every later one; in Redirecting, swap the sink.
func (w *World) redirect(inc *Inc, sink func(*Msg)) error {
	switch inc.mode {
	case mSealed:
		held := inc.queue
		inc.queue = nil
		for _, m := range held {
			sink(m)
		}
		inc.sink = sink
		w.setMode(inc, mRedirect)
		return nil
	case mRedirect:
		inc.sink = sink
		return nil
	}
	return fmt.Errorf("%w: redirect in mode %s", errSim, incModeNames[inc.mode])
}

// reconcileRead is Driver.reconcileRead (source_run.go): one read with a
// context of a cutover wait, answered as ReconcileRead; the Source machine
// judges it (handoff/record.go).
func (w *World) reconcileRead(r *SourceRun) {
	n := r.node
	w.store.call(n, storeOp{kind: opRead, obj: r.inc.key.obj, why: fmt.Sprintf("reconcile #%d", r.mv.id)}, w.Now()+w.cfg.Handoff.CutoverWaitTimeout,
		func(res storeRes) { w.answerRead(r, res) })
}

// confirmWatch is Driver.confirmWatch: watch the record until its version
// is past after or until passes (after 0: a read).
func (w *World) confirmWatch(r *SourceRun, after uint64, until time.Time) {
	if after == 0 {
		w.reconcileRead(r)
		return
	}
	w.store.call(r.node, storeOp{kind: opWatch, obj: r.inc.key.obj, after: after, why: fmt.Sprintf("confirm #%d", r.mv.id)}, w.logical(until),
		func(res storeRes) { w.answerRead(r, res) })
}

// answerRead is Driver.answerRead: feed the read to the move, keeping the
// record for a FenceOut of that version.
func (w *World) answerRead(r *SourceRun, res storeRes) {
	ev := handoff.ReconcileRead{Target: r.target.name, ObjectGeneration: 1, SourceEnded: r.node.ended}
	if res.err != errNone {
		ev.Err = fmt.Errorf("%w: %s", errSim, res.err)
	} else {
		ev.Record = recordView(res.rec)
		r.lastRead, r.haveRead = res.rec, true
	}
	w.stepSource(r, ev)
}

// fenceOut is Driver.fenceOut: write the move's RelocationId into the
// record read at version, owner unchanged, by CAS; the sabotage answers
// success without writing.
func (w *World) fenceOut(r *SourceRun, id handoff.Identity, version uint64) {
	if !r.haveRead || r.lastRead.Version != version {
		w.after(0, "fence-out", func() {
			w.stepSource(r, handoff.FenceOutAnswered{Err: fmt.Errorf("%w: no record read at version %d", errSim, version)})
		})
		return
	}
	if w.cfg.Sabotage == SabotageSkipFenceOut {
		w.after(time.Millisecond, "sabotage", func() { w.stepSource(r, handoff.FenceOutAnswered{}) })
		return
	}
	next := r.lastRead
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

// recordView is what the machines judge of a record.
func recordView(rec Record) handoff.RecordView {
	return handoff.RecordView{Present: true, Version: rec.Version, OwnerNodeRid: rec.OwnerNode, OwnerNodeGeneration: rec.OwnerNodeGen,
		OwnerGeneration: rec.OwnerGen, ObjectGeneration: rec.ObjectGen, RelocationID: rec.RelocID,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY} // the sim models no Close
}
