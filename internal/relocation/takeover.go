package relocation

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// TakeOver brings back on this node an Actor or User Spot whose owner
// ended, from v, its record as read (docs/FAULTS.md, "Checkpoints and
// recovery"): the caller has judged the owner ended and this node the one
// to recover it. The same incarnation comes back under the next owner
// generation — its ObjectGeneration stays, so a User Spot's members stay
// members and their Spot's member count stays exact — from its last
// checkpoint when fromCheckpoint, else from its producer.
//
// The record is written first, by compare-and-set on v's version (with a
// capacity slot of this node, and this node's Entry Spot for an Actor that
// was a member of the ended owner's): a node that loses the race to
// another recoverer, a call or an operator gets Conflict and leaves it.
// From then on the object is this node's: its incarnation is staged at
// once, so messages routed to it wait in its queue, and the checkpoint is
// claimed under the new owner generation (no capture of the ended owner
// can replace it afterwards) — again and again while the checkpoint store
// fails, for as long as this lifecycle lasts — before the state is
// restored and the queue opens. A bound Actor's Session owner is told the
// new route.
func (d *Driver) TakeOver(ctx context.Context, v location.Versioned, fromCheckpoint bool) error {
	if err := d.serving(); err != nil {
		return err
	}
	key, rec := v.Key, v.Record
	if key.Kind != location.KindActor && key.Kind != location.KindUserSpot {
		return fmt.Errorf("%w: %s: only Actors and User Spots are taken over here", roamerr.ErrInvalidOperation, key)
	}
	k, ok := d.kind(rec.GetStableType())
	if !ok {
		return fmt.Errorf("%w: stable type %q is not registered here", roamerr.ErrNotFound, rec.GetStableType())
	}
	if rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
		return fmt.Errorf("%w: %s is not Ready", roamerr.ErrInvalidOperation, key)
	}
	next := proto.Clone(rec).(*location.Record)
	next.Owner = d.owner()
	next.AuthorityOwnerGeneration = rec.GetAuthorityOwnerGeneration() + 1
	next.RelocationId = 0
	next.PreservesState = PreservesState(k.Policy)
	if key.Kind == location.KindActor && meshnode.IsEntrySpotID(rec.GetMembership().GetSpotId()) {
		// The ended owner's Entry Spot went with it.
		next.Membership = &messages.Membership{SpotId: d.desc.GetEntrySpotId(), SpotGeneration: 1}
	}
	if err := d.writeTakeOver(ctx, v, next); err != nil {
		return err
	}
	generation, owner := next.GetObjectGeneration(), next.GetAuthorityOwnerGeneration()
	staged, err := d.Stage(context.Background(), key, next.GetStableType(), generation, owner)
	if err != nil {
		// This lifecycle is ending: the record names an ended owner again,
		// and a live node takes it over.
		return err
	}
	var state []byte
	restore := false
	if fromCheckpoint {
		if state, restore, err = d.claimUntil(key, next.GetStableType(), generation, owner); err != nil {
			staged.Discard()
			return err
		}
	}
	if restore {
		rctx, cancel := context.WithTimeout(context.Background(), d.cfg.RestoreTimeout)
		err := staged.Restore(rctx, state)
		cancel()
		if err != nil {
			// The checkpoint is unusable to the application: it stays
			// stored, and the object serves from its producer, said loudly.
			d.log.Error().Str("event", "checkpoint_restore_failed").Str("object_id", key.ID).Str("stable_type", next.GetStableType()).Err(err).
				Msg("the recovered object's checkpoint could not be restored; it serves from its producer, without its state")
		}
	}
	var membership *messages.Membership
	if m := next.GetMembership(); m != nil && !meshnode.IsEntrySpotID(m.GetSpotId()) {
		membership = m
	}
	var session *messages.SessionBinding
	if next.GetSessionId() != "" {
		session = &messages.SessionBinding{SessionId: next.GetSessionId(), OwnerAddress: next.GetSessionOwnerAddress()}
	}
	if _, err := call(context.Background(), d, func() (struct{}, error) {
		staged.obj.member, staged.obj.session = membership, session
		return struct{}{}, nil
	}); err != nil {
		staged.Discard()
		return err
	}
	if err := staged.Open(context.Background(), nil, "", nil); err != nil {
		staged.Discard()
		return err
	}
	if session != nil {
		// Routed as a recovery: no move identity. The Session owner checks
		// the route against the store before it uses it.
		d.send(SessionOwnerPID(session.GetOwnerAddress()), &messages.SessionRouteUpdate{
			SessionId: session.GetSessionId(), ActorId: key.ID, TargetRoute: d.routeOf(staged.obj),
		})
	}
	return nil
}

// claimUntil claims key's checkpoint for the incarnation that took it
// over, trying again while the checkpoint store fails, until this
// lifecycle ends: the object is this node's, and its queue waits for its
// state. Stale when a newer owner holds the checkpoint (this takeover was
// overtaken).
func (d *Driver) claimUntil(key location.AuthorityKey, stableType string, generation, owner uint64) ([]byte, bool, error) {
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.RestoreTimeout)
		state, restore, err := d.ClaimCheckpoint(ctx, key, stableType, generation, owner)
		cancel()
		if err == nil || errors.Is(err, roamerr.ErrStale) {
			return state, restore, err
		}
		if try == 1 || try%20 == 0 {
			d.log.Warn().Str("event", "checkpoint_claim_failed").Str("object_id", key.ID).Int("attempt", try).Err(err).
				Msg("the recovered object's checkpoint could not be read; it waits, with its queue, and the claim is tried again")
		}
		if err := d.Usable(); err != nil {
			return nil, false, err
		}
		if !d.pauseUnlessStopped(storePause(try)) {
			return nil, false, fmt.Errorf("%w: the node stopped while %s waited for its checkpoint", roamerr.ErrUnavailable, key)
		}
	}
}

// writeTakeOver writes next over v (with a capacity slot of this node)
// and leaves in next what the store holds. An indeterminate answer is
// settled by consistent reads: the record written by this lifecycle under
// next's owner generation is this takeover's; one unchanged since v is
// written again (the lost write, should it land later, then conflicts);
// any other is Conflict.
func (d *Driver) writeTakeOver(ctx context.Context, v location.Versioned, next *location.Record) error {
	key := v.Key
	for attempt := 1; ; attempt++ {
		_, _, err := d.slots.Take(ctx, []location.AuthorityKey{key}, false, func(slots []uint32) []location.Op {
			WithSlot(next, slots, 0)
			return []location.Op{location.UpdateOp(key, v.Version, next)}
		})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, roamerr.ErrCapacityExceeded):
			return err
		case !errors.Is(err, location.ErrIndeterminate) && !errors.Is(err, location.ErrConflict):
			return roamerr.Keep(roamerr.ErrUnavailable, "take over "+key.String(), err)
		}
		cur, rerr := d.settleRead(ctx, key)
		switch {
		case rerr == nil && activationSameOwner(cur.Record.GetOwner(), next.GetOwner()) &&
			cur.Record.GetAuthorityOwnerGeneration() == next.GetAuthorityOwnerGeneration() && cur.Record.GetObjectGeneration() == next.GetObjectGeneration():
			proto.Reset(next)
			proto.Merge(next, cur.Record)
			return nil
		case rerr == nil && cur.Version == v.Version && errors.Is(err, location.ErrIndeterminate) && attempt < 5:
			continue
		case rerr != nil && !errors.Is(rerr, location.ErrNotFound):
			return roamerr.Keep(roamerr.ErrUnavailable, "settle the takeover of "+key.String(), errors.Join(err, rerr))
		}
		return roamerr.Wrap(roamerr.ErrConflict, key.String()+" changed while it was being taken over", err)
	}
}

// settleRead reads key consistently, trying again while the store fails,
// within ctx.
func (d *Driver) settleRead(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, d.cfg.RestoreTimeout)
		v, err := d.store.Read(rctx, key)
		cancel()
		if err == nil || errors.Is(err, location.ErrNotFound) || ctx.Err() != nil {
			return v, err
		}
		if !d.pauseUnlessStopped(storePause(try)) {
			return v, err
		}
	}
}

// activationSameOwner reports whether a and b are one owner lifecycle.
func activationSameOwner(a, b *messages.Owner) bool {
	return a.GetNodeRid() == b.GetNodeRid() && a.GetNodeGeneration() == b.GetNodeGeneration() && a.GetLeaseId() == b.GetLeaseId()
}
