package relocation

import (
	"fmt"
	"github.com/roamactors/roam/internal/activation"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Policy says what a relocation does with an object of a kind
// (docs/PROTOCOL.md §2.4).
type Policy interface{ isPolicy() }

// StateAdapter captures and restores an actor's state as opaque bytes. Both
// run on the actor's own goroutine between turns, so they may read and
// write the actor's fields freely. The bytes Capture returns are roam's:
// the move sends them as they are (a large state is not copied), so
// neither the adapter nor the actor may change them afterwards. The bytes
// Restore gets are the actor's to keep.
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

// Stateful is state that captures and restores itself. Like a
// StateAdapter's methods, both run on the actor's goroutine between turns,
// and the captured bytes are roam's from then on.
type Stateful interface {
	CaptureState() ([]byte, error)
	RestoreState(state []byte) error
}

// PreserveState: the state is whatever the incarnation registered with
// KeepState (a generated grain's implementation does so in its Init), else
// the actor itself, which must then implement Stateful. A move of an
// incarnation with neither fails with TypeMismatch when it captures; the
// incarnation serves on at its source.
func PreserveState() Policy { return preserveStateWith{adapter: statefulAdapter{}} }

// statefulAdapter is PreserveState's adapter: the host hands it the
// registered Stateful (or the actor).
type statefulAdapter struct{}

func (statefulAdapter) Capture(a actor.Actor) ([]byte, error) { return nil, errNotStateful }
func (statefulAdapter) Restore(a actor.Actor, _ []byte) error { return errNotStateful }

var errNotStateful = fmt.Errorf("%w: PreserveState: the incarnation neither called KeepState nor implements Stateful", roamerr.ErrTypeMismatch)

// isDisabled reports whether p is DisableRelocation.
func isDisabled(p Policy) bool { _, off := p.(disableRelocation); return off }

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
	// Props spawn an instance: the application's middleware, supervisor
	// strategy, dispatcher and context decorators are kept; roam replaces
	// only the mailbox (with its relocatable one, which can seal, capture
	// and relay the queue) and runs the actor inside a host actor of its
	// own, innermost: the actor gets a context of roam's, which passes
	// everything on to the incarnation's.
	// roam spawns every incarnation itself, with Proto.Actor's default
	// spawner and not through the actor system's root context: a spawner
	// of the Props, and spawn middleware of the root context (tracing,
	// middleware propagation), are not used for them; middleware that
	// should apply to the incarnations belongs on the Props.
	// Exactly one of Props and Producer is set.
	Props *actor.Props
	// Producer makes a fresh instance: shorthand for
	// Props: actor.PropsFromProducer(Producer).
	Producer actor.Producer
	// ClusterKind: Props come from Proto.Actor's cluster.NewKind, whose
	// middleware delivers cluster.ClusterInit itself. Otherwise roam
	// delivers it, right after Started, when the node is a member of a
	// Proto.Actor cluster, so that generated grains (protoc-gen-go-grain)
	// work unchanged.
	ClusterKind bool
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
	// SpotWide: a User Spot of this kind moves together with its members,
	// which live on its node (PROTOCOL.md §5.15): one seal of them all, one
	// payload, one commit of every record. Otherwise (PerActor) the Spot
	// moves alone and each member is a unit of its own.
	SpotWide bool
	// CheckpointEvery, CheckpointInterval and CheckpointIdle say when the
	// owner of an object of a PreserveStateWith kind captures its state
	// into the node's checkpoint store (docs/FAULTS.md, "Checkpoints and
	// recovery"): after every CheckpointEvery handled messages, at most
	// CheckpointInterval after the first handled message not yet
	// captured, and once the object has been idle CheckpointIdle after
	// one (each 0: off; periods at least 10 ms). The capture runs between
	// turns, the write off the dispatch path. All zero: CheckpointInterval
	// 1 s. An object whose owner ended is recovered from its last
	// checkpoint: what it handled after it is lost, and counted.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	CheckpointIdle     time.Duration
	// NoCheckpoints turns the checkpoints of a PreserveStateWith kind off
	// (ReactivateEmpty implies it): its objects' state then ends with an
	// owner that ends.
	NoCheckpoints bool
	// RecoverByOperator: an object of the kind whose owner ended is not
	// recovered by itself; it answers Unavailable (logged
	// reactivation_refused) until an operator accepts the loss with
	// ReleaseEnded. Default: recovered from
	// its last checkpoint (PreserveStateWith with checkpoints),
	// reactivated empty (the other policies, or ReactivateEmpty).
	RecoverByOperator bool

	// checkpoints is the effective capture policy (Off: none), set at
	// registration.
	checkpoints checkpoint.Policy

	// open and staging spawn every incarnation of the kind (a cold
	// activation's open; a staged or arriving one's temporary queue): the
	// kind's Props with roam's mailbox, supervisor and host, made
	// once at registration. A Props per incarnation would cost an idle
	// object about 450 bytes; the incarnation is found at spawn instead
	// (Driver.incarnate).
	open, staging *actor.Props
}

func (k *Kind) validate() error {
	if err := location.ValidateID("stable type", k.StableType); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	if (k.Producer == nil) == (k.Props == nil) {
		return fmt.Errorf("%w: kind %q needs exactly one of Props and Producer", roamerr.ErrInvalidOperation, k.StableType)
	}
	if k.Policy == nil {
		return fmt.Errorf("%w: kind %q has no relocation policy (DisableRelocation, RecreateOnRelocation or PreserveStateWith)", roamerr.ErrNotConfigured, k.StableType)
	}
	if p, ok := k.Policy.(preserveStateWith); ok && p.adapter == nil {
		return fmt.Errorf("%w: kind %q: PreserveStateWith needs an adapter", roamerr.ErrNotConfigured, k.StableType)
	}
	cp := checkpoint.Policy{Every: k.CheckpointEvery, Interval: k.CheckpointInterval, Idle: k.CheckpointIdle}
	if err := cp.Validate(); err != nil {
		return fmt.Errorf("kind %q: %w", k.StableType, err)
	}
	switch {
	case !cp.Off() && !PreservesState(k.Policy):
		return fmt.Errorf("%w: kind %q has checkpoints but no state to capture (its policy is not PreserveStateWith)", roamerr.ErrInvalidOperation, k.StableType)
	case !cp.Off() && (k.NoCheckpoints || k.ReactivateEmpty):
		return fmt.Errorf("%w: kind %q has checkpoints and NoCheckpoints or ReactivateEmpty: choose one", roamerr.ErrInvalidOperation, k.StableType)
	case k.RecoverByOperator && k.ReactivateEmpty:
		return fmt.Errorf("%w: kind %q is both RecoverByOperator and ReactivateEmpty: choose one", roamerr.ErrInvalidOperation, k.StableType)
	}
	return nil
}

// checkpointPolicy is the capture policy k runs with (Off: none).
func (k *Kind) checkpointPolicy() checkpoint.Policy {
	if !PreservesState(k.Policy) || k.NoCheckpoints || k.ReactivateEmpty {
		return checkpoint.Policy{}
	}
	cp := checkpoint.Policy{Every: k.CheckpointEvery, Interval: k.CheckpointInterval, Idle: k.CheckpointIdle}
	if cp.Off() {
		return checkpoint.DefaultPolicy
	}
	return cp
}

// Checkpointed reports whether objects of k are captured into checkpoints
// (and so recovered from them).
func (k *Kind) Checkpointed() bool { return !k.checkpoints.Off() }

// Activation is what the activation rules know of the kind (one place,
// so that every caller judges an ended owner's object by the same rule).
func (k *Kind) Activation() activation.Kind {
	return activation.Kind{Registered: true, PreservesState: PreservesState(k.Policy), ReactivateEmpty: k.ReactivateEmpty,
		Checkpointed: k.Checkpointed(), RecoverByOperator: k.RecoverByOperator}
}

// ActivationKind is the kind as this node's activations see it: with
// whether its checkpoints are the Location Store's own.
func (d *Driver) ActivationKind(k *Kind) activation.Kind {
	ak := k.Activation()
	ak.CheckpointsInStore = ak.Checkpointed && d.checkpointsInStore
	return ak
}

// recoversByItself reports whether an ended owner's object of stable type
// st is brought back by a live node without an operator, by this node's
// registration of the kind: releasing it would race that recovery.
// An Instance Spot of a kind without checkpoints is not recovered: it
// comes back on its next call, and its release races nothing.
func (d *Driver) recoversByItself(st string, kind location.Kind) bool {
	k, ok := d.kind(st)
	if !ok {
		return false
	}
	p := k.Activation().EndedPolicy()
	if kind == location.KindInstanceSpot {
		return p == activation.EndedFromCheckpoint
	}
	return p == activation.EndedFromCheckpoint || p == activation.EndedEmpty
}

// ValidateKind reports what is wrong with k, as RegisterKind would.
func ValidateKind(k Kind) error { return k.validate() }
