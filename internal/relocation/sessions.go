package relocation

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The hand-off's side of bound Sessions (docs/SESSIONS.md §2): the source
// asks each bound participant's Session owner to seal (command 42) before
// it seals, and tells it to release (command 44) once it serves again; the
// target tells it the new route (command 43) once it opened. The Session
// owner itself is internal/session; these are only the messages to it.

// SessionOwnerName is the PID id of a node's Session owner, a control
// actor: the commands' senders are checked against the connection's
// certificate.
const SessionOwnerName = "roam/session"

// SessionOwnerPID is the Session owner of the node at address.
func SessionOwnerPID(address string) *actor.PID { return actor.NewPID(address, SessionOwnerName) }

// IncarnationPID is the PID of the incarnation of key with this
// ObjectGeneration and owner generation on the node at address: where a
// Session's binding route delivers.
func IncarnationPID(address string, key location.AuthorityKey, generation, ownerGeneration uint64) *actor.PID {
	return actor.NewPID(address, objectPIDName(key, generation, ownerGeneration))
}

// sessionSealState is where one bound participant's seal request stands.
type sessionSealState uint8

const (
	sessionUnasked sessionSealState = iota
	sessionAsked                    // 42 sent, no answer yet (a seal may be installed)
	sessionSealed                   // answered sealed
	sessionRefused                  // answered with a refusal: nothing installed
)

// sessionBound reports whether a participant of the move is bound to a
// Session.
func (r *sourceRun) sessionBound() bool {
	for _, p := range r.parts {
		if p.obj.session != nil {
			return true
		}
	}
	return false
}

// prepareBound reports whether a Restore request names a bound participant.
func prepareBound(p *messages.RelocationPrepare) bool {
	if p.GetSession() != nil {
		return true
	}
	for _, m := range p.GetMembers() {
		if m.GetSession() != nil {
			return true
		}
	}
	return false
}

// sealSessions sends command 42 for every bound participant; the answers
// come to the driver (onSessionSealReply). The machine bounds the wait
// (TimerSessionSeal, then LookUpSessionOwners).
func (d *Driver) sealSessions(r *sourceRun) handoff.Event {
	id := r.m.Identity()
	asked := map[string]bool{} // Session owner address → its node is no live member (the timer's look)
	for _, p := range r.parts {
		b := p.obj.session
		if b == nil {
			continue
		}
		asked[b.GetOwnerAddress()] = false
		p.session = sessionAsked
		r.sessionsAwaiting++
		d.send(SessionOwnerPID(b.GetOwnerAddress()), &messages.SessionSeal{
			Identity:    id.ToProto(),
			SessionId:   b.GetSessionId(),
			ActorId:     p.obj.key.ID,
			SourceRoute: d.routeOf(p.obj),
		})
	}
	if r.sessionsAwaiting == 0 {
		return handoff.SessionsSealed{}
	}
	return nil
}

// lookUpSessionOwners answers the machine's LookUpSessionOwners once its
// seal wait ran out: silence from a Session owner whose node is no live
// member any more is a binding with no Session behind it (a node's
// Sessions end with its lifecycle), so the binding is dropped, not waited
// for. Asked off the driver's goroutine (the look may read the store),
// about the addresses still silent: the parts are the driver's.
func (d *Driver) lookUpSessionOwners(r *sourceRun) {
	id := r.m.Identity()
	gone := map[string]bool{}
	for _, p := range r.parts {
		if b := p.obj.session; b != nil && p.session == sessionAsked {
			gone[b.GetOwnerAddress()] = false
		}
	}
	wait := d.cfg.Handoff.SessionSealWait
	go func() {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, wait)
		for address := range gone {
			_, err := d.node.PeerAt(ctx, address)
			gone[address] = errors.Is(err, meshnode.ErrNotMember)
		}
		cancel()
		d.sys.Root.Send(d.self, &localCall{fn: func() {
			if cur := d.sources[id.RelocationID]; cur != r || r.sessionsAwaiting == 0 {
				return
			}
			for _, p := range r.parts {
				if b := p.obj.session; b != nil && p.session == sessionAsked && gone[b.GetOwnerAddress()] {
					d.dropBinding(r, p, "its Session owner's node is no live member of the mesh")
				}
			}
			d.stepSource(r, handoff.SessionOwnersLooked{Silent: r.sessionsAwaiting > 0})
		}})
	}()
}

// dropBinding forgets participant p's Session binding during the move r:
// its Session is gone (closed, or ended with its owner node's lifecycle),
// so nothing holds or sends the client's messages for it, and a binding
// kept would make every later move of the Actor ask it in vain — an Actor
// that could never be moved or drained again. The move goes on unbound;
// its target's record carries no binding (docs/SESSIONS.md §2).
func (d *Driver) dropBinding(r *sourceRun, p *sourcePart, why string) {
	b := p.obj.session
	d.log.Info().Str("event", "session_binding_dropped").Str("object_id", p.obj.key.ID).Str("session_id", b.GetSessionId()).
		Str("session_owner", b.GetOwnerAddress()).Uint64("relocation_id", r.m.Identity().RelocationID).
		Msg("the Actor's Session is gone (" + why + "); it moves unbound")
	p.obj.session = nil
	p.session = sessionUnasked
	r.sessionsAwaiting--
}

// routeOf is the binding route of obj's incarnation here.
func (d *Driver) routeOf(obj *object) *messages.SessionRoute {
	return &messages.SessionRoute{Address: d.desc.GetAddress(), OwnerGeneration: obj.ownerGeneration, ObjectGeneration: obj.generation, NodeRid: d.desc.GetNodeRid()}
}

// onSessionSealReply takes a Session owner's answer to command 42, only
// from the Session owner the participant's binding names.
func (d *Driver) onSessionSealReply(c actor.Context, m *messages.SessionSealReply) {
	id := handoff.IdentityFromProto(m.GetIdentity())
	r := d.sources[id.RelocationID]
	if r == nil || r.m.Identity() != id || r.sessionsAwaiting == 0 {
		return // late, or a duplicate
	}
	var part *sourcePart
	for _, p := range r.parts {
		if b := p.obj.session; b != nil && p.obj.key.ID == m.GetActorId() && b.GetSessionId() == m.GetSessionId() {
			part = p
		}
	}
	if part == nil || part.session != sessionAsked {
		return
	}
	if s := c.Sender(); s == nil || s.Address != part.obj.session.GetOwnerAddress() {
		d.log.Warn().Str("event", "reply_from_wrong_peer").Uint64("relocation_id", id.RelocationID).Msg("seal reply ignored: not from the binding's Session owner")
		return
	}
	if m.GetCode() == roamerr.CodeNotFound {
		// The Session owner has no such Session binding the Actor: closed,
		// or its node started again since.
		d.dropBinding(r, part, "the Session owner answered: "+m.GetDetail())
		if r.sessionsAwaiting == 0 {
			d.stepSource(r, handoff.SessionsSealed{})
		}
		return
	}
	r.sessionsAwaiting--
	if m.GetCode() != "" {
		part.session = sessionRefused
		r.sessionsAwaiting = 0
		d.stepSource(r, handoff.SessionsSealed{Err: fmt.Errorf("the Session owner refused to seal the binding of Actor %q: %w",
			part.obj.key.ID, roamerr.FromCode(m.GetCode(), m.GetDetail()))})
		return
	}
	part.session = sessionSealed
	if r.sessionsAwaiting == 0 {
		d.stepSource(r, handoff.SessionsSealed{})
	}
}

// abortSessions sends command 44 to the Session owner of every
// participant whose seal may be installed, once that participant's queue
// is restored (a participant whose seal is still pending sends it when the
// seal is undone: unsealLate).
func (d *Driver) abortSessions(r *sourceRun) {
	for _, p := range r.parts {
		if p.obj.session == nil || p.session == sessionUnasked || p.session == sessionRefused {
			continue
		}
		if p.Sealed && !p.Captured {
			p.abortLater = r.m.Identity()
			continue
		}
		d.sendSessionAbort(p, r.m.Identity())
	}
}

func (d *Driver) sendSessionAbort(p *sourcePart, id handoff.Identity) {
	b := p.obj.session
	d.send(SessionOwnerPID(b.GetOwnerAddress()), &messages.RelocationAbort{
		Identity: id.ToProto(), SessionId: b.GetSessionId(), ActorId: p.obj.key.ID,
	})
}

// updateSessionRoutes sends command 43 for every bound participant that
// arrived: its route is this node's incarnation now.
func (d *Driver) updateSessionRoutes(t *targetRun) {
	id := t.m.Identity().ToProto()
	objs := []*object{t.obj}
	for _, m := range t.members {
		objs = append(objs, m.obj)
	}
	for _, obj := range objs {
		if obj == nil || obj.session == nil {
			continue
		}
		d.send(SessionOwnerPID(obj.session.GetOwnerAddress()), &messages.SessionRouteUpdate{
			Identity: id, SessionId: obj.session.GetSessionId(), ActorId: obj.key.ID, TargetRoute: d.routeOf(obj),
		})
	}
}

// SpawnBound creates the relocatable Actor id of a registered kind on this
// node, bound to the client Session b whose pushes go to sessionPID. Its
// first message is a SessionBound naming them; the binding moves with it.
// The route the Session owner binds is the returned Route.
func (d *Driver) SpawnBound(ctx context.Context, stableType, id string, b *messages.SessionBinding, sessionPID *actor.PID) (*actor.PID, *messages.SessionRoute, error) {
	if b.GetSessionId() == "" || b.GetOwnerAddress() == "" {
		return nil, nil, fmt.Errorf("%w: a Session binding needs the Session's ID and owner address", roamerr.ErrInvalidOperation)
	}
	var route *messages.SessionRoute
	pid, err := d.spawnWith(ctx, location.Key(location.KindActor, id), stableType, nil, b, func(obj *object) {
		obj.session = b
		route = d.routeOf(obj)
		d.sys.Root.Send(obj.pid, &messages.SessionBound{SessionId: b.GetSessionId(), Session: &messages.PID{Address: sessionPID.Address, Id: sessionPID.Id}})
	})
	if err != nil {
		return nil, nil, err
	}
	return pid, route, nil
}

// BoundRoute is where the store says the Actor id serves (its owner's
// address, lifecycle and generations), and whether that owner's lifecycle
// is alive and reachable (an owner seen gone only just now is not yet
// alive nor ended, and one whose connection ended or that said it is
// leaving is alive only if it answers now: false otherwise).
// The Session owner's look for a bound Actor whose route went down.
func (d *Driver) BoundRoute(ctx context.Context, id string) (route *messages.SessionRoute, alive bool, err error) {
	v, err := d.store.Read(ctx, location.Key(location.KindActor, id))
	if err != nil {
		return nil, false, err
	}
	owner := v.Record.GetOwner()
	address, alive, err := d.OwnerNode(ctx, owner)
	if err != nil {
		alive = false
	}
	if alive && address != d.sys.Address() && d.Departed(address, owner.GetNodeRid()) {
		// A killed node's descriptor stays until its lease is revoked:
		// alive only if it answers (which makes the connection again),
		// and as the owner's lifecycle (a node started again under the
		// address has no incarnation of it), else what the Session
		// releases there would be dropped.
		l, perr := d.Load(ctx, address, "")
		alive = perr == nil && l.Node.GetNodeRid() == owner.GetNodeRid() && l.Node.GetNodeGeneration() == owner.GetNodeGeneration()
	}
	return &messages.SessionRoute{Address: address, OwnerGeneration: v.Record.GetAuthorityOwnerGeneration(),
		ObjectGeneration: v.Record.GetObjectGeneration(), NodeRid: owner.GetNodeRid()}, alive, nil
}
