package relocation

import (
	"context"
	"errors"
	"fmt"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// ReleaseEnded is the operator's acceptance that an Actor whose owner ended
// (its node crashed, was cut off or stopped) lost its in-memory state: it
// deletes the ended owner's record by compare-and-set on the version read,
// so the Actor's ID can be spawned again. It returns false when there is no
// record; InvalidOperation while the owner is alive (spec 003: an ended
// owner's record is released only once its owner has provably ended).
func (d *Driver) ReleaseEnded(ctx context.Context, key location.AuthorityKey) (bool, error) {
	if err := d.Usable(); err != nil {
		return false, err
	}
	if key.Kind != location.KindActor {
		return false, fmt.Errorf("%w: %s is not an Actor", roamerr.ErrInvalidOperation, key)
	}
	if err := key.Validate(); err != nil {
		return false, fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	v, err := d.store.Read(ctx, key)
	switch {
	case errors.Is(err, location.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: read %s: %w", roamerr.ErrUnavailable, key, err)
	}
	_, alive, err := d.OwnerNode(ctx, v.Record.GetOwner())
	if err != nil {
		return false, fmt.Errorf("%w: read owner node %s: %w", roamerr.ErrUnavailable, v.Record.GetOwner().GetNodeRid(), err)
	}
	if alive {
		return false, fmt.Errorf("%w: %s has a live owner (node %s)", roamerr.ErrInvalidOperation, key, v.Record.GetOwner().GetNodeRid())
	}
	if _, err := d.store.Apply(ctx, []location.Op{location.DeleteOp(key, v.Version)}); err != nil {
		if errors.Is(err, location.ErrConflict) {
			return false, fmt.Errorf("%w: %s changed while it was being released", roamerr.ErrConflict, key)
		}
		return false, fmt.Errorf("%w: release %s: %w", roamerr.ErrUnavailable, key, err)
	}
	d.log.Warn().Str("event", "ended_owner_released").Str("object_id", key.ID).Str("owner_node_rid", v.Record.GetOwner().GetNodeRid()).
		Msg("an operator accepted the loss of an ended owner's Actor state")
	return true, nil
}

// OwnerNode finds an owner's node address and whether the owner's
// lifecycle still holds its lease: its descriptor exists with the same
// lease and node generation (this node's own lifecycle: while its lease
// has not ended; a fenced node may still hold it). The one liveness rule
// for ended owners (spec 003), shared with the Spot manager.
func (d *Driver) OwnerNode(ctx context.Context, o *messages.Owner) (address string, alive bool, err error) {
	if o.GetNodeRid() == d.desc.GetNodeRid() {
		return d.desc.GetAddress(), o.GetNodeGeneration() == d.desc.GetNodeGeneration() && d.Usable() == nil, nil
	}
	n, err := d.store.ReadNode(ctx, location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()})
	switch {
	case errors.Is(err, location.ErrNotFound):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return n.Node.GetAddress(), n.Node.GetLeaseId() == o.GetLeaseId() && n.Node.GetNodeGeneration() == o.GetNodeGeneration(), nil
}
