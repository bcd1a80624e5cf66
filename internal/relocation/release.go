package relocation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// ReleaseEnded is the operator's acceptance that an Actor whose owner ended
// (its node crashed, was cut off or stopped) lost its in-memory state: it
// deletes the ended owner's record by compare-and-set on the version read,
// so the Actor's ID can be spawned again. It returns false when there is no
// record; InvalidOperation while the owner is alive (an ended owner's
// record is released only once its owner has provably ended,
// docs/PROTOCOL.md §7.10).
func (d *Driver) ReleaseEnded(ctx context.Context, key location.AuthorityKey) (bool, error) {
	if err := d.Usable(); err != nil {
		return false, err
	}
	v, found, err := d.readActor(ctx, key)
	if err != nil || !found {
		return false, err
	}
	_, alive, err := d.OwnerNode(ctx, v.Record.GetOwner())
	if err != nil {
		return false, roamerr.Keep(roamerr.ErrUnavailable, "read owner node "+v.Record.GetOwner().GetNodeRid(), err)
	}
	if alive {
		return false, fmt.Errorf("%w: %s has a live owner (node %s)", roamerr.ErrInvalidOperation, key, v.Record.GetOwner().GetNodeRid())
	}
	// The loss is accepted: its checkpoint must not come back either.
	if err := d.ForgetCheckpoint(ctx, key, v.Record); err != nil {
		return false, err
	}
	// A member leaves its User Spot's count in the same transaction.
	ops, err := d.leaveOps(ctx, v.Record)
	if err != nil {
		return false, err
	}
	// No capacity slot to free: the ended owner's went with its lease
	// (PROTOCOL.md §7.12).
	if _, err := d.store.Apply(ctx, append(ops, location.DeleteOp(key, v.Version))); err != nil {
		if errors.Is(err, location.ErrConflict) {
			return false, fmt.Errorf("%w: %s or its User Spot changed while it was being released", roamerr.ErrConflict, key)
		}
		return false, roamerr.Keep(roamerr.ErrUnavailable, "release "+key.String(), err)
	}
	d.log.Warn().Str("event", "ended_owner_released").Str("object_id", key.ID).Str("owner_node_rid", v.Record.GetOwner().GetNodeRid()).
		Msg("an operator accepted the loss of an ended owner's Actor state")
	return true, nil
}

// OwnerNode finds an owner's node address and whether the owner's
// lifecycle still holds its lease: its descriptor exists with the same
// lease and node generation (this node's own lifecycle: while its lease
// has not ended; a fenced node may still hold it). The one liveness rule
// for ended owners (PROTOCOL.md §3.4), shared with the Spot manager.
//
// A descriptor that is gone counts as an ended owner only once this node
// has seen it gone for a lease TTL (until then: Unavailable). The store
// can end a lease sooner than TTL after its last renewal — Consul destroys
// a session at once when the agent node it was created through leaves or
// is removed — while the owner, which counts from its last good renewal,
// may serve until that renewal's send time + TTL − margin. That renewal
// was applied before the lease ended, so before anyone saw the descriptor
// gone: a lease TTL after the first such sight, the owner has fenced
// itself (docs/FAULTS.md, "Lease fencing"). A descriptor with another
// lease or generation is a later lifecycle of the same node, which starts
// only after the node itself learnt that the old one ended.
func (d *Driver) OwnerNode(ctx context.Context, o *messages.Owner) (address string, alive bool, err error) {
	if o.GetNodeRid() == d.desc.GetNodeRid() {
		return d.desc.GetAddress(), o.GetNodeGeneration() == d.desc.GetNodeGeneration() && d.Usable() == nil, nil
	}
	n, err := d.store.ReadNode(ctx, location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()})
	switch {
	case errors.Is(err, location.ErrNotFound):
		if gone := d.goneFor(o); gone < d.node.LeaseTTL() {
			return "", false, fmt.Errorf("%w: %w: node %s seen gone for %s; its objects are taken over once it has been gone for the lease TTL (%s)",
				roamerr.ErrUnavailable, roamerr.ErrOwnerEnding, o.GetNodeRid(), gone.Round(time.Millisecond), d.node.LeaseTTL())
		}
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return n.Node.GetAddress(), n.Node.GetLeaseId() == o.GetLeaseId() && n.Node.GetNodeGeneration() == o.GetNodeGeneration(), nil
}

// goneFor reports how long this node has seen o's lifecycle's descriptor
// gone, counting from the first sight (monotonic clock).
func (d *Driver) goneFor(o *messages.Owner) time.Duration {
	key := o.GetNodeRid() + "/" + o.GetLeaseId()
	now := time.Now()
	d.goneMu.Lock()
	defer d.goneMu.Unlock()
	first, ok := d.goneSince[key]
	if !ok {
		first = now
		d.goneSince[key] = now
		for k, t := range d.goneSince {
			if now.Sub(t) > goneForget {
				delete(d.goneSince, k)
			}
		}
	}
	return now.Sub(first)
}

// goneForget is how long a lifecycle seen gone is remembered; long past
// any lease TTL (forgetting only makes the next look wait a TTL again).
const goneForget = time.Hour
