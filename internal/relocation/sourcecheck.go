package relocation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The source check before the seal (PROTOCOL.md §5.2, §5.7). A move's
// target must read the object's record before it commits: the source must
// own the object at the move's fence. Read after the Restore request, as
// VerifySource does, that read stands between the seal and relay-ready —
// on Consul the longest part of a small move's pause. Asked for by the
// source after its admission and before its seal, it is off the pause:
// the target reads, keeps the record it judged, and the Restore request of
// the same move takes it instead of reading again. The commit's CAS is at
// that record's version, so nothing that changed the record since then
// can be overwritten.

// maxPrechecks bounds the records a target keeps for Restore requests to
// come; past it the oldest goes (its Restore request then reads again).
const maxPrechecks = 4096

// precheck is what a source check found, kept for its Restore request.
type precheck struct {
	v       location.Versioned // the record, judged to back the source
	object  *messages.ObjectRef
	address string // where the check came from
	expires time.Time
}

// prechecks are the source checks that passed and whose Restore request
// has not come yet, by move identity, oldest first in order.
type prechecks struct {
	byID  map[handoff.Identity]precheck
	order []handoff.Identity
	taken int // Restore requests that took a record (tests)
}

func (ps *prechecks) put(id handoff.Identity, pc precheck, now time.Time) {
	if ps.byID == nil {
		ps.byID = map[handoff.Identity]precheck{}
	}
	for len(ps.order) > 0 {
		first := ps.order[0]
		old, ok := ps.byID[first]
		if ok && len(ps.byID) < maxPrechecks && !now.After(old.expires) {
			break
		}
		delete(ps.byID, first)
		ps.order = ps.order[1:]
	}
	if _, ok := ps.byID[id]; !ok {
		ps.order = append(ps.order, id)
	}
	ps.byID[id] = pc
}

// take returns, and forgets, the record the source check of the Restore
// request p (from address) found: only for the same move, object and
// source address, and before the move's deadline.
func (ps *prechecks) take(id handoff.Identity, p *messages.RelocationPrepare, address string, now time.Time) (location.Versioned, bool) {
	pc, ok := ps.byID[id]
	if !ok {
		return location.Versioned{}, false
	}
	delete(ps.byID, id) // its place in order goes when it comes first
	o := p.GetObject()
	if pc.address != address || now.After(pc.expires) || pc.object.GetKind() != o.GetKind() || pc.object.GetId() != o.GetId() ||
		pc.object.GetObjectGeneration() != o.GetObjectGeneration() || pc.object.GetStableType() != o.GetStableType() {
		return location.Versioned{}, false
	}
	ps.taken++
	return pc.v, true
}

// onSourceCheck answers a source check: only one that carries a ticket of
// this node for its source, from the source's own address; the others are
// refused unanswered, as a Restore request without one is.
func (d *Driver) onSourceCheck(c actor.Context, q *messages.SourceCheck) {
	from := c.Sender()
	id := handoff.IdentityFromProto(q.GetIdentity())
	now := d.clock.Now()
	if from == nil || !id.Valid() || from.Address != q.GetSource().GetAddress() || !d.tickets.CheckOnce(q, from.Address, now) {
		address := ""
		if from != nil {
			address = from.Address
		}
		d.refused("source check", address, "no valid move ticket for its source, or one a check carried already")
		return
	}
	reply := func(err error) {
		r := &messages.SourceCheckReply{Identity: q.GetIdentity()}
		if err != nil {
			r.Code, r.Detail = roamerr.Code(err), err.Error()
		}
		d.send(PID(from.Address), r)
	}
	obj := q.GetObject()
	key := location.Key(obj.GetKind(), obj.GetId())
	// The source's deadline, but no later than one restore timeout of
	// this node's from now: the sender chooses it, and the check's tries
	// and the record kept last until it.
	deadline := time.UnixMilli(q.GetRestoreDeadlineUnixMillis())
	if limit := now.Add(d.cfg.RestoreTimeout); deadline.After(limit) {
		deadline = limit
	}
	if _, ok := d.kind(obj.GetStableType()); !ok || key.Validate() != nil || !Movable(key.Kind) {
		reply(fmt.Errorf("%w: this node does not host %s of type %q", roamerr.ErrInvalidOperation, key, obj.GetStableType()))
		return
	}
	switch {
	case d.stopping || d.node.Draining():
		reply(fmt.Errorf("%w: %w: node %s takes no move in", roamerr.ErrUnavailable, roamerr.ErrNodeDraining, d.desc.GetNodeRid()))
		return
	case !d.node.Valid():
		reply(fmt.Errorf("%w: the target node's owner lease is not in force", roamerr.ErrUnavailable))
		return
	case !now.Before(deadline):
		reply(fmt.Errorf("%w: the move's restore deadline has passed", roamerr.ErrDeadlineExceeded))
		return
	}
	// The tries end halfway to the move's restore deadline: a check that
	// took longer would leave the move too little of it after the seal.
	sc := &sourceCheck{id: id, q: q, address: from.Address, until: now.Add(deadline.Sub(now) / 2)}
	sc.done = func(v location.Versioned, err error) {
		delete(d.checkNext, id)
		if err == nil {
			d.prechecks.put(id, precheck{v: v, object: obj, address: from.Address, expires: deadline}, d.clock.Now())
		} else if errors.Is(err, roamerr.ErrStale) {
			d.log.Warn().Str("event", "stale_relocation").Str("object_id", key.ID).Uint64("relocation_id", id.RelocationID).Err(err).
				Msg("a source check names a source that is not the owner the store names; the move is refused before its seal")
		}
		reply(err)
	}
	d.trySourceCheck(sc, 0)
}

// sourceCheck is one source check under way on the target.
type sourceCheck struct {
	id      handoff.Identity
	q       *messages.SourceCheck
	address string    // where it came from
	until   time.Time // its tries end here
	done    func(location.Versioned, error)
}

// trySourceCheck makes one try of c off the driver goroutine and judges
// it on it: an answer that says nothing of the source is tried again as
// VerifySource tries (handoff.VerifyAgain), on the node's clock, until
// c.until; then it is Unavailable. A record that does not back the source
// is Stale.
func (d *Driver) trySourceCheck(c *sourceCheck, prev time.Duration) {
	machine.Go(func() {
		ctx, cancel := machine.WithDeadline(context.Background(), d.clock, c.until)
		defer cancel()
		v, peer, err := d.checkSource(ctx, c.id, c.q, c.address)
		d.loop.Post(func() {
			again, wait := handoff.VerifyAgain(err, peer, prev)
			if !again {
				c.done(v, roamerr.Wrap(roamerr.ErrStale, "source check", err))
				return
			}
			pause, expired := handoff.VerifyPause(d.clock.Now(), c.until, wait)
			if expired {
				c.done(v, roamerr.Keep(roamerr.ErrUnavailable, "source check: nothing said whether the store backs the source in time", err))
				return
			}
			if d.checkNext == nil {
				d.checkNext = map[handoff.Identity]func(){}
			}
			d.checkNext[c.id] = func() { d.trySourceCheck(c, wait) }
			d.startTimer(timerKey{target: c.id, check: true}, handoff.StartTimer{After: pause})
		})
	})
}

// checkSource is one try of the check VerifySource makes: the source's
// node is a live member at address (peer: that check failed), and the
// record names it at the move's fence.
func (d *Driver) checkSource(ctx context.Context, id handoff.Identity, q *messages.SourceCheck, address string) (v location.Versioned, peer bool, err error) {
	src, obj := q.GetSource(), q.GetObject()
	if err := d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), address); err != nil {
		return v, true, err
	}
	v, err = d.store.Read(ctx, location.Key(obj.GetKind(), obj.GetId()))
	switch {
	case errors.Is(err, location.ErrNotFound):
		return v, false, id.JudgeSource(handoff.RecordView{}, obj.GetObjectGeneration())
	case err != nil:
		return v, false, err
	}
	return v, false, id.JudgeSource(handoff.ViewOf(v), obj.GetObjectGeneration())
}

// CheckSource asks the move's target to check the source before the seal.
func (e sourceEnv) CheckSource() {
	d, r := e.d, e.r
	key := r.obj.key
	d.send(r.targetPID, &messages.SourceCheck{
		Identity:                  r.wire.of(r.m.Identity()),
		Object:                    &messages.ObjectRef{Kind: key.Kind, Id: key.ID, ObjectGeneration: r.obj.generation, StableType: r.obj.kind.StableType},
		Source:                    d.selfRef(),
		MoveTicket:                r.ticket,
		RestoreDeadlineUnixMillis: r.deadline.UnixMilli(),
	})
}

// sourceChecked is the event of the target's answer to a source check.
func sourceChecked(m *messages.SourceCheckReply) handoff.SourceChecked {
	if m.GetCode() == "" {
		return handoff.SourceChecked{}
	}
	return handoff.SourceChecked{Err: roamerr.FromCode(m.GetCode(), "target: "+m.GetDetail())}
}
