package spotsim

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/internal/relocation/releaserun"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Client is an application on one node that calls Instance Spots by ID
// (Manager.Request/Send with InstanceSpot()), one call after the other: a
// send's call returns once the message is handed to the transport, a
// request's with its reply or a typed failure. Its calls decide with
// spotcall, as call.go does, on its node's current lifecycle; when that
// lifecycle is gone the client waits for the next one.
type Client struct {
	w    *World
	id   int
	node *Node
	seq  int
	plan []planned
	next int
	busy bool
	// last is, per order key, the highest sequence number handled, and
	// lastMsg its message.
	last    map[orderKey]int
	lastMsg map[orderKey]*Msg
}

type planned struct {
	spot    *Spot
	request bool
	think   time.Duration
}

// orderKey: one client's calls to one Spot through one lifecycle of its
// node (one connection): handled in its order (docs/PROTOCOL.md §7.5;
// docs/FAULTS.md, "One caller's order to a Missing Spot").
type orderKey struct {
	client int
	life   int
	spot   int
}

// wake lets a waiting client go on (its node serves again).
func (c *Client) wake() {
	if !c.busy {
		c.issue()
	}
}

// issue starts the next planned call, if any.
func (c *Client) issue() {
	w := c.w
	if c.busy || c.next >= len(c.plan) || w.over {
		return
	}
	l := c.node.cur
	if l == nil || !l.usable() {
		return // woken when the node's next lifecycle serves
	}
	p := c.plan[c.next]
	c.next++
	c.busy = true
	c.call(l, p.spot, p.request, false, func() {
		c.busy = false
		w.after(p.think, c.issue)
	})
}

// Call is one call.go Do on lifecycle life.
type Call struct {
	c        *Client
	life     *Life
	m        *Msg
	deadline time.Duration
	// await is the lifecycle a request's reply is awaited from (its
	// connection is watched), owner the owner whose liveness is checked.
	await *Life
	owner *messages.Owner
	ended bool
	// failedFirst: the call ended with a failure (or its caller went)
	// before its message was handled: the caller moved on not knowing.
	failedFirst bool
	// outcome is what its Do returned with, once it ended (the scripts'
	// status prints it).
	outcome string
	done    func()
}

func (c *Client) call(l *Life, s *Spot, request, probe bool, done func()) *Call {
	w := c.w
	c.seq++
	w.nextOp++
	m := &Msg{id: len(w.msgs) + 1, client: c, spot: s, seq: c.seq, request: request, op: "op" + strconv.Itoa(w.nextOp),
		deadline: w.Now() + w.cfg.CallTimeout, key: orderKey{client: c.id, life: l.addr, spot: s.idx}, probe: probe}
	w.msgs = append(w.msgs, m)
	w.stats.Calls++
	w.stats.Messages++
	call := &Call{c: c, life: l, m: m, deadline: m.deadline, done: done}
	m.call = call
	l.calls = append(l.calls, call)
	if w.Tracing() {
		kind := "send"
		if request {
			kind = "request"
		}
		if probe {
			kind = "probe request"
		}
		w.tracef("c%d %s m%d (seq %d) to %s via %s", c.id+1, kind, m.id, m.seq, s.id, l)
	}
	w.at(call.deadline, func() {
		if !call.ended {
			call.endedBy(spotcall.TimedOut, "")
		}
	})
	call.start()
	return call
}

// end ends the call (its Do returns).
func (call *Call) end(outcome string) {
	if call.ended {
		return
	}
	call.ended = true
	call.outcome = outcome
	l := call.life
	if i := slices.Index(l.calls, call); i >= 0 {
		l.calls = slices.Delete(l.calls, i, i+1)
	}
	w := call.c.w
	if w.Tracing() {
		w.tracef("c%d m%d returns: %s", call.c.id+1, call.m.id, outcome)
	}
	if call.m.probe {
		w.probeEnded(call.m, outcome)
	}
	if call.done != nil {
		call.done()
	}
}

// fail ends the call with a failure its caller sees (not the system's
// answer: a timeout, a lost connection, an owner that left).
func (call *Call) fail(f failure) {
	if call.ended {
		return
	}
	m := call.m
	if !m.accepted {
		call.c.w.stats.Unaccepted++
	}
	call.failedFirst = len(m.handled) == 0
	call.end("failed " + f.code + ": " + f.why)
}

// endedBy ends the call whose wait ended by e (call.go's await):
// address names the node asked.
func (call *Call) endedBy(e spotcall.End, address string) {
	err, drop := spotcall.Ended(call.m.spot.id, e, call.m.notice, address, nil)
	if drop {
		call.life.dropRoute(call.m.spot)
	}
	call.fail(failureOf(err, false))
}

// failureOf is err as the failure its caller sees.
func failureOf(err error, definite bool) failure {
	return failure{code: code(err), definite: definite, why: err.Error()}
}

// abandon: the caller's process is gone.
func (call *Call) abandon(why string) {
	if call.ended {
		return
	}
	call.ended = true
	call.outcome = "abandoned: " + why
	call.failedFirst = len(call.m.handled) == 0
	if !call.m.accepted {
		call.c.w.stats.Unaccepted++
	}
	if call.m.probe {
		call.c.w.probeEnded(call.m, "abandoned: "+why)
	}
}

// replied: a request's reply, or a send's dispatch notice, came back.
func (call *Call) replied(m *Msg) {
	if call.ended || m != call.m || !(m.request || m.notice) {
		return
	}
	if m.notice {
		call.end("dispatched")
		return
	}
	call.end("reply")
}

func (call *Call) failedBy(m *Msg, f failure) {
	if call.ended || m != call.m {
		return
	}
	if spotcall.Refused(roamerr.FromCode(f.code, f.why)) {
		call.life.dropRoute(m.spot)
	}
	call.failedFirst = len(m.handled) == 0
	call.end("failed " + f.code + ": " + f.why)
}

// sent ends a one-way send's call at outbound admission: the caller is
// told it is sent.
func (call *Call) sent() {
	call.m.accepted = true
	call.end("sent")
}

// start is call.go's do, its decisions spotcall's: the route cache
// (unless spotcall.RouteLost drops the route), else the store's authority;
// then a direct delivery to a Ready owner, or a SpotActivation (a Missing
// Spot to the rendezvous target, an ended owner's or abandoned one to a
// live node of its Mesh, a Creating or Closing one to its owner).
func (call *Call) start() {
	w := call.c.w
	l, s := call.life, call.m.spot
	if r := l.routeFor(s); r != nil {
		spotcall.RouteLost(l.connectionEnded(r.auth.address), func(answer func(bool, error)) {
			l.ownerAlive(r.auth.v.Record.GetOwner(), call.deadline, answer)
		}, func(lost bool) {
			switch {
			case call.ended:
			case lost:
				if w.Tracing() {
					w.tracef("c%d m%d finds its cached route to %s lost: its owner is gone", call.c.id+1, call.m.id, r.auth.address)
				}
				l.dropRoute(s)
				call.start()
			default:
				call.route(r.auth, "cache")
			}
		})
		return
	}
	l.readAuthority(s, call.deadline, func(a authority, err error) {
		if call.ended {
			return
		}
		if err != nil {
			w.checkClass("resolve "+s.id, err)
			call.fail(failure{code: code(err), definite: true, why: "resolve: " + errString(err)})
			return
		}
		if !l.putRoute(s, a) {
			// The drain of the other incarnation's route is not
			// modelled (no RouteBarrier here): it is dropped, and the
			// call reads again, as it does once a drain ended.
			if w.Tracing() {
				w.tracef("c%d m%d finds another incarnation's route cached: dropped, read again", call.c.id+1, call.m.id)
			}
			l.dropRoute(s)
			call.start()
			return
		}
		call.route(a, "store")
	})
}

func (call *Call) route(a authority, via string) {
	w := call.c.w
	p, err := spotcall.Route(call.intent(), spotcall.Found{V: a.v, Ended: a.ended}, w.wall(w.Now()))
	if err != nil {
		call.fail(failureOf(err, true))
		return
	}
	switch p.Way {
	case spotcall.Deliver:
		call.deliver(a, via)
	case spotcall.Place, spotcall.Reactivate:
		call.activate(p)
	default: // spotcall.ToOwner
		to := a.address
		if to == nil {
			call.fail(failure{code: roamerr.CodeUnavailable, definite: true, why: "no address for the owner"})
			return
		}
		call.sendActivation(to, a.v.Record.GetOwner(), spotcall.OwnersActivation(a.v.Record))
	}
}

// intent: a client's calls name Instance intent and no stable type or
// Mesh (InstanceSpot()).
func (call *Call) intent() spotcall.Intent {
	return spotcall.Intent{SpotID: call.m.spot.id, Instance: true}
}

// deliver sends to the owner's incarnation (route kind 1).
func (call *Call) deliver(a authority, via string) {
	w := call.c.w
	l, m := call.life, call.m
	rec := a.v.Record
	pid := pidKey{spot: m.spot.id, gen: rec.GetObjectGeneration(), ownerGen: rec.GetAuthorityOwnerGeneration()}
	if w.Tracing() {
		w.tracef("c%d m%d → %s on %s (route from %s)", call.c.id+1, m.id, pid, a.address, via)
	}
	m.sentAt, m.target = w.Now(), a.address
	l.send(a.address, &packet{kind: pApp, msg: m, pid: pid})
	if !m.request {
		call.sent()
		return
	}
	call.awaitReply(a.address, rec.GetOwner())
}

// activate selects a cold activation's target (spotcall.Target) from the
// live nodes' descriptors and sends it the envelope.
func (call *Call) activate(p spotcall.Plan) {
	w := call.c.w
	l, s := call.life, call.m.spot
	w.store.call(l, storeOp{kind: opListNodes, why: "select mesh"}, call.deadline, func(res storeRes) {
		if call.ended {
			return
		}
		node, act, err := spotcall.Target(p, s.id, descriptors(res.nodes), res.err)
		if err != nil {
			call.fail(failureOf(err, true))
			return
		}
		target := lifeOf(res.nodes, node)
		if w.hooks.Target != nil {
			if i := w.hooks.Target(w, call.c, s); i >= 0 && w.nodes[i].cur != nil {
				target = w.nodes[i].cur
				act.TargetMesh, act.TargetNodeRid, act.TargetNodeGeneration = target.owner.GetMesh(), target.rid, target.gen
			}
		}
		call.sendActivation(target, target.owner, act)
	})
}

// sendActivation completes and sends the SpotActivation act (route kind
// 2) with the first message inside, to the lifecycle to (whose owner
// fence it names).
func (call *Call) sendActivation(to *Life, owner *messages.Owner, act *messages.SpotActivation) {
	w := call.c.w
	l, m := call.life, call.m
	spotcall.Complete(act, m.op, m.spot.id, w.wall(call.deadline), l.rid, l.gen)
	act.First = &messages.Envelope{}
	if w.Tracing() {
		w.tracef("c%d m%d → command 39 %s to %s", call.c.id+1, m.id, m.op, to)
	}
	m.viaCmd39, m.sentAt, m.target = true, w.Now(), to
	m.notice = !m.request
	l.send(to, &packet{kind: pCmd39, msg: m, env: act})
	call.awaitReply(to, owner)
}

// awaitReply waits for the reply, a failure, the loss of the connection
// to to, the owner's end (checked every spotcall.TickEvery) or the
// deadline.
func (call *Call) awaitReply(to *Life, owner *messages.Owner) {
	w := call.c.w
	call.await, call.owner = to, owner
	if to.gone && to != call.life {
		w.after(detectDelay, func() { call.endedBy(spotcall.ConnectionLost, to.rid) })
		return
	}
	var tick func()
	tick = func() {
		if call.ended {
			return
		}
		call.life.ownerAlive(owner, call.deadline, func(alive bool, err error) {
			if call.ended {
				return
			}
			if spotcall.OwnerGone(alive, err) {
				call.endedBy(spotcall.OwnerLeft, owner.GetNodeRid())
				return
			}
			w.after(spotcall.TickEvery, tick)
		})
	}
	w.after(spotcall.TickEvery, tick)
}

// simStableType is the one Instance type every Spot of the simulation
// has and every node hosts.
const simStableType = "counter"

// descriptors are the node descriptors of the live lifecycles nodes:
// serving, weight 1, hosting simStableType.
func descriptors(nodes []*Life) []location.VersionedNode {
	out := make([]location.VersionedNode, len(nodes))
	for i, l := range nodes {
		out[i] = location.VersionedNode{Node: &messages.NodeDescriptor{
			NodeRid: l.rid, NodeGeneration: l.gen, Mesh: l.owner.GetMesh(),
			Status: messages.NodeStatus_NODE_STATUS_SERVING, InstanceTypes: []string{simStableType},
		}}
	}
	return out
}

// lifeOf is the lifecycle of nodes that n describes.
func lifeOf(nodes []*Life, n location.VersionedNode) *Life {
	for _, l := range nodes {
		if l.rid == n.Node.GetNodeRid() && l.gen == n.Node.GetNodeGeneration() {
			return l
		}
	}
	panic("spotsim: no lifecycle for descriptor " + n.Node.GetNodeRid())
}

// ---- authority and the route cache (manager.go, cache.go) ----

// authority is what a resolve found for a Spot ID.
type authority struct {
	v       location.Versioned
	address *Life
	ended   bool
}

// readAuthority resolves s's authority by spotcall.Resolve, the driver's
// own: both keys read at once, then the owner's liveness (ownerNode).
func (l *Life) readAuthority(s *Spot, deadline time.Duration, done func(authority, error)) {
	spotcall.Resolve(resolveEnv{l: l, s: s, deadline: deadline}, s.id, func(r spotcall.Resolved, err error) {
		if err != nil {
			done(authority{}, err)
			return
		}
		done(authority{v: r.V, address: l.w.lifeByAddress(r.Address), ended: r.Ended}, nil)
	})
}

// resolveEnv is spotcall.Resolve's host: the store model's reads, at once
// as the driver reads them from a remote store.
type resolveEnv struct {
	l        *Life
	s        *Spot
	deadline time.Duration
}

func (e resolveEnv) ReadKeys(instance, user location.AuthorityKey, done func(location.Versioned, error, location.Versioned, error)) {
	w := e.l.w
	var iv, uv location.Versioned
	var ierr, uerr error
	left := 2
	answered := func() {
		if left--; left == 0 {
			done(iv, ierr, uv, uerr)
		}
	}
	w.store.call(e.l, storeOp{kind: opRead, key: user, why: "authority (user) " + e.s.id}, e.deadline, func(res storeRes) {
		uv, uerr = res.v, res.err
		answered()
	})
	w.store.call(e.l, storeOp{kind: opRead, key: instance, why: "authority " + e.s.id}, e.deadline, func(res storeRes) {
		iv, ierr = res.v, res.err
		answered()
	})
}

func (e resolveEnv) OwnerNode(o *messages.Owner, done func(string, bool, error)) {
	e.l.ownerNode(o, e.deadline, func(addr *Life, alive bool, err error) {
		a := ""
		if addr != nil {
			a = addrOf(addr)
		}
		done(a, alive, err)
	})
}

// ownerAlive is ownerNode's liveness as every Spot caller of OwnerNode
// takes it (spotcall.OwnerAnswer, the Spot manager's ownerAddress).
func (l *Life) ownerAlive(o *messages.Owner, deadline time.Duration, done func(bool, error)) {
	releaserun.OwnerNode(ownerEnv{l, deadline}, o, func(addr string, alive bool, err error) {
		_, alive, err = spotcall.OwnerAnswer(addr, alive, err)
		done(alive, err)
	})
}

// ownerNode is an owner's node and whether its lifecycle holds its lease,
// judged by the driver's own releaserun.OwnerNode (Driver.OwnerNode) over
// this lifecycle's store calls and liveness watch. Errors are
// unclassified, as the driver's.
func (l *Life) ownerNode(o *messages.Owner, deadline time.Duration, done func(*Life, bool, error)) {
	releaserun.OwnerNode(ownerEnv{l, deadline}, o, func(addr string, alive bool, err error) {
		done(l.w.lifeByAddress(addr), alive, err)
	})
}

// ownerEnv is releaserun's host: this world's store calls, each within
// deadline, and the lifecycle's liveness watch on the logical clock.
type ownerEnv struct {
	l        *Life
	deadline time.Duration
}

func (e ownerEnv) Self() (*location.NodeDescriptor, bool) { return e.l.descriptor(), !e.l.ended }

func (e ownerEnv) ReadNode(o *messages.Owner, done func(location.VersionedNode, error)) {
	l, w := e.l, e.l.w
	w.store.call(l, storeOp{kind: opReadNode, owner: o, why: "owner alive"}, e.deadline, func(res storeRes) {
		switch {
		case isNotFound(res.err) && res.revoked:
			done(location.VersionedNode{}, location.ErrLeaseRevoked)
		case res.err != nil:
			done(location.VersionedNode{}, res.err)
		default:
			n := location.VersionedNode{Node: res.node.descriptor(), Version: location.StoreVersion(res.beat)}
			if res.alive {
				l.sabotageRevokeEarly(n)
			}
			done(n, nil)
		}
	})
}

func (e ownerEnv) RevokeLease(n location.VersionedNode, done func(error)) {
	l, w := e.l, e.l.w
	op := storeOp{kind: opRevoke, owner: location.OwnerOf(n.Node), beat: uint64(n.Version), why: "silent " + n.Node.GetNodeRid()}
	w.store.call(l, op, e.deadline, func(res storeRes) { done(res.err) })
}

func (e ownerEnv) Watch(f func(*liveness.Watch, time.Duration)) { f(e.l.liveness, e.l.w.Now()) }

// Serving is the driver's serving check: the lifecycle has not ended,
// and its lease is provably valid (meshnode's WriteLease).
func (e ownerEnv) Serving() error {
	switch l := e.l; {
	case l.ended:
		return fmt.Errorf("%w: node %s has stopped or its owner lease ended", roamerr.ErrUnavailable, l.rid)
	case !l.valid():
		return fmt.Errorf("%w: node %s is fenced: its owner lease is not provably in force", location.ErrFenced, l.rid)
	}
	return nil
}

func (e ownerEnv) LeaseRevoked(location.VersionedNode) {}

// sabotageRevokeEarly is SabotageRevokeEarly: the second node's liveness
// watch takes a descriptor it sees for the first time as seen a TTL ago,
// so it revokes what it merely saw once.
func (l *Life) sabotageRevokeEarly(n location.VersionedNode) {
	w := l.w
	if w.cfg.Sabotage != SabotageRevokeEarly || l.node != w.nodes[1] || n.Node.GetNodeRid() == l.rid {
		return
	}
	l.liveness.Seen(n.Node.GetNodeRid()+"/"+n.Node.GetLeaseId(), uint64(n.Version), 0, w.Now()-w.cfg.LeaseTTL)
}

// descriptor is l's node descriptor, as the store holds it: made once,
// since a lifecycle's descriptor never changes, and only read (the
// heartbeat watch lists every descriptor every watchEvery).
func (l *Life) descriptor() *location.NodeDescriptor {
	if l.desc == nil {
		l.desc = &messages.NodeDescriptor{NodeRid: l.rid, NodeGeneration: l.gen, LeaseId: l.lease, Mesh: l.owner.GetMesh(),
			Address: addrOf(l), Status: messages.NodeStatus_NODE_STATUS_SERVING, InstanceTypes: []string{simStableType}}
	}
	return l.desc
}

// cachedRoute is a positive route, kept and aged as the driver's cache
// keeps them (spotcall.RoutePolicy).
type cachedRoute struct {
	auth authority
	at   time.Duration
}

func (l *Life) routeFor(s *Spot) *cachedRoute {
	r := l.cache[s.idx]
	if r == nil {
		return nil
	}
	if l.w.routes().Aged(l.w.Now() - r.at) {
		l.cache[s.idx] = nil
		return nil
	}
	return r
}

func (w *World) routes() spotcall.RoutePolicy {
	return spotcall.RoutePolicy{MaxAge: w.cfg.RouteCacheMaxAge}
}

// putRoute caches a resolve of s as spotcall.RoutePolicy.Put decides; false
// when a route of another incarnation is cached (PutDrain). No route is
// ever being drained here (PutWait).
func (l *Life) putRoute(s *Spot, a authority) bool {
	old := l.cache[s.idx]
	same := old != nil && sameIncarnation(old.auth, a)
	switch l.w.routes().Put(spotcall.Resolved{V: a.v, Ended: a.ended}, old != nil, false, same) {
	case spotcall.PutDrain:
		return false
	case spotcall.PutNew:
		l.cache[s.idx] = &cachedRoute{auth: a, at: l.w.Now()}
		if !l.sweep {
			l.sweep = true
			l.w.after(spotcall.TickEvery, l.sweepRoutes)
		}
	}
	return true
}

// sameIncarnation: a and b name one incarnation's PID (its node's
// address, object and owner generations).
func sameIncarnation(a, b authority) bool {
	ra, rb := a.v.Record, b.v.Record
	return a.address == b.address && ra.GetObjectGeneration() == rb.GetObjectGeneration() &&
		ra.GetAuthorityOwnerGeneration() == rb.GetAuthorityOwnerGeneration()
}

func (l *Life) dropRoute(s *Spot) { l.cache[s.idx] = nil }

// sweepRoutes drops, every second, the cached routes whose owner's
// descriptor is gone or names another lease (spotcall.OwnerListed). The
// driver sweeps on its one every-second loop; here the sweep runs while
// the cache holds routes, and drops the aged ones to know when to stop
// (the driver's stay until their next use, which drops them).
func (l *Life) sweepRoutes() {
	w := l.w
	if l.gone {
		return
	}
	any := false
	for i, r := range l.cache {
		if r != nil && w.routes().Aged(w.Now()-r.at) {
			l.cache[i] = nil // aged out: never used again
			r = nil
		}
		any = any || r != nil
	}
	if !any {
		l.sweep = false
		return
	}
	w.store.call(l, storeOp{kind: opListNodes, why: "route sweep"}, w.Now()+spotcall.TickEvery, func(res storeRes) {
		if res.err == nil {
			live := make(map[string]string, len(res.nodes))
			for _, o := range res.nodes {
				live[o.rid] = o.lease
			}
			for i, r := range l.cache {
				if r != nil && !spotcall.OwnerListed(r.auth.v.Record.GetOwner(), live) {
					l.cache[i] = nil
				}
			}
		}
		w.after(spotcall.TickEvery, l.sweepRoutes)
	})
}
