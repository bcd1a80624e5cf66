// Package releaserun judges whether another lifecycle still holds its
// owner lease (docs/PROTOCOL.md §3.4, the one liveness rule for ended
// owners) and revokes the lease of one whose descriptor stood still for
// its TTL. It is run by the relocation driver (Driver.OwnerNode,
// Driver.WatchNodes) and by the Spot simulation (internal/spotsim), each
// over its own primitives (Env): the store's node reads and revocations,
// the liveness watch and its clock, and whether this node may write.
//
// Every answer comes through a callback, so one code serves a driver whose
// primitives block (and call back before they return) and a simulation
// whose primitives answer from its event queue.
package releaserun

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/internal/relocation/release"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Env is a node's primitives.
type Env interface {
	// Self is this node's lifecycle: its descriptor, and whether the
	// lifecycle still holds its lease (it has not ended; a fenced node may
	// still hold it).
	Self() (desc *location.NodeDescriptor, holds bool)
	// ReadNode reads o's node descriptor: location.ErrNotFound when it is
	// gone, location.ErrLeaseRevoked when its lease was revoked.
	ReadNode(o *messages.Owner, done func(location.VersionedNode, error))
	// RevokeLease revokes n's lease at n's version.
	RevokeLease(n location.VersionedNode, done func(error))
	// Watch runs f with this node's liveness watch (under whatever guards
	// it) and the watch's clock.
	Watch(f func(w *liveness.Watch, now time.Duration))
	// Serving is why this node may not write now (its lifecycle ended, or
	// its lease is fenced), or nil.
	Serving() error
	// LeaseRevoked tells the host that this node revoked n's lease (the
	// driver logs it).
	LeaseRevoked(n location.VersionedNode)
}

// Forget is how long what was seen of a lifecycle is remembered; long
// past any lease TTL (forgetting only makes the next look wait a TTL
// again).
const Forget = time.Hour

// OwnerNode finds an owner's node address and whether the owner's
// lifecycle still holds its lease: its descriptor exists with the same
// lease and node generation (this node's own lifecycle: while it holds its
// lease).
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
// after the node itself learnt that the old one ended. Errors are the
// store's, unclassified.
func OwnerNode(env Env, o *messages.Owner, done func(address string, alive bool, err error)) {
	if self, holds := env.Self(); o.GetNodeRid() == self.GetNodeRid() {
		done(self.GetAddress(), o.GetNodeGeneration() == self.GetNodeGeneration() && holds, nil)
		return
	}
	env.ReadNode(o, func(n location.VersionedNode, err error) {
		switch {
		case errors.Is(err, location.ErrLeaseRevoked):
			done("", false, nil)
			return
		case errors.Is(err, location.ErrNotFound):
			done("", false, missing(env, o))
			return
		case err != nil:
			done("", false, err)
			return
		}
		addr := n.Node.GetAddress()
		if n.Node.GetLeaseId() != o.GetLeaseId() || n.Node.GetNodeGeneration() != o.GetNodeGeneration() {
			done(addr, false, nil)
			return
		}
		if !Observe(env, n) {
			done(addr, true, nil)
			return
		}
		revoke(env, n, func(ended bool, err error) { done(addr, !ended, err) })
	})
}

// Observe records what this node saw of another lifecycle's descriptor
// (every read and listing feeds it) and reports whether it has stood
// still for its lease TTL: its holder has fenced itself.
func Observe(env Env, n location.VersionedNode) (silent bool) {
	if self, _ := env.Self(); n.Node.GetNodeRid() == self.GetNodeRid() {
		return false
	}
	ttl := time.Duration(n.Node.GetLeaseTtlSeconds()) * time.Second
	env.Watch(func(w *liveness.Watch, now time.Duration) {
		silent = w.Seen(lifecycleID(n.Node.GetNodeRid(), n.Node.GetLeaseId()), uint64(n.Version), ttl, now) == liveness.Silent
	})
	return silent
}

// WatchNodes feeds a listing of the Mesh's descriptors to the liveness
// watch and revokes the lease of every lifecycle whose descriptor stood
// still for its TTL; done gets how many it revoked once every revocation
// answered. Run every second or so, it bounds how long after its last
// heartbeat a crashed or cut-off node is taken for ended: its lease TTL
// and one period.
func WatchNodes(env Env, nodes []location.VersionedNode, done func(revoked int, err error)) {
	env.Watch(func(w *liveness.Watch, now time.Duration) { w.Forget(now - Forget) })
	var errs []error
	revoked, left := 0, 1
	answered := func() {
		if left--; left == 0 {
			done(revoked, errors.Join(errs...))
		}
	}
	for _, n := range nodes {
		if !Observe(env, n) {
			continue
		}
		left++
		revoke(env, n, func(ended bool, err error) {
			if err != nil {
				errs = append(errs, err)
			}
			if ended {
				revoked++
			}
			answered()
		})
	}
	answered()
}

// revoke ends the lease of a lifecycle whose descriptor n stood still for
// its TTL, at n's version. ended is false when the holder renewed
// meanwhile; an error when the store could not say, or this node may not
// write now (a fenced node revokes nothing: its own view may be old).
func revoke(env Env, n location.VersionedNode, done func(ended bool, err error)) {
	if err := env.Serving(); err != nil {
		done(false, fmt.Errorf("%w: %w: node %s stood still for its lease TTL; this node may not revoke it now: %w",
			roamerr.ErrUnavailable, roamerr.ErrOwnerEnding, n.Node.GetNodeRid(), err))
		return
	}
	env.RevokeLease(n, func(err error) {
		switch release.Revoked(err) {
		case release.Ended:
			if err == nil {
				env.Watch(func(w *liveness.Watch, now time.Duration) {
					w.Revoked(lifecycleID(n.Node.GetNodeRid(), n.Node.GetLeaseId()), now)
				})
				env.LeaseRevoked(n)
			}
			// else another node revoked it first, and said so
			done(true, nil)
		case release.Renewed:
			done(false, nil)
		case release.Missing:
			// Gone between the read and the revoke: ended once it has been
			// seen gone for its TTL, like any missing owner.
			err := missing(env, location.OwnerOf(n.Node))
			done(err == nil, err)
		default:
			done(false, roamerr.Keep(roamerr.ErrUnavailable, "revoke the lease of node "+n.Node.GetNodeRid(), err))
		}
	})
}

// missing judges an owner whose descriptor is gone (not revoked): nil once
// this node has seen it gone for a lease TTL, else ErrOwnerEnding.
func missing(env Env, o *messages.Owner) error {
	ttl := time.Duration(o.GetLeaseTtlSeconds()) * time.Second
	var v liveness.Verdict
	var gone, watchTTL time.Duration
	env.Watch(func(w *liveness.Watch, now time.Duration) {
		v, gone = w.Missing(lifecycleID(o.GetNodeRid(), o.GetLeaseId()), ttl, now)
		watchTTL = w.TTL
	})
	if v == liveness.Ended {
		return nil
	}
	return fmt.Errorf("%w: %w: node %s seen gone for %s; its objects are taken over once it has been gone for its lease TTL (%s)",
		roamerr.ErrUnavailable, roamerr.ErrOwnerEnding, o.GetNodeRid(), gone.Round(time.Millisecond), max(ttl, watchTTL))
}

func lifecycleID(rid, lease string) string { return rid + "/" + lease }
