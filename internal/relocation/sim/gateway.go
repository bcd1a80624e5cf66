package sim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/session/sessionrun"
)

// Bound Sessions (Config.Sessions; docs/SESSIONS.md): each client is also
// the Session owner of its one Session — the gateway that keeps the
// client's connection — running the driver's own Session owner
// interpreter (sessionrun) over this world's primitives (gatewayEnv).
// Object o is bound to client o mod Clients's Session: that client's
// messages to o go client → Session owner → the binding's route, the
// other clients' go straight to o. A move of a bound object asks the
// Session owner to seal (command 42) before the source seals, releases
// the seal with command 44 once the source serves again, and the target
// sends command 43 after it committed and opened; the source's side of
// that is the driver's own too (sourcerun), over sourceEnv's sends.

// gateway is one client's Session owner.
type gateway struct {
	run *sessionrun.Runner
	sid session.ID
	// timers: the live token of each armed timer.
	timers map[sessionrun.Timer]uint64
	closed bool
}

func actorName(o ObjID) string { return fmt.Sprintf("o%d", o) }

// boundTo is the client whose Session o is bound to, or -1.
func (w *World) boundTo(o ObjID) int {
	if !w.cfg.Sessions || w.cfg.Clients == 0 || w.objs[o].spot >= 0 {
		// A SpotWide member is not bound: its seal would be one more
		// Session seal of the unit, which the sim does not model.
		return -1
	}
	return int(o) % w.cfg.Clients
}

func (w *World) routeOf(n *Node, ownerGen uint64) session.Route {
	return session.Route{Address: n.name, OwnerGeneration: ownerGen, ObjectGeneration: 1}
}

// openSessions opens every client's Session and binds its objects where
// they were spawned.
func (w *World) openSessions() {
	if !w.cfg.Sessions {
		return
	}
	for _, c := range w.clients {
		owner := session.New(session.Config{SealTimeout: w.cfg.SessionSealTimeout, HoldLimit: w.cfg.SessionHoldLimit})
		c.gw = &gateway{run: sessionrun.New(owner, gatewayEnv{c}), sid: session.ID(fmt.Sprintf("s%d", c.id+1)), timers: map[sessionrun.Timer]uint64{}}
		c.gw.run.Step(session.OpenSession{Session: c.gw.sid})
	}
	for _, o := range w.objs {
		if w.boundTo(o.id) < 0 {
			continue
		}
		c := w.clients[w.boundTo(o.id)]
		rec := w.store.recs[o.id]
		c.gw.run.Step(session.Bind{Session: c.gw.sid, Actor: actorName(o.id), Route: w.routeOf(w.node(rec.OwnerNode), rec.OwnerGen)})
	}
}

// sendViaSession hands m to the client's Session owner.
func (c *Client) sendViaSession(m *Msg) {
	m.viaSession = true
	m.held = true
	c.gw.run.Step(session.Client{Session: c.gw.sid, Actor: actorName(m.obj), Item: session.Item{Msg: m, Bytes: 1}})
}

// receiveSession takes a hand-off's command to the Session owner.
func (c *Client) receiveSession(p *packet) {
	from := c.w.endpointName(p.from)
	g := c.gw
	switch p.kind {
	case pSessionSeal:
		g.run.Step(session.SealRequest{From: from, Session: g.sid, Actor: actorName(p.obj), Move: p.id, Source: p.route})
	case pSessionRoute:
		g.run.Step(session.RouteUpdate{From: from, Session: g.sid, Actor: actorName(p.obj), Move: p.id, Target: p.route})
	case pSessionAbort:
		g.run.Step(session.Abort{From: from, Session: g.sid, Actor: actorName(p.obj), Move: p.id})
	}
}

// gatewayEnv is a client's Session owner primitives (sessionrun.Env): the
// network's packets and the scheduler's timers.
type gatewayEnv struct{ c *Client }

var _ sessionrun.Env = gatewayEnv{}

func (e gatewayEnv) Deliver(_ string, r session.Route, item session.Item) {
	c, w := e.c, e.c.w
	m := item.Msg.(*Msg)
	m.held = false
	n := w.node(r.Address)
	key := incKey{obj: m.obj, ownerGen: r.OwnerGeneration}
	m.first = orderKey{client: c.id, node: n.idx, inc: key}
	if w.Tracing() {
		w.tracef("%s delivers m%d (seq %d) → %s o%d.%d", c.gw.sid, m.id, m.seq, n.name, m.obj, key.ownerGen)
	}
	w.net.send(&packet{from: c.endpoint(), to: n.idx, kind: pClient, msg: m, inc: key})
}

func (e gatewayEnv) Refuse(item session.Item, err error) {
	w := e.c.w
	m := item.Msg.(*Msg)
	m.held = false
	w.stats.SessionRefused++
	w.checkClass(m.obj, "session refusal", err)
	w.unaccepted(m, "refused by the Session owner: "+err.Error())
}

func (e gatewayEnv) Reject(err error) {
	e.c.w.violate("session-reject", "the Session owner rejected a local call: %v", err)
}

func (e gatewayEnv) ReplySeal(r session.ReplySeal) {
	w := e.c.w
	if n := w.node(r.To); n != nil {
		w.net.send(&packet{from: e.c.endpoint(), to: n.idx, kind: pSessionSealReply, id: r.Move, serr: r.Err, obj: objOf(r.Actor)})
	}
}

func (e gatewayEnv) Arm(t sessionrun.Timer, d time.Duration) {
	c, w := e.c, e.c.w
	w.tok++
	tok := w.tok
	c.gw.timers[t] = tok
	w.after(d, "session-seal-timer", func() {
		if c.gw.timers[t] != tok {
			return
		}
		delete(c.gw.timers, t)
		c.gw.run.Fire(t)
	})
}

func (e gatewayEnv) Stop(t sessionrun.Timer) { delete(e.c.gw.timers, t) }

// Look is not modelled: no route of a simulated binding goes down
// (session.Client's RouteDown), the only cause of a look.
func (e gatewayEnv) Look(s session.ID, actor string) {
	panic(fmt.Sprintf("sim: %s looked up %s: a Session binding's store look is not modelled", s, actor))
}

func (e gatewayEnv) Recovered(s session.ID, actor string) {
	panic(fmt.Sprintf("sim: %s's %s recovered: a Session binding's store look is not modelled", s, actor))
}

func (e gatewayEnv) Closed(s session.ID, err error) {
	w := e.c.w
	e.c.gw.closed = true
	w.stats.SessionsClosed++
	w.tracef("%s closed: %v", s, err)
}

func (e gatewayEnv) Log(l session.Log) {
	e.c.w.tracef("%s %s %s (move #%d): %s", l.Session, l.Event, l.Actor, l.Move.RelocationID, l.Msg)
}

// objOf is the object an Actor name names (actorName).
func objOf(actor string) ObjID {
	var o ObjID
	_, _ = fmt.Sscanf(actor, "o%d", &o)
	return o
}

// onSealReply is command 42's answer at the source: to the run of the
// move it names, from the endpoint the transport vouches for
// (onSessionSealReply).
func (n *Node) onSealReply(p *packet) {
	for _, r := range n.sources {
		if !r.dead && r.m.Identity() == p.id && r.inc.key.obj == p.obj {
			r.run.SessionSealReply(0, n.w.endpointName(p.from), p.serr)
			return
		}
	}
}

// updateSessionRoutes is the target's UpdateSessionRoutes: command 43,
// one-way, naming the incarnation that now serves.
func (w *World) updateSessionRoutes(t *TargetRun) {
	t.node.send(w.cfg.Nodes+w.boundTo(t.obj), &packet{kind: pSessionRoute, id: t.m.Identity(), obj: t.obj, route: w.routeOf(t.node, t.newOwner)})
}

// checkSessions: at the end nothing is held at a Session owner, no
// binding of an open Session stays sealed, and each routes to the owner
// the store names when that owner is live (session-held, session-sealed,
// session-route).
func (w *World) checkSessions() {
	if !w.cfg.Sessions {
		return
	}
	for _, m := range w.msgs {
		if m.held {
			w.violateO(m.obj, "session-held", "m%d (c%d seq %d to o%d) is still held by the Session owner", m.id, m.client+1, m.seq, m.obj)
		}
	}
	for _, c := range w.clients {
		for _, o := range w.objs {
			if w.boundTo(o.id) != c.id {
				continue
			}
			route, sealed, ok := c.gw.run.Owner().BindingOf(c.gw.sid, actorName(o.id))
			if !ok {
				continue // the Session closed (seal timeout): its client was told
			}
			if sealed {
				w.violateO(o.id, "session-sealed", "%s's binding of o%d is still sealed %s after the horizon", c.gw.sid, o.id, w.cfg.Settle)
				continue
			}
			rec := w.store.recs[o.id]
			if owner := w.node(rec.OwnerNode); owner.alive && !owner.ended && route != w.routeOf(owner, rec.OwnerGen) {
				w.violateO(o.id, "session-route", "%s's binding of o%d routes to %s, the store names %s (live) at owner generation %d",
					c.gw.sid, o.id, route, owner.name, rec.OwnerGen)
			}
		}
	}
}
