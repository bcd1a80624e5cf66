package spot

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/internal/stopguard"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// ServiceName is the PID id of every node's Spot service, which answers
// SpotActivation (cold activation), UserSpotCreate and UserSpotClose
// (docs/PROTOCOL.md §8).
const ServiceName = "roam/spot"

// Config configures a Manager. Zero fields take the documented defaults.
type Config struct {
	// Routes holds RouteCacheMaxAge (default 15 s) and
	// MessageFollowDuration (default 30 s); the cache age must be at least
	// 5 s shorter (PROTOCOL.md §7.8). The follow duration must be the one the
	// relocation driver uses.
	Routes RouteConfig
	// DefaultTimeout is a call's deadline when it sets none. Default 5 s.
	DefaultTimeout time.Duration
	// ResultRetention is how long a target keeps a create's or close's
	// terminal result for a redelivery of the same operation
	// (PROTOCOL.md §7.2). Default 1 min.
	ResultRetention time.Duration
	// Logger receives the Spot warnings. Default zerolog.Nop.
	Logger *zerolog.Logger
	// MeterProvider receives roam.spot.calls, .operations and .activation.
	// Default: OpenTelemetry's global provider.
	MeterProvider metric.MeterProvider
	// InFlight bounds the cold activations and Spot commands (create,
	// close) the node's Spot service holds at once.
	InFlight InFlightLimits
}

// InFlightLimits bound what other nodes — or a process claiming to be one
// — can make a node's Spot service hold at once. Cold activations queue
// per Spot ID (each with its first message, one goroutine per Spot) and
// each command takes a goroutine: the limits count a sender's Spots being
// activated and its commands, and the bytes of the messages queued. One
// past a limit is answered capacity_exceeded (a caller may retry) and
// counted as refused. The node's own calls count only toward Bytes.
type InFlightLimits struct {
	// PerPeer bounds the Spots one sender address has activations queued
	// for, plus its commands. Default 256.
	PerPeer int
	// Total bounds them for all senders. Default 4,096.
	Total int
	// Bytes bounds the activations' messages queued in all. Default 256
	// MiB.
	Bytes int64
}

func (l InFlightLimits) withDefaults() InFlightLimits {
	if l.PerPeer <= 0 {
		l.PerPeer = 256
	}
	if l.Total <= 0 {
		l.Total = 4096
	}
	if l.Bytes <= 0 {
		l.Bytes = 256 << 20
	}
	return l
}

// ValidateConfig refuses what New would refuse of c.
func ValidateConfig(c Config) error { return c.setDefaults() }

func (c *Config) setDefaults() error {
	if c.ResultRetention < 0 || c.InFlight.PerPeer < 0 || c.InFlight.Total < 0 || c.InFlight.Bytes < 0 {
		return fmt.Errorf("%w: ResultRetention (%s) and the in-flight limits (%+v) must not be negative", roamerr.ErrInvalidOperation, c.ResultRetention, c.InFlight)
	}
	c.Routes = c.Routes.WithDefaults()
	if err := c.Routes.Validate(); err != nil {
		return err
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 5 * time.Second
	}
	if c.DefaultTimeout < 0 {
		return fmt.Errorf("%w: DefaultTimeout %s", roamerr.ErrInvalidOperation, c.DefaultTimeout)
	}
	if c.ResultRetention == 0 {
		c.ResultRetention = time.Minute
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	c.InFlight = c.InFlight.withDefaults()
	return nil
}

// Manager is a node's Spot manager: Create, GetOrCreate, Find, Query and
// Close of User Spots, and direct calls by Spot ID with cold activation of
// Instance Spots (PROTOCOL.md §7). It hosts Spots through the node's relocation
// driver, so a Spot moves like any relocatable object.
type Manager struct {
	d     *relocation.Driver
	clock machine.Clock // the node's (relocation.Driver.Clock)
	// lastGeneration is the last ObjectGeneration newGeneration issued.
	lastGeneration atomic.Uint64
	store          location.Store
	roots          location.RootStore
	sys            *actor.ActorSystem
	desc           *location.NodeDescriptor
	cfg            Config
	acfg           activation.Config // the activation machines' settings
	log            zerolog.Logger
	self           *actor.PID
	cache          *routeCache
	met            *metrics
	// inProcess: the store answers in the process (memstore), so
	// concurrent reads gain nothing.
	inProcess bool
	// immediate: the store's calls return at once (location.Immediate):
	// an activation makes them on its own loop's goroutine (runner.store).
	immediate bool
	// keysReader: the node's store reads a Spot's two keys in one round
	// trip (nil: two reads).
	keysReader location.KeysReader
	// rootsInline: the Relocation Store is the Location Store, so a small
	// recovery root is written in the reservation's own transaction
	// (location.OpCreateRoot).
	rootsInline bool
	// pending counts creations in progress here (admitCapacity).
	pending atomic.Int64
	// lost holds, per peer address, a channel closed when the connection
	// to it ends (then replaced by the next lostSignal): the calls waiting
	// on that peer share it.
	lostMu sync.RWMutex
	lost   map[string]chan struct{}
	// resolving holds the route reads of calls in progress, per Spot ID
	// (readRouteAuthority): the calls that need one ID's route at once
	// share one read.
	resolvingMu sync.Mutex
	resolving   map[string]*routeRead
	stop        chan struct{}
	// tick is closed and replaced every second (everySecond): the calls
	// waiting for a reply check their owner's liveness on it. Every call
	// by Spot ID reads it: atomic, not under a lock 32 callers contend on.
	tick     atomic.Pointer[chan struct{}]
	stopOnce sync.Once
	events   *eventstream.Subscription
	// refusedLog limits control_message_refused lines.
	refusedLog ratelog.Limiter
	forgotLog  ratelog.Limiter // route_forgotten
	refusedN   atomic.Int64    // commands refused for their sender
	// pendingOps: the operation ids of this node's UserSpotCreate and
	// UserSpotClose commands still
	// waiting for their answer (CommandConfirm).
	pendingOps sync.Map

	mu sync.Mutex
	// results are the terminal results by operation id (PROTOCOL.md §7.2,
	// §7.9).
	results map[string]*retained
	// resultsSwept is when expired results were last dropped.
	resultsSwept time.Time
	keyLock      spotservice.Locks[string]                    // this node's work on one Spot ID, one at a time
	queues       spotservice.Queues[string, queuedActivation] // SpotActivations per Spot ID, in arrival order
	inFlight     inFlight                                     // activations and commands held, by sender
	watches      spotservice.Watches
	// recovering counts, per ended owner's object, the recovery passes
	// that found it waiting (RecoverEnded, recoversNow).
	recovering struct {
		sync.Mutex
		passes map[location.AuthorityKey]int
	}
}

// watch waits until key moves past version after, or ctx ends. All of this
// node's waiters on the same key and version share one store watch, so
// fifty callers waiting for one creation hold one Consul blocking query,
// not fifty connections.
func (m *Manager) watch(ctx context.Context, key location.AuthorityKey, after location.StoreVersion) error {
	wk := spotservice.WatchKey{Key: key, After: after}
	answer := make(chan error, 1) // a waiter gone at its deadline is not waited for
	m.mu.Lock()
	start := m.watches.Join(wk, func(err error) { answer <- err })
	m.mu.Unlock()
	if start {
		go func() {
			wctx, cancel := machine.WithTimeout(context.Background(), m.clock, spotservice.SharedWatchTimeout)
			defer cancel()
			_, err := m.store.Watch(wctx, key, after)
			m.mu.Lock()
			waiters, result := m.watches.Finish(wk, err, wctx.Err() != nil)
			m.mu.Unlock()
			for _, f := range waiters {
				f(result)
			}
		}()
	}
	select {
	case err := <-answer:
		return err
	case <-ctx.Done():
		return spotservice.WaitExpired(key, ctx.Err())
	}
}

type retained struct {
	done  chan struct{} // closed once reply is set
	reply *messages.SpotReply
	until time.Time
}

// New starts the Spot service of the node d runs on. roots is the
// Relocation Store for creation requests and activation recovery roots.
func New(d *relocation.Driver, roots location.RootStore, cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if roots == nil {
		return nil, fmt.Errorf("%w: spot: a Relocation Store (location.RootStore) is required", roamerr.ErrNotConfigured)
	}
	met, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		met:       met,
		d:         d,
		clock:     d.Clock(),
		store:     d.Store(),
		roots:     roots,
		sys:       d.System(),
		desc:      d.Descriptor(),
		cfg:       cfg,
		log:       cfg.Logger.With().Str("node_rid", d.Descriptor().GetNodeRid()).Logger(),
		cache:     newRouteCache(cfg.Routes.RouteCacheMaxAge, cfg.Routes.RouteCacheMaxRoutes),
		results:   map[string]*retained{},
		inFlight:  inFlight{limits: cfg.InFlight, held: map[flightKey]int{}, perPeer: map[string]int{}},
		lost:      map[string]chan struct{}{},
		resolving: map[string]*routeRead{},
		stop:      make(chan struct{}),
	}
	m.cache.clock = m.clock
	m.cache.drain = m.drainRoute
	m.cache.forgot = func(id string) {
		m.forgotLog.Warn(&m.log).Str("event", "route_forgotten").Str("spot_id", ratelog.Clip(id)).
			Msg("a route left the cache undrained: as many drains wait for their barriers as the cache holds routes; a call after a move of this Spot may overtake what this node sent before")
	}
	// The node's own store: m.store is its lease-fenced view, which does
	// not say.
	if s, ok := d.Node().Store().(location.InProcess); ok {
		m.inProcess = s.InProcess()
	}
	m.immediate = location.IsImmediate(d.Node().Store())
	// Reads need no lease: the store's own two-key read serves them.
	m.keysReader, _ = d.Node().Store().(location.KeysReader)
	if rs, ok := d.Node().Store().(location.RootStore); ok && samePointer(rs, roots) {
		m.rootsInline = true
	}
	m.acfg = activation.DefaultConfig(m.owner())
	m.acfg.RootsInApply = m.rootsInline
	// Nothing but the manager's own Stop ends the Spot service: activations
	// placed on this node and every Spot request rely on it.
	guard := stopguard.Producer(actor.Unbounded(), func() bool {
		select {
		case <-m.stop:
			return true
		default:
			return false
		}
	}, func(any) {
		m.log.Warn().Str("event", "stop_refused").Str("actor", ServiceName).Msg("a stop of the Spot service from outside roam was refused")
	})
	pid, err := m.sys.Root.SpawnNamed(actor.PropsFromFunc(m.receive, actor.WithMailbox(guard), actor.WithGuardian(relocation.RestartAlways),
		actor.WithDispatcher(machine.Dispatcher{Through: machine.DefaultThroughput})), ServiceName)
	if err != nil {
		return nil, fmt.Errorf("%w: spawn the Spot service: %w", roamerr.ErrInvalidOperation, err)
	}
	m.self = pid
	m.sys.Extensions.Register(m)
	m.events = m.sys.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*remote.EndpointTerminatedEvent); ok {
			m.endpointLost(e.Address)
		}
	})
	d.Slots().OnFull(m.reclaimAbandoned)
	first := make(chan struct{})
	m.tick.Store(&first)
	go m.everySecond()
	return m, nil
}

// Stop ends the manager's background work (extension.Stop calls it).
func (m *Manager) Stop() { m.stopOnce.Do(func() { close(m.stop) }) }

// Shutdown stops, after Stop, the Spot service actor on an actor system
// that outlives the node (meshnode.Node.Attached), so that a next
// lifecycle on the same system can start its own.
func (m *Manager) Shutdown() {
	m.Stop()
	m.sys.EventStream.Unsubscribe(m.events)
	_ = m.sys.Root.StopFuture(m.self).Wait()
}

// everySecond is the manager's one background loop: each second it
// wakes the calls waiting for a reply to check their owner's liveness,
// then sweeps the route cache. It ends at Stop.
func (m *Manager) everySecond() {
	for {
		fire, t := machine.NewTimer(m.clock, spotcall.TickEvery)
		select {
		case <-m.stop:
			t.Stop()
			return
		case <-fire:
		}
		next := make(chan struct{})
		close(*m.tick.Swap(&next))
		m.sweepRoutes()
	}
}

// sweepRoutes drops the cached routes of nodes that left (their descriptor
// is gone or names another lease), so a call does not use a route to a
// node that is no more: the positive cache is only used within the owner
// lease (PROTOCOL.md §7.8).
func (m *Manager) sweepRoutes() {
	if m.cfg.Routes.RouteCacheMaxAge <= 0 || m.cache.len() == 0 {
		return
	}
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, spotcall.TickEvery)
	nodes, err := m.store.ListNodes(ctx, "")
	cancel()
	if err != nil {
		return // a store failure drops nothing: calls still check liveness
	}
	live := make(map[string]string, len(nodes))
	for _, n := range nodes {
		live[n.Node.GetNodeRid()] = n.Node.GetLeaseId()
	}
	m.cache.dropOwnersNotIn(live)
}

// lostSignal returns a channel closed when the connection to address ends
// (a call takes it before it sends: a loss after that closes it). This
// node's own address is never lost: nil.
func (m *Manager) lostSignal(address string) <-chan struct{} {
	if address == m.desc.GetAddress() {
		return nil
	}
	m.lostMu.RLock()
	ch := m.lost[address]
	m.lostMu.RUnlock()
	if ch != nil {
		return ch
	}
	m.lostMu.Lock()
	defer m.lostMu.Unlock()
	if ch = m.lost[address]; ch == nil {
		ch = make(chan struct{})
		m.lost[address] = ch
	}
	return ch
}

func (m *Manager) endpointLost(address string) {
	m.lostMu.Lock()
	defer m.lostMu.Unlock()
	if ch := m.lost[address]; ch != nil {
		close(ch)
		delete(m.lost, address)
	}
}

// routeLost reports whether a cached route's owner has left: this node saw
// the connection to its address end and the store no longer has its
// lifecycle alive (or has no descriptor of it at all). Nothing sent on the
// route can still arrive by it, and no barrier down it would be answered.
// A call must not be sent on such a route: Proto.Actor would dial the dead
// address again for seconds and then drop the message, so the call could
// only end at its deadline with its outcome unknown, while the Spot is,
// after a drain, Ready on another node. Checked only after a connection
// ended, so a route in use costs no store read.
func (m *Manager) routeLost(ctx context.Context, a authority) (lost bool) {
	spotcall.RouteLost(m.d.ConnectionEnded(a.address), func(answer func(bool, error)) {
		_, alive, err := m.ownerAddress(ctx, a.v.Record.GetOwner())
		answer(alive, err)
	}, func(l bool) { lost = l })
	return lost
}

// servicePID is a node's Spot service.
func servicePID(address string) *actor.PID { return actor.NewPID(address, ServiceName) }

// receive is the Spot service. Each command runs on its own goroutine, so
// a slow factory or store never blocks the others; the reply goes to the
// captured sender.
func (m *Manager) receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *messages.SpotActivation:
		size := int64(proto.Size(msg))
		if !m.inFlight.admit(m.flightKey(c.Sender(), msg.GetSpotId()), size) {
			m.refused("Spot activation", c.Sender().GetAddress(), "past the node's in-flight limit")
			relocation.RespondFailure(m.sys, relocation.ReplyRoute(msg.GetFirst()), msg.GetFirst(), msg.GetSpotId(), errInFlight)
			return
		}
		m.enqueueActivation(msg, c.Sender(), size)
	case *messages.UserSpotCreate:
		m.runCommand(c.Sender(), msg.GetSourceNodeRid(), msg.GetSourceNodeGeneration(), msg.GetOperationId(),
			func() *messages.SpotReply { return m.onCreate(msg) })
	case *messages.UserSpotClose:
		m.runCommand(c.Sender(), msg.GetSourceNodeRid(), msg.GetSourceNodeGeneration(), msg.GetOperationId(),
			func() *messages.SpotReply { return m.onClose(msg) })
	case *messages.RouteHint:
		m.onHint(msg.GetSpotId())
	case *messages.CommandConfirm:
		_, pending := m.pendingOps.Load(msg.GetOperationId())
		c.Respond(&messages.CommandConfirm{OperationId: msg.GetOperationId(), Nonce: msg.GetNonce(), Pending: pending})
	}
}

// replyMember runs a UserSpotCreate or UserSpotClose only when the node it names as its
// source is a live member of the mesh at the address it came from (the
// reply goes there); anything else is refused and not retained, so a
// forged operation id cannot shadow the real one.
func (m *Manager) replyMember(to *actor.PID, rid string, generation uint64, op string, run func() *messages.SpotReply) {
	if to == nil {
		m.refused("Spot command", "", "no sender")
		return
	}
	// On the node's clock: confirm gives the source what is left of it.
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.cfg.DefaultTimeout)
	defer cancel()
	err := m.d.Node().VerifyPeer(ctx, rid, generation, to.Address)
	if err == nil {
		err = m.confirm(ctx, to.Address, op)
	}
	if err != nil {
		m.refused("Spot command", to.Address, err.Error())
		out := failure(peerRefusal("the command's source", err))
		out.OperationId = op
		m.sys.Root.Send(to, out)
		return
	}
	m.reply(to, op, run)
}

// confirm asks the Spot service at address (a live node's) whether it sent
// operation op and waits for it: only then did that node send the command
// — without TLS, anyone may claim its address as the sender. A redelivery
// is confirmed too (its source still waits for the answer).
func (m *Manager) confirm(ctx context.Context, address, op string) error {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	dl, _ := ctx.Deadline()
	res, err := ask.Ask(ctx, m.sys, servicePID(address), &messages.CommandConfirm{OperationId: op, Nonce: nonce}, machine.Until(m.clock, dl), ask.Question{
		Clock: m.clock, From: address, What: "command confirmation", Accept: func(msg any) bool {
			c, ok := msg.(*messages.CommandConfirm)
			return ok && c.GetOperationId() == op && bytes.Equal(c.GetNonce(), nonce)
		}})
	if err != nil {
		return fmt.Errorf("%w: confirm the command with its source: %w", roamerr.ErrUnavailable, err)
	}
	c, ok := res.(*messages.CommandConfirm)
	if !ok || !c.GetPending() {
		return fmt.Errorf("%w: the named source did not send this command", meshnode.ErrNotMember)
	}
	return nil
}

// peerRefusal is what a refused command's caller is told: PermissionDenied
// when the store says its sender is no live node there, Unavailable when
// the store could not tell (retry). It names nothing the caller did not
// send.
func peerRefusal(who string, err error) error {
	if errors.Is(err, meshnode.ErrNotMember) {
		return fmt.Errorf("%w: %s is not a live node of the cluster at its address", roamerr.ErrPermissionDenied, who)
	}
	return fmt.Errorf("%w: %s could not be checked in the Location Store now", roamerr.ErrUnavailable, who)
}

// refused logs a command refused for its sender.
// At most one line per 100 ms: a peer can send refused commands at will.
func (m *Manager) refused(what, from, why string) {
	m.refusedN.Add(1)
	m.refusedLog.Warn(&m.log).Str("event", "control_message_refused").Str("message", what).Str("from", ratelog.Clip(from)).
		Str("reason", ratelog.Clip(why)).Msg("a control message from a peer that is not entitled to it was refused")
}

// reply answers a command once per operation id: a redelivery of the same
// operation gets the retained terminal result, never a second run
// (PROTOCOL.md §7.2).
func (m *Manager) reply(to *actor.PID, op string, run func() *messages.SpotReply) {
	out := m.once(op, run)
	if to != nil {
		m.sys.Root.Send(to, out)
	}
}

// once runs a command's operation at most once per operation id: a
// concurrent redelivery waits for the first run, a later one gets the
// retained result.
func (m *Manager) once(op string, run func() *messages.SpotReply) *messages.SpotReply {
	now := m.clock.Now()
	m.mu.Lock()
	if now.Sub(m.resultsSwept) >= time.Second { // not a scan of every retained result per command
		m.resultsSwept = now
		for k, r := range m.results {
			if r.reply != nil && now.After(r.until) {
				delete(m.results, k)
			}
		}
	}
	r, seen := m.results[op]
	if !seen {
		r = &retained{done: make(chan struct{})}
		m.results[op] = r
	}
	m.mu.Unlock()
	if seen {
		<-r.done
		return r.reply
	}
	out := run()
	out.OperationId = op
	m.mu.Lock()
	r.reply, r.until = out, m.clock.Now().Add(m.cfg.ResultRetention)
	m.mu.Unlock()
	close(r.done)
	return out
}

// failure is a SpotReply failure tail.
func failure(err error) *messages.SpotReply {
	return &messages.SpotReply{FailureCode: roamerr.Code(err), FailureDetail: err.Error()}
}

// lockKey serialises this node's own work on one Spot ID.
func (m *Manager) lockKey(id string) func() {
	granted := make(chan func(), 1)
	m.lockKeyThen(id, func(unlock func()) { granted <- unlock })
	return <-granted
}

// lockKeyThen queues for id's lock and calls granted with its unlock once
// it is this caller's: at once, or on the goroutine of the unlock before
// it (so granted must not block).
func (m *Manager) lockKeyThen(id string, granted func(unlock func())) {
	unlock := func() {
		m.mu.Lock()
		next := m.keyLock.Release(id)
		m.mu.Unlock()
		if next != nil {
			next()
		}
	}
	m.mu.Lock()
	now := m.keyLock.Acquire(id, func() { granted(unlock) })
	m.mu.Unlock()
	if now {
		granted(unlock)
	}
}

// errInFlight answers an activation or command past InFlightLimits.
var errInFlight = fmt.Errorf("%w: the node holds as many activations and commands from its peers as it takes; retry", roamerr.ErrCapacityExceeded)

// runCommand runs a Spot command from another node on a goroutine of its
// own, within the in-flight limits.
func (m *Manager) runCommand(sender *actor.PID, rid string, generation uint64, op string, run func() *messages.SpotReply) {
	key := m.flightKey(sender, "command "+op)
	if !m.inFlight.admit(key, 0) {
		m.refused("Spot command", sender.GetAddress(), "past the node's in-flight limit")
		if sender != nil {
			out := failure(errInFlight)
			out.OperationId = op
			m.sys.Root.Send(sender, out)
		}
		return
	}
	machine.Go(func() {
		defer m.inFlight.release(key, 0)
		m.replyMember(sender, rid, generation, op, run)
	})
}

// enqueueActivation queues a SpotActivation behind the earlier ones for the
// same Spot ID: one goroutine per ID handles them in arrival order, so a
// caller's messages to a Spot being activated keep their order. It holds
// size bytes of the in-flight limits until handled.
func (m *Manager) enqueueActivation(a *messages.SpotActivation, from *actor.PID, size int64) {
	id := a.GetSpotId()
	m.mu.Lock()
	start := m.queues.Push(id, queuedActivation{a, from, size})
	m.mu.Unlock()
	if !start {
		return
	}
	go func() {
		for {
			m.mu.Lock()
			next, ok := m.queues.Next(id)
			m.mu.Unlock()
			if !ok {
				return
			}
			if err := m.fromMember(next.a, next.from); err != nil {
				m.refused("Spot activation", next.from.GetAddress(), err.Error())
				// The caller learns it at once, typed (a node whose lease
				// ended, say), instead of waiting out its deadline.
				relocation.RespondFailure(m.sys, relocation.ReplyRoute(next.a.GetFirst()), next.a.GetFirst(), id, peerRefusal("the activation's sender", err))
				m.inFlight.release(m.flightKey(next.from, id), next.size)
				continue
			}
			m.onActivation(next.a)
			m.inFlight.release(m.flightKey(next.from, id), next.size)
		}
	}()
}

// queuedActivation is a SpotActivation and the Spot service that sent it: the
// caller's, or a full target's passing it on.
type queuedActivation struct {
	a    *messages.SpotActivation
	from *actor.PID
	size int64 // held of the in-flight limits
}

// flightKey is what a message from sender for what (a Spot ID, or a
// command) holds of the in-flight limits.
func (m *Manager) flightKey(sender *actor.PID, what string) flightKey {
	return flightKey{peer: sender.GetAddress(), what: what, own: sender.GetAddress() == m.desc.GetAddress()}
}

type flightKey struct {
	peer, what string
	own        bool // the node's own: counts toward Bytes only
}

// inFlight counts what the Spot service holds (InFlightLimits): messages
// per (sender, Spot ID or command), and those keys per sender and in all.
type inFlight struct {
	limits  InFlightLimits
	mu      sync.Mutex
	held    map[flightKey]int
	perPeer map[string]int
	total   int
	bytes   int64
}

func (f *inFlight) admit(k flightKey, size int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	first := f.held[k] == 0
	if first && !k.own && (f.perPeer[k.peer] >= f.limits.PerPeer || f.total >= f.limits.Total) {
		return false
	}
	if f.bytes > 0 && f.bytes+size > f.limits.Bytes {
		return false
	}
	f.held[k]++
	f.bytes += size
	if first && !k.own {
		f.perPeer[k.peer]++
		f.total++
	}
	return true
}

func (f *inFlight) release(k flightKey, size int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bytes -= size
	if f.held[k]--; f.held[k] > 0 {
		return
	}
	delete(f.held, k)
	if k.own {
		return
	}
	if f.perPeer[k.peer]--; f.perPeer[k.peer] <= 0 {
		delete(f.perPeer, k.peer)
	}
	f.total--
}

// fromMember accepts a SpotActivation only from a live node of the mesh: the
// recovery root it stores and the Spot it activates are the caller's to
// decide, and a caller is a node.
func (m *Manager) fromMember(a *messages.SpotActivation, from *actor.PID) error {
	if from == nil {
		return fmt.Errorf("%w: no sender", meshnode.ErrNotMember)
	}
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.cfg.DefaultTimeout)
	defer cancel()
	// From the caller's node itself it names its lifecycle, checked by one
	// descriptor read; a full node passing it on is looked up by address.
	if err := m.d.Node().VerifyPeer(ctx, a.GetSourceNodeRid(), a.GetSourceNodeGeneration(), from.Address); err == nil {
		return nil
	}
	_, err := m.d.Node().PeerAt(ctx, from.Address)
	return err
}

// OnFollow is the relocation driver's Message Follow hook: it tells the
// caller's node that its route is followed, so that node drops the cached
// route (PROTOCOL.md §7.8).
func (m *Manager) OnFollow(key location.AuthorityKey, env *actor.MessageEnvelope) {
	if key.Kind != location.KindInstanceSpot && key.Kind != location.KindUserSpot {
		return
	}
	origin := ""
	if env.Header != nil {
		origin = env.Header.Get(headerOrigin)
	}
	if origin == "" && env.Sender != nil {
		origin = env.Sender.Address
	}
	if origin == "" {
		return
	}
	if origin == m.desc.GetAddress() {
		m.sys.Root.Send(m.self, &messages.RouteHint{Kind: key.Kind, SpotId: key.ID})
		return
	}
	m.sys.Root.Send(servicePID(origin), &messages.RouteHint{Kind: key.Kind, SpotId: key.ID})
}

// onHint drops a followed route without reordering this node's messages
// (PROTOCOL.md §7.8): a RouteBarrier goes down the old route behind everything
// sent on it; only when the Spot answers it (or after barrierTimeout) does
// the next call resolve the new owner.
func (m *Manager) onHint(id string) {
	a, idle, ok := m.cache.hinted(id)
	if !ok {
		return
	}
	machine.Go(func() {
		<-idle // every call that took the route has sent on it
		<-m.barrier(a)
		m.cache.drop(id)
	})
}

// drainRoute drains a route the cache could keep no longer
// (routeCache.keepExpiredLocked) as onHint drains a followed one.
func (m *Manager) drainRoute(id string, r *cachedRoute, idle <-chan struct{}) {
	machine.Go(func() {
		<-idle
		<-m.barrier(r.a)
		m.cache.dropRoute(id, r)
	})
}

// barrier sends a RouteBarrier down a route and returns a channel closed
// when the Spot answered it (after everything this node sent before it),
// the route failed it (a dead letter, a DeliveryFailed), the connection to
// the route's first hop ended, or barrierTimeout passed. Giving up earlier
// would let later messages overtake earlier ones on a busy Spot: the
// barrier queues behind them, and a loaded node may take seconds.
func (m *Manager) barrier(a authority) <-chan struct{} {
	pid := a.pid()
	lost := m.lostSignal(pid.Address)
	answered := make(chan struct{})
	machine.Go(func() {
		// The answer comes from wherever the route ends (Message Follow),
		// so from any node. The question ends with the manager: its
		// timeout is on the node's clock, which after a stop may never
		// move again, and its waiters end with the node anyway.
		ctx, cancel := machine.UntilClosed(m.stop)
		defer cancel()
		_, _ = ask.Ask(ctx, m.sys, pid, &messages.RouteBarrier{}, barrierTimeout, ask.Question{Clock: m.clock, What: "route barrier", Accept: isBarrier})
		close(answered)
	})
	done := make(chan struct{})
	machine.Go(func() {
		defer close(done)
		select {
		case <-answered:
		case <-lost:
		case <-m.stop:
		}
	})
	return done
}

// isBarrier: a route barrier is answered with itself.
func isBarrier(msg any) bool { _, ok := msg.(*messages.RouteBarrier); return ok }

// barrierTimeout bounds how long a followed route is kept for a barrier
// that is never answered nor failed (lost in a connection beyond the first
// hop). Every hop answers or fails it within Message Follow's duration
// (30 s), after which an old incarnation answers Unavailable.
const barrierTimeout = 30 * time.Second

// headerOrigin carries the calling node's address on a direct call, so a
// Message Follow hop can send the route hint there.
const headerOrigin = "roam-origin"

// authority is what a resolve found for a Spot ID.
type authority struct {
	v       location.Versioned // Present() false: Missing
	address string             // the owner's remote address, when alive
	ended   bool               // the owner's lease or lifecycle ended (PROTOCOL.md §3.4)
	// owner is the owner incarnation's PID, made once for a cached route
	// (routeCache.put): calls on the route share it, and with it the
	// process Proto.Actor resolves and caches in a PID on its first send.
	owner *actor.PID
	// leavingRead: read from the store once its owner's node had said it
	// is leaving: nothing was sent on it before that, so it needs no
	// drain (takeRoute).
	leavingRead bool
}

func (a authority) missing() bool { return !a.v.Present() }

func (a authority) ready() bool {
	return a.v.Present() && a.v.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY
}

// ref is the SpotRef of the authority (PROTOCOL.md §7.1).
func (a authority) ref() *messages.SpotRef {
	r := a.v.Record
	return &messages.SpotRef{
		SpotId:           a.v.Key.ID,
		ObjectGeneration: r.GetObjectGeneration(),
		Mesh:             r.GetOwner().GetMesh(),
		NodeRid:          r.GetOwner().GetNodeRid(),
		SpotKind:         r.GetSpotKind(),
		StableType:       r.GetStableType(),
	}
}

// pid is the owner incarnation's PID.
func (a authority) pid() *actor.PID {
	if a.owner != nil {
		return a.owner
	}
	return relocation.ObjectPID(a.address, a.v.Key, a.v.Record)
}

// readAuthority reads a Spot ID's authority (spotcall.Resolve, which the
// simulation runs too). The two reads go at once (one round trip to a
// remote store; an in-process one answers before a goroutine starts).
func (m *Manager) readAuthority(ctx context.Context, id string) (authority, error) {
	var found authority
	var ferr error
	spotcall.Resolve(resolveEnv{m: m, ctx: ctx}, id, func(r spotcall.Resolved, err error) {
		found, ferr = authority{v: r.V, address: r.Address, ended: r.Ended}, err
	})
	return found, ferr
}

// routeRead is one store read of a Spot's route that the calls needing it
// at the same moment share (readRouteAuthority).
type routeRead struct {
	done chan struct{}
	a    authority
	err  error
	// cut: the read ended with its reader's own context (deadline or
	// cancellation), which says nothing to another call's.
	cut bool
	// sharers counts the calls that joined the read (under resolvingMu).
	sharers int
}

// readRouteAuthority is readAuthority for a call about to send
// (readRoute): calls that need the route to one Spot ID while a read of
// it is on its way take that read's answer instead of reading again. A
// move of a busy Spot otherwise sends every caller of it on this node to
// the store at once, when its route is dropped after the drain
// (docs/PROTOCOL.md §7.8): two reads each (the Instance and the User key)
// per caller, a load on the store that grows with the callers. The shared
// answer is a read that started at most one store round trip before the
// call asked, as fresh as a cached route and judged the same way: a route
// that turns out old is followed, hinted and drained again.
func (m *Manager) readRouteAuthority(ctx context.Context, id string) (authority, error) {
	for {
		m.resolvingMu.Lock()
		r := m.resolving[id]
		if r == nil {
			r = &routeRead{done: make(chan struct{})}
			m.resolving[id] = r
			m.resolvingMu.Unlock()
			r.a, r.err = m.readAuthority(ctx, id)
			r.cut = r.err != nil && ctx.Err() != nil
			m.resolvingMu.Lock()
			delete(m.resolving, id)
			m.resolvingMu.Unlock()
			close(r.done)
			return r.a, r.err
		}
		r.sharers++
		m.resolvingMu.Unlock()
		select {
		case <-r.done:
			if !r.cut {
				return r.a, r.err
			}
			// The reader gave up for its own reasons: read again.
		case <-ctx.Done():
			return authority{}, storeError("resolve "+id, ctx.Err())
		}
	}
}

// resolveEnv is spotcall.Resolve's host: every answer comes before the
// call returns.
type resolveEnv struct {
	m   *Manager
	ctx context.Context
}

func (e resolveEnv) ReadKeys(instance, user location.AuthorityKey, done func(location.Versioned, error, location.Versioned, error)) {
	if kr := e.m.keysReader; kr != nil {
		// One round trip for both (on Consul one read transaction, where
		// two reads sent at once may go one after the other).
		vs, err := kr.ReadKeys(e.ctx, instance, user)
		if err != nil {
			done(location.Versioned{Key: instance}, err, location.Versioned{Key: user}, err)
			return
		}
		done(vs[0], notFound(vs[0]), vs[1], notFound(vs[1]))
		return
	}
	var uv location.Versioned
	var uerr error
	var wg sync.WaitGroup
	if e.m.inProcess {
		uv, uerr = e.m.store.Read(e.ctx, user)
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uv, uerr = e.m.store.Read(e.ctx, user)
		}()
	}
	iv, ierr := e.m.store.Read(e.ctx, instance)
	wg.Wait()
	done(iv, ierr, uv, uerr)
}

// notFound is Read's error for what ReadKeys answered of one key.
func notFound(v location.Versioned) error {
	if v.Present() {
		return nil
	}
	return &location.KeyNotFound{Key: v.Key}
}

func (e resolveEnv) OwnerNode(o *messages.Owner, done func(string, bool, error)) {
	done(e.m.d.OwnerNode(e.ctx, o))
}

// ownerAddress finds an owner's remote address and whether its lifecycle
// is alive (relocation.Driver.OwnerNode: the one liveness rule).
func (m *Manager) ownerAddress(ctx context.Context, o *messages.Owner) (string, bool, error) {
	return spotcall.OwnerAnswer(m.d.OwnerNode(ctx, o))
}

// samePointer reports whether a and b are one pointer. Comparing two
// interfaces panics when their dynamic type is not comparable (a store
// that is a struct value with a slice in it): only pointers are compared.
func samePointer(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Kind() == reflect.Pointer && vb.Kind() == reflect.Pointer && va.Type() == vb.Type() && va.Pointer() == vb.Pointer()
}

// storeError classifies a Location Store failure: an indeterminate or
// unreachable store is Unavailable to the caller.
func storeError(what string, err error) error { return activation.StoreError(what, err) }

// newGeneration issues the ObjectGeneration of a new incarnation: above
// prev and every generation this manager issued before, so two within one
// tick of the clock (a logical clock stands still) never share one.
func (m *Manager) newGeneration(prev uint64) uint64 {
	for {
		last := m.lastGeneration.Load()
		g := activation.NewGeneration(max(prev, last), m.clock.Now())
		if m.lastGeneration.CompareAndSwap(last, g) {
			return g
		}
	}
}

// self is this node as an owner.
func (m *Manager) owner() *messages.Owner {
	return location.OwnerOf(m.desc)
}

func sameOwner(a, b *messages.Owner) bool { return activation.SameOwner(a, b) }

// deadlineCtx fixes one end-to-end deadline: the call's timeout (or the
// default), never later than ctx's own. It is on the node's clock: the
// owner compares it with its own clock and arms it as a timer there.
func (m *Manager) deadlineCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return machine.WithTimeout(ctx, m.clock, m.timeoutOr(timeout))
}

// timeoutOr is timeout, or Config.DefaultTimeout when it is 0.
func (m *Manager) timeoutOr(timeout time.Duration) time.Duration {
	if timeout == 0 {
		return m.cfg.DefaultTimeout
	}
	return timeout
}

// wireDeadlineCtx is the context of a command that carries its caller's
// deadline (Unix nanoseconds on the caller's clock, which is the
// mesh's time as this node's clock is).
func (m *Manager) wireDeadlineCtx(unixNanos int64) (context.Context, context.CancelFunc) {
	return machine.WithTimeout(context.Background(), m.clock, machine.Until(m.clock, time.Unix(0, unixNanos)))
}
