// Package release is the pure policy of releasing an ended owner's object
// (docs/PROTOCOL.md §7.10; docs/FAULTS.md, "Checkpoints and recovery"):
// when an operator's release may delete the record, which nodes are asked
// whether they recover the object by themselves and how their answers
// count, how the delete's answer is told, and how the answer to revoking
// a silent lifecycle's lease is judged. The driver reads the store, asks
// the nodes and applies the ops.
package release

import (
	"errors"
	"fmt"
	"slices"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Owner judges whether the record of key may be released given its
// owner's liveness (alive, or err: the store could not say): only once its
// owner has provably ended.
func Owner(key location.AuthorityKey, ownerNodeRid string, alive bool, err error) error {
	switch {
	case err != nil:
		return roamerr.Keep(roamerr.ErrUnavailable, "read owner node "+ownerNodeRid, err)
	case alive:
		return fmt.Errorf("%w: %s has a live owner (node %s)", roamerr.ErrInvalidOperation, key, ownerNodeRid)
	}
	return nil
}

// Deleted tells the delete's answer err: nil, a Conflict (the record or
// its User Spot's count changed since it was read), or Unavailable.
func Deleted(key location.AuthorityKey, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, location.ErrConflict):
		return fmt.Errorf("%w: %s or its User Spot changed while it was being released", roamerr.ErrConflict, key)
	}
	return roamerr.Keep(roamerr.ErrUnavailable, "release "+key.String(), err)
}

// Recovered refuses the release of key, of stableType, which a live node
// (where) recovers by itself: its state would be forgotten while a
// recovery takes it over, which then serves it without its state.
func Recovered(key location.AuthorityKey, stableType, where string) error {
	return fmt.Errorf("%w: %s of stable type %q is recovered by a live node (%s) by itself; there is no loss to accept",
		roamerr.ErrInvalidOperation, key, stableType, where)
}

// Asks reports whether the node desc is asked whether it recovers key, of
// stableType, by itself: another node (not self) that hosts the type.
func Asks(desc *location.NodeDescriptor, self string, key location.AuthorityKey, stableType string) bool {
	types := desc.GetStableTypes()
	if key.Kind == location.KindInstanceSpot {
		types = desc.GetInstanceTypes()
	}
	return desc.GetNodeRid() != self && slices.Contains(types, stableType)
}

// Answered judges a hosting node's answer (recoversEnded, or err: it could
// not be asked): the release is refused when it recovers key by itself,
// and Unavailable when it cannot be told safe.
func Answered(key location.AuthorityKey, stableType, nodeRid string, recoversEnded *bool, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%w: cannot tell whether node %s, which hosts %q, recovers %s by itself: %w",
			roamerr.ErrUnavailable, nodeRid, stableType, key, err)
	case recoversEnded == nil:
		return fmt.Errorf("%w: node %s, which hosts %q, does not say whether it recovers %s by itself (an older version)",
			roamerr.ErrUnavailable, nodeRid, stableType, key)
	case *recoversEnded:
		return Recovered(key, stableType, "node "+nodeRid)
	}
	return nil
}

// Revoke is what the answer to revoking a silent lifecycle's lease says.
type Revoke int

const (
	// Ended: the lease is revoked (now or before): its owner ended.
	Ended Revoke = iota
	// Renewed: the holder renewed meanwhile: alive.
	Renewed
	// Missing: its descriptor is gone; judged as a missing owner.
	Missing
	// Unknown: the store could not say.
	Unknown
)

// Revoked judges the store's answer err to a lease revocation.
func Revoked(err error) Revoke {
	switch {
	case err == nil, errors.Is(err, location.ErrLeaseRevoked):
		return Ended
	case errors.Is(err, location.ErrConflict):
		return Renewed
	case errors.Is(err, location.ErrNotFound):
		return Missing
	}
	return Unknown
}
