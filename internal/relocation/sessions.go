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

// sessionBound reports whether a participant of the move is bound to a
// Session.
func (r *sourceRun) sessionBound() bool {
	for _, p := range r.parts {
		if p.obj.r().session != nil {
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

// The source's Session calls are decided by its interpreter
// (sourcerun/sessions.go: who is asked, what a missing owner, a refusal or
// silence means, when the abort goes); these are its primitives.

func (e sourceEnv) BoundTo(i int) (owner, actor string) {
	obj := e.obj(i)
	if obj.r().session == nil {
		return "", obj.key.ID
	}
	return obj.r().session.GetOwnerAddress(), obj.key.ID
}

func (e sourceEnv) SendSessionSeal(i int) {
	obj := e.obj(i)
	b := obj.r().session
	e.d.send(SessionOwnerPID(b.GetOwnerAddress()), &messages.SessionSeal{
		Identity:    e.r.m.Identity().ToProto(),
		SessionId:   b.GetSessionId(),
		ActorId:     obj.key.ID,
		SourceRoute: e.d.routeOf(obj),
	})
}

func (e sourceEnv) SendSessionAbort(i int) {
	obj := e.obj(i)
	b := obj.r().session
	e.d.send(SessionOwnerPID(b.GetOwnerAddress()), &messages.RelocationAbort{
		Identity: e.r.m.Identity().ToProto(), SessionId: b.GetSessionId(), ActorId: obj.key.ID,
	})
}

// DropBinding forgets the participant's Session binding: its target's
// record carries none (docs/SESSIONS.md §2).
func (e sourceEnv) DropBinding(i int, why string) {
	obj := e.obj(i)
	b := obj.r().session
	e.d.log.Info().Str("event", "session_binding_dropped").Str("object_id", obj.key.ID).Str("session_id", b.GetSessionId()).
		Str("session_owner", b.GetOwnerAddress()).Uint64("relocation_id", e.r.m.Identity().RelocationID).
		Msg("the Actor's Session is gone (" + why + "); it moves unbound")
	if obj.rare != nil {
		obj.rare.session = nil
	}
}

// SessionOwnersGone asks the mesh off the driver's goroutine (the look
// may read the store) and answers on it.
func (e sourceEnv) SessionOwnersGone(owners []string) (map[string]bool, bool) {
	d, r := e.d, e.r
	id := r.m.Identity()
	wait := d.cfg.Handoff.SessionSealWait
	go func() {
		gone := map[string]bool{}
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, wait)
		for _, address := range owners {
			_, err := d.node.PeerAt(ctx, address)
			gone[address] = errors.Is(err, meshnode.ErrNotMember)
		}
		cancel()
		d.loop.Post(func() {
			if cur := d.sources[id.RelocationID]; cur == r {
				r.run.SessionOwnersLooked(gone)
			}
		})
	}()
	return nil, false
}

// routeOf is the binding route of obj's incarnation here.
func (d *Driver) routeOf(obj *object) *messages.SessionRoute {
	return &messages.SessionRoute{Address: d.desc.GetAddress(), OwnerGeneration: obj.ownerGeneration, ObjectGeneration: obj.generation, NodeRid: d.desc.GetNodeRid()}
}

// onSessionSealReply takes a Session owner's answer to command 42 to the
// participant it names; the sender is what the transport vouches for.
func (d *Driver) onSessionSealReply(c actor.Context, m *messages.SessionSealReply) {
	id := handoff.IdentityFromProto(m.GetIdentity())
	r := d.sources[id.RelocationID]
	if r == nil || r.m.Identity() != id {
		return // late
	}
	for i, p := range r.parts {
		if b := p.obj.r().session; b != nil && p.obj.key.ID == m.GetActorId() && b.GetSessionId() == m.GetSessionId() {
			from := ""
			if s := c.Sender(); s != nil {
				from = s.Address
			}
			var err error
			if m.GetCode() != "" {
				err = roamerr.FromCode(m.GetCode(), m.GetDetail())
			}
			r.run.SessionSealReply(i, from, err)
			return
		}
	}
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
		if obj == nil || obj.r().session == nil {
			continue
		}
		d.send(SessionOwnerPID(obj.r().session.GetOwnerAddress()), &messages.SessionRouteUpdate{
			Identity: id, SessionId: obj.r().session.GetSessionId(), ActorId: obj.key.ID, TargetRoute: d.routeOf(obj),
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
		obj.x().session = b
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
