package sim

import (
	"fmt"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
)

// Bound Sessions (Config.Sessions; docs/SESSIONS.md): each client is also
// the Session owner of its one Session — the gateway that keeps the
// client's connection — running the pure session.Owner. Object o is bound
// to client o mod Clients's Session: that client's messages to o go
// client → Session owner → the binding's route, the other clients' go
// straight to o. A move of a bound object asks the Session owner to seal
// (command 42) before the source seals, releases the seal with command 44
// once the source serves again, and the target sends command 43 after it
// committed and opened. What the Session owner holds while sealed is
// delivered in order on the update or the abort, refused loudly past the
// hold limits, or refused when the seal timer closes the Session. The
// driver's side follows internal/relocation/sessions.go: a seal request
// unanswered for the machine's SessionSealWait ends the move unsealed.

// gateway is one client's Session owner.
type gateway struct {
	owner *session.Owner
	sid   session.ID
	// timers: the live token of each (actor, move) seal timer.
	timers map[sealKey]uint64
	closed bool
}

type sealKey struct {
	actor string
	move  handoff.Identity
}

// sealWait is a source's seal request waiting for its reply.
type sealWait struct {
	id handoff.Identity
}

func actorName(o ObjID) string { return fmt.Sprintf("o%d", o) }

// boundTo is the client whose Session o is bound to, or -1.
func (w *World) boundTo(o ObjID) int {
	if !w.cfg.Sessions || w.cfg.Clients == 0 {
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
		c.gw = &gateway{owner: session.New(session.Config{SealTimeout: w.cfg.SessionSealTimeout, HoldLimit: w.cfg.SessionHoldLimit}),
			sid: session.ID(fmt.Sprintf("s%d", c.id+1)), timers: map[sealKey]uint64{}}
		c.runSession(c.gw.owner.Step(session.OpenSession{Session: c.gw.sid}))
	}
	for _, o := range w.objs {
		c := w.clients[w.boundTo(o.id)]
		rec := w.store.recs[o.id]
		c.runSession(c.gw.owner.Step(session.Bind{Session: c.gw.sid, Actor: actorName(o.id), Route: w.routeOf(w.node(rec.OwnerNode), rec.OwnerGen)}))
	}
}

// sendViaSession hands m to the client's Session owner.
func (c *Client) sendViaSession(m *Msg) {
	m.viaSession = true
	m.held = true
	c.runSession(c.gw.owner.Step(session.Client{Session: c.gw.sid, Actor: actorName(m.obj), Item: session.Item{Msg: m, Bytes: 1}}))
}

// runSession runs the Session owner's effects, in order (the service's
// effect loop, internal/session/service.go).
func (c *Client) runSession(effs []session.Effect) {
	w := c.w
	for _, e := range effs {
		switch e := e.(type) {
		case session.Deliver:
			m := e.Item.Msg.(*Msg)
			m.held = false
			n := w.node(e.Route.Address)
			key := incKey{obj: m.obj, ownerGen: e.Route.OwnerGeneration}
			m.first = orderKey{client: c.id, node: n.idx, inc: key}
			if w.Tracing() {
				w.tracef("%s delivers m%d (seq %d) → %s o%d.%d", c.gw.sid, m.id, m.seq, n.name, m.obj, key.ownerGen)
			}
			w.net.send(&packet{from: c.endpoint(), to: n.idx, kind: pClient, msg: m, inc: key})
		case session.Refuse:
			m := e.Item.Msg.(*Msg)
			m.held = false
			w.stats.SessionRefused++
			w.checkClass(m.obj, "session refusal", e.Err)
			w.unaccepted(m, "refused by the Session owner: "+e.Err.Error())
		case session.Reject:
			w.violate("session-reject", "the Session owner rejected a local call: %v", e.Err)
		case session.ReplySeal:
			n := w.node(e.To)
			if n == nil {
				break
			}
			w.net.send(&packet{from: c.endpoint(), to: n.idx, kind: pSessionSealReply, id: e.Move, serr: e.Err})
		case session.StartSealTimer:
			w.tok++
			tok := w.tok
			k := sealKey{e.Actor, e.Move}
			c.gw.timers[k] = tok
			w.after(e.After, "session-seal-timer", func() {
				if c.gw.timers[k] != tok {
					return
				}
				delete(c.gw.timers, k)
				c.runSession(c.gw.owner.Step(session.SealExpired{Session: e.Session, Actor: e.Actor, Move: e.Move}))
			})
		case session.StopSealTimer:
			delete(c.gw.timers, sealKey{e.Actor, e.Move})
		case session.Closed:
			c.gw.closed = true
			w.stats.SessionsClosed++
			w.tracef("%s closed: %v", e.Session, e.Err)
		case session.Log:
			w.tracef("%s %s %s (move #%d): %s", e.Session, e.Event, e.Actor, e.Move.RelocationID, e.Msg)
		default:
			panic(fmt.Sprintf("sim: Session owner effect %T is not modelled", e))
		}
	}
}

// receiveSession takes a hand-off's command to the Session owner.
func (c *Client) receiveSession(p *packet) {
	from := c.w.nodes[p.from].name
	g := c.gw
	switch p.kind {
	case pSessionSeal:
		c.runSession(g.owner.Step(session.SealRequest{From: from, Session: g.sid, Actor: actorName(p.obj), Move: p.id, Source: p.route}))
	case pSessionRoute:
		c.runSession(g.owner.Step(session.RouteUpdate{From: from, Session: g.sid, Actor: actorName(p.obj), Move: p.id, Target: p.route}))
	case pSessionAbort:
		c.runSession(g.owner.Step(session.Abort{From: from, Session: g.sid, Actor: actorName(p.obj), Move: p.id}))
	}
}

// sealSessions is the source's SealSessions (Driver.sealSessions): ask
// the Session owner; the machine bounds the wait (TimerSessionSeal).
func (w *World) sealSessions(r *SourceRun) {
	n, inc := r.node, r.inc
	gw := w.boundTo(inc.key.obj)
	id := r.m.Identity()
	r.sealWait = &sealWait{id: id}
	n.send(w.cfg.Nodes+gw, &packet{kind: pSessionSeal, id: id, obj: inc.key.obj, route: w.routeOf(n, inc.key.ownerGen)})
}

// lookUpSessionOwners is Driver.lookUpSessionOwners: a client's Session
// owner never leaves the mesh here, so a seal request still unanswered
// stays silent.
func (w *World) lookUpSessionOwners(r *SourceRun) handoff.Event {
	return handoff.SessionOwnersLooked{Silent: r.sealWait != nil}
}

// onSealReply is command 42's answer at the source (onSessionSealReply:
// only from the Session owner asked, only for the move waiting).
func (n *Node) onSealReply(p *packet) {
	w := n.w
	for _, r := range n.sources {
		if r.dead || r.sealWait == nil || r.sealWait.id != p.id {
			continue
		}
		if w.cfg.Nodes+w.boundTo(r.inc.key.obj) != p.from {
			return
		}
		r.sealWait = nil
		w.stepSource(r, handoff.SessionsSealed{Err: p.serr})
		return
	}
}

// abortSessions is the source's AbortSessions: command 44, one-way.
func (w *World) abortSessions(r *SourceRun) {
	o := r.inc.key.obj
	r.node.send(w.cfg.Nodes+w.boundTo(o), &packet{kind: pSessionAbort, id: r.m.Identity(), obj: o})
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
			route, sealed, ok := c.gw.owner.BindingOf(c.gw.sid, actorName(o.id))
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
