package spotsim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// incMode is an incarnation's mailbox, as far as a Spot's lifecycle needs
// it.
type incMode int

const (
	// mStaged: spawned with dispatch held (Driver.Stage); what reaches its
	// PID waits.
	mStaged incMode = iota
	// mOpen: serving; handles its queue in order while its node's lease is
	// provably in force (the mailbox gate).
	mOpen
	// mEnded: its lifecycle ended (Driver.endOwned): what it holds and
	// what reaches it fails loudly.
	mEnded
	// mClosed: stopped (discarded, closed, or its process gone): its PID
	// is a dead letter.
	mClosed
)

var incModeNames = [...]string{"staged", "open", "ended", "closed"}

// Inc is one incarnation of a Spot on a lifecycle: the staged → open
// mailbox with its first messages at the head, its queue, and the
// messages it handled (its state).
type Inc struct {
	id    int
	life  *Life
	spot  *Spot
	pid   pidKey
	mode  incMode
	queue []item
	turn  bool
	// closing: CloseLocal ended it in the driver's registry (Hosted
	// false); its marker is queued.
	closing bool

	handled []*Msg
	// firstOp and afterFirst: once the handler of the message of firstOp
	// returned, afterFirst removes the recovery pointer (Staged.Open).
	firstOp    string
	afterFirst func(settled func())
	// pointerHeld: the first message ran and the Clear machine has not
	// finished: nothing more is dispatched (the relocation mailbox gate).
	pointerHeld bool
	// firsts are the messages Open put at the head; resumedFrom is the
	// operation a takeover replayed from its root ("" if none).
	firsts      []*Msg
	resumedFrom string
	openedAt    time.Duration
	// firstExpired: its first message was answered DeadlineExceeded at
	// dispatch (not run), so afterFirst never ran.
	firstExpired bool
	// restored: the state a claimed checkpoint gave it; seq: its last
	// capture's sequence (checkpoint.go).
	restored []*Msg
	seq      uint64
	// cpAsked and cpExpected: its activation claimed the checkpoint when
	// the store's last accepted one held cpExpected (the checker's).
	cpAsked    bool
	cpExpected []*Msg
	// cpClaimNo: how many claims of the checkpoint there had been when it
	// was staged; cpClosed: its close ended its checkpoints. A later
	// claim or the close fences its captures out (the checker's).
	cpClaimNo int
	cpClosed  bool
	// sealed: a close sealed its admission behind beforeSeal, the
	// messages it had accepted then (the checker's).
	sealed     bool
	beforeSeal []*Msg
}

// item is a queued message, or a close marker (CloseLocal).
type item struct {
	m      *Msg
	marker func()
}

func (i *Inc) String() string {
	return fmt.Sprintf("%s/%s#%d", i.life, i.pid, i.id)
}

// stage spawns an incarnation with dispatch held (Driver.Stage). A PID
// already in use on this lifecycle is refused, as SpawnNamed would.
func (l *Life) stage(s *Spot, gen, ownerGen uint64) (*Inc, error) {
	pid := pidKey{spot: s.id, gen: gen, ownerGen: ownerGen}
	if old := l.pids[pid]; old != nil && old.mode != mClosed {
		return nil, fmt.Errorf("stage %s: name in use", pid)
	}
	l.w.nextInc++
	inc := &Inc{id: l.w.nextInc, life: l, spot: s, pid: pid, mode: mStaged}
	l.incs = append(l.incs, inc)
	l.pids[pid] = inc
	return inc, nil
}

// open makes a staged incarnation serve with first at the head of its
// queue, ahead of what waited (Staged.Open); a lifecycle that ended ends
// it at once (Driver.nowServing).
func (w *World) open(inc *Inc, first []*Msg, firstOp string, afterFirst func(settled func())) {
	l := inc.life
	held := inc.queue
	inc.queue = make([]item, 0, len(first)+len(held))
	for _, m := range first {
		inc.queue = append(inc.queue, item{m: m})
		w.place(m, l)
		if m.deliveredAt == 0 {
			m.deliveredAt = w.Now()
		}
	}
	inc.queue = append(inc.queue, held...)
	inc.firsts, inc.firstOp, inc.afterFirst = first, firstOp, afterFirst
	inc.mode = mOpen
	inc.openedAt = w.Now()
	l.objects[inc.spot.idx] = inc
	w.tracef("%s OPENS with %s first (%d waited)", inc, msgList(first), len(held))
	w.incOpened(inc)
	if l.ended {
		w.endOwned(inc)
		return
	}
	w.checkServing(inc.spot, inc)
	w.schedTurn(inc)
}

// discard removes a staged incarnation that will never open
// (Staged.Discard): what waited fails loudly — a request gets a
// DeliveryFailed, a send is logged and counted (send_unavailable).
func (w *World) discard(inc *Inc) {
	held := inc.queue
	inc.queue = nil
	inc.mode = mClosed
	w.tracef("%s discarded (%d waited)", inc, len(held))
	for _, it := range held {
		if it.m == nil {
			continue
		}
		if it.m.request {
			w.answerFailure(inc.life, it.m, failure{code: roamerr.CodeUnavailable, definite: true, why: "the incarnation was removed before it opened"})
			continue
		}
		w.answerFailure(inc.life, it.m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_unavailable: the incarnation was removed before it opened"})
	}
}

// post hands m to inc's mailbox according to its mode.
func (w *World) post(inc *Inc, m *Msg) {
	m.accepted = true
	if m.deliveredAt == 0 {
		m.deliveredAt = w.Now()
	}
	w.place(m, inc.life)
	if w.Tracing() {
		w.tracef("%s m%d → %s (%s)", inc.life, m.id, inc, incModeNames[inc.mode])
	}
	switch inc.mode {
	case mStaged:
		inc.queue = append(inc.queue, item{m: m})
	case mOpen:
		inc.queue = append(inc.queue, item{m: m})
		w.schedTurn(inc)
	case mEnded:
		w.answerFailure(inc.life, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_lease_ended: the node's owner lease ended"})
	}
}

// endOwned ends an incarnation of an ended lifecycle: what it holds and
// what arrives later fails loudly (Driver.endOwned).
func (w *World) endOwned(inc *Inc) {
	held := inc.queue
	inc.queue = nil
	inc.mode = mEnded
	for _, it := range held {
		if it.m == nil {
			continue
		}
		if inc.afterFirst != nil && it.m.op == inc.firstOp {
			// Driver.endOwned: the activation's root still holds it; a live
			// node that resumes the activation runs it.
			if it.m.request || it.m.notice {
				w.answerFailure(inc.life, it.m, failure{code: roamerr.CodeDeadlineExceeded, why: "the owner's lease ended before the first message ran"})
			}
			continue
		}
		w.answerFailure(inc.life, it.m, failure{code: roamerr.CodeUnavailable, definite: true, why: "the node's owner lease ended"})
	}
}

// afterFirst is host.Receive's hook after the first message's turn:
// dispatch waits until the pointer's removal settled (Staged.Open).
func (w *World) afterFirst(inc *Inc) {
	done := inc.afterFirst
	inc.afterFirst = nil
	inc.pointerHeld = true
	done(func() {
		if inc.pointerHeld {
			inc.pointerHeld = false
			w.tracef("%s: recovery pointer settled; dispatch goes on", inc)
			w.schedTurn(inc)
		}
	})
}

func (w *World) schedTurn(inc *Inc) {
	if inc.turn || inc.mode != mOpen || len(inc.queue) == 0 || inc.pointerHeld {
		return
	}
	inc.turn = true
	w.after(w.randDur(50*time.Microsecond, time.Millisecond), func() { w.runTurn(inc) })
}

// deadlineGrace: a request dispatched this long after its deadline is
// answered DeadlineExceeded and not run (relocation host.Receive).
const deadlineGrace = time.Second

// runTurn dispatches one queued item: only while the lifecycle's lease is
// provably in force (mailbox.Gate), only in Open mode.
func (w *World) runTurn(inc *Inc) {
	inc.turn = false
	l := inc.life
	if inc.mode != mOpen || len(inc.queue) == 0 || !l.valid() || inc.pointerHeld {
		return
	}
	it := inc.queue[0]
	inc.queue = inc.queue[1:]
	if it.marker != nil {
		it.marker()
		return
	}
	m := it.m
	if m.request && w.Now() > m.deadline+deadlineGrace {
		// Answered DeadlineExceeded and not run; the turn is over, so the
		// afterFirst hook runs all the same (host.Receive).
		w.tracef("%s m%d: deadline passed %s ago: answered DeadlineExceeded, not run", inc, m.id, ms(w.Now()-m.deadline))
		w.answerFailure(l, m, failure{code: roamerr.CodeDeadlineExceeded, why: "the request's deadline passed before it was dispatched; not run"})
		if inc.afterFirst != nil && m.op == inc.firstOp {
			w.afterFirst(inc)
		}
		w.schedTurn(inc)
		return
	}
	if m.notice && m.call != nil && !m.call.life.gone {
		l.send(m.call.life, &packet{kind: pReply, msg: m}) // the dispatch notice, before the handler
	}
	w.handle(inc, m)
	w.capture(inc)
	if m.request && m.call != nil && !m.call.life.gone {
		l.send(m.call.life, &packet{kind: pReply, msg: m})
	}
	if inc.afterFirst != nil && m.op == inc.firstOp {
		w.afterFirst(inc)
	}
	if w.hooks.Handled != nil {
		w.hooks.Handled(w, inc, m)
	}
	if inc.mode == mOpen && !w.over && w.chance(w.faults.PCloseSelf) {
		l.closeInstance(inc)
	}
	w.schedTurn(inc)
}

// closeLocal is Driver.CloseLocal: the incarnation is ended in the
// registry; a marker queued behind everything it accepted stops it once
// those ran: what is behind the marker and what arrives before the stop
// gets a stale answer, later messages are dead letters. done gets nil
// then, NotFound if the incarnation does not serve here, or nothing
// while it never reaches the marker (the caller's timeout decides).
func (w *World) closeLocal(l *Life, s *Spot, gen uint64, done func(error)) {
	inc := l.objects[s.idx]
	if inc == nil || inc.pid.gen != gen || inc.mode != mOpen || inc.closing {
		done(errNotServing)
		return
	}
	inc.closing = true
	inc.sealed = true
	for _, it := range inc.queue {
		if it.m != nil {
			inc.beforeSeal = append(inc.beforeSeal, it.m)
		}
	}
	var marker func()
	marker = func() {
		if w.cfg.Sabotage == SabotageCloseNoSeal && len(inc.queue) > 0 {
			inc.queue = append(inc.queue, item{marker: marker})
			w.schedTurn(inc)
			return
		}
		rest := inc.queue
		inc.queue = nil
		for _, it := range rest {
			if it.m != nil {
				w.answerFailure(l, it.m, failure{code: roamerr.CodeStale, definite: true, why: "send_after_close: the incarnation closed"})
			}
		}
		inc.mode = mClosed
		if l.objects[s.idx] == inc {
			delete(l.objects, s.idx)
		}
		w.forget(inc)
		w.tracef("%s closed", inc)
		done(nil)
	}
	inc.queue = append(inc.queue, item{marker: marker})
	w.schedTurn(inc)
}

// hosts is Driver.Hosts: an incarnation of the Spot at gen serves here.
func (l *Life) hosts(s *Spot, gen uint64) bool {
	inc := l.objects[s.idx]
	return inc != nil && inc.pid.gen == gen && inc.mode == mOpen && !inc.closing
}

func msgList(ms []*Msg) string {
	s := "["
	for i, m := range ms {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("m%d", m.id)
	}
	return s + "]"
}
