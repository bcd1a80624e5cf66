package relocation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/release"
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
	if err := release.Owner(key, v.Record.GetOwner().GetNodeRid(), alive, err); err != nil {
		return false, err
	}
	if err := d.ReleasableEnded(ctx, v.Record.GetStableType(), key); err != nil {
		return false, err
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
		return false, release.Deleted(key, err)
	}
	d.log.Warn().Str("event", "ended_owner_released").Str("object_id", key.ID).Str("owner_node_rid", v.Record.GetOwner().GetNodeRid()).
		Msg("an operator accepted the loss of an ended owner's Actor state")
	return true, nil
}

// ReleasableEnded refuses the release of an ended owner's object whose
// kind a live node recovers by itself (docs/FAULTS.md, "Checkpoints and
// recovery"): its state would be forgotten while a recovery takes it over,
// which then serves it without its state, and the operator is told the
// release lost the race. A node that does not host the stable type asks
// the live nodes that do (a capability query); one it cannot ask makes
// the release Unavailable, as it cannot be told safe.
func (d *Driver) ReleasableEnded(ctx context.Context, stableType string, key location.AuthorityKey) error {
	if _, ok := d.kind(stableType); ok {
		if d.recoversByItself(stableType, key.Kind) {
			return release.Recovered(key, stableType, "this one")
		}
		return nil
	}
	nodes, err := d.store.ListNodes(ctx, d.desc.GetMesh())
	if err != nil {
		return roamerr.Keep(roamerr.ErrUnavailable, "list the nodes that host "+stableType, err)
	}
	for _, n := range nodes {
		desc := n.Node
		if !release.Asks(desc, d.desc.GetNodeRid(), key, stableType) {
			continue
		}
		l, err := d.askLoad(ctx, desc.GetAddress(), key.Kind, stableType, false)
		if err := release.Answered(key, stableType, desc.GetNodeRid(), l.RecoversEnded, err); err != nil {
			return err
		}
	}
	return nil
}

// OwnerNode finds an owner's node address and whether the owner's
// lifecycle still holds its lease: its descriptor exists with the same
// lease and node generation (this node's own lifecycle: while its lease
// has not ended; a fenced node may still hold it). The one liveness rule
// for ended owners (PROTOCOL.md §3.4, internal/liveness), shared with the
// Spot manager.
//
// A descriptor this node has watched stand still for its lease TTL is one
// whose holder fenced itself: this node revokes the lease at the version
// it saw (a compare-and-set: a renewal that landed meanwhile wins) and
// takes the owner for ended. A descriptor that is gone counts as an ended
// owner at once when its lease was revoked so; otherwise only once this
// node has seen it gone for a lease TTL (until then: Unavailable,
// ErrOwnerEnding) — the store may end a lease early (Consul destroys a
// session when its agent's node leaves), and the holder counts from its
// last good renewal, which was applied before the descriptor went
// (docs/FAULTS.md, "Lease fencing"). A descriptor with another lease or
// generation is a later lifecycle of the same node, which starts only
// after the node itself learnt that the old one ended.
func (d *Driver) OwnerNode(ctx context.Context, o *messages.Owner) (address string, alive bool, err error) {
	if o.GetNodeRid() == d.desc.GetNodeRid() {
		return d.desc.GetAddress(), o.GetNodeGeneration() == d.desc.GetNodeGeneration() && d.Usable() == nil, nil
	}
	key := location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()}
	n, err := d.store.ReadNode(ctx, key)
	switch {
	case errors.Is(err, location.ErrLeaseRevoked):
		return "", false, nil
	case errors.Is(err, location.ErrNotFound):
		return "", false, d.missing(o)
	case err != nil:
		return "", false, err
	}
	if n.Node.GetLeaseId() != o.GetLeaseId() || n.Node.GetNodeGeneration() != o.GetNodeGeneration() {
		return n.Node.GetAddress(), false, nil
	}
	if !d.Observe(n) {
		return n.Node.GetAddress(), true, nil
	}
	if ended, err := d.revoke(ctx, n); err != nil || !ended {
		return n.Node.GetAddress(), !ended, err
	}
	return n.Node.GetAddress(), false, nil
}

// Observe records what this node saw of another lifecycle's descriptor
// (every read and listing feeds it) and reports whether it has stood
// still for its lease TTL: its holder has fenced itself.
func (d *Driver) Observe(n location.VersionedNode) (silent bool) {
	if n.Node.GetNodeRid() == d.desc.GetNodeRid() {
		return false
	}
	ttl := time.Duration(n.Node.GetLeaseTtlSeconds()) * time.Second
	d.goneMu.Lock()
	defer d.goneMu.Unlock()
	return d.watch.Seen(lifecycleID(n.Node.GetNodeRid(), n.Node.GetLeaseId()), uint64(n.Version), ttl, d.monotonic()) == liveness.Silent
}

// WatchNodes feeds a listing of the Mesh's descriptors to the liveness
// watch and revokes the lease of every lifecycle whose descriptor stood
// still for its TTL; it returns how many it revoked. Called every second
// or so, it bounds how long after its last heartbeat a crashed or cut-off
// node is taken for ended: its lease TTL and one period.
func (d *Driver) WatchNodes(ctx context.Context, nodes []location.VersionedNode) (revoked int, err error) {
	d.goneMu.Lock()
	d.watch.Forget(d.monotonic() - goneForget)
	d.goneMu.Unlock()
	var errs []error
	for _, n := range nodes {
		if !d.Observe(n) {
			continue
		}
		ended, err := d.revoke(ctx, n)
		if err != nil {
			errs = append(errs, err)
		}
		if ended {
			revoked++
		}
	}
	return revoked, errors.Join(errs...)
}

// revoke ends the lease of a lifecycle whose descriptor n stood still for
// its TTL, at n's version. ended is false when the holder renewed
// meanwhile; an error when the store could not say, or this node may not
// write now (a fenced node revokes nothing: its own view may be old).
func (d *Driver) revoke(ctx context.Context, n location.VersionedNode) (ended bool, err error) {
	id := lifecycleID(n.Node.GetNodeRid(), n.Node.GetLeaseId())
	if err := d.serving(); err != nil {
		return false, fmt.Errorf("%w: %w: node %s stood still for its lease TTL; this node may not revoke it now: %w",
			roamerr.ErrUnavailable, roamerr.ErrOwnerEnding, n.Node.GetNodeRid(), err)
	}
	err = d.store.RevokeLease(ctx, location.NodeKeyOf(n.Node), n.Version)
	switch release.Revoked(err) {
	case release.Ended:
		if err != nil {
			return true, nil // another node revoked it first, and said so
		}
		d.goneMu.Lock()
		d.watch.Revoked(id, d.monotonic())
		d.goneMu.Unlock()
		d.log.Warn().Str("event", "owner_lease_revoked").Str("owner_node_rid", n.Node.GetNodeRid()).Str("lease_id", n.Node.GetLeaseId()).
			Msg("another node's descriptor stood still for its lease TTL: its holder has fenced itself, and its lease is revoked; its objects are recovered")
		return true, nil
	case release.Renewed:
		return false, nil
	case release.Missing:
		// Gone between the read and the revoke: ended once it has been
		// seen gone for its TTL, like any missing owner.
		err := d.missing(location.OwnerOf(n.Node))
		return err == nil, err
	}
	return false, roamerr.Keep(roamerr.ErrUnavailable, "revoke the lease of node "+n.Node.GetNodeRid(), err)
}

// missing judges an owner whose descriptor is gone (not revoked): nil once
// this node has seen it gone for a lease TTL, else ErrOwnerEnding.
func (d *Driver) missing(o *messages.Owner) error {
	d.goneMu.Lock()
	ttl := time.Duration(o.GetLeaseTtlSeconds()) * time.Second
	v, gone := d.watch.Missing(lifecycleID(o.GetNodeRid(), o.GetLeaseId()), ttl, d.monotonic())
	d.goneMu.Unlock()
	if v == liveness.Ended {
		return nil
	}
	return fmt.Errorf("%w: %w: node %s seen gone for %s; its objects are taken over once it has been gone for its lease TTL (%s)",
		roamerr.ErrUnavailable, roamerr.ErrOwnerEnding, o.GetNodeRid(), gone.Round(time.Millisecond), max(ttl, d.node.LeaseTTL()))
}

func lifecycleID(rid, lease string) string { return rid + "/" + lease }

// monotonic is the driver's clock for the liveness watch: time since the
// driver started, on the monotonic clock.
func (d *Driver) monotonic() time.Duration { return machine.Since(d.clock, d.started) }

// goneForget is how long what was seen of a lifecycle is remembered; long
// past any lease TTL (forgetting only makes the next look wait a TTL
// again).
const goneForget = time.Hour
