package relocation

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Movable reports whether objects of kind k are relocation units: an
// Actor, an Instance Spot, and a User Spot's own incarnation — its members
// move one by one as Actors (PerActor, docs/PROTOCOL.md §2.1). An Entry
// Spot belongs to its node's lifecycle.
func Movable(k location.Kind) bool {
	return k == location.KindActor || k == location.KindInstanceSpot || k == location.KindUserSpot
}

// Unit is one relocation unit this node serves: an Actor, an Instance
// Spot or a User Spot (docs/PROTOCOL.md §2.1).
type Unit struct {
	Key        location.AuthorityKey
	StableType string
}

// UnitRefusal is a unit that cannot move, and why.
type UnitRefusal struct {
	Unit
	Err error
}

// Inventory is what a drain finds on this node.
type Inventory struct {
	// Movable are the units serving here that may move now.
	Movable []Unit
	// Unmovable are the units that stay: a kind with DisableRelocation.
	// A member of a SpotWide User Spot here is no unit of its own: it
	// moves with its Spot.
	Unmovable []UnitRefusal
	// Busy are the incarnations moving in or out right now; ask again once
	// they settle (an arrival becomes a unit to move on).
	Busy []location.AuthorityKey
}

// Inventory lists the units this node serves (Drain).
func (d *Driver) Inventory(ctx context.Context) (Inventory, error) {
	return call(ctx, d, func() (Inventory, error) {
		var inv Inventory
		// A SpotWide User Spot moves with all its members: while one of
		// them is being deleted, it is busy, not refused.
		closingMember := map[location.AuthorityKey]bool{}
		for _, del := range d.deletions {
			if del.spot != "" {
				closingMember[location.Key(location.KindUserSpot, del.spot)] = true
			}
		}
		for key, obj := range d.objects {
			switch {
			case obj.state == staging || obj.state == leaving || obj.r().out != nil || (closingMember[key] && obj.kind.SpotWide):
				inv.Busy = append(inv.Busy, key)
				continue
			case obj.state != serving || obj.closing:
				continue
			case d.spotWideOf(obj) != nil:
				continue // it moves with its SpotWide User Spot
			}
			u := Unit{Key: key, StableType: obj.kind.StableType}
			switch {
			case isDisabled(obj.kind.Policy):
				inv.Unmovable = append(inv.Unmovable, UnitRefusal{u, fmt.Errorf("%w: kind %q has DisableRelocation", roamerr.ErrInvalidOperation, obj.kind.StableType)})
			default:
				inv.Movable = append(inv.Movable, u)
			}
		}
		// Taken over, their checkpoints not restorable yet (restoreUntil):
		// they cannot move, and waiting for them could take for ever.
		for key, u := range d.unrestored {
			inv.Unmovable = append(inv.Unmovable, UnitRefusal{Unit{Key: key, StableType: u.stableType},
				fmt.Errorf("%w: its checkpoint could not be restored yet: %w", roamerr.ErrUnavailable, u.err)})
		}
		// Moves into this node admitted before it drained: each becomes a
		// unit to move on once it opens (or nothing, if it fails).
		for key, t := range d.arrivals {
			if !t.m.Finished() && d.objects[key] == nil {
				inv.Busy = append(inv.Busy, key)
			}
		}
		return inv, nil
	})
}

// NodeLoad is another node's load as its relocation actor answers it.
type NodeLoad struct {
	Serving, Capacity int
	// Refused is why the node would take no move now (draining, full,
	// fenced), nil if it would.
	Refused error
	// RecoversEnded: whether the node recovers an ended owner's object of
	// the asked kind and stable type by itself; nil when it does not say
	// (a node of an older version).
	RecoversEnded *bool
	// Node is the lifecycle that answered (another one may have started
	// under the address asked).
	Node *messages.NodeRef
}

// Load asks the node at address (RID rid) for its load: a capability
// query for stableType, which the node answers with its serving count and
// capacity, and whether it would take a move of that type.
func (d *Driver) Load(ctx context.Context, address, stableType string) (NodeLoad, error) {
	return d.askLoad(ctx, address, location.KindActor, stableType, false)
}

// Leaving tells the node at address that this drained node is about to
// stop, and waits for its answer: from then on that node sends nothing
// to this one by a cached route or a Message Follow hop, and everything
// it sent before has arrived (the answer comes back on the same
// connection, behind it).
func (d *Driver) Leaving(ctx context.Context, address string) error {
	l, err := d.askLoad(ctx, address, location.KindActor, "", true)
	if err == nil && l.Node == nil {
		// Only a refusal to answer at all (the asker not verified as a
		// live member) lacks the answering node: the peer did not mark
		// this node leaving.
		return fmt.Errorf("%w: %s did not take the Leaving: %w", roamerr.ErrUnavailable, address, l.Refused)
	}
	return err
}

func (d *Driver) askLoad(ctx context.Context, address string, kind location.Kind, stableType string, leaving bool) (NodeLoad, error) {
	q := &messages.CapabilityQuery{Kind: kind, StableType: stableType, Source: d.selfRef(), WantLoad: true, Leaving: leaving}
	if k, ok := d.kind(stableType); ok {
		q.ApplicationVersion = k.ApplicationVersion
	}
	timeout := d.cfg.CapabilityTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, machine.Until(d.clock, dl))
	}
	if timeout <= 0 {
		return NodeLoad{}, fmt.Errorf("%w: load of %s: %w", roamerr.ErrDeadlineExceeded, address, context.DeadlineExceeded)
	}
	res, err := ask.Ask(ctx, d.sys, actor.NewPID(address, DriverName), q, timeout, ask.Question{Clock: d.clock, From: address, What: "load query", Accept: isCapabilityReply})
	if err != nil {
		return NodeLoad{}, fmt.Errorf("%w: load of %s: %v", roamerr.ErrUnavailable, address, err)
	}
	reply, ok := res.(*messages.CapabilityReply)
	if !ok {
		return NodeLoad{}, fmt.Errorf("%w: load of %s: answered %T", roamerr.ErrUnavailable, address, res)
	}
	l := NodeLoad{Serving: int(reply.GetServingCount()), Capacity: int(reply.GetCapacity()), RecoversEnded: reply.RecoversEnded, Node: reply.GetNode()}
	switch {
	case reply.GetSupported():
	case reply.GetCode() != "":
		l.Refused = roamerr.FromCode(reply.GetCode(), reply.GetReason())
	default:
		l.Refused = fmt.Errorf("%w: %s", roamerr.ErrUnavailable, reply.GetReason())
	}
	return l, nil
}
