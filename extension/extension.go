// Package extension is roam's public entry point on one node: it starts a
// Proto.Actor node that claims its place in the Location Store, registers
// relocatable kinds with their policies, spawns relocatable Actors and
// Instance Spots, and moves them with Relocate (spec 000).
//
//	store := memstore.New() // or consulstore.New(consulstore.Config{...})
//	ext, err := extension.Start(ctx, extension.Config{Node: cluster.Config{Store: store}})
//	err = ext.RegisterKind(extension.Kind{StableType: "room", Producer: newRoom,
//		Policy: extension.PreserveStateWith(roomState{})})
//	pid, err := ext.SpawnActor(ctx, "room", "lobby")
//	out, err := ext.Relocate(ctx, extension.ActorRef("lobby"), otherNodeRid)
package extension

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/cluster"
	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation"
	"github.com/roamactors/roam/roamerr"
)

// Kind, policies, outcomes and events, as the relocation package defines them.
type (
	Kind         = relocation.Kind
	Policy       = relocation.Policy
	StateAdapter = relocation.StateAdapter
	Outcome      = relocation.Outcome
	Event        = relocation.Event
	// Ref names a relocatable object: an Actor or an Instance Spot.
	Ref = location.AuthorityKey
)

// Policies (spec 002 §8).
var (
	DisableRelocation    = relocation.DisableRelocation
	RecreateOnRelocation = relocation.RecreateOnRelocation
	PreserveStateWith    = relocation.PreserveStateWith
	// Timers gives a relocatable actor its framework timers.
	Timers = relocation.Timers
)

// ActorRef names the Actor id.
func ActorRef(id string) Ref { return location.Key(location.KindActor, id) }

// InstanceSpotRef names the Instance Spot id.
func InstanceSpotRef(id string) Ref { return location.Key(location.KindInstanceSpot, id) }

// Config configures a node.
type Config struct {
	// Node configures the Proto.Actor node and its Location Store (required).
	Node cluster.Config
	// Relocation configures the hand-off; zero fields take spec defaults.
	Relocation relocation.Config
}

// Extension is roam on one node.
type Extension struct {
	node   *cluster.Node
	driver *relocation.Driver
}

// Start starts the node, claims it in the store and starts its relocation
// driver.
func Start(ctx context.Context, cfg Config) (*Extension, error) {
	node, err := cluster.Start(ctx, cfg.Node)
	if err != nil {
		return nil, err
	}
	if cfg.Relocation.Logger == nil {
		cfg.Relocation.Logger = cfg.Node.Logger
	}
	d, err := relocation.New(node, cfg.Node.Store, cfg.Relocation)
	if err != nil {
		return nil, errors.Join(err, node.Stop(ctx))
	}
	return &Extension{node: node, driver: d}, nil
}

// RegisterKind registers a relocatable kind; every node that may host it
// must register it with the same ApplicationVersion.
func (e *Extension) RegisterKind(k Kind) error { return e.driver.RegisterKind(k) }

// SpawnActor creates a relocatable Actor on this node.
func (e *Extension) SpawnActor(ctx context.Context, stableType, id string) (*actor.PID, error) {
	return e.driver.Spawn(ctx, stableType, id)
}

// SpawnInstanceSpot creates an Instance Spot on this node.
func (e *Extension) SpawnInstanceSpot(ctx context.Context, stableType, id string) (*actor.PID, error) {
	return e.driver.SpawnInstanceSpot(ctx, stableType, id)
}

// Resolve returns the current PID of ref from the store.
func (e *Extension) Resolve(ctx context.Context, ref Ref) (*actor.PID, error) {
	return e.driver.Resolve(ctx, ref)
}

// Relocate moves ref, owned by this node, to the node targetRid. It returns
// when the target's commit is visible in the store; the Outcome carries the
// phase timestamps and the pause the source observed.
func (e *Extension) Relocate(ctx context.Context, ref Ref, targetRid string) (Outcome, error) {
	if ref.Kind != location.KindActor && ref.Kind != location.KindInstanceSpot {
		return Outcome{}, fmt.Errorf("%w: only Actors and Instance Spots move on their own", roamerr.ErrInvalidOperation)
	}
	return e.driver.Relocate(ctx, ref, targetRid)
}

// Node is the underlying node (actor system, address, descriptor).
func (e *Extension) Node() *cluster.Node { return e.node }

// System is the node's actor system.
func (e *Extension) System() *actor.ActorSystem { return e.node.System() }

// NodeRid is this node lifecycle's RID, the target name Relocate takes.
func (e *Extension) NodeRid() string { return e.node.Descriptor().GetNodeRid() }

// Stop releases the node's claim and stops it.
func (e *Extension) Stop(ctx context.Context) error { return e.node.Stop(ctx) }
