package sim

import (
	"fmt"
	"strings"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/roamerrtest"
)

// The invariants (checked while the schedule runs, and at its end):
//
//   - two-serving: at most one incarnation of an object dispatches (mailbox
//     Open on a live node whose lifecycle has not ended) at any instant;
//     checked at every change of a mailbox to or from Open.
//   - fork: an incarnation dispatches only from the head of its object's
//     history (no state handled elsewhere is missing from it).
//   - duplicate / failed-after-handled: no message is handled twice, or
//     both failed loudly and handled.
//   - order: one sender's messages on one connection to one incarnation
//     are handled in sending order, except across a move that went on
//     without its cutover (docs/PROTOCOL.md §5.10: order not guaranteed then).
//   - silent-drop / lost / stuck: every accepted message is handled once
//     or failed loudly; it may be lost only with a node that went down
//     (counted apart, never as a pass) or, forwarded by Message Follow, on a
//     cut link (a known limit, counted apart).
//   - released-twice / completed-twice: the payload is released at most
//     once, each side completes once.
//   - error-class: a move's error (each side's Complete) is in exactly
//     one roamerr class.
//   - move-not-ended: within Settle after the horizon (faults over, store
//     answering) both machines of every move on a live node are Finished,
//     and its timers with them.
//   - unserved: at the end every object whose store owner is a live node
//     has exactly one serving incarnation there, at the owner generation
//     the store names, with its application instance.
//   - unit-split / member-count: at the end every SpotWide member's
//     record names its Spot's owner (node and lifecycle) and the Spot,
//     and the Spot's record counts its members: a unit moves whole
//     (docs/PROTOCOL.md §5.15).
//   - slots: at the end every live node's capacity slots in the store are
//     the objects whose records name it, each in its record's slot, none
//     pending (Config.Capacity; docs/PROTOCOL.md §7.12).
//   - budget-stall / budget: no chunk queues and no move waits for
//     admission while its node's in-flight payload budget has room for
//     it (checked at every change); at the end every live node's budget
//     is idle (Config.Budget; docs/PROTOCOL.md §5.3).
//   - With Config.Sessions (gateway.go): session-held — nothing is left
//     held at a Session owner (every client message it took is delivered
//     or refused); session-sealed — no binding of an open Session stays
//     sealed; session-route — each binding of an open Session routes to
//     the owner the store names, when that owner is live.

// handle dispatches m on inc: the application handles it (the turn).
func (w *World) handle(inc *Inc, m *Msg) {
	o := w.objs[m.obj]
	if w.Tracing() {
		w.tracef("%s HANDLES m%d (c%d seq %d) at version %d", inc, m.id, m.client+1, m.seq, inc.version)
	}
	if !inc.inst {
		w.violateO(m.obj, "silent-drop", "m%d dispatched by %s, whose application instance was dropped: the host drops it silently", m.id, inc)
		w.lostMsg(m, lossDropped, "dispatched without an application instance")
		return
	}
	if m.handled > 0 {
		w.violateO(m.obj, "duplicate", "m%d handled again by %s", m.id, inc)
	}
	if m.failed > 0 {
		w.violateO(m.obj, "failed-after-handled", "m%d was failed loudly and is now handled by %s", m.id, inc)
	}
	if inc.version != o.head {
		w.violateO(m.obj, "fork", "%s handles m%d from state version %d, but object o%d's history is at %d", inc, m.id, inc.version, m.obj, o.head)
	}
	if !m.exempt {
		c := w.clients[m.client]
		if last, ok := c.last[m.first]; ok && m.seq < last {
			w.violateO(m.obj, "order", "m%d (c%d seq %d, sent to %s o%d.%d) handled by %s after seq %d", m.id, m.client+1, m.seq,
				w.nodes[m.first.node].name, m.first.inc.obj, m.first.inc.ownerGen, inc, last).Msg = int(m.id)
		}
		c.last[m.first] = max(c.last[m.first], m.seq)
	}
	m.handled++
	w.stats.Handled++
	inc.version++
	o.head = inc.version
}

// serving counts the incarnations of o that dispatch or will as soon as a
// fence lifts.
func (w *World) serving(o ObjID) []*Inc {
	var out []*Inc
	for _, n := range w.nodes {
		if !n.alive || n.ended {
			continue
		}
		for _, inc := range n.incList {
			if inc.key.obj == o && inc.mode == mOpen {
				out = append(out, inc)
			}
		}
	}
	return out
}

func (w *World) checkServing(o ObjID) {
	if s := w.serving(o); len(s) > 1 {
		names := make([]string, len(s))
		for i, inc := range s {
			names[i] = inc.String()
		}
		w.violateO(o, "two-serving", "object o%d has %d serving incarnations: %s (store %s)", o, len(s), strings.Join(names, ", "), w.store.recs[o])
	}
}

func (w *World) spawnObject(o ObjID, n *Node) {
	w.objs = append(w.objs, &Object{id: o, spot: -1})
	w.store.version++
	w.store.recs = append(w.store.recs, Record{Version: w.store.version, OwnerNode: n.name, OwnerNodeGen: n.gen, OwnerGen: 1, ObjectGen: 1})
	w.spawnSlot(o, n)
	inc := n.newInc(incKey{obj: o, ownerGen: 1}, mOpen, sServing)
	inc.inst = true
	n.objects[o] = inc
}

// checkEnd checks the end state once the schedule has settled.
func (w *World) checkEnd() {
	for _, m := range w.msgs {
		if !m.accepted || m.handled > 0 || m.failed > 0 {
			continue
		}
		switch m.loss {
		case lossCrash:
			w.stats.LostCrash++
		case lossEnded:
			w.stats.LostEnded++
		case lossFollow:
			w.stats.LostInTransitFollow++
		case lossNone:
			w.violateO(m.obj, "stuck", "m%d (c%d seq %d to o%d) accepted but never handled nor failed; held at %s", m.id, m.client+1, m.seq, m.obj, w.where(m))
		default:
			w.violateO(m.obj, "lost", "m%d (c%d seq %d to o%d) lost (%s): %s", m.id, m.client+1, m.seq, m.obj, lossNames[m.loss], m.lossWhy).Msg = int(m.id)
		}
	}
	for _, mv := range w.moves {
		if r := mv.src; !r.dead && r.node.alive && !r.run.Ended() {
			w.violateO(mv.obj, "move-not-ended", "%s: the source is still in %s (finished %v) %s after the horizon", mv, r.m.Phase(), r.m.Finished(), w.cfg.Settle)
		}
		if t := mv.tgt; t != nil && !t.dead && t.node.alive && !t.m.Finished() {
			w.violateO(mv.obj, "move-not-ended", "%s: the target is still in %s %s after the horizon", mv, t.m.Phase(), w.cfg.Settle)
		}
	}
	w.checkUnits()
	w.checkSlots()
	w.checkBudget()
	for _, o := range w.objs {
		rec := w.store.recs[o.id]
		owner := w.node(rec.OwnerNode)
		if !owner.alive || owner.ended {
			continue // an ended owner's object (recovery by reactivation is not modelled)
		}
		inc := owner.objects[o.id]
		switch {
		case inc == nil:
			w.violateO(o.id, "unserved", "o%d: the store names %s (live) %s, which has no incarnation of it registered", o.id, owner.name, rec)
		case inc.mode != mOpen || inc.state != sServing || !inc.inst:
			w.violateO(o.id, "unserved", "o%d: the store names %s %s, whose incarnation %s is %s (state %d, instance %v)", o.id, owner.name, rec, inc, incModeNames[inc.mode], inc.state, inc.inst)
		case inc.key.ownerGen != rec.OwnerGen:
			w.violateO(o.id, "unserved", "o%d: the store names %s at owner generation %d, its serving incarnation is %s", o.id, owner.name, rec.OwnerGen, inc)
		case len(inc.queue) > 0 && owner.valid():
			w.violateO(o.id, "stuck", "o%d: %s still holds %d messages", o.id, inc, len(inc.queue))
		}
	}
}

// where finds the live places that hold m (for a report).
func (w *World) where(m *Msg) string {
	var at []string
	for _, n := range w.nodes {
		for _, inc := range n.incList {
			for _, x := range inc.queue {
				if x == m {
					at = append(at, fmt.Sprintf("%s queue (%s)", inc, incModeNames[inc.mode]))
				}
			}
		}
		for _, r := range n.sources {
			if pk := r.part(max(0, r.partOf(m.obj))).Parked; pk != nil {
				for _, x := range pk.Waiting() {
					if x == m {
						at = append(at, fmt.Sprintf("%s parked by move #%d", n.name, r.mv.id))
					}
				}
			}
		}
	}
	if len(at) == 0 {
		if m.at != nil {
			return "nowhere live (last at " + m.at.name + ")"
		}
		return "nowhere"
	}
	return strings.Join(at, ", ")
}

// ---- trace formatting ----

func eventString(ev handoff.Event) string {
	switch ev := ev.(type) {
	case handoff.Captured:
		return fmt.Sprintf("Captured(%dB)", ev.Stream.Len())
	case handoff.ChunkReceived:
		return fmt.Sprintf("Chunk(%d)", ev.Chunk.Index)
	case handoff.RelayRecordReceived:
		return fmt.Sprintf("RelayRecord(e%d m%d)", ev.Epoch, ev.Item.(*Msg).id)
	case handoff.CutoverReceivedEvent:
		return fmt.Sprintf("Cutover(e%d n%d)", ev.Epoch, ev.Sum.Count)
	case handoff.CutoverSent:
		return fmt.Sprintf("CutoverSent(n%d)", ev.Sum.Count)
	case handoff.TimerFired:
		return "Timer(" + ev.Timer.String() + ")"
	case handoff.ReconcileAnswered:
		return fmt.Sprintf("ReconcileAnswered%+v", ev)
	case handoff.StoreRetryable:
		return fmt.Sprintf("StoreRetryable(unknown=%v: %v)", ev.Unknown, ev.Err)
	case handoff.StoreStale:
		return fmt.Sprintf("StoreStale(%v)", ev.Err)
	case handoff.CapabilityAnswered:
		return fmt.Sprintf("CapabilityAnswered(%v)", ev.Supported)
	case handoff.FailedReceived:
		return fmt.Sprintf("FailedReceived(%s)", ev.Reason)
	case handoff.PrepareReceived:
		return "PrepareReceived"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", ev), "handoff.")
}

func effectsString(effects []handoff.Effect) string {
	parts := make([]string, 0, len(effects))
	for _, e := range effects {
		switch e := e.(type) {
		case handoff.StartTimer:
			parts = append(parts, "StartTimer("+e.Timer.String()+")")
		case handoff.StopTimer:
			parts = append(parts, "StopTimer("+e.Timer.String()+")")
		case handoff.Log:
			parts = append(parts, "Log("+e.Event+")")
		case handoff.Complete:
			if e.Err != nil {
				parts = append(parts, "Complete(err)")
			} else {
				parts = append(parts, "Complete(ok)")
			}
		case handoff.CommitOwner:
			parts = append(parts, fmt.Sprintf("CommitOwner(%d settle=%v)", e.Attempt, e.SettleOnly))
		case handoff.SendChunks:
			parts = append(parts, fmt.Sprintf("SendChunks(%d)", len(e.Chunks)))
		default:
			parts = append(parts, strings.TrimPrefix(fmt.Sprintf("%T", e), "handoff."))
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// checkClass records a machine's error that is not in exactly one roamerr
// class (roamerr's package documentation): a caller that switches on the
// class would take either branch.
func (w *World) checkClass(o ObjID, where string, err error) {
	if err == nil {
		return
	}
	if in := roamerrtest.ClassesOf(err); len(in) != 1 {
		w.violateO(o, "error-class", "%s: %q is in %d roamerr classes %v", where, err, len(in), in)
	}
}
