package relocation

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/meshnode"
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
	ms := rec.GetMembership()
	if ms.GetSpotId() == "" || meshnode.IsEntrySpotID(ms.GetSpotId()) {
		return nil
	}
	return ms
}

// leaveOps are the operations that take one member off the User Spot
// incarnation rec is a member of: its count, one less, at the version
// read. None when rec is no User Spot's member, or that incarnation is
// gone (a Spot released with its members, or created anew).
func (d *Driver) leaveOps(ctx context.Context, rec *location.Record) ([]location.Op, error) {
	ms := memberUserSpot(rec)
	if ms == nil {
		return nil, nil
	}
	key := location.Key(location.KindUserSpot, ms.GetSpotId())
	v, err := d.store.Read(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, roamerr.Keep(roamerr.ErrUnavailable, "read "+key.String(), err)
	}
	if v.Record.GetObjectGeneration() != ms.GetSpotGeneration() || v.Record.GetMemberCount() == 0 {
		return nil, nil
	}
	next := proto.Clone(v.Record).(*location.Record)
	next.MemberCount--
	return []location.Op{location.UpdateOp(key, v.Version, next)}, nil
}

// maxMembershipTries bounds the retries of a membership change that lost
// a race with another change of the same records.
const maxMembershipTries = 8

// DeleteActor ends the Actor key for good, on its owner (this node): its
// incarnation handles the messages it accepted, stops, and its record goes
// with its membership, in one transaction; the ID can then be spawned
// again. Messages sent after it end as stale or NotFound. False when there
// is no such Actor; NotFound when this node is not its owner;
// Unavailable while it moves.
func (d *Driver) DeleteActor(ctx context.Context, key location.AuthorityKey) (bool, error) {
	if err := d.serving(); err != nil {
		return false, err
	}
	v, found, err := d.readActor(ctx, key)
	switch {
	case err != nil || !found:
		return false, err
	case !activation.SameOwner(v.Record.GetOwner(), d.owner()):
		return false, fmt.Errorf("%w: %s is not owned by this node", roamerr.ErrNotFound, key)
	}
	// First the incarnation: what it accepted runs, later messages end
	// stale. A delete asked again after a failed store write finds it gone.
	if li, ok, err := d.Local(ctx, key); err != nil {
		return false, err
	} else if ok {
		if err := d.CloseLocal(ctx, key, li.Generation); err != nil {
			return false, err
		}
	} else if d.Hosts(key, v.Record.GetObjectGeneration()) {
		return false, fmt.Errorf("%w: %s is moving", roamerr.ErrUnavailable, key)
	}
	for try := 0; ; try++ {
		ops, err := d.leaveOps(ctx, v.Record)
		if err != nil {
			return false, err
		}
		_, err = d.store.Apply(ctx, append(ops, location.DeleteOp(key, v.Version)))
		if err == nil {
			d.log.Info().Str("event", "actor_deleted").Str("object_id", key.ID).Msg("Actor deleted")
			return true, nil
		}
		if !errors.Is(err, location.ErrConflict) || try == maxMembershipTries {
			return false, roamerr.Keep(roamerr.ErrUnavailable, "delete "+key.String(), err)
		}
		// The Spot's count moved (another member joined or left): read
		// both again. The Actor's own record cannot have moved on: its
		// incarnation is closed and only its owner writes it.
		if v, found, err = d.readActor(ctx, key); err != nil || !found {
			return false, err
		}
	}
}

// LeaveSpot takes the Actor key, owned by this node, out of the User Spot
// it is a member of: it becomes a member of this node's Entry Spot and
// serves on. InvalidOperation when it is no User Spot's member; NotFound
// when this node does not own it.
func (d *Driver) LeaveSpot(ctx context.Context, key location.AuthorityKey) error {
	if err := d.serving(); err != nil {
		return err
	}
	for try := 0; ; try++ {
		v, found, err := d.readActor(ctx, key)
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("%w: %s", roamerr.ErrNotFound, key)
		case !activation.SameOwner(v.Record.GetOwner(), d.owner()):
			return fmt.Errorf("%w: %s is not owned by this node", roamerr.ErrNotFound, key)
		case memberUserSpot(v.Record) == nil:
			return fmt.Errorf("%w: %s is no User Spot's member", roamerr.ErrInvalidOperation, key)
		}
		ops, err := d.leaveOps(ctx, v.Record)
		if err != nil {
			return err
		}
		next := proto.Clone(v.Record).(*location.Record)
		next.Membership = &messages.Membership{SpotId: d.desc.GetEntrySpotId(), SpotGeneration: 1}
		_, err = d.store.Apply(ctx, append(ops, location.UpdateOp(key, v.Version, next)))
		if err == nil {
			return nil
		}
		if !errors.Is(err, location.ErrConflict) || try == maxMembershipTries {
			// A conflict on the Actor's own record is a move that
			// committed meanwhile: read again, it is then not ours.
			return roamerr.Keep(roamerr.ErrUnavailable, "leave "+key.String(), err)
		}
	}
}

// readActor reads the record of the Actor key: found false when there is
// none; InvalidOperation when key names no Actor.
func (d *Driver) readActor(ctx context.Context, key location.AuthorityKey) (location.Versioned, bool, error) {
	if key.Kind != location.KindActor {
		return location.Versioned{}, false, fmt.Errorf("%w: %s is not an Actor", roamerr.ErrInvalidOperation, key)
	}
	if err := key.Validate(); err != nil {
		return location.Versioned{}, false, fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	v, err := d.store.Read(ctx, key)
	switch {
	case errors.Is(err, location.ErrNotFound):
		return v, false, nil
	case err != nil:
		return v, false, roamerr.Keep(roamerr.ErrUnavailable, "read "+key.String(), err)
	}
	return v, true, nil
}
