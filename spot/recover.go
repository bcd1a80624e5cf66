package spot

import (
	"context"
	"errors"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Sweep is what one RecoverEnded pass found.
type Sweep struct {
	// Recovered: Spots this node brought back from their checkpoints.
	Recovered int
	// Waiting: Spots of ended (or ending) owners left for a later pass:
	// their owner is seen gone for less than a lease TTL, another live
	// node is the one to recover them, or their recovery failed here.
	Waiting int
}

// RecoverEnded brings back, without waiting for a call, the stateful
// Instance Spots whose owner ended (docs/FAULTS.md, "Checkpoints and
// recovery"): each such Spot of a kind this node hosts that checkpoints
// (and does not wait for an operator) is recovered from its last checkpoint
// by one live node, the first of its Instance candidates in the same
// weighted order a cold activation uses, so the recoveries of a lost node
// spread over the live ones by weight. Others leave it; a node that ends
// before it recovered its share leaves it to the next pass, in which the
// order no longer names it. A recovery racing another node's (or a call's
// activation) loses the store's compare-and-set and leaves the Spot to it.
func (m *Manager) RecoverEnded(ctx context.Context) (Sweep, error) {
	var sw Sweep
	nodes, err := m.store.ListNodes(ctx, m.desc.GetMesh())
	if err != nil {
		return sw, storeError("list nodes", err)
	}
	var errs []error
	after := ""
	for {
		page, err := m.store.List(ctx, location.KindInstanceSpot, location.PageRequest{Size: location.MaxPageSize, After: after})
		if err != nil {
			return sw, storeError("scan", err)
		}
		for _, v := range page.Items {
			if !activation.RecoverableFromCheckpoint(v) {
				continue // the common case: a Spot of a stateless kind, or one being activated
			}
			k := m.kindOf(v.Record.GetStableType())
			if !k.Registered || !k.Checkpointed || k.RecoverByOperator {
				continue
			}
			_, alive, err := m.ownerAddress(ctx, v.Record.GetOwner())
			switch {
			case errors.Is(err, roamerr.ErrOwnerEnding):
				sw.Waiting++
				continue
			case err != nil:
				errs = append(errs, err)
				continue
			case alive:
				continue
			}
			if c := candidates(nodes, v.Record.GetStableType(), true, v.Key.ID); len(c) == 0 || c[0].Node.GetNodeRid() != m.desc.GetNodeRid() {
				sw.Waiting++ // another live node's share
				continue
			}
			if err := m.recoverOne(ctx, v); err != nil {
				sw.Waiting++
				errs = append(errs, err)
				continue
			}
			if m.d.Hosts(v.Key, v.Record.GetObjectGeneration()) {
				sw.Recovered++
			}
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	return sw, oneFailure(errs)
}
