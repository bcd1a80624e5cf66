package relocation

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/roamerr"
)

// Policy says what a relocation does with an object of a kind
// (docs/PROTOCOL.md §2.4).
type Policy interface{ isPolicy() }

// StateAdapter captures and restores an actor's state as opaque bytes. Both
// run on the actor's own goroutine between turns, so they may read and
// write the actor's fields freely.
type StateAdapter interface {
	Capture(a actor.Actor) ([]byte, error)
	Restore(a actor.Actor, state []byte) error
}

type disableRelocation struct{}

type recreateOnRelocation struct{}

type preserveStateWith struct{ adapter StateAdapter }

func (disableRelocation) isPolicy()    {}
func (recreateOnRelocation) isPolicy() {}
func (preserveStateWith) isPolicy()    {}

// DisableRelocation: objects of the kind never move; Relocate fails with
// InvalidOperation.
func DisableRelocation() Policy { return disableRelocation{} }

// RecreateOnRelocation: the object moves with its queue and timers but no
// state; the target runs a fresh instance from the producer.
func RecreateOnRelocation() Policy { return recreateOnRelocation{} }

// PreserveStateWith: the adapter carries the state across.
func PreserveStateWith(a StateAdapter) Policy { return preserveStateWith{adapter: a} }

// PreservesState reports whether p carries in-memory state across moves,
// state that a reactivation after the owner ended cannot bring back.
func PreservesState(p Policy) bool {
	_, ok := p.(preserveStateWith)
	return ok
}

// Kind is a relocatable stable type: how to make an instance and what a
// move does with it.
type Kind struct {
	// StableType is the kind's stable name (UTF-8, 1..255 bytes,
	// case-sensitive; PROTOCOL.md §2.1).
	StableType string
	// Producer makes a fresh instance.
	Producer actor.Producer
	// Policy is required: registering a kind without one is a start-up
	// error (PROTOCOL.md §2.4).
	Policy Policy
	// ApplicationVersion is carried in the payload; a target hosting the
	// kind at another version refuses the move before any seal
	// (PROTOCOL.md §5.2).
	ApplicationVersion string
	// Instance lets a first message with Instance intent cold-activate the
	// kind as an Instance Spot on nodes that host it (PROTOCOL.md §7.5);
	// otherwise it is a User Spot or Actor type only.
	Instance bool
	// ReactivateEmpty lets an Instance Spot of a PreserveStateWith kind
	// whose owner ended (crashed, cut off) be reactivated by the next
	// Instance-intent call without its in-memory state, which ended with
	// the owner (logged spot_reactivated). By default such a Spot answers
	// Unavailable naming the cause until an operator accepts the loss
	// with spot.Manager.ReleaseEnded (PROTOCOL.md §7.10: an ended owner's
	// record is released automatically only when no state is lost). Kinds that carry
	// no state reactivate either way.
	ReactivateEmpty bool
}

func (k *Kind) validate() error {
	if err := location.ValidateID("stable type", k.StableType); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	if k.Producer == nil {
		return fmt.Errorf("%w: kind %q has no producer", roamerr.ErrInvalidOperation, k.StableType)
	}
	if k.Policy == nil {
		return fmt.Errorf("%w: kind %q has no relocation policy (DisableRelocation, RecreateOnRelocation or PreserveStateWith)", roamerr.ErrNotConfigured, k.StableType)
	}
	if p, ok := k.Policy.(preserveStateWith); ok && p.adapter == nil {
		return fmt.Errorf("%w: kind %q: PreserveStateWith needs an adapter", roamerr.ErrNotConfigured, k.StableType)
	}
	return nil
}
