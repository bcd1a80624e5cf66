// Package extension is roam's public entry point on one node: it starts a
// Proto.Actor node that claims its place in the Location Store, registers
// relocatable kinds with their policies, spawns relocatable Actors, moves
// them with Relocate (spec 000), and addresses Spots by ID through Spots()
// (spec 002).
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
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/cluster"
	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation"
	"github.com/roamactors/roam/extension/relocation/handoff"
	"github.com/roamactors/roam/extension/spot"
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
	// Kinds are registered before the node claims its place, so its
	// descriptor lists their stable types (and the Instance ones) as
	// placement candidates for Spot creation and cold activation.
	Kinds []Kind
	// Relocation configures the hand-off; zero fields take spec defaults.
	Relocation relocation.Config
	// Spot configures the Spot manager; zero fields take spec defaults.
	// Its MessageFollowDuration defaults to the hand-off's.
	Spot spot.Config
	// Roots is the Relocation Store for creation requests and activation
	// recovery roots. Default: the Location Store, when it is one
	// (memstore and consulstore are).
	Roots location.RootStore
}

// Extension is roam on one node.
type Extension struct {
	node   *cluster.Node
	driver *relocation.Driver
	spots  *spot.Manager
}

// Start starts the node, claims it in the store, starts its relocation
// driver and Spot manager, and runs the Spot start-up scan in the
// background (spec 002 §4.1.1).
func Start(ctx context.Context, cfg Config) (*Extension, error) {
	for _, k := range cfg.Kinds {
		cfg.Node.StableTypes = append(cfg.Node.StableTypes, k.StableType)
		if k.Instance {
			cfg.Node.InstanceTypes = append(cfg.Node.InstanceTypes, k.StableType)
		}
	}
	if cfg.Spot.Routes.MessageFollowDuration == 0 {
		cfg.Spot.Routes.MessageFollowDuration = cfg.Relocation.Handoff.FollowDuration
		if cfg.Spot.Routes.MessageFollowDuration == 0 {
			cfg.Spot.Routes.MessageFollowDuration = handoff.DefaultConfig().FollowDuration
		}
	}
	// Refuse a bad route configuration before the node claims anything.
	if err := cfg.Spot.Routes.WithDefaults().Validate(); err != nil {
		return nil, err
	}
	roots := cfg.Roots
	if roots == nil {
		roots, _ = cfg.Node.Store.(location.RootStore)
	}
	var lookup *spot.IdentityLookup
	if pc := cfg.Node.ProtoCluster; pc != nil {
		p := *pc
		if p.Lookup == nil {
			p.Lookup = spot.NewIdentityLookup()
		}
		lookup, _ = p.Lookup.(*spot.IdentityLookup)
		cfg.Node.ProtoCluster = &p
	}
	node, err := cluster.Start(ctx, cfg.Node)
	if err != nil {
		return nil, err
	}
	if cfg.Relocation.Logger == nil {
		cfg.Relocation.Logger = cfg.Node.Logger
	}
	// The Spot manager hears of Message Follow hops; it exists only once
	// the driver does.
	var spots atomic.Pointer[spot.Manager]
	cfg.Relocation.OnFollow = func(key location.AuthorityKey, env *actor.MessageEnvelope) {
		if m := spots.Load(); m != nil {
			m.OnFollow(key, env)
		}
	}
	d, err := relocation.New(node, cfg.Node.Store, cfg.Relocation)
	if err != nil {
		return nil, errors.Join(err, node.Stop(ctx))
	}
	for _, k := range cfg.Kinds {
		if err := d.RegisterKind(k); err != nil {
			return nil, errors.Join(err, node.Stop(ctx))
		}
	}
	if cfg.Spot.Logger == nil {
		cfg.Spot.Logger = cfg.Node.Logger
	}
	m, err := spot.New(d, roots, cfg.Spot)
	if err != nil {
		return nil, errors.Join(err, node.Stop(ctx))
	}
	spots.Store(m)
	if lookup != nil {
		lookup.Attach(m)
	}
	go func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.Recover(rctx); err != nil && cfg.Node.Logger != nil {
			cfg.Node.Logger.Warn().Str("event", "spot_recovery_failed").Err(err).Msg("the Spot start-up scan did not finish")
		}
	}()
	return &Extension{node: node, driver: d, spots: m}, nil
}

// Spots is the node's Spot manager: Create, GetOrCreate, Find, Query,
// Close and direct calls by Spot ID (spec 002).
func (e *Extension) Spots() *spot.Manager { return e.spots }

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

// Serving reports whether this node runs the serving incarnation of ref.
func (e *Extension) Serving(ctx context.Context, ref Ref) (bool, error) {
	return e.driver.Serving(ctx, ref)
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
func (e *Extension) Stop(ctx context.Context) error {
	e.spots.Stop()
	return e.node.Stop(ctx)
}
