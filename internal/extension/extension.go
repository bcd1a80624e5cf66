// Package extension is roam's runtime on one node, behind package roam: it
// runs a node that claims its place in the Location Store (on its own actor
// system, or attached to an application's), registers
// relocatable kinds with their policies, spawns relocatable Actors, moves
// them with Relocate (docs/PROTOCOL.md §5), and addresses Spots by ID
// through Spots() (PROTOCOL.md §7).
//
//	store := memstore.New() // or consulstore.New(consulstore.Config{...})
//	ext, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: store},
//		Kinds: []extension.Kind{{StableType: "room", Producer: newRoom,
//			Policy: extension.PreserveStateWith(roomState{})}}})
//	pid, err := ext.SpawnActor(ctx, "room", "lobby")
//	out, err := ext.Relocate(ctx, extension.ActorRef("lobby"), otherNodeRid)
package extension

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/internal/failpoint"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/sessionhost"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
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

// Policies (PROTOCOL.md §2.4).
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

// UserSpotRef names the User Spot id: its own incarnation, which moves
// without its members (they move one by one).
func UserSpotRef(id string) Ref { return location.Key(location.KindUserSpot, id) }

// Config configures a node.
type Config struct {
	// Node configures the Proto.Actor node and its Location Store (required).
	Node meshnode.Config
	// Kinds are registered before the node claims its place, so its
	// descriptor lists their stable types (and the Instance ones) as
	// placement candidates for Spot creation and cold activation.
	Kinds []Kind
	// Relocation configures the hand-off; zero fields take the defaults of
	// PROTOCOL.md §9.
	Relocation relocation.Config
	// Spot configures the Spot manager; zero fields take the defaults of
	// PROTOCOL.md §9.
	// Its MessageFollowDuration defaults to the hand-off's.
	Spot spot.Config
	// Session bounds what a Session holds while its Actor moves and how
	// long a seal lasts (docs/SESSIONS.md); zero fields take the defaults.
	Session session.Config
	// Placement runs the director that moves idle units to even out the
	// nodes (docs/PLACEMENT.md) when Placement.Enabled; it needs a store
	// that is also a location.Board (memstore and consulstore are).
	Placement placement.Config
	// Roots is the Relocation Store for creation requests and activation
	// recovery roots. Default: the Location Store, when it is one
	// (memstore and consulstore are).
	Roots location.RootStore
	// Lookup, if set, is the Spot-backed IdentityLookup of the
	// application's Proto.Actor cluster (Node.Attach): each lifecycle's
	// Spot manager is attached to it.
	Lookup *spot.IdentityLookup
	// StopWithoutDrain makes Stop end the node at once, as before drains
	// existed: its objects are then recovered like an ended owner's. By
	// default Stop drains the node first (Drain), bounded by its context.
	StopWithoutDrain bool
	// OnRejoin, if set, is called after the Extension started a new node
	// lifecycle because the previous one's owner lease ended. The new
	// lifecycle has its own actor system (System() returns it) and, when
	// Node.Port is 0, a new address: spawn the application's own actors
	// there again.
	OnRejoin func(*Extension)
}

// Extension is roam on one node. It runs one node lifecycle at a time
// (an owner lease, a descriptor, an Entry Spot, the relocation driver and
// the Spot manager on their own actor system). When a lifecycle's lease
// ends without Stop — the node was cut off from the store, paused or slow
// for longer than its lease — the Extension starts a new lifecycle by
// itself (a new node RID and generation; the old one's objects are
// recovered like any ended owner's) and calls Config.OnRejoin.
type Extension struct {
	cfg     Config
	cur     atomic.Pointer[life]
	mu      sync.Mutex // guards kinds, stopped and the rejoin
	kinds   []Kind
	stopped bool
	retired []*life // ended lifecycles still answering late arrivals
	stopCh  chan struct{}
	// rejoining: the current lifecycle's lease ended and the next one is
	// not serving yet (Settled).
	rejoining atomic.Bool
	// quit is cancelled when StopNow begins: a rejoin under way (a claim
	// the store does not take, the wait for the old lifecycle's end) and
	// every lifecycle's background work end then, rather than when their
	// own timeouts run out.
	quit       context.Context
	cancelQuit context.CancelFunc
	// background counts the lifecycles' goroutines (sweeps, scans,
	// operators), which StopNow waits for once the rejoin goroutine ended
	// (only it starts lifecycles after Start, so none is added then).
	background sync.WaitGroup
	// retiring counts the stops of retired lifecycles under way
	// (stopRetired), which StopNow waits for.
	retiring sync.WaitGroup
	done     chan struct{} // closed when the rejoin goroutine ends
}

// life is one node lifecycle.
type life struct {
	// ctx ends when the node stops, its lease ends, or the Extension
	// stops: the lifecycle's background work ends with it.
	ctx      context.Context
	node     *meshnode.Node
	driver   *relocation.Driver
	spots    *spot.Manager
	sessions *sessionhost.Service
	director *placement.Director // nil unless Config.Placement.Enabled
}

// Validate refuses what Start would refuse of cfg's settings, without
// touching the network or the store: roam.New calls it so that a bad
// option is refused where it is given.
func Validate(cfg Config) error {
	if err := meshnode.ValidateConfig(cfg.Node); err != nil {
		return err
	}
	if err := relocation.ValidateConfig(cfg.Relocation); err != nil {
		return err
	}
	if cfg.Spot.Routes.MessageFollowDuration == 0 {
		cfg.Spot.Routes.MessageFollowDuration = cfg.Relocation.Handoff.FollowDuration
		if cfg.Spot.Routes.MessageFollowDuration == 0 {
			cfg.Spot.Routes.MessageFollowDuration = handoff.DefaultConfig().FollowDuration
		}
	}
	if err := spot.ValidateConfig(cfg.Spot); err != nil {
		return err
	}
	if err := cfg.Session.Validate(); err != nil {
		return err
	}
	if cfg.Placement.Enabled {
		if err := cfg.Placement.WithDefaults().Validate(); err != nil {
			return err
		}
	}
	for _, k := range cfg.Kinds {
		if err := relocation.ValidateKind(k); err != nil {
			return err
		}
	}
	return nil
}

// Start starts the node, claims it in the store, starts its relocation
// driver and Spot manager, and runs the Spot start-up scan in the
// background (PROTOCOL.md §7.7).
func Start(ctx context.Context, cfg Config) (*Extension, error) {
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
	if cfg.Placement.Enabled {
		if err := cfg.Placement.WithDefaults().Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Roots == nil {
		cfg.Roots, _ = cfg.Node.Store.(location.RootStore)
	}

	e := &Extension{cfg: cfg, kinds: append([]Kind(nil), cfg.Kinds...), stopCh: make(chan struct{}), done: make(chan struct{})}
	e.quit, e.cancelQuit = context.WithCancel(context.Background())
	l, err := e.startLife(ctx)
	if err != nil {
		e.cancelQuit()
		return nil, err
	}
	e.cur.Store(l)
	go e.rejoinLoop()
	return e, nil
}

// startLife starts one node lifecycle with every kind registered so far.
func (e *Extension) startLife(ctx context.Context) (*life, error) {
	cfg := e.cfg
	e.mu.Lock()
	kinds := append([]Kind(nil), e.kinds...)
	e.mu.Unlock()
	cfg.Node.StableTypes = append([]string(nil), cfg.Node.StableTypes...)
	cfg.Node.InstanceTypes = append([]string(nil), cfg.Node.InstanceTypes...)
	for _, k := range kinds {
		cfg.Node.StableTypes = append(cfg.Node.StableTypes, k.StableType)
		if k.Instance {
			cfg.Node.InstanceTypes = append(cfg.Node.InstanceTypes, k.StableType)
		}
	}
	lookup := cfg.Lookup
	if pc := cfg.Node.ProtoCluster; pc != nil && cfg.Node.Attach == nil {
		p := *pc
		if p.Lookup == nil {
			p.Lookup = spot.NewIdentityLookup(nil, func(kind string) bool {
				return slices.ContainsFunc(kinds, func(k Kind) bool { return k.StableType == kind && k.Instance })
			})
		}
		lookup, _ = p.Lookup.(*spot.IdentityLookup)
		cfg.Node.ProtoCluster = &p
	}
	node, err := meshnode.Start(ctx, cfg.Node)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(e.quit)
	e.goLife(func() {
		select {
		case <-node.Stopping():
		case <-node.LeaseLost():
		case <-lctx.Done():
		}
		cancel()
	})
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
	// Each move this node commits goes to its moves note (roamctl watch)
	// as well as to the application's OnEvent.
	board, hasBoard := cfg.Node.Store.(location.Board)
	var feed *operator.MoveFeed
	if hasBoard {
		feed = operator.NewMoveFeed(board, node.Descriptor().GetMesh(), node.Descriptor().GetNodeRid(), node.Clock())
		onEvent := cfg.Relocation.OnEvent
		cfg.Relocation.OnEvent = func(ev relocation.Event) {
			feed.Add(ev)
			if onEvent != nil {
				onEvent(ev)
			}
		}
	}
	if p := cfg.Placement.WithDefaults(); p.Enabled && p.Sampling() {
		// Every node samples its objects' traffic; the elected director
		// reads the tables (docs/PLACEMENT.md §5).
		cfg.Relocation.SampleEvery = p.CoLocation.SampleEvery
		cfg.Relocation.Edges = placement.NewEdgeTable(p.CoLocation.TableSize, p.CoLocation.HalfLife)
	}
	d, err := relocation.New(node, cfg.Node.Store, cfg.Relocation)
	if err != nil {
		return nil, startFailed(err, node.Stop(ctx))
	}
	// A lifecycle that fails to start on the application's system leaves
	// none of its actors there: the next attempt spawns them anew under
	// the same names.
	var m *spot.Manager
	failed := func(err error) error {
		stopErr := node.Stop(ctx)
		if node.Attached() {
			if m != nil {
				m.Shutdown()
			}
			d.Shutdown()
		}
		return startFailed(err, stopErr)
	}
	for _, k := range kinds {
		if err := d.RegisterKind(k); err != nil {
			return nil, failed(err)
		}
	}
	if cfg.Spot.Logger == nil {
		cfg.Spot.Logger = cfg.Node.Logger
	}
	m, err = spot.New(d, cfg.Roots, cfg.Spot)
	if err != nil {
		m = nil
		return nil, failed(err)
	}
	spots.Store(m)
	if lookup != nil {
		lookup.Attach(m)
	}
	sessions, err := sessionhost.Start(d, cfg.Session, sessionLogger(cfg.Node.Logger))
	if err != nil {
		m.Stop()
		return nil, failed(err)
	}
	l := &life{ctx: lctx, node: node, driver: d, spots: m, sessions: sessions}
	if hasBoard {
		e.serveOperators(l, board, feed)
	}
	if cfg.Placement.Enabled {
		if err := e.direct(l, board, hasBoard); err != nil {
			sessions.Stop()
			m.Stop()
			return nil, failed(err)
		}
	}
	e.goLife(func() { e.sweepEnded(l) })
	e.goLife(func() {
		// An owner seen gone only just now is not taken over for a lease
		// TTL (roamerr.ErrOwnerEnding): scan again after one, a few
		// times, so such activations resume without waiting for a call.
		for attempt := 0; ; attempt++ {
			rctx, cancel := machine.WithTimeout(lctx, l.node.Clock(), time.Minute)
			err := m.Recover(rctx)
			cancel()
			if err == nil || lctx.Err() != nil {
				return
			}
			if !errors.Is(err, roamerr.ErrOwnerEnding) || attempt == 4 {
				if cfg.Node.Logger != nil {
					cfg.Node.Logger.Warn().Str("event", "spot_recovery_failed").Err(err).Msg("the Spot start-up scan did not finish")
				}
				return
			}
			select {
			case <-lctx.Done():
				return
			case <-machine.After(node.Clock(), node.LeaseTTL()):
			}
		}
	})
	return l, nil
}

// goLife runs f, a lifecycle's background work that ends with its ctx,
// on a goroutine StopNow waits for.
func (e *Extension) goLife(f func()) {
	e.background.Add(1)
	go func() {
		defer e.background.Done()
		f()
	}()
}

// sweepPasses bounds the passes over the ended owners' objects after a
// node lifecycle disappeared or was revoked (or this one started), beyond
// the three lease TTLs they always last: enough for a share whose
// recoverer ended too to fall to another node.
const sweepPasses = 10

// forOperatorEvery is how many sweep ticks apart, past that budget, a pass
// runs again while objects wait: those waiting for an operator are
// counted again, and those no node could take are tried again.
const forOperatorEvery = 20

// sweepEnded recovers, for the lifecycle's life, the objects of ended
// owners without waiting for a call (spot.RecoverEnded, docs/FAULTS.md
// "Checkpoints and recovery"): every tick (a quarter lease TTL, at most a
// second) it lists the Mesh's node descriptors and revokes the lease of a
// lifecycle whose heartbeat stood still for its TTL (WatchNodes); after a
// lifecycle disappeared or was revoked (and once at start) it passes over
// the Instance Spots, User Spots and Actors every tick until none waits or
// the budget is spent, then every forOperatorEvery ticks while any waits.
func (e *Extension) sweepEnded(l *life) {
	period := min(max(l.node.LeaseTTL()/4, 250*time.Millisecond), time.Second)
	clock := l.node.Clock()
	mesh := l.node.Descriptor().GetMesh()
	known := map[string]bool{}
	// Enough passes to outlast the TTL a gone owner waits (liveness).
	budget := sweepPasses + int(3*l.node.LeaseTTL()/period)
	passes, ticks := budget, 0
	// waiting: the last pass left objects of ended owners waiting (or did
	// not finish). Past the budget they are looked at again now and then:
	// an object no node could take (every candidate full, or failing) is
	// taken once one can, without a new node event to start a pass.
	waiting := false
	for {
		fire, t := machine.NewTimer(clock, period)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-fire:
		}
		ctx, cancel := machine.WithTimeout(l.ctx, clock, time.Minute)
		if nodes, err := l.node.Store().ListNodes(ctx, mesh); err == nil {
			// A lifecycle whose heartbeat stood still for its TTL is
			// revoked here, and its objects recovered by the next pass.
			if n, err := l.driver.WatchNodes(ctx, nodes); n > 0 {
				passes = budget
			} else if err != nil && !errors.Is(err, roamerr.ErrOwnerEnding) {
				log := e.logger()
				log.Warn().Str("event", "owner_lease_revoke_failed").Err(err).Msg("a silent node's lease could not be revoked; the next look tries again")
			}
			cur := make(map[string]bool, len(nodes))
			for _, n := range nodes {
				cur[n.Node.GetNodeRid()+"/"+n.Node.GetLeaseId()] = true
			}
			for k := range known {
				if !cur[k] {
					passes = budget
				}
			}
			known = cur
		}
		ticks++
		if passes == 0 && (waiting || l.spots.ForOperator() > 0) && ticks%forOperatorEvery == 0 {
			passes = 1 // count them again: an operator may have released some
		}
		if passes > 0 && l.node.Valid() {
			passes--
			sw, err := l.spots.RecoverEnded(ctx)
			waiting = err != nil || sw.Waiting > 0
			switch {
			case err != nil && l.ctx.Err() != nil: // the lifecycle ended meanwhile
			case err != nil:
				log := e.logger()
				log.Warn().Str("event", "spot_recovery_failed").Err(err).Int("recovered", sw.Recovered).Int("waiting", sw.Waiting).
					Msg("a pass over the ended owners' Spots did not finish; the next pass tries again")
			case sw.Waiting == 0:
				passes = 0
			}
		}
		cancel()
	}
}

// serveOperators runs, for the lifecycle's life, the operators' requests
// (roamctl drain, move) and its moves note; it first clears the notes that
// ended lifecycles left behind.
func (e *Extension) serveOperators(l *life, board location.Board, feed *operator.MoveFeed) {
	ctx := l.ctx
	desc := l.node.Descriptor()
	log := e.logger()
	e.goLife(func() {
		operator.Serve(ctx, l.node.Clock(), board, desc.GetMesh(), desc.GetNodeRid(), &operatorHost{e: e, l: l}, log)
	})
	e.goLife(func() { feed.Run(ctx, log) })
	e.goLife(func() {
		sctx, scancel := machine.WithTimeout(ctx, l.node.Clock(), time.Minute)
		defer scancel()
		if _, err := location.SweepNotes(sctx, l.node.Store(), board, desc.GetMesh()); err != nil && ctx.Err() == nil {
			log.Debug().Str("event", "note_sweep_failed").Err(err).Msg("notes of ended node lifecycles were not all removed")
		}
	})
}

// direct runs the placement director for the lifecycle's life
// (docs/PLACEMENT.md): it directs only while elected, and stops when the
// lifecycle does.
func (e *Extension) direct(l *life, board location.Board, hasBoard bool) error {
	if !hasBoard {
		return fmt.Errorf("%w: the placement director needs a store that is also a location.Board", roamerr.ErrNotConfigured)
	}
	desc := l.node.Descriptor()
	d, err := placement.New(e.cfg.Placement, placement.Env{
		Store: l.node.Store(), Board: board, Mesh: desc.GetMesh(), Self: l.node.Descriptor, Clock: l.node.Clock(),
		Move: func(ctx context.Context, key location.AuthorityKey, targetRid string, window time.Duration) error {
			_, err := e.RelocateIfIdle(ctx, key, targetRid, window)
			return err
		},
		Samples: func(ctx context.Context, n *location.NodeDescriptor) (placement.Sample, error) {
			return l.driver.Edges(ctx, n.GetAddress(), e.cfg.Placement.WithDefaults().CoLocation.TableSize)
		},
		Logger: e.logger(),
	})
	if err != nil {
		return err
	}
	l.director = d
	d.Start()
	e.goLife(func() {
		<-l.ctx.Done()
		d.Stop()
	})
	return nil
}

// Placement is this lifecycle's director, or nil when Config.Placement
// is not enabled.
func (e *Extension) Placement() *placement.Director { return e.cur.Load().director }

// operatorHost runs operators' requests on a lifecycle.
type operatorHost struct {
	e *Extension
	l *life
}

func (h *operatorHost) Drain(ctx context.Context, opts drain.Options) (drain.Result, error) {
	if h.e.cur.Load() != h.l {
		return drain.Result{}, fmt.Errorf("%w: the node lifecycle the drain was asked of has ended", roamerr.ErrStale)
	}
	return h.e.Drain(ctx, opts)
}

func (h *operatorHost) Relocate(ctx context.Context, key location.AuthorityKey, target string) (relocation.Outcome, error) {
	return h.e.Relocate(ctx, key, target)
}

// rejoinLoop starts a new lifecycle whenever the current one's lease ends
// while the Extension is not stopping. A node that is a Proto.Actor
// cluster member does not rejoin by itself (its membership provider cannot
// be restarted in place): it logs node_rejoin_unsupported and stays ended.
func (e *Extension) rejoinLoop() {
	defer close(e.done)
	defer e.rejoining.Store(false)
	log := e.cfg.Node.Logger
	for {
		l := e.cur.Load()
		select {
		case <-e.stopCh:
			return
		case <-l.node.LeaseLost():
		}
		e.rejoining.Store(true)
		e.mu.Lock()
		stopped := e.stopped
		e.mu.Unlock()
		if stopped {
			return
		}
		if e.cfg.Node.ProtoCluster != nil && e.cfg.Node.Attach == nil {
			if log != nil {
				log.Error().Str("event", "node_rejoin_unsupported").Str("node_rid", l.node.Descriptor().GetNodeRid()).
					Msg("the owner lease ended; a Proto.Actor cluster member does not rejoin by itself: restart the process")
			}
			return
		}
		// End the old lifecycle for good: its claim is gone already. Its
		// objects first fail what they held, loudly; then its actor system
		// and remote stop. With a free port (Node.Port 0) the old remote
		// stays up for one Message Follow period to answer late arrivals
		// with a typed failure; a fixed port must be freed for the new one.
		l.sessions.Stop()
		l.spots.Stop()
		// On the node's clock: ending the lifecycle may wait for store
		// calls bounded on it (a rejoin is not a Stop, which is bounded in
		// real time).
		wctx, cancel := machine.WithTimeout(e.quit, l.node.Clock(), 10*time.Second)
		if err := l.driver.WaitEnded(wctx); err != nil && e.quit.Err() == nil && log != nil {
			log.Warn().Str("event", "lifecycle_end_incomplete").Err(err).Msg("not every incarnation of the ended lifecycle failed what it held in time")
		}
		cancel()
		switch {
		case e.cfg.Node.Attach != nil:
			// The application's system outlives the lifecycle: stop what
			// the old one runs there, so the new one can start its own at
			// the same address.
			stopNode(l.node)
			l.shutdown()
		case e.cfg.Node.Port == 0:
			e.mu.Lock()
			e.retired = append(e.retired, l)
			e.mu.Unlock()
			l.node.Clock().AfterFunc(e.cfg.Spot.Routes.MessageFollowDuration, func() { e.stopRetired(l) })
		default:
			stopNode(l.node)
		}
		for attempt := 0; ; attempt++ {
			if e.quit.Err() != nil {
				return
			}
			parent := e.quit
			if failpoint.StopCancelsRejoin.Broken() {
				parent = context.Background()
			}
			ctx, cancel := machine.WithTimeout(parent, machine.Or(e.cfg.Node.Clock), 30*time.Second)
			next, err := e.startLife(ctx)
			cancel()
			if err == nil {
				e.mu.Lock()
				stopped := e.stopped
				if !stopped {
					e.cur.Store(next)
					e.rejoining.Store(false)
				}
				e.mu.Unlock()
				if stopped {
					next.sessions.Stop()
					next.spots.Stop()
					_ = next.node.Stop(context.Background())
					next.shutdown()
					return
				}
				if log != nil {
					log.Warn().Str("event", "node_rejoined").Str("old_node_rid", l.node.Descriptor().GetNodeRid()).
						Str("node_rid", next.node.Descriptor().GetNodeRid()).Msg("the owner lease had ended; the node serves again as a new lifecycle")
				}
				if e.cfg.OnRejoin != nil {
					e.cfg.OnRejoin(e)
				}
				break
			}
			if e.quit.Err() != nil {
				return // Stop cancelled the attempt
			}
			if log != nil {
				log.Warn().Str("event", "node_rejoin_failed").Int("attempt", attempt).Err(err).Msg("starting a new node lifecycle failed; retrying")
			}
			select {
			case <-e.quit.Done():
				return
			case <-machine.After(machine.Real, min(time.Duration(attempt+1)*time.Second, 10*time.Second)): // pacing
			}
		}
	}
}

// Spots is the node's Spot manager: Create, GetOrCreate, Find, Query,
// Close and direct calls by Spot ID (PROTOCOL.md §7).
func (e *Extension) Spots() *spot.Manager { return e.cur.Load().spots }

// RegisterKind registers a relocatable kind after Start; every node that
// may host it must register it with the same ApplicationVersion. Only a
// kind spawned here explicitly (SpawnActor) can be added so: an Instance
// kind is refused with InvalidOperation, since the node's descriptor,
// which tells other nodes where a first message may activate it, was
// claimed at Start (give it in Config.Kinds).
func (e *Extension) RegisterKind(k Kind) error {
	if k.Instance {
		return fmt.Errorf("%w: Instance kind %q registered after Start: other nodes would never place its Spots here; give it in Config.Kinds", roamerr.ErrInvalidOperation, k.StableType)
	}
	if err := e.cur.Load().driver.RegisterKind(k); err != nil {
		return err
	}
	e.mu.Lock()
	e.kinds = append(e.kinds, k) // a later lifecycle registers it too
	e.mu.Unlock()
	return nil
}

// SpawnActor creates a relocatable Actor on this node.
func (e *Extension) SpawnActor(ctx context.Context, stableType, id string) (*actor.PID, error) {
	return e.cur.Load().driver.Spawn(ctx, stableType, id)
}

// SpawnInstanceSpot creates an Instance Spot on this node.
func (e *Extension) SpawnInstanceSpot(ctx context.Context, stableType, id string) (*actor.PID, error) {
	return e.cur.Load().driver.SpawnInstanceSpot(ctx, stableType, id)
}

func sessionLogger(l *zerolog.Logger) zerolog.Logger {
	if l == nil {
		return zerolog.Nop()
	}
	return *l
}

// OpenSession opens a client Session on this node (docs/SESSIONS.md).
func (e *Extension) OpenSession(opts sessionhost.Options) (*sessionhost.Session, error) {
	return e.cur.Load().sessions.Open(opts)
}

// Resolve returns the current PID of ref from the store.
func (e *Extension) Resolve(ctx context.Context, ref Ref) (*actor.PID, error) {
	return e.cur.Load().driver.Resolve(ctx, ref)
}

// Serving reports whether this node runs the serving incarnation of ref.
func (e *Extension) Serving(ctx context.Context, ref Ref) (bool, error) {
	return e.cur.Load().driver.Serving(ctx, ref)
}

// Relocate moves ref to the node target, named by its stable name
// (meshnode.Config.Name) or its RID, from any node: when this node is not
// ref's owner, the owner is asked to move it. It returns when the
// target's commit is visible in the store; the Outcome carries what the
// owner observed (phase timestamps only when this node is the owner). A
// move to the node that owns ref already returns at once, with a zero
// pause. NotFound when no live node of the mesh has that name or RID, or
// ref does not exist.
func (e *Extension) Relocate(ctx context.Context, ref Ref, target string) (Outcome, error) {
	return e.move(ctx, ref, target, idleSpec{})
}

// RelocateIfIdle is Relocate for a move that the owner admits only if the
// object is idle at its seal: no message queued, no timer due within
// window (docs/PLACEMENT.md §3). A busy object is not moved: the error is
// ErrUnavailable with ErrBusy, and it serves on where it is.
func (e *Extension) RelocateIfIdle(ctx context.Context, ref Ref, target string, window time.Duration) (Outcome, error) {
	return e.move(ctx, ref, target, idleSpec{only: true, window: window})
}

// idleSpec: an idle-only move (RelocateIfIdle) and its timer window.
type idleSpec struct {
	only   bool
	window time.Duration
}

func (e *Extension) move(ctx context.Context, ref Ref, target string, idle idleSpec) (Outcome, error) {
	if !relocation.Movable(ref.Kind) {
		return Outcome{}, fmt.Errorf("%w: an Entry Spot does not move", roamerr.ErrInvalidOperation)
	}
	l := e.cur.Load()
	out, used, err := l.relocate(ctx, ref, target, nodesFresh, idle)
	if err != nil {
		// The target was named by a node list up to nodesFresh old: if
		// the store's list names another node (one that restarted under
		// its name, or started just now), once more with that one.
		if rid, _, rerr := l.targetRid(ctx, target, 0); rerr == nil && rid != used {
			out, _, err = l.relocate(ctx, ref, target, 0, idle)
		}
	}
	if err != nil && failpoint.RefusedMoveIsTyped.Broken() {
		err = errors.New(err.Error())
	}
	return out, err
}

// nodesFresh is how old a node list Relocate resolves its target in may
// be: a move's set-up then costs no store round trip for it.
const nodesFresh = time.Second

// relocate moves ref to target as named in a node list at most nodesAge
// old; it returns the target's RID it used ("" when none).
func (l *life) relocate(ctx context.Context, ref Ref, target string, nodesAge time.Duration, idle idleSpec) (Outcome, string, error) {
	targetRid, nodes, err := l.targetRid(ctx, target, nodesAge)
	if err != nil {
		return Outcome{}, "", err
	}
	out, err := l.relocateTo(ctx, ref, targetRid, nodes, idle)
	return out, targetRid, err
}

func (l *life) relocateTo(ctx context.Context, ref Ref, targetRid string, nodes []*location.NodeDescriptor, idle idleSpec) (Outcome, error) {
	here := func() (Outcome, error) {
		if idle.only {
			return l.driver.RelocateIfIdle(ctx, ref, targetRid, idle.window)
		}
		return l.driver.Relocate(ctx, ref, targetRid)
	}
	self := l.node.Descriptor().GetNodeRid()
	_, local, lerr := l.driver.Local(ctx, ref)
	if errors.Is(lerr, roamerr.ErrDeadlineExceeded) || errors.Is(lerr, roamerr.ErrInvalidOperation) {
		// A move of it into this node outlasted the caller's deadline
		// (say so, rather than read the store with a context that ended),
		// or the caller is the callback that arrival waits for.
		return Outcome{}, lerr
	}
	if lerr == nil && local {
		// Served here: no need to read who owns it.
		if targetRid == self {
			return Outcome{Key: ref, From: self, To: self}, nil
		}
		out, err := here()
		if !errors.Is(err, roamerr.ErrNotFound) {
			return out, err
		}
		// It left meanwhile: the store says where it is.
	}
	// The owner may change between the read and the request (a move by
	// someone else): then the one asked answers NotFound, and the store is
	// read again.
	for attempt := 0; ; attempt++ {
		v, err := l.node.Store().Read(ctx, ref)
		if err != nil {
			if errors.Is(err, location.ErrNotFound) {
				return Outcome{}, fmt.Errorf("%w: %s", roamerr.ErrNotFound, ref)
			}
			return Outcome{}, fmt.Errorf("%w: relocate %s: %v", roamerr.ErrUnavailable, ref, err)
		}
		var out Outcome
		if v.Record.GetOwner().GetNodeRid() == targetRid && v.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY {
			// Already there: a move to where it is asks nothing of anyone.
			return Outcome{Key: ref, From: targetRid, To: targetRid}, nil
		}
		if v.Record.GetOwner().GetNodeRid() == l.node.Descriptor().GetNodeRid() {
			out, err = here()
		} else {
			// The owner's address, from the list the target came from; an
			// owner newer than that list is looked up.
			owner := v.Record.GetOwner().GetNodeRid()
			var address string
			if i := slices.IndexFunc(nodes, func(n *location.NodeDescriptor) bool { return n.GetNodeRid() == owner }); i >= 0 {
				address = nodes[i].GetAddress()
			} else if pid, rerr := l.driver.Resolve(ctx, ref); rerr == nil {
				address = pid.Address
			} else {
				err = rerr
			}
			switch {
			case address != "" && idle.only:
				out, err = l.driver.RelocateIfIdleAt(ctx, address, ref, targetRid, idle.window)
			case address != "":
				out, err = l.driver.RelocateAt(ctx, address, ref, targetRid)
			}
		}
		if err == nil || attempt == 2 || !errors.Is(err, roamerr.ErrNotFound) {
			return out, err
		}
	}
}

// DeleteActor ends the Actor ref for good, from any node (its owner is
// asked): the incarnation handles what it accepted, stops, and its record
// goes together with its membership, so its User Spot may then close and
// the ID may be spawned again. False when there is no such Actor.
func (e *Extension) DeleteActor(ctx context.Context, ref Ref) (bool, error) {
	var done bool
	err := e.atOwner(ctx, ref, func(l *life) (err error) {
		done, err = l.driver.DeleteActor(ctx, ref)
		return err
	}, func(l *life, address string) (err error) {
		done, err = l.driver.DeleteActorAt(ctx, address, ref)
		return err
	})
	if errors.Is(err, roamerr.ErrNotFound) {
		return false, nil
	}
	return done, err
}

// LeaveSpot takes the Actor ref out of the User Spot it is a member of,
// from any node (its owner is asked); it becomes a member of its owner's
// Entry Spot and serves on. InvalidOperation when it is no User Spot's
// member; NotFound when there is no such Actor.
func (e *Extension) LeaveSpot(ctx context.Context, ref Ref) error {
	return e.atOwner(ctx, ref, func(l *life) error { return l.driver.LeaveSpot(ctx, ref) },
		func(l *life, address string) error { return l.driver.LeaveSpotAt(ctx, address, ref) })
}

// JoinSpot makes the Actor ref a member of the User Spot incarnation to,
// from any node (its owner is asked): moved to the Spot's node first when
// it is elsewhere, with its owner and both memberships changed in one
// commit; its first message after that commit is messages.JoinedSpot.
func (e *Extension) JoinSpot(ctx context.Context, ref Ref, to spot.SpotRef) (relocation.Outcome, error) {
	join := &messages.Membership{SpotId: to.SpotID, SpotGeneration: to.ObjectGeneration}
	var out relocation.Outcome
	err := e.atOwner(ctx, ref, func(l *life) (err error) {
		out, err = l.driver.JoinSpot(ctx, ref, join)
		return err
	}, func(l *life, address string) (err error) {
		out, err = l.driver.JoinSpotAt(ctx, address, ref, join)
		return err
	})
	return out, err
}

// atOwner runs an Actor operation on its owner: here, or asked of the
// owner's node. An owner that changed meanwhile (a move) answers
// NotFound, and the store is read again.
func (e *Extension) atOwner(ctx context.Context, ref Ref, here func(*life) error, there func(*life, string) error) error {
	if ref.Kind != location.KindActor {
		return fmt.Errorf("%w: %s is not an Actor", roamerr.ErrInvalidOperation, ref)
	}
	l := e.cur.Load()
	for attempt := 0; ; attempt++ {
		v, err := l.node.Store().Read(ctx, ref)
		if errors.Is(err, location.ErrNotFound) {
			return fmt.Errorf("%w: %s", roamerr.ErrNotFound, ref)
		}
		if err != nil {
			return roamerr.Keep(roamerr.ErrUnavailable, "read "+ref.String(), err)
		}
		if v.Record.GetOwner().GetNodeRid() == l.node.Descriptor().GetNodeRid() {
			err = here(l)
		} else if pid, rerr := l.driver.Resolve(ctx, ref); rerr != nil {
			err = rerr
		} else {
			err = there(l, pid.Address)
		}
		if err == nil || attempt == 2 || !errors.Is(err, roamerr.ErrNotFound) {
			return err
		}
	}
}

// targetRid resolves a move's target: the live node of the mesh whose RID
// target is, else the one named so, else the newest one at that address;
// it returns the mesh's live nodes it read too.
func (l *life) targetRid(ctx context.Context, target string, maxAge time.Duration) (string, []*location.NodeDescriptor, error) {
	var all []*location.NodeDescriptor
	if maxAge > 0 {
		var err error
		if all, err = l.node.LiveNodes(ctx, maxAge); err != nil {
			return "", nil, fmt.Errorf("%w: relocate: list nodes: %v", roamerr.ErrUnavailable, err)
		}
	} else {
		listed, err := l.node.Store().ListNodes(ctx, l.node.Descriptor().GetMesh())
		if err != nil {
			return "", nil, fmt.Errorf("%w: relocate: list nodes: %v", roamerr.ErrUnavailable, err)
		}
		for _, n := range listed {
			all = append(all, n.Node)
		}
	}
	mesh := l.node.Descriptor().GetMesh()
	var nodes []*location.NodeDescriptor
	for _, n := range all {
		if n.GetMesh() == mesh {
			nodes = append(nodes, n)
		}
	}
	// RIDs first: they are unique by construction, and a name that
	// happens to equal another node's RID must not take its moves.
	for _, n := range nodes {
		if n.GetNodeRid() == target {
			return target, nodes, nil
		}
	}
	for _, n := range nodes {
		if n.GetName() == target {
			return n.GetNodeRid(), nodes, nil
		}
	}
	// An address: the newest lifecycle there (an older one may not have
	// left the store yet).
	var at *location.NodeDescriptor
	for _, n := range nodes {
		if n.GetAddress() == target && (at == nil || n.GetNodeGeneration() > at.GetNodeGeneration()) {
			at = n
		}
	}
	if at != nil {
		return at.GetNodeRid(), nodes, nil
	}
	return "", nil, fmt.Errorf("%w: no live node of mesh %q has the RID, name or address %q", roamerr.ErrNotFound, mesh, target)
}

// NodeName is this node's stable name, which Relocate takes as a target.
func (e *Extension) NodeName() string { return e.cur.Load().node.Name() }

// ReleaseEnded is the operator's acceptance that ref's owner ended and its
// in-memory state is lost: the ended owner's record is released so the
// Actor can be spawned again, the Instance Spot activated empty by its
// next call, or the User Spot created anew together with the release of
// its ended members (Spots().ReleaseEnded). InvalidOperation while the
// owner lives.
func (e *Extension) ReleaseEnded(ctx context.Context, ref Ref) (bool, error) {
	switch ref.Kind {
	case location.KindActor:
		return e.cur.Load().driver.ReleaseEnded(ctx, ref)
	case location.KindInstanceSpot, location.KindUserSpot:
		return e.Spots().ReleaseEnded(ctx, ref.ID)
	}
	return false, fmt.Errorf("%w: %s cannot be released", roamerr.ErrInvalidOperation, ref)
}

// Node is the underlying node (actor system, address, descriptor).
func (e *Extension) Node() *meshnode.Node { return e.cur.Load().node }

// CheckpointStats are the current lifecycle's checkpoint counts: captures
// taken, and the writer's outcomes.
func (e *Extension) CheckpointStats() (captures uint64, st checkpoint.Stats) {
	return e.cur.Load().driver.CheckpointStats()
}

// System is the node's actor system.
func (e *Extension) System() *actor.ActorSystem { return e.cur.Load().node.System() }

// Settled reports that the node has no work of its own under way that
// only needs the CPU: its lease loop has taken its Ticks and answers
// (meshnode.Node.Settled) and no rejoin is due or starting the next
// lifecycle. A test that runs nodes in logical time waits for it between
// steps of the clock, as real time would let a rejoin finish before the
// next renewal.
func (e *Extension) Settled() bool {
	l := e.cur.Load()
	if l.node.LeaseStatus() == lease.Ended {
		// An ended lease settles its node, but the rejoin it starts has
		// only begun: until the next lifecycle is current, or the rejoin
		// loop has ended (Stop, or a cluster member, which does not
		// rejoin), the node has CPU work due. rejoining alone would leave
		// a gap before the loop's goroutine runs, in which a starved rejoin
		// sees the clock move past the bounds of its claim.
		select {
		case <-e.done:
			return true
		default:
			return false
		}
	}
	return !e.rejoining.Load() && l.node.Settled()
}

// NodeRid is this node lifecycle's RID, the target name Relocate takes.
func (e *Extension) NodeRid() string { return e.cur.Load().node.Descriptor().GetNodeRid() }

// restoreTimeout is the hand-off's restore timeout as configured.
func (e *Extension) restoreTimeout() time.Duration {
	if t := e.cfg.Relocation.RestoreTimeout; t > 0 {
		return t
	}
	return 10 * time.Second
}

// stopNode stops n within 10 s of real time: stopping ends in bounded
// real time whatever the node's clock does.
func stopNode(n *meshnode.Node) {
	ctx, cancel := machine.WithTimeout(context.Background(), machine.Real, 10*time.Second)
	defer cancel()
	_ = n.Stop(ctx)
}

// stopRetired stops an ended lifecycle kept up after a rejoin. It runs
// from a timer of the node's clock, so the stop goes on a goroutine of its
// own: it may wait up to stopNode's bound for a store that does not answer
// the claim's release, and a logical clock runs its timers inside Advance,
// where that wait would hold every timer of every node on that clock.
func (e *Extension) stopRetired(l *life) {
	e.mu.Lock()
	i := slices.Index(e.retired, l)
	if i >= 0 {
		e.retired = slices.Delete(e.retired, i, i+1)
		// Under mu, before StopNow takes the retired: it waits for these.
		e.retiring.Add(1)
	}
	e.mu.Unlock()
	if i >= 0 {
		go func() {
			defer e.retiring.Done()
			stopNode(l.node)
		}()
	}
}

// Drain empties the node for a rolling deploy: it marks the node DRAINING
// (no new placement, activation or move lands here any more, here or as
// other nodes see it in the store) and moves every unit it serves to
// other live serving nodes, a bounded number at a time, placing each by
// the targets' load and capacity (docs/OPERATIONS.md). It returns when
// nothing movable is left or ctx ends, with every unit it could not move
// and why; the error is for a drain that could not start. The node keeps
// serving what did not move, and stays draining until it stops.
func (e *Extension) Drain(ctx context.Context, opts drain.Options) (drain.Result, error) {
	l := e.cur.Load()
	if err := l.node.SetDraining(ctx); err != nil {
		return drain.Result{}, err
	}
	log := e.logger()
	log.Info().Str("event", "drain_started").Msg("draining the node")
	opts.Clock = l.node.Clock()
	res, err := drain.Run(ctx, &drainHost{l: l}, opts)
	ev := log.Info()
	if err != nil || !res.Complete() {
		ev = log.Warn()
	}
	ev.Str("event", "drain_finished").Int("units", res.Total).Int("moved", res.Moved).Int("failed", len(res.Failed)).
		Dur("took", res.Finished.Sub(res.Started)).Dur("pause_p50", res.PauseP50).Dur("pause_p99", res.PauseP99).AnErr("error", err).
		Msg("drain finished")
	for i, f := range res.Failed {
		if i == 20 {
			log.Warn().Str("event", "drain_unit_failed").Int("more", len(res.Failed)-i).Msg("more units did not move")
			break
		}
		log.Warn().Str("event", "drain_unit_failed").Str("unit", f.Key.String()).Str("target", f.To).Err(f.Err).Msg("a unit did not move")
	}
	return res, err
}

func (e *Extension) logger() zerolog.Logger {
	if e.cfg.Node.Logger != nil {
		return *e.cfg.Node.Logger
	}
	return zerolog.Nop()
}

// drainHost is a lifecycle as drain.Run sees it.
type drainHost struct{ l *life }

func (h *drainHost) Inventory(ctx context.Context) (relocation.Inventory, error) {
	return h.l.driver.Inventory(ctx)
}

func (h *drainHost) Move(ctx context.Context, key location.AuthorityKey, targetRid string) (relocation.Outcome, error) {
	return h.l.driver.Relocate(ctx, key, targetRid)
}

func (h *drainHost) Owner(ctx context.Context, key location.AuthorityKey) (string, error) {
	v, err := h.l.node.Store().Read(ctx, key)
	if errors.Is(err, location.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", roamerr.Keep(roamerr.ErrUnavailable, "drain: read "+key.String(), err)
	}
	return v.Record.GetOwner().GetNodeRid(), nil
}

func (h *drainHost) Self() string { return h.l.node.Descriptor().GetNodeRid() }

// Targets are the mesh's other live SERVING nodes with their load, each
// asked once (in parallel); a node that does not answer is left out.
func (h *drainHost) Targets(ctx context.Context) ([]drain.Target, error) {
	self := h.l.node.Descriptor()
	nodes, err := h.l.node.Store().ListNodes(ctx, self.GetMesh())
	if err != nil {
		return nil, roamerr.Keep(roamerr.ErrUnavailable, "drain: list nodes", err)
	}
	var out []drain.Target
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		d := n.Node
		if d.GetNodeRid() == self.GetNodeRid() || d.GetStatus() != messages.NodeStatus_NODE_STATUS_SERVING || len(d.GetStableTypes()) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			load, err := h.l.driver.Load(ctx, d.GetAddress(), d.GetStableTypes()[0])
			if err != nil || errors.Is(load.Refused, roamerr.ErrNodeDraining) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			out = append(out, drain.Target{Rid: d.GetNodeRid(), Name: d.GetName(), StableTypes: d.GetStableTypes(),
				Weight: int(d.GetWeight()), Serving: load.Serving, Capacity: load.Capacity})
		}()
	}
	wg.Wait()
	return out, nil
}

// Stop drains the node (unless Config.StopWithoutDrain), bounded by ctx,
// tells its peers it is leaving and lets Message Follow fall quiet if it
// drained, then releases the node's claim and stops it; no new lifecycle
// starts.
// What the drain did not move is then an ended owner's, recovered as such
// (docs/FAULTS.md).
func (e *Extension) Stop(ctx context.Context) error {
	e.mu.Lock()
	stopped := e.stopped
	e.mu.Unlock()
	if l := e.cur.Load(); !stopped && l.node.Valid() {
		if !e.cfg.StopWithoutDrain {
			// A drain error (the store cannot be reached) leaves the stop to
			// go on: Drain logged it. The drain takes at most two thirds of
			// what ctx leaves: the peers must still be told and the claim
			// released, or what did not move waits a lease TTL.
			dctx, cancel := shareOf(ctx, 2, 3)
			_, _ = e.Drain(dctx, drain.Options{})
			cancel()
		}
		if l.node.Draining() {
			// Peers first stop sending here by their cached routes, then
			// what they had sent follows to the new owners. The wait for
			// it takes at most half of what is left of ctx: the rest is
			// the stop's own (moves in, last checkpoints, the release of
			// the node's claim), which a busy follow must not eat.
			e.flushPeers(ctx, l)
			qctx, cancel := shareOf(ctx, 1, 2)
			e.followQuiet(qctx, l)
			cancel()
		}
	}
	return e.StopNow(ctx)
}

// flushPeers tells every other live node of the mesh that this drained
// node is leaving (a load query marked leaving) and waits for the answers,
// each within the capability timeout. Before it answers, a node stops
// sending here by its cached routes and Message Follow hops: it reads the
// owner from the store instead (a send on a route cached up to the route
// cache's age would otherwise reach this node after its transport shut
// down, and be dropped without a word).
// An answer comes back on that node's connection to this one, behind
// everything the node queued for this one before answering: once it is
// here, no send of that node from before the question is still on its
// way. Without it, a sender whose connection is slow (a loaded node) can
// still hold sends to moved objects when this node's transport shuts
// down, and Proto.Actor drops what is in flight on a connection that ends
// without a dead letter, so those could not be redelivered. The sends it
// brings in follow to the objects' new owners; the follow-quiet wait after
// it lets them.
func (e *Extension) flushPeers(ctx context.Context, l *life) {
	self := l.node.Descriptor()
	log := e.logger()
	nodes, err := l.node.Store().ListNodes(ctx, self.GetMesh())
	if err != nil {
		// The follow-quiet wait is all there is.
		log.Warn().Str("event", "stop_peers_not_told").Err(err).
			Msg("stopping without telling the peers: a send on a route they cached here may be lost when the node stops")
		return
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		d := n.Node
		if d.GetNodeRid() == self.GetNodeRid() || d.GetAddress() == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.driver.Leaving(ctx, d.GetAddress()); err != nil {
				log.Warn().Str("event", "stop_peers_not_told").Str("peer_node_rid", d.GetNodeRid()).Str("address", d.GetAddress()).Err(err).
					Msg("stopping without the peer's answer: a send on a route it cached here may be lost when the node stops")
			}
		}()
	}
	wg.Wait()
}

// shareOf is ctx bounded by num/den of the time left to its deadline (ctx
// itself without one).
func shareOf(ctx context.Context, num, den time.Duration) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return machine.WithTimeout(ctx, machine.Real, machine.Until(machine.Real, dl)*num/den) // the caller's deadline: real time
}

// followQuietFor is how long Message Follow must have been idle before a
// drained node stops; followQuiet waits for it at most the follow duration.
const followQuietFor = 300 * time.Millisecond

// followQuiet keeps a drained lifecycle following until its old routes
// fall silent (Driver.FollowQuiet), within ctx and the follow duration.
func (e *Extension) followQuiet(ctx context.Context, l *life) {
	// Stopping is bounded in real time (see stopNode).
	fctx, cancel := machine.WithTimeout(ctx, machine.Real, e.cfg.Spot.Routes.MessageFollowDuration)
	defer cancel()
	if err := l.driver.FollowQuiet(fctx, followQuietFor); err != nil {
		log := e.logger()
		log.Warn().Str("event", "stop_while_following").Err(err).Msg("stopping while messages still follow to moved objects; late ones are redelivered from the store")
	}
}

// checkpointFlushFor bounds the last checkpoints of a stopping node.
const checkpointFlushFor = 5 * time.Second

// StopNow is Stop without the drain: for a node whose actor system is gone
// already, or an application that chose so.
func (e *Extension) StopNow(ctx context.Context) error {
	e.mu.Lock()
	first := !e.stopped
	e.stopped = true
	e.mu.Unlock()
	if first {
		e.cancelQuit()
		close(e.stopCh)
	}
	// A rejoin under way ends first (its attempt is cancelled; a lifecycle
	// it had just started it stops itself): from here on the lifecycle in
	// e.cur is the last one, and only this goroutine ends it.
	rejoinEnded := false
	select {
	case <-e.done:
		rejoinEnded = true
	case <-ctx.Done():
	}
	e.mu.Lock()
	retired := e.retired
	e.retired = nil
	e.mu.Unlock()
	for _, r := range retired {
		stopNode(r.node)
	}
	l := e.cur.Load()
	// Moves into this node that passed relay-ready commit first (bounded by
	// ctx and the restore timeout); then the lease ends and the node stops.
	fctx, cancel := machine.WithTimeout(ctx, machine.Real, e.restoreTimeout()) // stopping: real time (stopNode)
	if err := l.driver.FinishIncoming(fctx); err != nil && e.cfg.Node.Logger != nil {
		e.cfg.Node.Logger.Warn().Str("event", "stop_incoming_unfinished").Err(err).Msg("stopping with moves into the node or Actor deletions on it unfinished")
	}
	cancel()
	// What still serves here ends with the node: its latest state goes to
	// its checkpoint first, for its recovery elsewhere.
	cctx, cancel := machine.WithTimeout(ctx, machine.Real, checkpointFlushFor) // stopping: real time (stopNode)
	if err := l.driver.FlushCheckpoints(cctx); err != nil {
		log := e.logger()
		log.Warn().Str("event", "checkpoint_flush_incomplete").Err(err).Msg("stopping before every serving object's last state was checkpointed; what it handled since its last checkpoint is lost")
	}
	cancel()
	l.sessions.Stop()
	l.spots.Stop()
	err := l.node.Stop(ctx)
	l.shutdown()
	if rejoinEnded {
		// Every lifecycle's background work was cancelled above (quit);
		// none of it outlives the Extension.
		waited := make(chan struct{})
		go func() {
			e.background.Wait()
			e.retiring.Wait()
			close(waited)
		}()
		select {
		case <-waited:
		case <-ctx.Done():
		}
	}
	return err
}

// shutdown stops, after its node stopped, what a lifecycle runs on an
// application's actor system, which outlives it; a node's own system
// stopped all of it already.
func (l *life) shutdown() {
	// What its ended incarnations held back of their log (a line a second)
	// is written now: the process may exit before the next.
	l.driver.FlushSendLogs()
	if l.node.Attached() {
		l.spots.Shutdown()
		l.driver.Shutdown()
	}
}
