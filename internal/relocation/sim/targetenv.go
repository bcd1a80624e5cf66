package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/roamactors/roam/internal/relocation/capslots"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/targetrun"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// targetEnv is this world's primitives for a move's target interpreter
// (targetrun.Env): the staged incarnation's mailbox modes, the network's
// packets, the simulated store and the scheduler's timers. The
// interpreter's choreography is the driver's own; the checks at effects
// (completed-twice, fallback accounting, what a removed target drops)
// live here, where the primitives see them. A SpotWide Spot's move has
// its members as participants 1..; the sim models neither Joins nor
// capacity slots.
type targetEnv struct{ t *TargetRun }

var _ targetrun.Env[*Msg] = targetEnv{}

func (e targetEnv) Gone() bool { return e.t.dead }

func (e targetEnv) Stepped(ev handoff.Event, effects []handoff.Effect) {
	t := e.t
	if t.w.Tracing() {
		t.w.tracef("%s tgt #%d %s → %s %s", t.node.name, t.mv.id, eventString(ev), t.m.Phase(), effectsString(effects))
	}
}

func (e targetEnv) Before(eff handoff.Effect) { e.t.w.beforeTargetEffect(e.t, eff) }

func (e targetEnv) Install(i int) error {
	t, n, w := e.t, e.t.node, e.t.w
	key := incKey{obj: t.objs[i], ownerGen: t.owners[i]}
	if cur := n.incs[key]; cur != nil && !cur.stopped {
		return fmt.Errorf("%w: install temporary queue: %s exists", errSim, cur)
	}
	inc := n.newInc(key, mStaging, sStaging)
	inc.target = t
	inc.closed = w.unavailableSink(inc, "the relocation target was removed before it opened")
	t.incs[i] = inc
	if i == 0 {
		t.inc = inc
	}
	return nil
}

// VerifyPeer: membership is not modelled; a move's source is a member.
func (e targetEnv) VerifyPeer(answer func(error)) { answer(nil) }

func (e targetEnv) ReadSource(answer func(location.Versioned, error)) {
	t := e.t
	t.w.store.call(t.node, storeOp{kind: opRead, obj: t.obj, why: fmt.Sprintf("verify source #%d", t.m.Identity().RelocationID)}, t.deadline, func(res storeRes) {
		if t.dead {
			return
		}
		if res.err != errNone {
			answer(location.Versioned{}, readError(res.err))
			return
		}
		answer(versionedOf(t.w.keyOf(t.obj), res.rec), nil)
	})
}

// ObjectGeneration: the sim's objects are never recreated.
func (e targetEnv) ObjectGeneration() uint64 { return 1 }

// VerifyMembers reads the SpotWide members' records at once and judges
// them with the commit's VerifyMembers, as the driver's verifyMembers
// does (no capacity slots: unbounded).
func (e targetEnv) VerifyMembers(v location.Versioned, answer func(error)) {
	t := e.t
	if len(t.members) == 0 {
		answer(nil)
		return
	}
	c := e.CommitPlan(false)
	simStore{t: t, ctx: t.deadline, why: "verify members"}.ReadAll(c.MemberKeys(), func(vs []location.Versioned, err error) {
		if t.dead {
			return
		}
		if err != nil {
			answer(err)
			return
		}
		answer(c.VerifyMembers(v.Record, vs, false))
	})
}

// TakeSlots takes a slot of this node for every participant before
// relay-ready, as the driver's takeArrivalSlots does; ArrivalSlots keeps
// the account, and what a take that came too late may hold is freed.
func (e targetEnv) TakeSlots(answer func(error)) {
	t, n := e.t, e.t.node
	if !n.bounded() || !t.slots.Wanted() {
		answer(nil)
		return
	}
	holders := make([]location.AuthorityKey, len(t.objs))
	for i, o := range t.objs {
		holders[i] = t.w.keyOf(o)
	}
	n.takeSlots(holders, t.deadline, t.slots.Taking, func(slots []uint32, err error) {
		if errors.Is(err, location.ErrIndeterminate) {
			t.slotsSettle = t.w.Now() + capslots.SettleFor
		}
		free, err := t.slots.Taken(slots, err)
		n.freeSlots(t, free)
		if !t.dead {
			answer(err)
		}
	})
}

func (e targetEnv) KeepVerified(v location.Versioned) { e.t.verified = &v }

func (e targetEnv) After(d time.Duration, fn func(expired bool)) {
	t, w := e.t, e.t.w
	pause, expired := handoff.VerifyPause(w.wall(w.Now()), w.wall(t.deadline), d)
	w.after(pause, "verify retry", func() {
		if !t.dead {
			fn(expired)
		}
	})
}

func (e targetEnv) SendCredit(received uint64) {
	t := e.t
	t.node.send(t.source.idx, &packet{kind: pCredit, id: t.m.Identity(), bytes: received})
}

func (e targetEnv) SendFailed(f handoff.SendFailed) {
	t := e.t
	t.node.send(t.source.idx, &packet{kind: pFailed, id: t.m.Identity(), reason: f.Reason, detail: f.Detail})
}

func (e targetEnv) SendRelayReady() {
	t := e.t
	t.mv.relayReadySent = true
	t.node.send(t.source.idx, &packet{kind: pRelayReady, id: t.m.Identity()})
}

func (e targetEnv) AckBoundary() {
	t := e.t
	t.node.send(t.source.idx, &packet{kind: pBoundaryAck, id: t.m.Identity()})
}

// SendOwnerCommitted: the sim's sources watch the store.
func (e targetEnv) SendOwnerCommitted() {}

func (e targetEnv) UpdateSessionRoutes() { e.t.w.updateSessionRoutes(e.t) }

// Decode reads the sim's payload: the move's RelocationId, the state's
// version, and the saved work's message ids, in order.
func (e targetEnv) Decode(b []byte) ([]targetrun.Work[*Msg], error) {
	t, w := e.t, e.t.w
	if len(b) < 20 || binary.BigEndian.Uint64(b) != t.m.Identity().RelocationID {
		return nil, fmt.Errorf("%w: payload describes another move", errSim)
	}
	var work []targetrun.Work[*Msg]
	at := 8
	for p := range t.objs {
		if len(b) < at+12 {
			return nil, fmt.Errorf("%w: payload carries %d of %d participants", errSim, p, len(t.objs))
		}
		t.versions[p] = int(binary.BigEndian.Uint64(b[at:]))
		k := int(binary.BigEndian.Uint32(b[at+8:]))
		at += 12
		t.saved[p] = nil
		for i := 0; i < k; i++ {
			m := w.msgs[binary.BigEndian.Uint64(b[at:])-1]
			at += 8
			w.place(m, t.node)
			t.saved[p] = append(t.saved[p], m)
			work = append(work, targetrun.Work[*Msg]{Participant: uint32(p + 1), Order: uint64(i + 1), Msg: m, What: "saved work"})
		}
	}
	t.version = t.versions[0]
	return work, nil
}

// Restore: the state is restored on the object's goroutine; the answer
// comes back to the driver later.
func (e targetEnv) Restore(i int) error {
	t, w := e.t, e.t.w
	if t.incs[i].mode == mClosed {
		return fmt.Errorf("%w: restore: mailbox closed", errSim)
	}
	w.after(w.randDur(50*time.Microsecond, 2*time.Millisecond), "restored", func() { t.run.Restored(i, nil) })
	return nil
}

// PartOf: a relayed record names its participant by the object its
// message is for.
func (e targetEnv) PartOf(item any) (int, *Msg) {
	m := item.(*Msg)
	return max(0, slices.Index(e.t.objs, m.obj)), m
}

func (e targetEnv) JoinCallback(handoff.Committed) (*Msg, bool) { return nil, false }
func (e targetEnv) IsJoinCallback(*Msg) bool                    { return false }

// OpenMembers opens each member's staged incarnation with its backlog
// and registers it serving, before the Spot opens (no RelocationReady
// callback is modelled).
func (e targetEnv) OpenMembers(backlogs [][]*Msg) {
	for j, backlog := range backlogs {
		i := j + 1
		if err := e.openPart(i, backlog, len(backlog)-len(e.t.saved[i])); err != nil {
			e.Problem(i, "open_failed", err, "opening dispatch failed")
			continue
		}
		e.t.node.objects[e.t.objs[i]] = e.t.incs[i]
		e.t.w.nowServing(e.t.incs[i])
	}
}

// Open switches the staged incarnation to dispatch. A fallback's relayed
// messages, and what waits behind them, are exempt from the order checks
// (they may be handled after later messages that took Message Follow).
func (e targetEnv) Open(backlog []*Msg, relayed int, _ handoff.Committed) error {
	if e.t.m.FellBack() {
		e.t.w.stats.Fallbacks++
	}
	return e.openPart(0, backlog, relayed)
}

// openPart opens participant i's staged incarnation, backlog first.
func (e targetEnv) openPart(i int, backlog []*Msg, relayed int) error {
	t, w := e.t, e.t.w
	inc := t.incs[i]
	if t.m.FellBack() {
		inc.fellBack = true
		for _, m := range backlog[len(backlog)-relayed:] {
			m.exempt = true
		}
		for _, m := range inc.queue {
			m.exempt = true
		}
	}
	if inc.mode != mStaging {
		return fmt.Errorf("mode %s", incModeNames[inc.mode])
	}
	inc.inst, inc.version = true, t.versions[i]
	return w.reopen(inc, mStaging, backlog)
}

func (e targetEnv) Serving() {
	t, w := e.t, e.t.w
	t.node.objects[t.obj] = t.inc
	t.mv.opened = true
	w.stats.Committed++
	w.nowServing(t.inc)
}

func (e targetEnv) ReleaseJoin() {
	if t := e.t; t.joinHold != nil {
		t.joinHold.joining--
		t.joinHold = nil
	}
}

func (e targetEnv) Deliver(i int, m *Msg) {
	t, w := e.t, e.t.w
	m.exempt = true
	if t.incs[i].stopped {
		w.lostMsg(m, lossDeadLetter, "late relay record to a stopped incarnation")
		return
	}
	w.post(t.incs[i], m)
}

// Remove closes the staged incarnation. The machine drops its relay
// buffer and the restored saved work silently: the source's payload and
// batch are the copies left, if it still holds them.
func (e targetEnv) Remove(i int, saved []*Msg) {
	t, w, n := e.t, e.t.w, e.t.node
	t.mv.targetRemoved = true
	var relayed []*Msg
	for _, m := range t.relayed {
		if m.obj == t.objs[i] {
			relayed = append(relayed, m)
		}
	}
	for _, m := range append(append([]*Msg(nil), saved...), relayed...) {
		if m.at != n || m.handled > 0 || m.failed > 0 {
			continue
		}
		r := t.mv.src
		switch {
		case r != nil && !r.dead && (containsMsg(r.part(i).Relayed, m) || containsMsg(r.part(i).Saved, m)):
			m.at = r.node
		case r != nil && r.dead:
			w.lostMsg(m, r.node.downKind, "its source went down with its copy; the removed target discarded its own")
		case r != nil && r.node.ended:
			// The source's lease ended with the move undecided: it gave its
			// copy up with the lifecycle (relocation_undecided_at_lease_end),
			// whose objects' state and queues are lost (docs/FAULTS.md).
			w.lostMsg(m, lossEnded, "its source's lifecycle ended with the move undecided; the removed target discarded its own")
		default:
			w.lostMsg(m, lossTransit, "discarded by the removed target")
		}
	}
	if inc := t.incs[i]; inc != nil {
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
}

func (e targetEnv) StopIncarnation(i int) {
	if inc := e.t.incs[i]; inc != nil {
		e.t.w.stopInc(inc)
	}
}

// CommitPlan is the move's owner commit as the sim composes it, as the
// driver's commitPlan does: the object (an Actor, or a SpotWide User
// Spot with its members, fenced at the source's node), at object
// generation 1, with no Session binding; the Join and the slots the
// move carries.
func (e targetEnv) CommitPlan(settleOnly bool) *handoff.Commit {
	t, n := e.t, e.t.node
	id := t.m.Identity()
	c := &handoff.Commit{
		ID: id, Key: t.w.keyOf(t.obj), Owner: &messages.Owner{NodeRid: n.name, NodeGeneration: n.gen},
		NewOwnerGeneration: t.newOwner, ObjectGeneration: 1, SettleOnly: settleOnly, RestoreDeadline: t.w.wall(t.deadline),
		Session: &messages.SessionBinding{}, IsEntrySpot: func(string) bool { return false },
		SourceNodeRid: id.Fence.NodeRid, SourceNodeGeneration: id.Fence.NodeGeneration,
		Slots: t.slots.Slots, Node: n.nodeKey(), Lease: n.leaseID(), Join: t.join,
	}
	for _, m := range t.members {
		c.Members = append(c.Members, handoff.CommitMember{Key: t.w.keyOf(m.obj), OwnerGeneration: m.ownerGen, NewOwnerGeneration: m.newOwner,
			ObjectGeneration: 1, Session: &messages.SessionBinding{}})
	}
	return c
}

func (e targetEnv) TakeVerified() (location.Versioned, bool) {
	v := e.t.verified
	if v == nil {
		return location.Versioned{}, false
	}
	e.t.verified = nil
	return *v, true
}

// Commit runs the attempt against the simulated store, its calls ending
// at the restore deadline (settling: a restore timeout from now).
// SabotageOpenWithoutCommit is a faulty store that answers the owner
// change committed without writing it.
func (e targetEnv) Commit(c *handoff.Commit, attempt func(targetrun.Store, func(handoff.Event, handoff.Committed))) {
	t, w := e.t, e.t.w
	done := func(ev handoff.Event, got handoff.Committed) { t.run.Answered(ev, got) }
	if w.cfg.Sabotage == SabotageOpenWithoutCommit && !c.SettleOnly {
		w.after(time.Millisecond, "sabotage", func() { done(handoff.StoreCommitted{}, handoff.Committed{}) })
		return
	}
	why := "commit"
	ctx := t.deadline
	if c.SettleOnly {
		why, ctx = "settle fence-out", w.Now()+w.cfg.RestoreTimeout
	}
	attempt(simStore{t: t, ctx: ctx, why: why}, done)
}

func (e targetEnv) JoinRefused(*handoff.Commit) {
	e.t.w.stats.JoinsRefused++
	e.t.w.tracef("%s tgt #%d: the User Spot no longer takes the joining Actor; the move commits without the Join", e.t.node.name, e.t.m.Identity().RelocationID)
}

func (e targetEnv) StartTimer(st handoff.StartTimer) {
	t, w := e.t, e.t.w
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

func (e targetEnv) StopTimer(tm handoff.Timer) { delete(e.t.timers, tm) }
func (e targetEnv) StopTimers()                { clear(e.t.timers) }
func (e targetEnv) Log(handoff.Log)            {}

func (e targetEnv) Problem(_ int, event string, err error, _ string) {
	e.t.w.tracef("%s DRIVER ERROR %s: %v", e.t.node.name, event, err)
}

func (e targetEnv) Complete(err error) {
	t := e.t
	t.node.freeSlots(t, t.slots.Complete(err == nil))
	t.w.checkClass(t.mv.obj, t.mv.String()+" target", err)
	t.completes++
	if t.completes > 1 {
		t.w.violateO(t.mv.obj, "completed-twice", "%s target completed %d times", t.mv, t.completes)
	}
	if err == nil {
		t.mv.committed = true
	}
}

func (e targetEnv) Forgotten() {
	t, n := e.t, e.t.node
	for i, x := range n.targets {
		if x == t {
			n.targets = append(n.targets[:i:i], n.targets[i+1:]...)
			break
		}
	}
}

// simStore is a commit attempt's view of the simulated store: one record
// per object, answers scheduled, errors classed as the driver's store
// classes them (location's errors).
type simStore struct {
	t   *TargetRun
	ctx time.Duration
	why string
}

func (s simStore) Read(key location.AuthorityKey, answer func(location.Versioned, error)) {
	t := s.t
	t.w.store.call(t.node, storeOp{kind: opRead, obj: t.w.objOfKey(key), why: fmt.Sprintf("commit #%d", t.m.Identity().RelocationID)}, s.ctx, func(res storeRes) {
		if res.err != errNone {
			answer(location.Versioned{}, fmt.Errorf("%w: read: %s", errSim, res.err))
			return
		}
		answer(versionedOf(key, res.rec), nil)
	})
}

// ReadAll reads the records of keys in one store call (as a store
// client that batches sends them together).
func (s simStore) ReadAll(keys []location.AuthorityKey, answer func([]location.Versioned, error)) {
	t, w := s.t, s.t.w
	objs := make([]ObjID, len(keys))
	for i, k := range keys {
		objs[i] = w.objOfKey(k)
	}
	w.store.call(t.node, storeOp{kind: opReadAll, obj: t.obj, objs: objs, why: fmt.Sprintf("%s #%d", s.why, t.m.Identity().RelocationID)}, s.ctx, func(res storeRes) {
		if res.err != errNone {
			answer(nil, readError(res.err))
			return
		}
		vs := make([]location.Versioned, len(keys))
		for i, k := range keys {
			vs[i] = versionedOf(k, res.recs[i])
		}
		answer(vs, nil)
	})
}

func (s simStore) CAS(op location.Op, answer func(error)) {
	t := s.t
	next := recordOf(op.Record, uint64(op.Version))
	t.w.store.call(t.node, storeOp{kind: opCAS, obj: t.w.objOfKey(op.Key), expected: uint64(op.Version), next: next, why: fmt.Sprintf("%s #%d", s.why, t.m.Identity().RelocationID)}, s.ctx, func(res storeRes) {
		answer(writeError(op.Key, res))
	})
}

// Apply writes ops (record updates and capacity slot ops) in one
// transaction.
func (s simStore) Apply(ops []location.Op, answer func(error)) {
	t, w := s.t, s.t.w
	var writes []write
	var keys []location.AuthorityKey
	for _, op := range ops {
		switch {
		case op.Kind == location.OpUpdate:
			if w.cfg.Sabotage == SabotageSplitUnit && w.objOfKey(op.Key) != t.obj {
				continue
			}
			writes = append(writes, write{obj: w.objOfKey(op.Key), expected: uint64(op.Version), next: recordOf(op.Record, uint64(op.Version))})
			keys = append(keys, op.Key)
		case op.Kind.IsSlotOp():
			writes = append(writes, write{slot: &op})
			keys = append(keys, location.AuthorityKey{})
		default:
			panic(fmt.Sprintf("sim: a commit's transaction with a %v op", op.Kind))
		}
	}
	w.store.call(t.node, storeOp{kind: opApply, obj: t.obj, writes: writes, why: fmt.Sprintf("%s #%d", s.why, t.m.Identity().RelocationID)}, s.ctx, func(res storeRes) {
		answer(applyError(keys, res))
	})
}

// readError is a simulated read's failure as the Location Store classes
// it (location's errors).
func readError(e storeErr) error {
	var class error
	switch e {
	case errUnavailable:
		class = location.ErrUnavailable
	case errIndeterminate:
		class = location.ErrIndeterminate
	case errDeadline:
		class = context.DeadlineExceeded
	}
	return simWriteError{text: "read: " + e.String(), class: class}
}

// writeError is a simulated CAS answer as the Location Store classes it
// (location's errors), worded as the sim's trace words it.
func writeError(key location.AuthorityKey, res storeRes) error {
	var class error
	text := res.err.String()
	switch res.err {
	case errNone:
		return nil
	case errConflict:
		class = &location.ConflictError{Op: "cas", Current: []location.Versioned{versionedOf(key, res.rec)}}
	case errLeaseEnded:
		class, text = location.ErrLeaseEnded, "lease ended"
	case errIndeterminate:
		class = location.ErrIndeterminate
	case errDeadline:
		class = context.DeadlineExceeded
	}
	return simWriteError{text: text, class: class}
}

// simWriteError is errSim, of class class (nil: none, the store was
// unavailable).
type simWriteError struct {
	text  string
	class error
}

func (e simWriteError) Error() string { return errSim.Error() + ": " + e.text }

func (e simWriteError) Unwrap() []error {
	if e.class == nil {
		return []error{errSim}
	}
	return []error{errSim, e.class}
}
