package spotservice

import (
	"fmt"

	"github.com/roamactors/roam/roamerr"
)

// AdmitCapacity decides whether a node admits one more new incarnation
// (PROTOCOL.md §7.2, placement): not while it drains (other nodes'
// placement skips a DRAINING descriptor; this is for what was sent before
// they saw it, passed on like a full node's), and not beyond its Capacity
// (0: unbounded), which the incarnations it serves plus the creations in
// progress here (creating, not counting this one) share. An admitted
// creation on a bounded node holds a creation slot until it ends, so
// concurrent creations cannot overshoot; the host counts it.
func AdmitCapacity(rid string, draining bool, capacity uint32, serving, creating int) error {
	if draining {
		return fmt.Errorf("%w: %w: node %s takes no new Spots", roamerr.ErrUnavailable, roamerr.ErrNodeDraining, rid)
	}
	if capacity != 0 && serving+creating+1 > int(capacity) {
		return fmt.Errorf("%w: node %s hosts %d and creates %d of %d", roamerr.ErrCapacityExceeded, rid, serving, creating, capacity)
	}
	return nil
}

// HoldsSlot reports whether a creation this node admits holds a creation
// slot until it ends: only on a bounded node that is not draining (a
// draining one admits none; an unbounded one has nothing to share).
func HoldsSlot(draining bool, capacity uint32) bool { return !draining && capacity != 0 }
