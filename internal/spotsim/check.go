package spotsim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The invariants (checked while the schedule runs, and at its end):
//
//   - two-serving (1): at most one incarnation of a Spot ID is open on a
//     lifecycle whose lease is provably valid, at any instant; checked at
//     every open, every lifted fence and every handled message.
//   - duplicate, failed-after-handled, lost, stuck, silent-drop (2): an
//     accepted message is handled exactly once or failed loudly (a typed
//     answer, or logged and counted); a loud failure that says the
//     message did not run is never followed or preceded by its handling.
//     A second run of a cold activation's first message whose owner ended
//     after the handler returned and before the recovery pointer's removal
//     landed, replayed from its root, is the documented repeated first
//     message: marked Known, not failed. Losses with a crashed or ended
//     lifecycle, and accepted sends lost on a cut link (documented), are
//     counted apart.
//   - order (3): one client's messages to one Spot through one lifecycle of
//     its node are handled in its order, except a message whose call
//     ended in a failure first (the caller moved on not knowing), a
//     message passed on for capacity (documented), and a replay.
//   - not-ended, lock-held, slot-held, staged-left, queue-left (4): once
//     faults stop, every machine on a live lifecycle ends, and the Spot
//     ID's lock, the creation slots and every staged incarnation are given
//     back.
//   - creating-left, unserved, pointer-left, probe-failed (5): at the end
//     no record is Creating under a live owner; a Ready record under a live
//     owner has its incarnation serving there, and no recovery pointer
//     once its first message ran; the probe request each Spot gets after
//     every deadline and AbandonGrace passed is handled (or refused as (6)
//     requires).
//   - error-class: every error an activation machine answers or ends
//     with is in exactly one roamerr class (seed 802 found a write whose
//     outcome its deadline left unknown answered as both DeadlineExceeded
//     and Unavailable, which the caller reads as "not run").
//   - reactivated-empty (6): a PreserveStateWith Spot without
//     ReactivateEmpty never opens empty over a previous incarnation's
//     state (other than the first messages it replays), unless the Spot
//     was closed and its record released in between.
//   - checkpoint-fork, checkpoint-revived (7): a Spot of a kind that
//     checkpoints (every other Spot) opens with a state that is a prefix
//     of the history of the incarnation it replaces (never a state of
//     another branch, such as an ended incarnation's late capture landing
//     over a recovery's claim), and empty after its close (no late
//     capture of the closed incarnation brings its state back).
//   - checkpoint-older-restored, checkpoint-holds-replayed (8): an
//     incarnation that claimed its Spot's checkpoint starts from the last
//     one the store had accepted when it claimed, not an older one, nor
//     none (a claim that failed starts nothing); one that replays a first
//     message from a recovery root never starts from a state that already
//     holds that message (no capture while a recovery pointer may be in
//     the store).
//   - checkpoint-stale-write, checkpoint-unleased-write (9): the store
//     never accepts a capture of an incarnation that a later claim of the
//     checkpoint, or its own close, fenced out; a node's checkpoint writer
//     never writes while its lease is not provably in force.
//   - handled-after-seal (10): an incarnation whose close sealed its
//     admission handles only what it had accepted before the seal;
//     whatever reaches it later gets a stale answer.

// handle is one handled message: the application ran it on inc.
func (w *World) handle(inc *Inc, m *Msg) {
	s := m.spot
	if w.Tracing() {
		w.tracef("%s HANDLES m%d (c%d seq %d)", inc, m.id, m.client.id+1, m.seq)
	}
	w.checkServing(s, inc)
	if len(m.handled) > 0 {
		prev := m.handled[len(m.handled)-1]
		if w.repeatedFirst(prev, inc, m) {
			v := w.violate("duplicate", "m%d (first message of %s) handled again by %s after %s handled it; %s ended before the recovery pointer's removal landed", m.id, m.op, inc, prev, prev.life)
			v.Obj, v.Msg, v.Known = s.id, m.id, KnownRepeatedFirst
			w.stats.Replayed++
		} else {
			v := w.violate("duplicate", "m%d (c%d seq %d to %s) handled again by %s after %s", m.id, m.client.id+1, m.seq, s.id, inc, prev)
			v.Obj, v.Msg = s.id, m.id
		}
	}
	if inc.sealed && !slices.Contains(inc.beforeSeal, m) {
		v := w.violate("handled-after-seal", "m%d (c%d seq %d to %s) handled by %s after its close sealed admission behind %s", m.id, m.client.id+1, m.seq, s.id, inc, msgList(inc.beforeSeal))
		v.Obj, v.Msg = s.id, m.id
	}
	for _, f := range m.failures {
		if f.definite {
			v := w.violate("failed-after-handled", "m%d (c%d seq %d to %s) failed loudly as not run (%s: %s) and is now handled by %s", m.id, m.client.id+1, m.seq, s.id, f.code, f.why, inc)
			v.Obj, v.Msg = s.id, m.id
			break
		}
	}
	if len(m.handled) == 0 {
		c := m.client
		last, seen := c.last[m.key]
		switch {
		case !seen || m.seq > last:
			c.last[m.key] = m.seq
			c.lastMsg[m.key] = m
		case m.passedOn:
		case m.dlCount > 0:
			// Redelivered from a dead letter: it reaches the incarnation
			// as a plain send; its order against the sender's later sends
			// is not kept (docs/FAULTS.md, "Sends that dead-letter").
			w.stats.LateAfterMaybe++
		case m.call != nil && m.call.failedFirst, len(m.failures) > 0:
			// Its call, or the system, reported a failure first: the
			// caller moved on not knowing whether it would run.
			w.stats.LateAfterMaybe++
		default:
			v := w.violate("order", "m%d (c%d seq %d to %s through %s) handled by %s after seq %d", m.id, c.id+1, m.seq, s.id, w.lifeByAddr(m.key.life), inc, last)
			v.Obj, v.Msg = s.id, m.id
			if x := c.lastMsg[m.key]; cmd39Overtaken(m, x) {
				v.Known = KnownCmd39Overtaken
				v.Detail += fmt.Sprintf(" (m%d went in a command 39 to %s at %s and had not reached the incarnation when m%d took another route, to %s, at %s)", m.id, m.target, ms(m.sentAt), x.id, x.target, ms(x.sentAt))
			}
		}
	}
	m.handled = append(m.handled, inc)
	m.handledAt = append(m.handledAt, w.Now())
	inc.handled = append(inc.handled, m)
	w.stats.Handled++
}

// repeatedFirst: m is the first message cur replays from its recovery
// root after prev, whose first message it was, handled it and whose
// lifecycle then ended with the pointer still set (a removal that had
// landed would have left nothing to replay).
func (w *World) repeatedFirst(prev, cur *Inc, m *Msg) bool {
	end, ended := w.ownerEnd(prev.life)
	return ended && len(prev.firsts) > 0 && prev.firsts[0] == m && prev.firstOp == m.op &&
		cur.resumedFrom == m.op && len(cur.firsts) > 0 && cur.firsts[0] == m && end >= m.handledAt[len(m.handledAt)-1]
}

// ownerEnd is when l ended as an owner, if it did: its process went, it
// learnt that its lease ended, or the store ended its lease.
func (w *World) ownerEnd(l *Life) (time.Duration, bool) {
	end, ended := time.Duration(0), false
	take := func(t time.Duration) {
		if !ended || t < end {
			end, ended = t, true
		}
	}
	if l.gone {
		take(l.goneAt)
	}
	if l.ended {
		take(l.endedAt)
	}
	if sl := w.store.leases[l.lease]; sl != nil && (sl.gone || w.Now() >= sl.expiresAt) {
		take(sl.expiresAt)
	}
	return end, ended
}

// checkServing checks invariant (1) for s, now that inc may serve.
func (w *World) checkServing(s *Spot, inc *Inc) {
	var serving []*Inc
	for _, l := range w.lives {
		if !l.valid() {
			continue
		}
		for _, x := range l.incs {
			if x.spot == s && x.mode == mOpen {
				serving = append(serving, x)
			}
		}
	}
	if len(serving) > 1 {
		names := make([]string, len(serving))
		for i, x := range serving {
			names[i] = x.String()
		}
		v := w.violate("two-serving", "Spot %s has %d serving incarnations on lifecycles with valid leases: %s (store %s)", s.id, len(serving), strings.Join(names, ", "), recString(w.store.Read(s.key())))
		v.Obj = s.id
	}
}

// incOpened checks invariant (6) when inc opens.
func (w *World) incOpened(inc *Inc) {
	s := inc.spot
	prev := s.live
	if s.kind.Checkpointed {
		w.checkRestored(inc, prev)
	} else if prev != nil && prev != inc && !s.released && s.kind.PreservesState && !s.kind.ReactivateEmpty {
		var lost []*Msg
		for _, m := range prev.handled {
			if !slices.Contains(inc.firsts, m) {
				lost = append(lost, m)
			}
		}
		if len(lost) > 0 {
			v := w.violate("reactivated-empty", "PreserveStateWith Spot %s (no ReactivateEmpty) opens empty as %s over %s's state (it handled %s; %s replays %s)",
				s.id, inc, prev, msgList(prev.handled), inc, msgList(inc.firsts))
			v.Obj = s.id
			if inc.resumedFrom != "" {
				v.Known = KnownResumeStartsEmpty
				v.Detail += " — resumed from the recovery root of " + inc.resumedFrom
			}
		}
	}
	s.live = inc
	s.released = false
}

// checkRestored checks invariant (7) when inc of a Spot that checkpoints
// opens: its restored state is a prefix of the history of prev, the
// incarnation it replaces (nothing of another branch, nothing older than
// a checkpoint prev had already written and had not been superseded), and
// empty after a close. What prev handled past it is lost by design
// (counted).
func (w *World) checkRestored(inc, prev *Inc) {
	s := inc.spot
	restored := inc.restored
	if inc.cpAsked && len(restored) < len(inc.cpExpected) {
		v := w.violate("checkpoint-older-restored", "Spot %s opens as %s with %s, but the last checkpoint the store had accepted when its activation claimed it held %s", s.id, inc, msgList(restored), msgList(inc.cpExpected))
		v.Obj = s.id
	}
	if inc.resumedFrom != "" {
		for _, m := range inc.firsts {
			if slices.Contains(restored, m) {
				v := w.violate("checkpoint-holds-replayed", "Spot %s opens as %s replaying m%d from the recovery root of %s, on a restored state %s that already holds it", s.id, inc, m.id, inc.resumedFrom, msgList(restored))
				v.Obj, v.Msg = s.id, m.id
			}
		}
	}
	if prev == nil || s.released {
		if len(restored) > 0 {
			v := w.violate("checkpoint-revived", "Spot %s opens as %s with %s, but its last incarnation was closed (or it never served)", s.id, inc, msgList(restored))
			v.Obj = s.id
		}
		return
	}
	if prev == inc {
		return
	}
	hist := prev.state()
	if len(restored) > len(hist) || !slices.Equal(restored, hist[:len(restored)]) {
		v := w.violate("checkpoint-fork", "Spot %s opens as %s with %s, not a prefix of %s's history %s", s.id, inc, msgList(restored), prev, msgList(hist))
		v.Obj = s.id
		return
	}
	for _, m := range hist[len(restored):] {
		if !slices.Contains(inc.firsts, m) {
			w.stats.LostAfterCheckpoint++
		}
	}
}

// recordChanged follows the Spot's record: a Closing record deleted (a
// close's release) ends its state legitimately.
func (w *World) recordChanged(s *Spot, before *location.Record, after location.Versioned) {
	if !after.Present() && before.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CLOSING {
		s.released = true
	}
}

// rootDeleted: a recovery root is gone; its first message, if nobody ran
// or failed it, has no copy left but the ones in memory.
func (w *World) rootDeleted(r *root, by *Life, holder *Msg) {
	if m := r.first; m != nil && m != holder && m.open() && m.at == nil {
		w.lostMsg(m, lossRoot, "its recovery root was deleted by "+by.rid)
	}
}

// probes sends one request to every Spot at ProbeAt, from a client on a
// serving node.
func (w *World) probes() {
	for i, s := range w.spots {
		c := w.clients[i%len(w.clients)]
		var try func(n int)
		try = func(n int) {
			l := c.node.cur
			if l == nil || !l.usable() {
				if n < 40 {
					w.after(100*time.Millisecond, func() { try(n + 1) })
				} else {
					v := w.violate("probe-failed", "no serving lifecycle on %s to probe %s from", c.node.name, s.id)
					v.Obj = s.id
				}
				return
			}
			c.call(l, s, true, true, nil)
		}
		w.at(w.cfg.ProbeAt+time.Duration(i)*10*time.Millisecond, func() { try(0) })
	}
}

// probeEnded judges a probe's outcome.
func (w *World) probeEnded(m *Msg, outcome string) {
	if outcome == "reply" {
		w.stats.ProbesOK++
		return
	}
	s := m.spot
	v := w.store.Read(s.key())
	rec := v.Record
	if s.kind.PreservesState && !s.kind.ReactivateEmpty && v.Present() && rec.GetActivationRecovery() == nil &&
		strings.Contains(outcome, roamerr.CodeUnavailable) && !w.ownerLive(rec.GetOwner()) {
		w.stats.ProbesOK++ // refused as docs/PROTOCOL.md §7.10 requires
		return
	}
	w.stats.ProbesFail++
	x := w.violate("probe-failed", "the probe m%d of %s %s (store %s)", m.id, s.id, outcome, recString(v))
	x.Obj, x.Msg = s.id, m.id
}

// ownerLive: the owner's lifecycle runs and holds its lease.
func (w *World) ownerLive(o *messages.Owner) bool {
	l := w.lifeByRid(o.GetNodeRid())
	return l != nil && !l.gone && !l.ended && w.store.leaseLive(l)
}

// checkEnd checks the end state once the schedule has settled.
func (w *World) checkEnd() {
	for _, m := range w.msgs {
		if !m.accepted || !m.open() {
			continue
		}
		if w.pendingReplay(m) {
			v := w.violate("stuck", "m%d (c%d seq %d to %s) waits in its recovery root, never resumed (store %s)", m.id, m.client.id+1, m.seq, m.spot.id, recString(w.store.Read(m.spot.key())))
			v.Obj, v.Msg = m.spot.id, m.id
			continue
		}
		switch m.loss {
		case lossCrash:
			w.stats.LostCrash++
		case lossEnded:
			w.stats.LostEnded++
		case lossTransit:
			if m.cmd39DeadLetter && !m.request {
				v := w.violate("lost", "m%d (c%d seq %d, a send to %s) lost: %s", m.id, m.client.id+1, m.seq, m.spot.id, m.lossWhy)
				v.Obj, v.Msg, v.Known = m.spot.id, m.id, KnownCmd39DeadLetter
				continue
			}
			w.stats.LostTransit++
		case lossNone:
			v := w.violate("stuck", "m%d (c%d seq %d to %s) accepted but never handled nor failed; held at %s", m.id, m.client.id+1, m.seq, m.spot.id, w.where(m))
			v.Obj, v.Msg = m.spot.id, m.id
		default:
			v := w.violate("lost", "m%d (c%d seq %d to %s) lost (%s): %s", m.id, m.client.id+1, m.seq, m.spot.id, lossNames[m.loss], m.lossWhy)
			v.Obj, v.Msg = m.spot.id, m.id
		}
	}
	for _, r := range w.runners {
		if r.life.gone || r.done {
			continue
		}
		v := w.violate("not-ended", "%s still runs %s after faults stopped (%s)", r, w.cfg.End-w.cfg.Horizon, r.phase())
		v.Obj = r.spot.id
	}
	for _, l := range w.lives {
		if l.gone {
			continue
		}
		for _, s := range w.spots {
			if held, waiting := l.locks.Held(s.idx); held {
				v := w.violate("lock-held", "%s still holds the lock of %s (%d waiting)", l, s.id, waiting)
				v.Obj = s.id
			}
			if l.queues.Working(s.idx) {
				v := w.violate("queue-left", "%s still has %d command 39s queued for %s", l, len(l.queues.Queued(s.idx)), s.id)
				v.Obj = s.id
			}
		}
		if l.pending != 0 {
			w.violate("slot-held", "%s still counts %d creations in progress", l, l.pending)
		}
		for _, inc := range l.incs {
			if inc.mode == mStaged {
				v := w.violate("staged-left", "%s is still staged", inc)
				v.Obj = inc.spot.id
			}
		}
	}
	for _, s := range w.spots {
		v := w.store.Read(s.key())
		if !v.Present() {
			continue
		}
		rec := v.Record
		l := w.lifeByRid(rec.GetOwner().GetNodeRid())
		if l == nil || l.gone || l.ended || !w.store.leaseLive(l) {
			continue
		}
		switch rec.GetState() {
		case messages.LifecycleState_LIFECYCLE_STATE_CREATING:
			x := w.violate("creating-left", "%s is Creating under the live owner %s: %s", s.id, l, recString(v))
			x.Obj = s.id
		case messages.LifecycleState_LIFECYCLE_STATE_CLOSING:
			x := w.violate("closing-left", "%s is Closing under the live owner %s: %s", s.id, l, recString(v))
			x.Obj = s.id
		case messages.LifecycleState_LIFECYCLE_STATE_READY:
			if !l.hosts(s, rec.GetObjectGeneration()) {
				x := w.violate("unserved", "%s is Ready under the live owner %s, which serves no incarnation of it: %s", s.id, l, recString(v))
				x.Obj = s.id
				continue
			}
			if rr := rec.GetActivationRecovery(); rr != nil {
				x := w.violate("pointer-left", "%s is Ready under %s with its recovery pointer of %s still set: %s", s.id, l, rr.GetOperationId(), recString(v))
				x.Obj = s.id
				if inc := l.objects[s.idx]; inc != nil && inc.firstOp == rr.GetOperationId() && inc.firstExpired {
					x.Known = KnownExpiredFirstKeepsPointer
					x.Detail += " — its first message was answered DeadlineExceeded at dispatch, not run"
				}
			}
		}
	}
}

// pendingReplay: m's recovery root and the pointer naming it are still in
// the store.
func (w *World) pendingReplay(m *Msg) bool {
	v := w.store.Read(m.spot.key())
	return w.store.roots["activation-"+m.op] != nil && v.Present() && v.Record.GetActivationRecovery().GetOperationId() == m.op
}

// where finds the live places that hold m (for a report).
func (w *World) where(m *Msg) string {
	var at []string
	for _, l := range w.lives {
		if l.gone {
			continue
		}
		for _, inc := range l.incs {
			for _, it := range inc.queue {
				if it.m == m {
					at = append(at, fmt.Sprintf("%s queue (%s)", inc, incModeNames[inc.mode]))
				}
			}
		}
		for _, s := range w.spots {
			for _, c := range l.queues.Queued(s.idx) {
				if c.m == m {
					at = append(at, l.rid+" command 39 queue")
				}
			}
		}
		for i, q := range l.redeliver {
			if slices.Contains(q, m) || slices.Contains(l.inFlight[i], m) || slices.Contains(l.dlHeld[i], m) {
				at = append(at, l.rid+" redelivery")
			}
		}
	}
	if len(at) == 0 {
		if m.at != nil {
			return "nowhere live (last at " + m.at.rid + ")"
		}
		return "nowhere"
	}
	return strings.Join(at, ", ")
}

// phase names a runner's machine phase, for reports.
func (r *Runner) phase() string {
	if r.act != nil {
		return r.act.Phase().String()
	}
	return r.kind
}

// checkClass records an error that is not in exactly one roamerr class
// (roamerr's package documentation): a caller that switches on the class
// would take either branch.
func (w *World) checkClass(where string, err error) {
	if err == nil {
		return
	}
	if in := roamerrtest.ClassesOf(err); len(in) != 1 {
		w.violate("error-class", "%s: %q is in %d roamerr classes %v", where, err, len(in), in)
	}
}

// lastCheckpointState is the state of the last checkpoint the store
// accepted for s (nil: none, or a tombstone).
func (w *World) lastCheckpointState(s *Spot) []*Msg {
	if cp := w.cps[s.idx]; cp != nil && !cp.noState {
		return cp.state
	}
	return nil
}

// claimed notes a claim of s's checkpoint: every incarnation staged
// before it is fenced out.
func (w *World) claimed(s *Spot) { s.cpClaims++ }

// closedCheckpoints notes inc's close: its captures are fenced out.
func (w *World) closedCheckpoints(inc *Inc) { inc.cpClosed = true }

// checkWriterFence checks invariant (9) as the store accepts a write of
// by: no claim since by was staged, and by not closed (its own tombstone
// aside).
func (w *World) checkWriterFence(s *Spot, by *Inc, fence checkpoint.Fence, state []*Msg) {
	var why string
	switch {
	case s.cpClaims > by.cpClaimNo:
		why = fmt.Sprintf("%d later claim(s) of the checkpoint fenced it out", s.cpClaims-by.cpClaimNo)
	case by.cpClosed:
		why = "its close fenced it out"
	default:
		return
	}
	v := w.violate("checkpoint-stale-write", "the store accepted a checkpoint of %s at %s holding %s over %s, but %s", by, fence, msgList(state), cpString(w.cps[s.idx]), why)
	v.Obj = s.id
}

// checkWriterLease checks invariant (9) as l's checkpoint writer sends a
// capture of inc: its lease must be provably in force, whatever a
// sabotage lets the lifecycle believe.
func (w *World) checkWriterLease(l *Life, inc *Inc, fence checkpoint.Fence) {
	if !l.gone && l.claimed && !l.ended && w.Now() < l.validUntil() {
		return
	}
	v := w.violate("checkpoint-unleased-write", "%s writes a checkpoint of %s at %s with its lease not provably in force (fenced at %s)", l, inc, fence, ms(l.validUntil()))
	v.Obj = inc.spot.id
}

func cpString(cp *simCheckpoint) string {
	switch {
	case cp == nil:
		return "none"
	case cp.noState:
		return fmt.Sprintf("%s (no state)", cp.fence)
	}
	return fmt.Sprintf("%s %s", cp.fence, msgList(cp.state))
}
