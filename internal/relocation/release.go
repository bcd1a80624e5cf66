package relocation

import (
	"context"
	"time"

	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/release"
	"github.com/roamactors/roam/internal/relocation/releaserun"
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
// lifecycle still holds its lease, by the one liveness rule for ended
// owners (PROTOCOL.md §3.4, releaserun.OwnerNode), shared with the Spot
// manager: a descriptor watched standing still for its lease TTL has its
// lease revoked; one gone is an ended owner once revoked, or once seen gone
// for a lease TTL (until then ErrOwnerEnding).
func (d *Driver) OwnerNode(ctx context.Context, o *messages.Owner) (address string, alive bool, err error) {
	releaserun.OwnerNode(ownerEnv{d, ctx}, o, func(a string, al bool, e error) { address, alive, err = a, al, e })
	return address, alive, err
}

// WatchNodes feeds a listing of the Mesh's descriptors to the liveness
// watch and revokes the lease of every lifecycle whose descriptor stood
// still for its TTL (releaserun.WatchNodes); it returns how many it
// revoked. Called every second or so, it bounds how long after its last
// heartbeat a crashed or cut-off node is taken for ended: its lease TTL
// and one period.
func (d *Driver) WatchNodes(ctx context.Context, nodes []location.VersionedNode) (revoked int, err error) {
	releaserun.WatchNodes(ownerEnv{d, ctx}, nodes, func(n int, e error) { revoked, err = n, e })
	return revoked, err
}

// ownerEnv is releaserun's host on the driver: every primitive blocks and
// calls back before it returns, so OwnerNode and WatchNodes have their
// answer when the interpreter returns.
type ownerEnv struct {
	d   *Driver
	ctx context.Context
}

func (e ownerEnv) Self() (*location.NodeDescriptor, bool) { return e.d.desc, e.d.Usable() == nil }

func (e ownerEnv) ReadNode(o *messages.Owner, done func(location.VersionedNode, error)) {
	done(e.d.store.ReadNode(e.ctx, location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()}))
}

func (e ownerEnv) RevokeLease(n location.VersionedNode, done func(error)) {
	done(e.d.store.RevokeLease(e.ctx, location.NodeKeyOf(n.Node), n.Version))
}

// Watch runs f under goneMu: OwnerNode runs on any goroutine.
func (e ownerEnv) Watch(f func(*liveness.Watch, time.Duration)) {
	e.d.goneMu.Lock()
	defer e.d.goneMu.Unlock()
	f(e.d.watch, e.d.monotonic())
}

func (e ownerEnv) Serving() error { return e.d.serving() }

func (e ownerEnv) LeaseRevoked(n location.VersionedNode) {
	e.d.log.Warn().Str("event", "owner_lease_revoked").Str("owner_node_rid", n.Node.GetNodeRid()).Str("lease_id", n.Node.GetLeaseId()).
		Msg("another node's descriptor stood still for its lease TTL: its holder has fenced itself, and its lease is revoked; its objects are recovered")
}

// monotonic is the driver's clock for the liveness watch: time since the
// driver started, on the monotonic clock.
func (d *Driver) monotonic() time.Duration { return machine.Since(d.clock, d.started) }
