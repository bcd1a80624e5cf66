package relocation

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/spawn"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// The Actor lifecycle (docs/PROTOCOL.md §7.10): an Actor is a member of
// its node's Entry Spot or of a User Spot incarnation. A User Spot's
// record counts its members (member_count), changed in the same
// transaction as every membership, so Close needs no list of the Actors.

// memberUserSpot is the User Spot rec is a member of, or nil for an Entry
// Spot member (or none).
func memberUserSpot(rec *location.Record) *messages.Membership {
	return handoff.UserSpotOf(rec, meshnode.IsEntrySpotID)
}

// leaveOps reads the User Spot rec is a member of for handoff.LeaveOps.
func (d *Driver) leaveOps(ctx context.Context, rec *location.Record) ([]location.Op, error) {
	ms := memberUserSpot(rec)
	if ms == nil {
		return nil, nil
	}
	key := location.Key(location.KindUserSpot, ms.GetSpotId())
	v, err := d.store.Read(ctx, key)
	if found, err := handoff.RecordRead(key, err); !found {
		return nil, err
	}
	return handoff.LeaveOps(ms, v), nil
}

// membershipRetry runs handoff.MembershipRetry's answer: nil after its
// pause to read again and retry, else the error to return.
func membershipRetry(ctx context.Context, what string, try int, err error) error {
	pause, fail := handoff.MembershipRetry(what, try, err, rand.IntN)
	if fail != nil {
		return fail
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %s: %w", roamerr.ErrDeadlineExceeded, what, ctx.Err())
	case <-machine.After(machine.Real, pause): // pacing
		return nil
	}
}

// pauseUnlessStopped waits for pause on the node's clock: false when the
// node stopped first. The pause is part of what a recovery takes (a
// restore tried again a second, then two, … later), which a node whose
// time is not the real one measures on its own clock like the rest.
func (d *Driver) pauseUnlessStopped(pause time.Duration) bool {
	fire, t := machine.NewTimer(d.clock, pause)
	defer t.Stop()
	select {
	case <-d.node.Stopped():
		return false
	case <-fire:
		return true
	}
}

// DeleteActor ends the Actor key for good, on its owner (this node): its
// incarnation handles the messages it accepted, stops, and its record goes
// with its membership, in one transaction; the ID can then be spawned
// again. Messages sent after it end as stale or NotFound. False when there
// is no such Actor; NotFound when this node is not its owner;
// Unavailable while it moves or its membership changes.
//
// Once the incarnation is marked closed, the delete runs to its end on its
// own: a record left Ready with nothing serving it would be an object no
// one can reach, move or drain (and a SpotWide Spot counting it could not
// move). It waits for the accepted turns, then retries the record's delete
// past conflicts with other changes of the Spot's count and past store
// faults until it lands. A caller whose context ends first hears
// DeadlineExceeded while it goes on; a second delete meanwhile waits for
// the first.
func (d *Driver) DeleteActor(ctx context.Context, key location.AuthorityKey) (bool, error) {
	if err := d.servingWithin(ctx); err != nil {
		return false, err
	}
	// A move into this node that committed opens just after: its
	// incarnation is the one to close.
	if err := d.arrived(ctx, key); err != nil {
		return false, err
	}
	v, found, err := d.readActor(ctx, key)
	if err != nil || !found {
		return false, err
	}
	if err := handoff.OwnedHere(key, v, found, d.owner()); err != nil {
		return false, err
	}
	del, err := call(ctx, d, func() (*deletion, error) {
		if del := d.deletions[key]; del != nil {
			return del, nil
		}
		obj := d.objects[key]
		closeIt, err := spawn.AdmitDelete(key, v.Record.GetObjectGeneration(), d.here(key, func() bool { return d.hosts(key, v.Record.GetObjectGeneration()) }),
			d.desc.GetNodeRid(), d.stopping)
		if err != nil {
			return nil, err
		}
		if closeIt {
			// Closed from here on, in the same step that registers the
			// deletion: no move, join or second delete starts on it.
			d.setState(obj, ended)
			obj.closing = true
		} else {
			obj = nil // nothing serves the record here: only the record goes
		}
		del := &deletion{done: make(chan struct{}), spot: memberUserSpot(v.Record).GetSpotId()}
		d.deletions[key] = del
		go d.runDeletion(del, key, obj, v)
		return del, nil
	})
	if err != nil {
		return false, err
	}
	select {
	case <-del.done:
		return del.result.done, del.result.err
	case <-ctx.Done():
		return false, fmt.Errorf("%w: delete %s: its incarnation is closing; its record is deleted once its accepted turns ran and the store takes the delete: %w", roamerr.ErrDeadlineExceeded, key, ctx.Err())
	}
}

// deletion is one DeleteActor in progress; done is closed once it ended,
// with its outcome.
type deletion struct {
	done chan struct{}
	// spot is the User Spot the Actor is a member of, or "": a SpotWide
	// Spot waits for its members' deletions before it moves.
	spot   string
	result deleteResult
}

// runDeletion closes obj (nil: no incarnation serves here), waiting for
// what it accepted, then deletes its record read as v.
func (d *Driver) runDeletion(del *deletion, key location.AuthorityKey, obj *object, v location.Versioned) {
	var r deleteResult
	if obj != nil {
		// Its accepted turns may take long; only the node's end cuts
		// the wait (the incarnation then goes with the actor system).
		ctx, cancel := d.untilStopped()
		r.err = d.closeEnded(ctx, obj)
		cancel()
	} else if k, ok := d.kind(v.Record.GetStableType()); ok && k.Checkpointed() {
		// no incarnation here: its checkpoint goes all the same
		d.forgetCheckpoint(key, v.Record.GetObjectGeneration(), v.Record.GetAuthorityOwnerGeneration(), v.Record.GetStableType())
	}
	if r.err == nil {
		r = d.deleteRecord(key, v)
	}
	// The result is delivered once: on the driver's goroutine, or here
	// when the node stopped. call returns its error on a stopped node even
	// while the driver still runs fn, so both may try (a second close of
	// done panicked); only the driver's goroutine touches the map.
	var once sync.Once
	deliver := func() {
		once.Do(func() {
			del.result = r
			close(del.done)
		})
	}
	if _, err := call(context.Background(), d, func() (struct{}, error) {
		delete(d.deletions, key)
		deliver()
		return struct{}{}, nil
	}); err != nil {
		deliver() // the driver has stopped; its entry goes with it
	}
}

type deleteResult struct {
	done bool
	err  error
}

// deleteRecord deletes the record of the Actor key, read as v, whose
// incarnation on this node has closed (or never served here), with its
// place in its User Spot's count and its capacity slot. It returns once
// the record is gone (or is another incarnation's: an ID spawned again),
// owned by another lifecycle, or this node has stopped (the record is
// then an ended owner's object, released as such).
func (d *Driver) deleteRecord(key location.AuthorityKey, v location.Versioned) deleteResult {
	x := &spawn.Delete{Key: key, Owner: d.owner(), At: v}
	for try := 0; ; try++ {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.RestoreTimeout)
		step := x.Wrote(d.tryDelete(ctx, key, x.At))
		if step == spawn.Reread {
			cur, found, rerr := d.readActor(ctx, key)
			step = x.Reread(cur, found, rerr)
		}
		cancel()
		switch step {
		case spawn.Deleted:
			d.freedRecordSlot(x.At.Record)
			d.log.Info().Str("event", "actor_deleted").Str("object_id", key.ID).Msg("Actor deleted")
			return deleteResult{done: true}
		case spawn.Over:
			done, err := x.Result()
			return deleteResult{done: done, err: err}
		}
		pause, warn := x.Pause(try, rand.IntN)
		if warn {
			d.log.Warn().Str("event", "actor_delete_retry").Str("object_id", key.ID).Int("try", try+1).Err(x.Err()).
				Msg("the Actor's incarnation has closed; deleting its record failed, trying again")
		}
		if !d.pauseUnlessStopped(pause) {
			return deleteResult{err: x.Stopped(d.desc.GetNodeRid())}
		}
	}
}

// tryDelete is one transaction of deleteRecord.
func (d *Driver) tryDelete(ctx context.Context, key location.AuthorityKey, v location.Versioned) error {
	ops, err := d.leaveOps(ctx, v.Record)
	if err != nil {
		return err
	}
	ops = append(ops, FreeRecordSlotOps(v.Record)...)
	_, err = d.store.Apply(ctx, append(ops, location.DeleteOp(key, v.Version)))
	return err
}

// LeaveSpot takes the Actor key, owned by this node, out of the User Spot
// it is a member of: it becomes a member of this node's Entry Spot and
// serves on. InvalidOperation when it is no User Spot's member; NotFound
// when this node does not own it.
func (d *Driver) LeaveSpot(ctx context.Context, key location.AuthorityKey) error {
	if err := d.servingWithin(ctx); err != nil {
		return err
	}
	for try := 0; ; try++ {
		v, found, err := d.readActor(ctx, key)
		if err == nil {
			err = handoff.OwnedHere(key, v, found, d.owner())
		}
		if err == nil {
			err = handoff.Member(key, v, meshnode.IsEntrySpotID)
		}
		if err != nil {
			return err
		}
		if err := d.arrived(ctx, key); err != nil {
			return err
		}
		obj, release, err := d.holdHere(ctx, key)
		if err != nil {
			return err
		}
		ops, err := d.leaveOps(ctx, v.Record)
		if err != nil {
			release()
			return err
		}
		_, err = d.store.Apply(ctx, handoff.LeaveTxn(key, v, d.desc.GetEntrySpotId(), ops))
		if err == nil {
			d.setMember(obj, nil)
		}
		release()
		if err == nil {
			return nil
		}
		// A conflict on the Actor's own record is a move that committed
		// meanwhile: read again, it is then not ours.
		if err := membershipRetry(ctx, "leave "+key.String(), try, err); err != nil {
			return err
		}
	}
}

// readActor reads the record of the Actor key: found false when there is
// none; InvalidOperation when key names no Actor.
func (d *Driver) readActor(ctx context.Context, key location.AuthorityKey) (location.Versioned, bool, error) {
	if err := handoff.ActorKey(key); err != nil {
		return location.Versioned{}, false, err
	}
	v, err := d.store.Read(ctx, key)
	found, err := handoff.RecordRead(key, err)
	return v, found, err
}

// admitJoin runs admit.Join on the driver's goroutine, before anything of
// the move is installed, with the User Spot as this node sees it.
func (d *Driver) admitJoin(key location.AuthorityKey, join *messages.Membership) error {
	spot := admit.Spot{}
	if obj := d.objects[location.Key(location.KindUserSpot, join.GetSpotId())]; obj != nil {
		spot = admit.Spot{Here: true, Serving: obj.state == serving, Generation: obj.generation, Moving: obj.r().out != nil}
	} else {
		spot.Arriving = d.arriving(location.Key(location.KindUserSpot, join.GetSpotId())) != nil
	}
	return admit.Join(key, join, spot, meshnode.IsEntrySpotID)
}

// JoinSpot makes the Actor key, owned by this node, a member of the User
// Spot incarnation join (PROTOCOL.md §7.10). When this node serves that
// Spot, one transaction changes both memberships. Otherwise the Actor moves
// to the Spot's owner with the ordinary hand-off, admitted there by the
// Spot, and the target's commit changes its owner and both memberships
// together. Either way the Actor's first message after the commit is its
// Join callback, messages.JoinedSpot. Already a member: nothing happens.
// Stale when the Spot is not Ready at that generation, or changed before a
// cross-node commit (the Actor then stays where it landed, in the Spot it
// was in); NotFound when this node does not own the Actor.
func (d *Driver) JoinSpot(ctx context.Context, key location.AuthorityKey, join *messages.Membership) (Outcome, error) {
	if err := d.servingWithin(ctx); err != nil {
		return Outcome{}, err
	}
	spotKey := location.Key(location.KindUserSpot, join.GetSpotId())
	if err := spotKey.Validate(); err != nil || meshnode.IsEntrySpotID(join.GetSpotId()) {
		return Outcome{}, fmt.Errorf("%w: %q names no User Spot", roamerr.ErrInvalidOperation, join.GetSpotId())
	}
	self := d.desc.GetNodeRid()
	for try := 0; ; try++ {
		v, found, err := d.readActor(ctx, key)
		if err == nil {
			err = handoff.OwnedHere(key, v, found, d.owner())
		}
		if err != nil {
			return Outcome{}, err
		}
		out := Outcome{Key: key, From: self, To: self}
		if handoff.SameMembership(memberUserSpot(v.Record), join) {
			return out, nil
		}
		sv, err := d.store.Read(ctx, spotKey)
		if err := handoff.JoinTarget(join, sv, err); err != nil {
			return out, err
		}
		if owner := sv.Record.GetOwner().GetNodeRid(); owner != self {
			return d.joinAcross(ctx, key, owner, join)
		}
		// Both may have moved here just now and be about to open.
		if err := d.arrived(ctx, spotKey); err != nil {
			return out, err
		}
		if err := d.arrived(ctx, key); err != nil {
			return out, err
		}
		obj, release, err := d.holdHere(ctx, key)
		if err != nil {
			return out, err
		}
		if _, err := call(ctx, d, func() (struct{}, error) { return struct{}{}, d.admitJoin(key, join) }); err != nil {
			release()
			return out, err
		}
		done, err := d.joinBegins(ctx, join, sv.Record.GetStableType(), self)
		if err != nil {
			release()
			return out, err
		}
		leave, err := d.leaveOps(ctx, v.Record)
		if err != nil {
			done()
			release()
			return out, err
		}
		ops, next := handoff.JoinOps(key, v, join, sv, leave)
		_, err = d.store.Apply(ctx, ops)
		if err == nil {
			d.setMember(obj, next.Membership)
			// After the commit, on the Actor's own queue, while no move of
			// it can start: a later move carries it ahead of its own.
			d.sys.Root.Send(obj.pid, &messages.JoinedSpot{SpotId: join.GetSpotId(), SpotGeneration: join.GetSpotGeneration()})
		}
		done()
		release()
		if err == nil {
			d.log.Info().Str("event", "actor_joined").Str("object_id", key.ID).Str("spot_id", join.GetSpotId()).Msg("Actor joined a User Spot")
			return out, nil
		}
		if err := membershipRetry(ctx, "join "+key.String(), try, err); err != nil {
			return out, err
		}
		// A count changed (another join or leave), the Spot moved, or the
		// Actor did: read again.
	}
}

// joinAcross is JoinSpot when the Spot's owner is another node: a move
// there that carries the Join, which that node admits and commits.
func (d *Driver) joinAcross(ctx context.Context, key location.AuthorityKey, owner string, join *messages.Membership) (Outcome, error) {
	out, err := d.relocate(ctx, key, owner, moveSpec{join: join})
	if err != nil {
		return out, err
	}
	after, found, err := d.readActor(ctx, key)
	switch {
	case err != nil:
		return out, err
	case !found || !handoff.SameMembership(after.Record.GetMembership(), join):
		return out, fmt.Errorf("%w: %s moved to node %s, but User Spot %q changed before the commit; it did not join", roamerr.ErrStale, key, out.To, join.GetSpotId())
	}
	return out, nil
}

// holdHere is this node's serving incarnation of key, not moving, held
// in place until release is called: a membership changes only under its
// owner's serving incarnation, and no move of it starts meanwhile (a move
// sealed before the write lands would carry a callback for a membership
// its target's commit then changes again). Unavailable otherwise.
func (d *Driver) holdHere(ctx context.Context, key location.AuthorityKey) (obj *object, release func(), err error) {
	// Not bounded by ctx: a call given up would still run later and hold
	// the object with no one to release it. The driver answers at once.
	if d.beforeHold != nil {
		d.beforeHold()
	}
	obj, err = call(context.Background(), d, func() (*object, error) {
		obj := d.objects[key]
		if obj == nil || obj.state != serving || obj.r().out != nil {
			return nil, fmt.Errorf("%w: %s is moving or not active here", roamerr.ErrUnavailable, key)
		}
		obj.x().changing++
		return obj, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return obj, func() { d.loop.Post(func() { obj.x().changing-- }) }, nil
}

// setMember records, on the driver goroutine, the User Spot membership
// obj's record now names (nil: none).
func (d *Driver) setMember(obj *object, m *messages.Membership) {
	if m != nil && meshnode.IsEntrySpotID(m.GetSpotId()) {
		m = nil
	}
	d.loop.Post(func() { obj.x().member = m })
}
