package spotsim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/relocation/redelivery"
	"github.com/roamactors/roam/internal/relocation/releaserun"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Node is one machine: a sequence of lifecycles (Life), one current. A
// crash ends the process (every lifecycle on it); a lease that ends ends
// the lifecycle; either way the node comes back as a new lifecycle after
// a delay (the Extension's rejoin, or a restart), which runs the start-up
// scan.
type Node struct {
	w        *World
	idx      int
	name     string
	lives    []*Life
	cur      *Life
	storeCut bool // the node cannot reach the store
	// capacity bounds the incarnations a lifecycle serves plus those it
	// creates (0: unbounded; admitCapacity).
	capacity int
}

// Life is one node lifecycle (cluster.Node + relocation.Driver +
// spot.Manager): its owner identity and lease, its incarnations, its Spot
// service (per-ID SpotActivation queues, the Spot ID locks, the creation
// slots, shared watches, route cache) and the machines running on it.
type Life struct {
	w     *World
	node  *Node
	n     int
	gen   uint64
	rid   string
	lease string
	addr  int
	owner *messages.Owner
	desc  *location.NodeDescriptor // descriptor's, made on first use
	acfg  activation.Config

	claimed bool
	ended   bool // its lease ended (or it found out): nothing here may own any more
	endedAt time.Duration
	gone    bool // its process (remote, memory) is gone
	goneAt  time.Duration
	// keeper runs the lifecycle's owner lease on the node's own keeper
	// (simkit.Lease); nil until its claim landed.
	keeper *simkit.Lease

	incs    []*Inc
	pids    map[pidKey]*Inc
	objects map[int]*Inc // the driver's registry, by Spot index

	queues  spotservice.Queues[int, cmd39] // SpotActivations per Spot index, in arrival order
	locks   spotservice.Locks[int]         // by Spot index
	pending int                            // creations in progress (admitCapacity)
	cache   []*cachedRoute
	sweep   bool
	watches spotservice.Watches
	// liveness is what this lifecycle saw of the others' descriptors
	// (releaserun.Observe and its revocations and gone owners).
	liveness *liveness.Watch
	// listed: the other lifecycles the last heartbeat listing named;
	// look: a recovery pass's look at the records' owners is due
	// (ownerLooks).
	listed []*Life
	look   bool

	// Dead letters per Spot index (Driver.onDeadLettered, onRedeliver):
	// queued for the Spot's redelivery worker, taken by it and being
	// looked up, held for a pause, the pause running.
	redeliver    [][]*Msg
	redelivering []bool
	inFlight     [][]*Msg
	dlHeld       [][]*Msg
	dlPaused     []bool

	runners []*Runner
	calls   []*Call // calls of clients running on this lifecycle, not ended
}

type pidKey struct {
	spot     string
	gen      uint64
	ownerGen uint64
}

func (l *Life) String() string { return l.rid }

// valid: the lease is provably in force (cluster.Node.Valid; the mailbox
// gate).
func (l *Life) valid() bool {
	return !l.gone && l.claimed && !l.ended && (l.w.Now() < l.validUntil() || l.w.cfg.Sabotage == SabotageNoFence)
}

func (l *Life) fenced() bool {
	return l.claimed && !l.ended && l.w.Now() >= l.validUntil() && l.w.cfg.Sabotage != SabotageNoFence
}

// usable: its handle may be used (Driver.Usable).
func (l *Life) usable() bool { return !l.gone && l.claimed && !l.ended }

// start begins a new lifecycle of n: a lease claim (retried until it
// lands), then renewals and the start-up scan.
func (n *Node) start(first bool) {
	w := n.w
	k := len(n.lives) + 1
	w.nextAddr++
	l := &Life{w: w, node: n, n: k, gen: uint64(k), rid: fmt.Sprintf("%s.%d", n.name, k), addr: w.nextAddr,
		pids: map[pidKey]*Inc{}, objects: map[int]*Inc{}, liveness: liveness.New(w.cfg.LeaseTTL),
		cache: make([]*cachedRoute, len(w.spots)), redeliver: make([][]*Msg, len(w.spots)), redelivering: make([]bool, len(w.spots)),
		inFlight: make([][]*Msg, len(w.spots)), dlHeld: make([][]*Msg, len(w.spots)), dlPaused: make([]bool, len(w.spots))}
	l.lease = "L-" + l.rid
	l.look = true // the extension's first recovery pass, at start
	l.owner = &messages.Owner{Mesh: "default", NodeRid: l.rid, NodeGeneration: l.gen, LeaseId: l.lease}
	l.acfg = w.cfg.Activation
	l.acfg.Self = l.owner
	n.lives = append(n.lives, l)
	n.cur = l
	w.lives = append(w.lives, l)
	if !first {
		w.stats.Restarts++
	}
	w.tracef("%s starts (lifecycle %d of %s)", l, k, n.name)
	l.claim()
}

func (l *Life) claim() {
	w := l.w
	if l.gone {
		return
	}
	sent := w.Now()
	w.store.call(l, storeOp{kind: opClaim, why: "claim"}, 0, func(res storeRes) {
		if res.err != nil {
			w.after(w.cfg.RetryEvery, l.claim)
			return
		}
		ls, err := simkit.StartLease(lease.Config{TTL: w.cfg.LeaseTTL, RenewEvery: w.cfg.RenewEvery, RetryEvery: w.cfg.RetryEvery,
			Margin: w.cfg.LeaseMargin}, sent, &w.Sched, lifeLease{l})
		if err != nil {
			panic(fmt.Sprintf("spotsim: lease config: %v", err))
		}
		l.claimed, l.keeper = true, ls
		w.tracef("%s serves (lease until %s)", l, ms(l.validUntil()))
		w.after(watchEvery, l.watchNodes)
		l.recoverScan()
		for _, c := range w.clients {
			if c.node == l.node {
				c.wake()
			}
		}
	})
}

// validUntil is when the lifecycle stops acting as the owner unless a
// later renewal proves its lease (0 before its claim landed).
func (l *Life) validUntil() time.Duration {
	if l.keeper == nil {
		return 0
	}
	return l.keeper.ValidUntil()
}

// lifeLease is l as its lease sees it (simkit.LeaseHost).
type lifeLease struct{ l *Life }

func (h lifeLease) LeaseLive() bool { return !h.l.gone && !h.l.ended }

func (h lifeLease) Renew(timeout time.Duration, answer func(lease.Answer)) {
	w := h.l.w
	w.store.call(h.l, storeOp{kind: opRenew, why: "lease"}, w.Now()+timeout, func(res storeRes) {
		switch {
		case res.err == nil:
			answer(lease.Renewed)
		case isNotFound(res.err):
			answer(lease.Gone)
		default:
			answer(lease.NoAnswer)
		}
	})
}

func (h lifeLease) LeaseChanged(s lease.Status, reason string) {
	switch s {
	case lease.Ended:
		h.l.endLifecycle(reason)
	case lease.Valid:
		h.l.w.tracef("%s lease renewed: unfenced", h.l)
		h.l.wake()
	}
}

// watchEvery is how often a lifecycle lists the descriptors to watch
// their heartbeats (the extension's sweep: every second against a 10 s
// TTL).
const watchEvery = 300 * time.Millisecond

// watchNodes lists the descriptors and hands them to the driver's own
// releaserun.WatchNodes (Driver.WatchNodes): every descriptor listed feeds
// the liveness watch, and one that stood still for a TTL is revoked at the
// version seen (a write: refused while this lifecycle is fenced).
func (l *Life) watchNodes() {
	w := l.w
	if l.gone || l.ended {
		return
	}
	w.store.call(l, storeOp{kind: opListNodes, why: "watch heartbeats", quiet: true}, w.Now()+watchEvery, func(res storeRes) {
		defer w.after(watchEvery, l.watchNodes)
		if res.err != nil || l.ended {
			return
		}
		l.departed(res.nodes)
		l.ownerLooks()
		nodes := make([]location.VersionedNode, len(res.nodes))
		for i, o := range res.nodes {
			nodes[i] = location.VersionedNode{Node: o.descriptor(), Version: location.StoreVersion(res.beats[i])}
			l.sabotageRevokeEarly(nodes[i])
		}
		releaserun.WatchNodes(ownerEnv{l, w.Now() + watchEvery}, nodes, func(int, error) {})
	})
}

// departed notes that a lifecycle left the listing: the extension's
// recovery passes (sweepEnded) then look at the records' owners again.
func (l *Life) departed(nodes []*Life) {
	for _, o := range l.listed {
		if !slices.Contains(nodes, o) {
			l.look = true
		}
	}
	l.listed = slices.DeleteFunc(append(l.listed[:0], nodes...), func(o *Life) bool { return o == l })
}

// ownerLooks models what the extension's recovery passes
// (extension sweepEnded: once at start, and after a lifecycle left the
// listing) do to this lifecycle's liveness watch: Manager.RecoverEnded
// asks OwnerNode about every record's owner, so an owner whose descriptor
// went without a revocation is counted gone from then on, not from the
// first call that names it (docs/PROTOCOL.md §3.4). A pass runs only
// while the lease is valid, and again until one has looked at every owner.
// The passes' recoveries are not modelled (doc.go).
func (l *Life) ownerLooks() {
	w := l.w
	if !l.look || !l.valid() {
		return
	}
	l.look = false
	w.store.call(l, storeOp{kind: opList, key: location.AuthorityKey{Kind: location.KindInstanceSpot}, why: "owner looks", quiet: true}, w.Now()+watchEvery, func(res storeRes) {
		if res.err != nil {
			l.look = true
			return
		}
		seen := map[string]bool{}
		for _, v := range res.list {
			o := v.Record.GetOwner()
			id := o.GetNodeRid() + "/" + o.GetLeaseId()
			if o.GetNodeRid() == l.rid || seen[id] {
				continue
			}
			seen[id] = true
			l.ownerNode(o, w.Now()+watchEvery, func(_ *Life, _ bool, err error) {
				if err != nil && !errors.Is(err, roamerr.ErrOwnerEnding) {
					l.look = true // not looked at: the next pass looks again
				}
			})
		}
	})
}

// wake schedules a turn for every incarnation with work (a lifted fence),
// after checking that no two serve.
func (l *Life) wake() {
	for _, inc := range l.incs {
		if inc.mode == mOpen {
			l.w.checkServing(inc.spot, inc)
			l.w.schedTurn(inc)
		}
	}
}

// endLifecycle: the owner lease ended (driver.onLeaseChanged(Ended)):
// every serving incarnation is ended (what it holds and what arrives
// later fails loudly); the machines still running finish on their own
// (their writes now fail); the process goes after Linger and the node
// rejoins as a new lifecycle.
func (l *Life) endLifecycle(why string) {
	w := l.w
	if l.ended || l.gone {
		return
	}
	l.ended = true
	l.endedAt = w.Now()
	w.stats.LeaseEnds++
	w.tracef("%s lifecycle ended: %s", l, why)
	for _, inc := range l.incs {
		if inc.mode == mOpen {
			w.endOwned(inc)
		}
	}
	l.abandonRedeliveries()
	w.after(w.cfg.Linger, func() {
		if !l.gone {
			l.goDown(lossEnded, "its lifecycle ended")
		}
	})
	if l.node.cur == l {
		w.after(w.randDur(w.cfg.RestartMin, w.cfg.RestartMax), func() {
			if l.node.cur == l {
				l.node.start(false)
			}
		})
	}
}

// crash stops n's process at once: every lifecycle on it is gone with
// what it held; the store keeps the lease until the TTL runs out. The node
// restarts as a new lifecycle after a delay.
func (n *Node) crash() {
	w := n.w
	cur := n.cur
	if cur == nil || cur.gone {
		return
	}
	w.stats.Crashes++
	for _, l := range n.lives {
		if !l.gone {
			l.goDown(lossCrash, "its node crashed")
		}
	}
	n.cur = nil
	w.after(w.randDur(w.cfg.RestartMin, w.cfg.RestartMax), func() {
		if n.cur == nil {
			n.start(false)
		}
	})
}

// goDown ends l's process: everything it held in memory is lost; its
// machines stop; peers learn that its endpoint terminated.
func (l *Life) goDown(kind lossKind, why string) {
	w := l.w
	w.tracef("%s DOWN: %s", l, why)
	if !l.ended {
		l.endedAt = w.Now()
	}
	l.gone = true
	l.goneAt = w.Now()
	for _, m := range w.msgs {
		if m.at == l && m.open() {
			w.lostMsg(m, kind, why)
		}
	}
	for _, inc := range l.incs {
		inc.mode = mClosed
		inc.queue = nil
	}
	for _, r := range l.runners {
		r.dead = true
	}
	for _, c := range l.calls {
		c.abandon("its node is gone")
	}
	l.calls = nil
	for _, o := range w.lives {
		if o != l && !o.gone {
			o := o
			w.after(detectDelay, func() {
				if !o.gone {
					o.endpointGone(l)
				}
			})
		}
	}
}

// connectionEnded reports whether l knows its connection to peer ended
// (Driver.ConnectionEnded): peer's process is gone and its endpoint's end
// has reached l. Only a gone process counts: a connection ended by a cut
// link, which the driver also counts until it reconnects, is not modelled.
func (l *Life) connectionEnded(peer *Life) bool {
	return peer != nil && peer != l && peer.gone && l.w.Now() >= peer.goneAt+detectDelay
}

// endpointLost: the connection to node peer ended (a cut): every call of
// this lifecycle awaiting a reply over it ends Unavailable (call.go
// watchEndpoint).
func (l *Life) endpointLost(peer *Node) {
	for _, c := range append([]*Call(nil), l.calls...) {
		if c.await != nil && c.await.node == peer && c.await != l {
			c.endedBy(spotcall.ConnectionLost, c.await.rid)
		}
	}
}

// endpointGone: the lifecycle peer's process is gone.
func (l *Life) endpointGone(peer *Life) {
	for _, c := range append([]*Call(nil), l.calls...) {
		if c.await == peer {
			c.endedBy(spotcall.ConnectionLost, peer.rid)
		}
	}
}

// ---- packets ----

func (l *Life) send(to *Life, p *packet) {
	p.from, p.to = l, to
	l.w.net.send(p)
}

func (l *Life) receive(p *packet) {
	w := l.w
	switch p.kind {
	case pCmd39:
		m := p.msg
		m.accepted = true // the activation envelope reached its target (an owner)
		w.place(m, l)
		if w.Tracing() {
			w.tracef("%s ← command 39 %s for %s (m%d)", l, p.env.GetOperationId(), p.env.GetSpotId(), m.id)
		}
		l.enqueueActivation(p.env, m)
	case pApp:
		l.deliverApp(p.pid, p.msg)
	case pReply:
		if c := p.msg.call; c != nil && c.life == l {
			c.replied(p.msg)
		}
	case pFailure:
		if c := p.msg.call; c != nil && c.life == l {
			c.failedBy(p.msg, p.fail)
		}
	}
}

// deliverApp posts an application message to the incarnation its PID
// names; a PID with no actor is a dead letter: a request's caller gets a
// dead-letter answer (ErrStale), a send is redelivered from the store.
func (l *Life) deliverApp(pid pidKey, m *Msg) {
	w := l.w
	inc := l.pids[pid]
	if inc == nil || inc.mode == mClosed {
		w.stats.DeadLetters++
		if m.request {
			if w.Tracing() {
				w.tracef("%s dead letter: m%d for %s (request: ErrStale)", l, m.id, pid)
			}
			w.answerFailure(l, m, failure{code: roamerr.CodeStale, definite: true, why: "dead letter"})
			return
		}
		l.deadLettered(m, pid)
		return
	}
	w.post(inc, m)
}

// answerFailure sends a DeliveryFailed for request m from l to its
// caller, and records the loud failure.
// A send with a dispatch notice gets its failure there too (relocation
// ReplyRoute, noticeOf).
func (w *World) answerFailure(l *Life, m *Msg, f failure) {
	w.failLoud(m, l, f)
	if (m.request || m.notice) && m.call != nil && !m.call.life.gone {
		l.send(m.call.life, &packet{kind: pFailure, msg: m, fail: f})
	}
}

// ---- dead letters (relocation/redeliver.go) ----

// redelivery is the driver's redelivery policy with this world's window
// and patience (Config.RedeliveryWindow, DeadLetterPatience); there are no
// moves here, so no follow period.
func (w *World) redelivery() redelivery.Policy {
	return redelivery.Policy{Window: w.cfg.RedeliveryWindow, Patience: w.cfg.DeadLetterPatience,
		Backoff: redelivery.DefaultBackoff, BackoffMax: redelivery.DefaultBackoffMax}
}

// deadLettered takes a one-way send to an incarnation PID with no actor
// (Driver.onDeadLettered): it is redelivered from the store's owner
// record at once or after a pause, or fails loudly, as
// redelivery.Policy.DeadLettered decides; once the lifecycle ended it
// fails loudly.
func (l *Life) deadLettered(m *Msg, pid pidKey) {
	w := l.w
	if w.Tracing() {
		w.tracef("%s dead letter: m%d for %s (send: redelivered from the store)", l, m.id, pid)
	}
	m.accepted = true
	m.notice = false // Proto.Actor's DeadLetterEvent carries no headers: the dispatch notice is gone
	w.place(m, l)
	if m.dlCount == 0 {
		m.dlFirst = w.Now()
	}
	m.dlCount++
	if l.ended {
		w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_dead_letter"})
		return
	}
	i := m.spot.idx
	d := w.redelivery().DeadLettered(redelivery.Send{N: m.dlCount, First: w.wall(m.dlFirst)}, w.wall(w.Now()),
		len(l.dlHeld[i]) > 0, l.dlPaused[i])
	switch d.Verdict {
	case redelivery.Fail:
		w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_dead_letter"})
		return
	case redelivery.Now:
		l.redeliverNow(m)
		return
	}
	l.dlHeld[i] = append(l.dlHeld[i], m)
	if !d.Arm {
		return
	}
	l.dlPaused[i] = true
	w.after(d.After, func() {
		if l.gone {
			return
		}
		held := l.dlHeld[i]
		l.dlHeld[i], l.dlPaused[i] = nil, false
		for _, x := range held {
			l.redeliverNow(x)
		}
	})
}

// redeliverNow queues m behind its Spot's earlier redeliveries and starts
// the Spot's redelivery worker if none runs (Driver.onRedeliver); once
// the lifecycle ended, m fails loudly at once.
func (l *Life) redeliverNow(m *Msg) {
	w := l.w
	if l.ended {
		w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_dead_letter"})
		return
	}
	i := m.spot.idx
	l.redeliver[i] = append(l.redeliver[i], m)
	if l.redelivering[i] {
		return
	}
	l.redelivering[i] = true
	w.after(w.randDur(time.Millisecond, 3*time.Millisecond), func() { l.redeliverWork(m.spot) })
}

// abandonRedeliveries fails loudly every dead letter still waiting for
// its redelivery when the lifecycle ends (Driver.abandonRedeliveries):
// held for a pause or queued for a worker; a batch being looked up ends
// as redelivery.Batch says.
func (l *Life) abandonRedeliveries() {
	for i := range l.redeliver {
		for _, m := range append(l.dlHeld[i], l.redeliver[i]...) {
			l.w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_dead_letter"})
		}
		l.dlHeld[i], l.redeliver[i] = nil, nil
	}
}

// redeliverWork is a Spot's redelivery worker (Driver.redeliverWorker):
// batch by batch, in order, it looks the owner up (redelivery.Lookup, the
// driver's, paced by redelivery.ResolveAgain within the policy's window)
// and does with the batch what redelivery.Batch says.
func (l *Life) redeliverWork(s *Spot) {
	w := l.w
	if l.gone {
		return
	}
	i := s.idx
	batch := l.redeliver[i]
	l.redeliver[i] = nil
	if len(batch) == 0 || l.ended {
		l.redelivering[i] = false
		for _, m := range batch {
			w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_dead_letter"})
		}
		return
	}
	l.inFlight[i] = batch
	start := w.Now()
	var try func(prev time.Duration)
	try = func(prev time.Duration) {
		redelivery.Lookup(lookupEnv{l, start + w.redelivery().Window, s.id}, s.key(), func(v location.Versioned, addr string, err error) {
			if l.gone {
				return
			}
			if again, after := redelivery.ResolveAgain(err, prev); again && w.Now()+after < start+w.redelivery().Window {
				w.after(after, func() { try(after) })
				return
			}
			l.inFlight[i] = nil
			switch redelivery.Batch(l.ended, err) {
			case redelivery.Abandon:
				for _, m := range batch {
					w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_dead_letter"})
				}
			case redelivery.FailNoOwner:
				for _, m := range batch {
					w.answerFailure(l, m, failure{code: roamerr.CodeUnavailable, definite: true, why: "send_redelivery_failed: " + errString(err)})
				}
			default:
				rec := v.Record
				pid := pidKey{spot: s.id, gen: rec.GetObjectGeneration(), ownerGen: rec.GetAuthorityOwnerGeneration()}
				owner := w.lifeByAddress(addr)
				for _, m := range batch {
					if w.Tracing() {
						w.tracef("%s redelivers m%d → %s on %s", l, m.id, pid, owner)
					}
					l.send(owner, &packet{kind: pApp, msg: m, pid: pid})
				}
			}
			l.redeliverWork(s)
		})
	}
	try(0)
}

// lookupEnv is redelivery.Lookup's host: this world's store reads, within
// deadline.
type lookupEnv struct {
	l        *Life
	deadline time.Duration
	spot     string // for the trace
}

func (e lookupEnv) Self() *location.NodeDescriptor { return e.l.descriptor() }

func (e lookupEnv) Read(key location.AuthorityKey, done func(location.Versioned, error)) {
	e.l.w.store.call(e.l, storeOp{kind: opRead, key: key, why: "resolve " + e.spot}, e.deadline, func(res storeRes) { done(res.v, res.err) })
}

func (e lookupEnv) ReadNode(key location.NodeKey, done func(location.VersionedNode, error)) {
	o := &messages.Owner{Mesh: key.Mesh, NodeRid: key.NodeRid}
	e.l.w.store.call(e.l, storeOp{kind: opReadNode, owner: o, why: "node of " + e.spot}, e.deadline, func(res storeRes) {
		if res.err != nil {
			done(location.VersionedNode{}, res.err)
			return
		}
		done(location.VersionedNode{Node: res.node.descriptor(), Version: location.StoreVersion(res.beat)}, nil)
	})
}

func (w *World) lifeByRid(rid string) *Life {
	for _, l := range w.lives {
		if l.rid == rid {
			return l
		}
	}
	return nil
}

func (w *World) lifeByAddr(addr int) *Life {
	for _, l := range w.lives {
		if l.addr == addr {
			return l
		}
	}
	return nil
}

func (w *World) spotByID(id string) *Spot {
	for _, s := range w.spots {
		if s.id == id {
			return s
		}
	}
	return nil
}
