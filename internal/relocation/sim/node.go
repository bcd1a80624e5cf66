package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/internal/relocation/budget"
	"github.com/roamactors/roam/internal/relocation/capslots"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/redelivery"
	"github.com/roamactors/roam/internal/relocation/sourcerun"
	"github.com/roamactors/roam/internal/relocation/targetrun"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// incKey names one incarnation of an object on a node (the object PID's
// owner generation; the object generation is always 1 here).
type incKey struct {
	obj      ObjID
	ownerGen uint64
}

// incMode is the relocatable mailbox's mode (mailbox.Mode).
type incMode int

const (
	mOpen incMode = iota
	mSealed
	mRedirect
	mStaging
	mClosed
)

var incModeNames = [...]string{"open", "sealed", "redirect", "staging", "closed"}

// incState is the driver's objectState.
type incState int

const (
	sServing incState = iota
	sLeaving
	sStaging
	sFollowing
	sEnded
)

// Inc is one incarnation: the relocatable mailbox (mode, queue, sink) and
// the application instance, whose state is the number of messages it has
// handled (version) — the object's history must be one chain.
type Inc struct {
	id    int
	node  *Node
	key   incKey
	mode  incMode
	queue []*Msg
	// sink receives messages in mRedirect; closed in mClosed.
	sink, closed func(*Msg)
	stopped      bool // the actor stopped: later messages are dead letters
	state        incState
	inst         bool // the application instance is there (closeOut drops it)
	version      int
	out          *SourceRun
	turn         bool
	fellBack     bool       // opened by a move without its cutover: order not guaranteed
	target       *TargetRun // set on an incarnation a move's target installed
	// joining counts the Joins on their way into this SpotWide Spot's
	// incarnation (the driver's object.joining): it does not move
	// meanwhile.
	joining int
	// offered: the highest owner generation a move out of it offered
	// (object.offeredOwner): a retry never offers one a removed target of
	// an earlier attempt may still be named by.
	offered uint64
}

func (i *Inc) String() string {
	return fmt.Sprintf("%s/o%d.%d#%d", i.node.name, i.key.obj, i.key.ownerGen, i.id)
}

// Node is one node: its driver (objects, moves, timers), its owner lease
// as the node sees it, and whether its process runs.
type Node struct {
	w    *World
	idx  int
	name string
	gen  uint64
	life int

	alive    bool // the process runs (this lifecycle's remote is up)
	ended    bool // the owner lease ended (or Stop): nothing here may own any more
	stopping bool
	storeCut bool // the node cannot reach the store
	downKind lossKind

	// lease is the node's owner lease, run on the node's own keeper
	// (simkit.Lease); nil before the world starts it.
	lease *simkit.Lease

	incs    map[incKey]*Inc
	incList []*Inc
	objects map[ObjID]*Inc // the driver's registry: the serving (or leaving) incarnation
	sources []*SourceRun
	targets []*TargetRun
	capWait map[uint64]*SourceRun
	// prechecks: what the source checks this lifecycle answered found,
	// for their Restore requests (the driver's prechecks); lost with it.
	prechecks map[handoff.Identity]precheck
	// redeliver: sends per object queued for redelivery from the store,
	// in order, and whether its worker runs; dlHeld: dead-lettered sends
	// held for a pause, and whether it runs (redeliver.go).
	redeliver    map[ObjID][]*Msg
	redelivering map[ObjID]bool
	dlHeld       map[ObjID][]*Msg
	dlPaused     map[ObjID]bool
	// view is this lifecycle's view of its capacity slots (nil:
	// unbounded).
	view *capslots.View
	// budget is the in-flight payload budget of its moves out (budget.go).
	budget *budget.Budget
}

func newNode(w *World, i int) *Node {
	return &Node{w: w, idx: i, name: fmt.Sprintf("n%d", i+1), gen: 1, alive: true,
		incs: map[incKey]*Inc{}, objects: map[ObjID]*Inc{}, capWait: map[uint64]*SourceRun{},
		redeliver: map[ObjID][]*Msg{}, redelivering: map[ObjID]bool{}, dlHeld: map[ObjID][]*Msg{}, dlPaused: map[ObjID]bool{}}
}

// newNodeIn is node i of w, with its capacity slots' view when bounded.
func newNodeIn(w *World, i int) *Node {
	n := newNode(w, i)
	b := w.cfg.Budget
	n.budget = budget.New(b.PerPeer, b.PerNode, b.Window)
	if w.cfg.Capacity > 0 {
		n.view = capslots.NewView(n.name, w.cfg.Capacity)
	}
	return n
}

// valid: the lease is provably in force (cluster.Node.Valid).
func (n *Node) valid() bool { return n.alive && !n.ended && n.w.Now() < n.validUntil() }

func (n *Node) fenced() bool { return !n.ended && n.w.Now() >= n.validUntil() }

func (n *Node) newInc(key incKey, mode incMode, state incState) *Inc {
	n.w.nextIncID++
	inc := &Inc{id: n.w.nextIncID, node: n, key: key, mode: mode, state: state}
	n.incs[key] = inc
	n.incList = append(n.incList, inc)
	return inc
}

// setMode changes an incarnation's mailbox mode; every change to or from
// Open is where the single-serving invariant can break, so it is checked
// here.
func (w *World) setMode(inc *Inc, m incMode) {
	was := inc.mode
	inc.mode = m
	if m == mOpen && was != mOpen {
		w.checkServing(inc.key.obj)
		w.schedTurn(inc)
	}
}

// ---- lease ----

func (n *Node) startLease() {
	w := n.w
	// The claim, sent at the world's start, is the first proof.
	l, err := simkit.StartLease(lease.Config{TTL: w.cfg.LeaseTTL, RenewEvery: w.cfg.RenewEvery, RetryEvery: w.cfg.RetryEvery,
		Margin: w.cfg.LeaseMargin}, 0, &w.Sched, nodeLease{n, n.life})
	if err != nil {
		panic(fmt.Sprintf("sim: lease config: %v", err))
	}
	n.lease = l
}

// validUntil is when the node stops acting as the owner unless a later
// renewal proves its lease.
func (n *Node) validUntil() time.Duration {
	if n.lease == nil {
		return 0
	}
	return n.lease.ValidUntil()
}

// nodeLease is lifecycle life of n, as its lease sees it
// (simkit.LeaseHost).
type nodeLease struct {
	n    *Node
	life int
}

func (h nodeLease) LeaseLive() bool { return h.n.alive && !h.n.ended && h.n.life == h.life }

func (h nodeLease) Renew(timeout time.Duration, answer func(lease.Answer)) {
	n, w := h.n, h.n.w
	w.store.call(n, storeOp{kind: opRenew, why: "lease"}, w.Now()+timeout, func(res storeRes) {
		if n.life != h.life {
			return
		}
		switch res.err {
		case errNone:
			answer(lease.Renewed)
		case errNoLease:
			answer(lease.Gone)
		default:
			answer(lease.NoAnswer)
		}
	})
}

func (h nodeLease) LeaseChanged(s lease.Status, reason string) {
	switch s {
	case lease.Ended:
		h.n.endLifecycle(reason)
	case lease.Valid:
		h.n.w.tracef("%s lease renewed: unfenced", h.n.name)
		h.n.wake()
	}
}

// wake schedules a turn for every incarnation with work (mailbox.Wake on a
// lifted fence).
func (n *Node) wake() {
	for _, inc := range n.incList {
		if inc.mode == mOpen && len(inc.queue) > 0 {
			n.w.schedTurn(inc)
		}
	}
}

// endLifecycle: the owner lease ended (driver.onLeaseChanged(Ended)):
// every serving incarnation without a move out is ended — what it holds
// and what arrives later fails loudly — and the lifecycle's process goes
// away one follow period later (the node rejoins as a new lifecycle, which
// the sim does not model: its objects belong to an ended owner).
func (n *Node) endLifecycle(why string) {
	w := n.w
	if n.ended || !n.alive {
		return
	}
	n.ended = true
	w.stats.LeaseEnds++
	w.tracef("%s lifecycle ended: %s", n.name, why)
	for _, inc := range n.incList {
		if inc.state == sServing && inc.out == nil && n.objects[inc.key.obj] == inc {
			w.endOwned(inc)
		}
	}
	life := n.life
	w.after(w.cfg.Handoff.FollowDuration, "lifecycle-gone", func() {
		if n.alive && n.life == life {
			n.down(lossEnded, "its lifecycle ended")
		}
	})
}

// endOwned ends an incarnation of an ended lifecycle: everything queued
// and later fails loudly (Driver.endOwned).
func (w *World) endOwned(inc *Inc) {
	inc.state = sEnded
	held := inc.queue
	inc.queue = nil
	sink := func(m *Msg) { w.failLoud(m, inc, "the node's owner lease ended") }
	inc.sink = sink
	w.setMode(inc, mRedirect)
	for _, m := range held {
		sink(m)
	}
}

// nowServing makes inc the serving incarnation, or ends it at once if the
// lifecycle has ended (Driver.nowServing).
func (w *World) nowServing(inc *Inc) {
	inc.state = sServing
	if inc.node.ended {
		w.endOwned(inc)
	}
}

// crash stops the node's process at once: everything it holds is lost
// (expected losses), its machines stop, the store keeps its lease until
// the TTL runs out.
func (n *Node) crash() {
	if !n.alive {
		return
	}
	n.w.stats.Crashes++
	n.down(lossCrash, "its node crashed")
}

func (n *Node) down(kind lossKind, why string) {
	w := n.w
	w.tracef("%s DOWN: %s", n.name, why)
	n.alive = false
	n.downKind = kind
	n.life++
	n.prechecks = nil
	for _, m := range w.msgs {
		if m.at == n && m.handled == 0 && m.failed == 0 {
			w.lostMsg(m, kind, why)
		}
	}
	for _, inc := range n.incList {
		was := inc.mode
		inc.mode = mClosed
		inc.queue = nil
		if was == mOpen {
			w.checkServing(inc.key.obj)
		}
	}
	for _, r := range n.sources {
		r.dead = true
	}
	for _, t := range n.targets {
		t.dead = true
	}
}

// stop is Extension.Stop: no new move lands; the moves in are asked and
// waited for as the driver's FinishIncoming does (targetrun.Stopping),
// polled every 20 ms within the restore timeout; then the lease is given
// up and the process ends.
func (n *Node) stop() {
	w := n.w
	if !n.alive || n.ended || n.stopping {
		return
	}
	w.stats.Stops++
	w.tracef("%s stopping", n.name)
	n.stopping = true
	deadline := w.Now() + w.cfg.RestoreTimeout
	var poll func()
	poll = func() {
		if !n.alive {
			return
		}
		// A run that finishes leaves n.targets: step a copy.
		busy := targetrun.Stopping(slices.Values(slices.Clone(n.targets)), func(t *TargetRun) *handoff.Target { return t.m }, w.stepTarget)
		if busy > 0 && w.Now() < deadline {
			w.after(20*time.Millisecond, "stop-poll", poll)
			return
		}
		w.store.endLease(n)
		n.endLifecycle("stopped")
		life := n.life
		w.after(10*time.Millisecond, "stopped", func() {
			if n.alive && n.life == life {
				n.down(lossEnded, "it stopped")
			}
		})
	}
	poll()
}

// endpointTerminated: the connection to peer ended; the moves it concerns
// are told as the driver tells them (sourcerun.ConnectionLost).
func (n *Node) endpointTerminated(peer int) {
	w := n.w
	w.tracef("%s endpoint terminated: %s", n.name, w.endpointName(peer))
	// A run that ends leaves n.sources: step a copy.
	sourcerun.ConnectionLost(slices.Values(slices.Clone(n.sources)), func(r *SourceRun) bool { return r.target.idx == peer && !r.dead },
		func() { n.budgetOut(n.budget.LostPeer(w.endpointName(peer))) },
		w.stepSource)
}

// ---- packets ----

func (n *Node) send(to int, p *packet) {
	p.from, p.to = n.idx, to
	n.w.net.send(p)
}

func (n *Node) receive(p *packet) {
	w := n.w
	if w.Tracing() && p.kind != pClient && p.kind != pFollow {
		w.tracef("%s ← %s %s %s", n.name, w.endpointName(p.from), p.kind, idString(p.id))
	}
	switch p.kind {
	case pCapQuery:
		// Capacity is not modelled; every node hosts the one kind.
		v := admit.Capability(admit.Target{LeaseValid: n.valid(), Leaving: n.stopping, Registered: true, Movable: true}, capabilityQuery)
		n.send(p.from, &packet{kind: pCapReply, capReq: p.capReq, supported: v.Supported, detail: v.Reason, code: v.Code, check: !w.cfg.NoSourceCheck})
	case pCapReply:
		if r := n.capWait[p.capReq]; r != nil {
			delete(n.capWait, p.capReq)
			w.stepSource(r, handoff.CapabilityAnswered{Supported: p.supported, ReceiveChunkLimit: 64, Reason: p.detail, Code: p.code, SourceCheck: p.check})
		}
	case pSourceCheck:
		n.onSourceCheck(p)
	case pSourceCheckReply:
		ev := handoff.SourceChecked{}
		if p.code != "" {
			ev.Err = roamerr.FromCode(p.code, p.detail)
		}
		n.onSourceEvent(p, ev)
	case pPrepare:
		w.onPrepare(n, p)
	case pChunk:
		if t := n.target(p); t != nil {
			w.stepTarget(t, handoff.ChunkReceived{Chunk: p.chunk})
		}
	case pRelay:
		if t := n.target(p); t != nil {
			// Once committed, a relay record is either delivered late
			// (DeliverLate posts it, which places it) or a repeat the
			// target drops: a repeat must not count as a live copy. Nor
			// does a record a removed target ignores (a resend that
			// crossed the removal).
			if ph := t.m.Phase(); ph != handoff.OwnerCommitted && ph != handoff.TargetOpen && ph != handoff.TargetRemoved {
				w.place(p.msg, n)
				t.relayed = append(t.relayed, p.msg)
			}
			w.stepTarget(t, handoff.RelayRecordReceived{Epoch: p.epoch, Index: p.index, Record: p.record, Item: p.msg})
		} else {
			w.lostMsg(p.msg, lossTransit, "relay record for a move this node does not know")
		}
	case pCutover:
		if t := n.target(p); t != nil {
			w.stepTarget(t, handoff.CutoverReceivedEvent{Epoch: p.epoch, Sum: p.sum})
		}
	case pAbort:
		if t := n.target(p); t != nil {
			w.stepTarget(t, handoff.AbortReceived{Reason: p.reason})
		}
	case pCredit:
		if r := n.sourceOf(p); r != nil {
			n.budgetOut(n.budget.Credit(p.id.RelocationID, p.bytes))
		}
	case pRelayReady:
		n.onSourceEvent(p, handoff.RelayReadyReceived{})
	case pBoundaryAck:
		n.onSourceEvent(p, handoff.BoundaryAcked{})
	case pFailed:
		n.onSourceEvent(p, handoff.FailedReceived{Reason: p.reason, Detail: p.detail})
	case pFollow, pClient:
		n.deliverApp(p)
	case pSessionSealReply:
		n.onSealReply(p)
	}
}

// onSourceEvent routes a target's reply to the source run handoff.Attribute
// gives it.
func (n *Node) onSourceEvent(p *packet, ev handoff.Event) {
	if r := n.sourceOf(p); r != nil {
		n.w.stepSource(r, ev)
	}
}

// sourceOf is the source run handoff.Attribute gives a target's reply.
func (n *Node) sourceOf(p *packet) *SourceRun {
	for _, r := range n.sources {
		if r.m.Identity() == p.id && !r.dead {
			if handoff.Attribute(r.m.Identity(), r.target.name, p.id, n.w.endpointName(p.from)) == handoff.ThisRun {
				return r
			}
			return nil
		}
	}
	return nil
}

// target finds the target run handoff.Attribute gives a control message.
func (n *Node) target(p *packet) *TargetRun {
	if t := n.targetOf(p.id); t != nil && handoff.Attribute(t.m.Identity(), t.source.name, p.id, n.w.endpointName(p.from)) == handoff.ThisRun {
		return t
	}
	return nil
}

// deliverApp posts an application message to the incarnation its PID
// names; a PID with no live actor is a dead letter.
func (n *Node) deliverApp(p *packet) {
	w := n.w
	m := p.msg
	inc := n.incs[p.inc]
	if inc == nil || inc.stopped {
		if w.Tracing() {
			w.tracef("%s dead letter: m%d for o%d.%d", n.name, m.id, p.inc.obj, p.inc.ownerGen)
		}
		if m.request {
			// Proto.Actor answers a request to a dead PID with a
			// DeadLetterResponse: the caller learns it (loudly if the
			// request was accepted before).
			if !m.accepted {
				w.unaccepted(m, "dead letter at its first hop")
				return
			}
			w.failLoud(m, &Inc{node: n, key: p.inc}, "dead letter (DeadLetterResponse)")
			return
		}
		w.deadLettered(n, m, p.inc)
		return
	}
	if p.kind == pFollow && inc.fellBack {
		m.exempt = true
	}
	w.post(inc, m)
}

// post hands m to inc's mailbox according to its mode.
func (w *World) post(inc *Inc, m *Msg) {
	if !m.accepted {
		m.accepted = true
	}
	w.place(m, inc.node)
	if w.Tracing() {
		w.tracef("%s m%d → %s (%s)", inc.node.name, m.id, inc, incModeNames[inc.mode])
	}
	switch inc.mode {
	case mOpen:
		inc.queue = append(inc.queue, m)
		w.schedTurn(inc)
	case mSealed, mStaging:
		inc.queue = append(inc.queue, m)
		if inc.mode == mSealed && w.cfg.Sabotage == SabotageHandleAfterSeal && inc.node.alive {
			w.handle(inc, m)
		}
	case mRedirect:
		inc.sink(m)
	case mClosed:
		if inc.closed != nil {
			inc.closed(m)
		} else {
			w.lostMsg(m, lossDeadLetter, "posted to a closed mailbox without a handler at "+inc.String())
		}
	}
}

func (w *World) schedTurn(inc *Inc) {
	if inc.turn || inc.mode != mOpen || len(inc.queue) == 0 {
		return
	}
	inc.turn = true
	w.after(w.randDur(50*time.Microsecond, time.Millisecond), "turn", func() { w.runTurn(inc) })
}

// runTurn dispatches one message: only on a live node whose lease is
// provably in force (mailbox.Gate), only in Open mode.
func (w *World) runTurn(inc *Inc) {
	inc.turn = false
	n := inc.node
	if !n.alive || inc.mode != mOpen || len(inc.queue) == 0 || !n.valid() {
		return
	}
	m := inc.queue[0]
	inc.queue = inc.queue[1:]
	w.handle(inc, m)
	w.schedTurn(inc)
}

// unavailableSink fails every message loudly (Driver.unavailableSink).
func (w *World) unavailableSink(inc *Inc, why string) func(*Msg) {
	return func(m *Msg) { w.failLoud(m, inc, why) }
}

// stopInc stops inc's actor now (Driver.stop).
func (w *World) stopInc(inc *Inc) {
	inc.stopped = true
	if inc.node.incs[inc.key] == inc {
		delete(inc.node.incs, inc.key)
	}
}

func idString(id handoff.Identity) string {
	if id.RelocationID == 0 {
		return ""
	}
	return fmt.Sprintf("#%d", id.RelocationID)
}

// capabilityQuery is what every capability query of the sim asks: a
// move of its one kind.
var capabilityQuery = &messages.CapabilityQuery{Kind: messages.AuthorityKind_AUTHORITY_KIND_ACTOR}

// failure reason shorthand
var reasonStale = messages.FailureReason_FAILURE_REASON_STALE

// redelivery is the driver's redelivery policy at its defaults, with the
// world's follow period.
func (w *World) redelivery() redelivery.Policy {
	return redelivery.Policy{FollowDuration: w.cfg.Handoff.FollowDuration, Window: redelivery.DefaultWindow,
		Patience: redelivery.DefaultPatience, Backoff: redelivery.DefaultBackoff, BackoffMax: redelivery.DefaultBackoffMax}
}

// deadLettered takes a one-way send to an incarnation PID with no actor:
// the node redelivers it from the store's owner record, at once or after
// a pause, or fails it loudly, as redelivery.Policy.DeadLettered decides;
// once the lifecycle ended it fails loudly.
func (w *World) deadLettered(n *Node, m *Msg, key incKey) {
	if w.Tracing() {
		w.tracef("%s dead letter: m%d for o%d.%d (send: redelivered from the store)", n.name, m.id, key.obj, key.ownerGen)
	}
	m.accepted = true
	w.place(m, n)
	m.deadAt = &deadLetter{node: n, key: key, inc: n.incFor(key)}
	if m.dlCount == 0 {
		m.dlFirst = w.Now()
	}
	m.dlCount++
	if n.ended {
		w.failLoud(m, &Inc{node: n, key: key}, "send_dead_letter: the lifecycle ended")
		return
	}
	o := key.obj
	d := w.redelivery().DeadLettered(redelivery.Send{N: m.dlCount, First: w.wall(m.dlFirst)}, w.wall(w.Now()),
		len(n.dlHeld[o]) > 0, n.dlPaused[o])
	switch d.Verdict {
	case redelivery.Fail:
		w.failLoud(m, &Inc{node: n, key: key}, "send_dead_letter: redelivery patience exhausted")
		return
	case redelivery.Now:
		w.redeliverNow(n, o, m)
		return
	}
	n.dlHeld[o] = append(n.dlHeld[o], m)
	if !d.Arm {
		return
	}
	n.dlPaused[o] = true
	life := n.life
	w.after(d.After, "dead-letter pause", func() {
		if !n.alive || n.life != life {
			return
		}
		held := n.dlHeld[o]
		n.dlHeld[o], n.dlPaused[o] = nil, false
		for _, x := range held {
			if n.ended {
				w.failLoud(x, &Inc{node: n, key: incKey{obj: o}}, "send_dead_letter: the lifecycle ended")
				continue
			}
			w.redeliverNow(n, o, x)
		}
	})
}

// redeliverNow queues m for o's redelivery worker, which looks the owner
// up in the store (paced by redelivery.ResolveAgain within the policy's
// window) and sends what is queued there, in order.
func (w *World) redeliverNow(n *Node, o ObjID, m *Msg) {
	n.redeliver[o] = append(n.redeliver[o], m)
	if n.redelivering[o] {
		return
	}
	n.redelivering[o] = true
	life, started := n.life, w.Now()
	var work func(prev time.Duration)
	work = func(prev time.Duration) {
		if !n.alive || n.life != life {
			return
		}
		var err error
		if w.store.down || n.storeCut {
			err = location.ErrUnavailable
			if again, after := redelivery.ResolveAgain(err, prev); again && w.Now()+after-started < w.redelivery().Window {
				w.after(after, "redeliver-retry", func() { work(after) })
				return
			}
		}
		batch := n.redeliver[o]
		n.redeliver[o] = nil
		n.redelivering[o] = false
		switch redelivery.Batch(n.ended, err) {
		case redelivery.Abandon:
			for _, x := range batch {
				w.failLoud(x, &Inc{node: n, key: incKey{obj: o}}, "send_dead_letter: the lifecycle ended")
			}
		case redelivery.FailNoOwner:
			for _, x := range batch {
				w.failLoud(x, &Inc{node: n, key: incKey{obj: o}}, "send_redelivery_failed: no owner to deliver to")
			}
		default:
			rec := w.store.Record(o)
			owner := w.node(rec.OwnerNode)
			for _, x := range batch {
				if w.Tracing() {
					w.tracef("%s redelivers m%d → %s o%d.%d", n.name, x.id, owner.name, o, rec.OwnerGen)
				}
				n.send(owner.idx, &packet{kind: pFollow, msg: x, inc: incKey{obj: o, ownerGen: rec.OwnerGen}})
			}
		}
	}
	w.after(w.randDur(time.Millisecond, 5*time.Millisecond), "redeliver", func() { work(0) })
}
