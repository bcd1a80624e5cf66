// Package relocation moves live Actors and Instance Spots between nodes
// with roam's hand-off (docs/PROTOCOL.md §5). The pure state machines are in handoff; this
// package is their driver: one Proto.Actor actor per node ("roam/relocation")
// that owns every move's state, runs the effects against the relocatable
// mailbox, the remote and the Location Store, and feeds results back. All
// sends of one move to a peer (prepare, chunks, cutover) leave from this
// actor, and relay records are sent under the mailbox's lock before the
// cutover is, so the peer's one ordered stream carries them in order
// (PROTOCOL.md §4.1, §5.1).
package relocation

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/metric"

	"github.com/roamactors/roam/internal/checkpoint"
	"github.com/roamactors/roam/internal/chunklink"
	"github.com/roamactors/roam/internal/liveness"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/pinned"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/internal/relocation/budget"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/mailbox"
	"github.com/roamactors/roam/internal/relocation/redelivery"
	"github.com/roamactors/roam/internal/relocation/targetrun"
	"github.com/roamactors/roam/internal/stopguard"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// DriverName is the PID id of every node's relocation actor.
const DriverName = "roam/relocation"

// Config configures a Driver. Zero fields take the documented defaults.
type Config struct {
	// Handoff holds the hand-off's timings and chunk limits
	// (handoff.DefaultConfig when zero; PROTOCOL.md §9).
	Handoff handoff.Config
	// RestoreTimeout bounds a move from the moment Relocate starts it
	// (before the capability query and the wait for budget, so a long
	// wait for budget uses it up): the Restore operation's absolute
	// deadline (PROTOCOL.md §5.11). Default 10 s.
	RestoreTimeout time.Duration
	// InFlightPayloadBudget is RelocationInFlightPayloadBudget per peer.
	// Default 16 MiB; at most 32 MiB, so that the chunks queued for one
	// peer always fit one transport frame (meshnode.MaxFrameBytes).
	InFlightPayloadBudget int64
	// NodeInFlightPayloadBudget is RelocationNodeInFlightPayloadBudget.
	// Default 0 (off).
	NodeInFlightPayloadBudget int64
	// ChunkWindow paces the chunks of admitted moves within the budget:
	// at most this many chunk bytes are handed to one peer's connection
	// and not yet credited by the target (a chunk is always sent when
	// none is in flight). The connection carries everything else between
	// the two nodes in order, so other messages never queue behind more
	// than this, and the target copies chunks out while the rest arrive.
	// Default 1 MiB; at most InFlightPayloadBudget (PROTOCOL.md §5.3).
	ChunkWindow int64
	// ChunkLinkPort is the port of this node's chunk link: a TCP listener
	// beside the Proto.Actor remote, on the remote's host and with its TLS,
	// where peers send the state chunks of moves to this node, so that a
	// large payload does not hold up other messages between the two nodes
	// and crosses without the remote's copies (PROTOCOL.md §5.3). 0
	// (default): a free port, announced to peers in capability answers;
	// -1: no link, and this node's chunks, in and out, ride the
	// Proto.Actor connection.
	ChunkLinkPort int
	// MaxPayloadLength is the largest payload a target accepts. Default 1 GiB.
	MaxPayloadLength uint64
	// CapabilityTimeout bounds the capability query. Default 5 s.
	CapabilityTimeout time.Duration
	// RedeliveryWindow bounds how long a message that Message Follow or a
	// dead letter hands to the store waits for the store to name a
	// reachable owner before it fails loudly; it also bounds the drain
	// barrier (with FollowDuration). Default 10 s.
	RedeliveryWindow time.Duration
	// DeadLetterPatience bounds how long a dead-lettered send keeps being
	// redelivered: longer than a restore deadline plus a cutover wait (a
	// move whose target died is fenced out by then) and than an owner
	// lease. Default 30 s.
	DeadLetterPatience time.Duration
	// DeadLetterBackoff is the first pause before a send that dead-letters
	// again is redelivered; it doubles with each try up to
	// DeadLetterBackoffMax. Defaults 50 ms and 2 s.
	DeadLetterBackoff, DeadLetterBackoffMax time.Duration
	// Logger receives the hand-off's warnings and errors (cutover_timeout,
	// late_cutover, location_update_failed, …). Default zerolog.Nop;
	// extension.Start passes the node's logger.
	Logger *zerolog.Logger
	// OnEvent, if set, is called once per finished move on the node that
	// decided it (the target), from the driver's goroutine; keep it quick.
	OnEvent func(Event)
	// OnFollow, if set, is called when Message Follow forwards a message,
	// with the object and the forwarded envelope (sender and headers), so
	// the caller's node can drop its cached route (PROTOCOL.md §7.8). It runs
	// under the mailbox lock: only send a message.
	OnFollow func(key location.AuthorityKey, env *actor.MessageEnvelope)
	// MeterProvider receives the move metrics (roam.relocation.moves,
	// .pause, .payload). Default: OpenTelemetry's global provider.
	MeterProvider metric.MeterProvider
	// SampleEvery, above 0, stamps one message in SampleEvery that a
	// relocatable object sends through its actor context (or a Spot call
	// From it) with its sender (HeaderFrom), and the receiving object
	// counts it in Edges: placement's co-location (docs/PLACEMENT.md §5).
	// It costs each send from an object an envelope. Default 0: off.
	SampleEvery int
	// Edges is this node's edge table (required with SampleEvery).
	Edges *placement.EdgeTable
	// Checkpoints is where the owners of objects of kinds that checkpoint
	// write their captures (docs/FAULTS.md, "Checkpoints and recovery").
	// Default: the Location Store, when it is one (memstore and
	// consulstore are).
	Checkpoints location.CheckpointStore
}

// ValidateConfig refuses what NewDriver would refuse of c.
func ValidateConfig(c Config) error { return c.setDefaults() }

func (c *Config) setDefaults() error {
	l := handoff.Limits{
		Handoff: c.Handoff, RestoreTimeout: c.RestoreTimeout, CapabilityTimeout: c.CapabilityTimeout,
		InFlightPayloadBudget: c.InFlightPayloadBudget, NodeInFlightPayloadBudget: c.NodeInFlightPayloadBudget,
		ChunkWindow: c.ChunkWindow, ChunkLinkPort: c.ChunkLinkPort, MaxPayloadLength: c.MaxPayloadLength,
		RedeliveryWindow: c.RedeliveryWindow, DeadLetterPatience: c.DeadLetterPatience,
		DeadLetterBackoff: c.DeadLetterBackoff, DeadLetterBackoffMax: c.DeadLetterBackoffMax, SampleEvery: c.SampleEvery,
	}
	if err := l.Settle(meshnode.MaxFrameBytes); err != nil {
		return err
	}
	c.Handoff, c.RestoreTimeout, c.CapabilityTimeout = l.Handoff, l.RestoreTimeout, l.CapabilityTimeout
	c.InFlightPayloadBudget, c.ChunkWindow, c.MaxPayloadLength = l.InFlightPayloadBudget, l.ChunkWindow, l.MaxPayloadLength
	c.RedeliveryWindow, c.DeadLetterPatience = l.RedeliveryWindow, l.DeadLetterPatience
	c.DeadLetterBackoff, c.DeadLetterBackoffMax = l.DeadLetterBackoff, l.DeadLetterBackoffMax
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return nil
}

// Event describes one finished move, as the target saw it.
type Event struct {
	Key          location.AuthorityKey
	RelocationID uint64
	From, To     string // node RIDs
	Bytes        uint64
	Chunks       uint32
	// Pause is seal (on the source) → dispatch open (on the target).
	Pause time.Duration
	// Fallback is true when the cutover did not arrive in time.
	Fallback bool
	// Err is nil when the target opened; otherwise why it was removed.
	Err error
}

// Driver is a node's relocation actor and the registry of the relocatable
// objects it hosts.
type Driver struct {
	cfg  Config
	node *meshnode.Node
	// clock is the node's: every protocol timer and time reading here.
	clock machine.Clock
	// lastGeneration is the last ObjectGeneration newGeneration issued.
	lastGeneration atomic.Uint64
	store          location.Store
	// slots are this node's capacity slots in the store (PROTOCOL.md §7.12).
	slots *Slots
	log   zerolog.Logger
	self  *actor.PID
	sys   *actor.ActorSystem
	desc  *location.NodeDescriptor

	mu    sync.RWMutex // guards kinds (read by callers, written at registration)
	kinds map[string]*Kind

	// events is the driver's event stream subscription; live holds every
	// incarnation spawned and not stopped yet, for Shutdown (under liveMu).
	events *eventstream.Subscription
	// prechecks: what the source checks found, for the Restore requests
	// to come (sourcecheck.go).
	prechecks prechecks
	// noSourceCheck: answer capability queries as a version without the
	// source check does (tests of the check after the Restore request).
	noSourceCheck bool
	// checkNext: the next try of each source check that waits for its
	// pause (timerKey.check).
	checkNext map[handoff.Identity]func()
	// peers: the addresses whose connection ended and was not made again
	// (ConnectionEnded).
	peers  peerLinks
	liveMu sync.Mutex
	// live are the incarnations not stopped, each at its liveAt (minus
	// one); liveFree the places stops freed. A map cost every idle Spot
	// about 40 bytes at a million; a place costs 8.
	live     []*object
	liveFree []uint32
	// settling holds a channel for each object whose cold activation a
	// move waits to settle (object.settled), closed and removed when it
	// settles or its incarnation ends; under settleMu. Few objects ever
	// have one: in the object, a field each would cost every idle Spot 16
	// bytes.
	settling map[*object]chan struct{}
	// takeovers: the ended owners' objects this node is taking over.
	takeovers takeovers
	// spawning is the incarnation Driver.incarnate is spawning (written on
	// the driver goroutine; read inside the spawn by the kind's Props).
	spawning atomic.Pointer[object]
	// spawner spawns incarnations: a root context of the driver's own,
	// without the application's spawn middleware (Driver.incarnate).
	spawner *actor.RootContext

	// Everything below is touched only by the driver actor's goroutine.
	objects map[location.AuthorityKey]*object
	// hostingN and arrivingN count the registered incarnations serving or
	// leaving, and staging: load (setState, putObject, dropObject).
	hostingN, arrivingN int
	sources             map[uint64]*sourceRun
	targets             map[handoff.Identity]*targetRun
	// arrivals: the unfinished move into this node of each object, at most
	// one (newest prepare wins, onPrepare).
	arrivals map[location.AuthorityKey]*targetRun
	// timers: the running timers of moves; a stopped node's watcher
	// closes them all: a follow timer would otherwise keep the whole
	// stopped driver in memory for its FollowDuration.
	// spares: fresh capability answers with spare move tickets; asking:
	// the moves waiting for the capability query in flight for their key
	// (tickets_out.go); oneByOne: until when the moves to a target that
	// gives no spare tickets ask on their own.
	spares   map[capabilityKey]*capabilityAnswer
	asking   map[capabilityKey][]capabilityWaiter
	oneByOne map[capabilityKey]time.Time
	// returning: spare tickets per target address to give back with the
	// next query there.
	returning  map[string][][]byte
	spareFresh time.Duration
	// loop runs the driver's own turns (calls, answers of its I/O, the
	// moves' timers) on the relocation actor's mailbox, in one queue with
	// the control messages it receives (machine.NewLoopOn).
	loop *machine.Loop[timerKey]
	// tickets: the move tickets this node issued and no Restore request
	// has used yet (admission.go).
	tickets *tickets
	// refusedLog and prepareRefusedLog limit control_message_refused and
	// relocation_refused lines (admission.go, target_run.go).
	refusedLog, prepareRefusedLog ratelog.Limiter
	replyTooLargeLog              ratelog.Limiter
	// redeliveries queues messages awaiting their owner's lookup: per
	// moved-away incarnation, those Message Follow hands to the store
	// (followSink); per object, dead-lettered sends. A queue is present
	// while its worker runs.
	redeliveries map[redeliveryQueue][]*redeliver
	// redelivered: where each queue's last worker delivered last, until
	// the queue's next worker takes it (redeliverWorker).
	redelivered      map[redeliveryQueue]lastDelivery
	redeliveredSwept time.Time
	// draining counts the redelivery workers waiting for a route barrier
	// (drainHop).
	draining atomic.Int64
	// unrestored: taken-over objects whose checkpoints could not be
	// restored yet (restoreUntil), reported unmovable by Inventory.
	unrestored map[location.AuthorityKey]unrestored
	// sendLogs: the endSinks holding back a summary line, *sendLog → its
	// flush; Shutdown writes them (the process may exit before their
	// timers).
	sendLogs sync.Map
	// deadLetters is, per copy of a dead-lettered send this driver
	// redelivered, that send's bookkeeping (redeliver.go); swept by age.
	deadLetters    map[any]*redelivery.Send
	deadLetterHeld map[location.AuthorityKey]*deadLetterHold
	// deletions are the Actors this node is deleting (DeleteActor), from
	// the close of their incarnation until their record is gone: a second
	// delete of one waits for the first.
	deletions map[location.AuthorityKey]*deletion
	// deadLetterLogged: when each object's dead-letter redelivery was last
	// logged (rate limit).
	deadLetterLogged map[location.AuthorityKey]time.Time
	deadLetterSwept  time.Time
	// deadLetterPatience is Config.DeadLetterPatience (tests shorten it).
	deadLetterPatience time.Duration
	// stopping is set by FinishIncoming: no new move lands here.
	stopping bool
	// lifecycleEnded is closed once every incarnation of an ended
	// lifecycle has failed what it held (WaitEnded); nil before.
	lifecycleEnded chan struct{}
	budget         *budget.Budget
	metrics        *metrics
	// watch is what this node saw of the other lifecycles' descriptors
	// (OwnerNode's liveness rule); any goroutine, under goneMu.
	goneMu sync.Mutex
	watch  *liveness.Watch
	// started is when the driver started: the liveness watch's epoch.
	started time.Time
	// lastFollow: when Message Follow last forwarded a message, or a move
	// out of this node started following (unix nanoseconds; any
	// goroutine), for FollowQuiet.
	lastFollow atomic.Int64
	// dropInbound, set only by tests (export_test.go), drops messages
	// reaching the relocation actor, as a cut link would.
	dropInbound atomic.Pointer[func(any) bool]
	// beforeHold, set only by tests before the driver serves, runs on a
	// membership change's goroutine just before holdHere asks for its hold.
	beforeHold func()
	// targetCache: descriptors of move targets, read a moment ago (any
	// goroutine; moveTarget).
	targetCache descriptorCache
	// inProcess: the store's calls stay in the process (location.InProcess).
	inProcess bool
	// immediate: the store's calls return at once (location.Immediate):
	// the commit calls it on the driver goroutine.
	immediate bool
	// link is this node's chunk link (nil: off; link.go). chunkLinks: each
	// peer's link address from its last capability answer; linkDown: until
	// when a peer whose link failed gets its chunks on the Proto.Actor
	// connection; early: chunks that came on the link before their Restore
	// request.
	link       *chunklink.Link
	chunkLinks map[string]string
	linkDown   map[string]time.Time
	// linkFailures: a peer's link failures since it announced its link.
	linkFailures map[string]int
	early        earlyChunks
	// linked and linkedInPlace count the chunks read from the link, and
	// of those the ones read in place (tests).
	linked, linkedInPlace atomic.Int64
	// cps runs this node's checkpoints (nil: no checkpoint store).
	cps *checkpointer
	// checkpointsInStore: the checkpoints are the Location Store's own,
	// and its Apply checks them (location.CheckpointsInApply).
	checkpointsInStore bool
}

// New starts the relocation actor of node. Register kinds before objects
// of them are spawned or moved here.
func New(node *meshnode.Node, store location.Store, cfg Config) (*Driver, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	d := &Driver{
		cfg:        cfg,
		node:       node,
		store:      location.Leased(store, node),
		log:        cfg.Logger.With().Str("node_rid", node.Descriptor().GetNodeRid()).Logger(),
		sys:        node.System(),
		desc:       node.Descriptor(),
		kinds:      map[string]*Kind{},
		objects:    map[location.AuthorityKey]*object{},
		spawner:    actor.NewRootContext(node.System(), nil),
		sources:    map[uint64]*sourceRun{},
		targets:    map[handoff.Identity]*targetRun{},
		arrivals:   map[location.AuthorityKey]*targetRun{},
		tickets:    newTickets(),
		spares:     map[capabilityKey]*capabilityAnswer{},
		asking:     map[capabilityKey][]capabilityWaiter{},
		oneByOne:   map[capabilityKey]time.Time{},
		returning:  map[string][][]byte{},
		spareFresh: spareFresh,
		inProcess: func() bool {
			s, ok := store.(location.InProcess)
			return ok && s.InProcess()
		}(),
		immediate: location.IsImmediate(store),

		redeliveries:       map[redeliveryQueue][]*redeliver{},
		redelivered:        map[redeliveryQueue]lastDelivery{},
		unrestored:         map[location.AuthorityKey]unrestored{},
		deadLetters:        map[any]*redelivery.Send{},
		deadLetterHeld:     map[location.AuthorityKey]*deadLetterHold{},
		deletions:          map[location.AuthorityKey]*deletion{},
		deadLetterLogged:   map[location.AuthorityKey]time.Time{},
		watch:              liveness.New(node.LeaseTTL()),
		started:            node.Clock().Now(),
		clock:              node.Clock(),
		deadLetterPatience: cfg.DeadLetterPatience,
		budget:             budget.New(cfg.InFlightPayloadBudget, cfg.NodeInFlightPayloadBudget, cfg.ChunkWindow),
		chunkLinks:         map[string]string{},
		linkDown:           map[string]time.Time{},
		linkFailures:       map[string]int{},
		early:              earlyChunks{limit: cfg.InFlightPayloadBudget},
	}
	d.loop = machine.NewLoopOn[timerKey](node.Clock(), func(turn func()) bool {
		d.sys.Root.Send(d.self, &localCall{fn: turn})
		return true
	})
	d.loop.OnTimer(d.onTimer)
	d.peers.clock = d.clock
	d.slots = newSlots(d.store, d.desc, d.clock)
	if cfg.Checkpoints == nil {
		cfg.Checkpoints, _ = store.(location.CheckpointStore)
		c, ok := store.(location.CheckpointsInApply)
		d.checkpointsInStore = ok && c.CheckpointsInApply() && cfg.Checkpoints != nil
	}
	if cfg.Checkpoints != nil {
		d.cps = newCheckpointer(cfg.Checkpoints, func() error { _, _, err := node.WriteLease(); return err }, d)
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, err
	}
	d.metrics = m
	// Nothing stops the relocation actor while the node lives: moves,
	// follow redelivery and ended-lifecycle handling all run on it.
	guard := stopguard.Producer(actor.Unbounded(), func() bool { return isClosed(node.Stopped()) }, func(msg any) {
		d.log.Warn().Str("event", "stop_refused").Str("actor", DriverName).Msg("a stop of the relocation actor from outside roam was refused")
	})
	if err := d.startLink(node); err != nil {
		return nil, err
	}
	// Its turns run on a goroutine of its own (pinned), ended with the
	// node: Proto.Actor's default dispatcher started one per run, which
	// grew its stack through the turn every time.
	dispatch := pinned.New(machine.DefaultThroughput)
	pid, err := d.sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return d }, actor.WithMailbox(guard), actor.WithGuardian(RestartAlways),
		actor.WithDispatcher(dispatch)), DriverName)
	if err != nil {
		dispatch.Close()
		if d.link != nil {
			d.link.Close()
		}
		return nil, fmt.Errorf("%w: spawn relocation actor: %w", roamerr.ErrInvalidOperation, err)
	}
	d.self = pid
	d.events = d.sys.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *remote.EndpointTerminatedEvent:
			d.peers.lost(e.Address) // before anything is sent on it again
			d.sys.Root.Send(d.self, e)
		case *remote.EndpointConnectedEvent:
			d.peers.connected(e.Address)
		case *actor.DeadLetterEvent:
			d.onDeadLetterEvent(e)
		}
	})
	node.OnLeaseChange(func(st lease.Status) { d.sys.Root.Send(d.self, &leaseChanged{status: st}) })
	go func() {
		<-node.Stopped()
		dispatch.Close() // what still reaches the actor runs as before
		d.loop.CloseTimers()
		if d.cps != nil {
			d.cps.shutdown()
		}
		if d.link != nil {
			d.link.Close()
		}
	}()
	return d, nil
}

// RegisterKind adds a relocatable kind. A kind without a policy, or a
// stable type registered twice, is refused (PROTOCOL.md §2.1, §2.4).
func (d *Driver) RegisterKind(k Kind) error {
	if err := k.validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, dup := d.kinds[k.StableType]; dup {
		return fmt.Errorf("%w: stable type %q registered twice", roamerr.ErrInvalidOperation, k.StableType)
	}
	kk := k
	props := kk.Props
	if props == nil {
		props = actor.PropsFromProducer(kk.Producer)
	}
	var err error
	if kk.open, err = d.props(props, false); err != nil {
		return fmt.Errorf("kind %q: %w", k.StableType, err)
	}
	if kk.staging, err = d.props(props, true); err != nil {
		return fmt.Errorf("kind %q: %w", k.StableType, err)
	}
	kk.checkpoints = kk.checkpointPolicy()
	if kk.Checkpointed() && d.cps == nil {
		if kk.CheckpointEvery != 0 || kk.CheckpointInterval != 0 || kk.CheckpointIdle != 0 {
			return fmt.Errorf("%w: kind %q checkpoints its objects, and this node has no checkpoint store", roamerr.ErrNotConfigured, k.StableType)
		}
		// The default only: a store that keeps no checkpoints (an
		// application's own Location Store) leaves the kind as it was
		// before checkpoints, loudly.
		kk.checkpoints = checkpoint.Policy{}
		d.log.Warn().Str("event", "checkpoints_unavailable").Str("stable_type", k.StableType).
			Msg("the kind preserves state but this node has no checkpoint store: an object whose owner ends waits for an operator (ReleaseEnded)")
	}
	if kk.Checkpointed() {
		d.cps.register(kk.checkpoints)
	}
	d.kinds[k.StableType] = &kk
	return nil
}

func (d *Driver) kind(stableType string) (*Kind, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	k, ok := d.kinds[stableType]
	return k, ok
}

// PID returns the driver actor's PID on a node address.
func PID(address string) *actor.PID { return actor.NewPID(address, DriverName) }

// objectPIDName is the PID id of one incarnation of an object on a node.
// The ObjectGeneration tells incarnations of one ID apart (a Spot closed and
// created again), the owner generation every arrival of one incarnation, so
// a stub that still follows from an earlier visit never collides with it.
func objectPIDName(key location.AuthorityKey, generation, ownerGeneration uint64) string {
	return "roam/" + location.KindName(key.Kind) + "/" + key.ID + "@" + strconv.FormatUint(generation, 10) + "." + strconv.FormatUint(ownerGeneration, 10)
}

// ObjectPID is the PID of an object's incarnation on the node at address,
// as its Location Store record names it.
func ObjectPID(address string, key location.AuthorityKey, rec *location.Record) *actor.PID {
	return actor.NewPID(address, objectPIDName(key, rec.GetObjectGeneration(), rec.GetAuthorityOwnerGeneration()))
}

// call runs fn on the driver's goroutine and waits for its answer.
func call[T any](ctx context.Context, d *Driver, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	select {
	case <-d.node.Stopped():
		var zero T
		return zero, fmt.Errorf("%w: node %s has stopped", roamerr.ErrUnavailable, d.desc.GetNodeRid())
	default:
	}
	done := make(chan result, 1)
	d.loop.Post(func() { v, err := fn(); done <- result{v, err} })
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("%w: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	case <-d.node.Stopped():
		// The driver actor is gone with the actor system: never wait for it
		// (callers with context.Background would wait forever).
		select {
		case r := <-done:
			return r.v, r.err
		default:
			var zero T
			return zero, fmt.Errorf("%w: node %s has stopped", roamerr.ErrUnavailable, d.desc.GetNodeRid())
		}
	}
}

// localCall carries a turn of the driver's loop to its actor.
type localCall struct{ fn func() }

// Receive is the driver actor: every move's state changes here, one
// message at a time.
func (d *Driver) Receive(c actor.Context) {
	if drop := d.dropInbound.Load(); drop != nil {
		msg := c.Message()
		if lc, ok := msg.(*linkedChunk); ok {
			msg = lc.m // a cut link drops chunks whatever connection they take
		}
		if (*drop)(msg) {
			return
		}
	}
	switch m := c.Message().(type) {
	case *localCall:
		m.fn()
	case *leaseChanged:
		d.onLeaseChanged(m.status)
	case *redeliver:
		d.onRedeliver(m)
	case *deadLettered:
		d.onDeadLettered(m)
	case *remote.EndpointTerminatedEvent:
		d.onEndpointTerminated(m.Address)
	case *linkedChunk:
		d.onLinkedChunk(m)
	case *chunkLinkLost:
		d.onChunkLinkLost(m.peer)
	case *messages.CapabilityQuery:
		d.onCapability(c, m)
	case *messages.EdgeQuery:
		d.onEdgeQuery(c, m)
	case *messages.RelocateRequest:
		d.onRelocateRequest(c, m)
	case *messages.SourceCheck:
		d.onSourceCheck(c, m)
	case *messages.SourceCheckReply:
		d.onSourceEvent(m.GetIdentity(), c, sourceChecked(m))
	case *messages.RelocationPrepare:
		d.onPrepare(c, m)
	case *messages.RelocationState:
		d.onChunk(c, m)
	case *messages.RelocationStateCredit:
		d.onCredit(c, m)
	case *messages.RelayReady:
		d.onSourceEvent(m.GetIdentity(), c, handoff.RelayReadyReceived{}, func(r *sourceRun) {
			if r.m.Phase() == handoff.SourcePaused { // not a duplicate's
				r.versionHint = m.GetRecordVersionHint()
			}
		})
	case *messages.RelocationFailed:
		d.onSourceEvent(m.GetIdentity(), c, handoff.FailedReceived{Reason: m.GetReason(), Detail: m.GetDetail()}, func(r *sourceRun) {
			// The target may refuse what its answer allowed (it drains
			// now, or restarted and knows none of its tickets): the next
			// move to it asks again.
			d.forgetSpares(r.target.GetAddress())
		})
	case *messages.BoundaryAck:
		d.onSourceEvent(m.GetIdentity(), c, handoff.BoundaryAcked{})
	case *messages.OwnerCommitted:
		d.onOwnerCommitted(c, m)
	case *messages.RelayedRecord:
		d.onRelayed(c, m)
	case *messages.Cutover:
		d.onTargetEvent(m.GetIdentity(), c, handoff.CutoverReceivedEvent{Epoch: m.GetResendEpoch(),
			Sum: handoff.RelaySum{Count: m.GetRelayRecordCount(), CRC: m.GetRelayCrc32C()}})
	case *messages.RelocationAbort:
		d.onTargetEvent(m.GetIdentity(), c, handoff.AbortReceived{Reason: m.GetReason()})
	case *messages.SessionSealReply:
		d.onSessionSealReply(c, m)
	}
}

// Slots are this node lifecycle's capacity slots in the store.
func (d *Driver) Slots() *Slots { return d.slots }

func (d *Driver) capability(q *messages.CapabilityQuery) *messages.CapabilityReply {
	reply := &messages.CapabilityReply{
		ReceiveChunkLimit: uint32(d.cfg.Handoff.ChunkLimit),
		Node:              d.selfRef(),
	}
	if d.link != nil {
		reply.ChunkLink = d.link.Address()
	}
	k, ok := d.kind(q.GetStableType())
	recovers := ok && d.recoversByItself(q.GetStableType(), location.Kind(q.GetKind()))
	reply.RecoversEnded = &recovers
	var hosting, arriving int
	if q.GetWantLoad() || d.desc.GetCapacity() > 0 {
		hosting, arriving = d.load()
	}
	reply.ServingCount, reply.Capacity = uint32(hosting), d.desc.GetCapacity()
	var version string
	if ok {
		version = k.ApplicationVersion
	}
	v := admit.Capability(admit.Target{
		LeaseValid: d.node.Valid(), Leaving: d.stopping || d.node.Draining(),
		Capacity: d.desc.GetCapacity(), Hosting: hosting, Arriving: arriving,
		Registered: ok, ApplicationVersion: version, Movable: Movable(q.GetKind()),
	}, q)
	reply.Supported, reply.Reason, reply.Code = v.Supported, v.Reason, v.Code
	reply.SourceCheck = !d.noSourceCheck // sourcecheck.go
	return reply
}

// load counts the incarnations this node serves (moving out included)
// and those arriving (moves in not open yet): what its capacity bounds.
func (d *Driver) load() (hosting, arriving int) { return d.hostingN, d.arrivingN }

// recount is load counted over every incarnation (tests check the
// counts kept against it).
func (d *Driver) recount() (hosting, arriving int) {
	for _, obj := range d.objects {
		switch obj.state {
		case serving, leaving:
			hosting++
		case staging:
			arriving++
		}
	}
	return hosting, arriving
}

// count adds delta to what load counts of o.
func (d *Driver) count(o *object, delta int) {
	switch o.state {
	case serving, leaving:
		d.hostingN += delta
	case staging:
		d.arrivingN += delta
	}
}

// setState changes o's state, counted if o is registered. Every change of
// a state and of d.objects goes through setState, putObject and
// dropObject: load is asked for every move into a node with a capacity,
// and counting a million incarnations each time took milliseconds of the
// driver's loop.
func (d *Driver) setState(o *object, st objectState) {
	in := d.objects[o.key] == o
	if in {
		d.count(o, -1)
	}
	o.state = st
	if in {
		d.count(o, 1)
	}
}

// putObject registers o under its key, in place of whatever was.
func (d *Driver) putObject(o *object) {
	if old := d.objects[o.key]; old != nil {
		d.count(old, -1)
	}
	d.objects[o.key] = o
	d.count(o, 1)
}

// dropObject unregisters o if it is registered under its key.
func (d *Driver) dropObject(o *object) {
	if d.objects[o.key] == o {
		d.count(o, -1)
		delete(d.objects, o.key)
	}
}

// selfRef names this node lifecycle in control messages.
func (d *Driver) selfRef() *messages.NodeRef {
	return &messages.NodeRef{NodeRid: d.desc.GetNodeRid(), NodeGeneration: d.desc.GetNodeGeneration(), Address: d.desc.GetAddress()}
}

func newRelocationID() uint64 {
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		if id := binary.BigEndian.Uint64(b[:]) >> 1; id != 0 {
			return id
		}
	}
}

// timerKey names one running timer of one move, or (deadLetter set) the
// pause before an object's held dead letters are redelivered.
type timerKey struct {
	source     uint64
	target     handoff.Identity
	isTarget   bool
	timer      handoff.Timer
	deadLetter location.AuthorityKey
	// verify: a target run's VerifySource pause (targetEnv.After).
	verify bool
	// check: a source check's pause before its next try (target, keyed
	// by the move's identity; sourcecheck.go).
	check bool
}

func (d *Driver) startTimer(k timerKey, t handoff.StartTimer) {
	after := t.After
	if !t.At.IsZero() {
		after = machine.Until(d.clock, t.At)
	}
	d.loop.ArmEvent(k, max(after, 0))
}

func (d *Driver) stopTimer(k timerKey) { d.loop.Cancel(k) }

// stopTimers stops the running timers whose keys match: every timer of
// a run that ended, whichever of its timers the machine left running.
func (d *Driver) stopTimers(match func(timerKey) bool) { d.loop.CancelIf(match) }

func (d *Driver) onTimer(k timerKey) {
	if k.deadLetter != (location.AuthorityKey{}) {
		d.releaseDeadLetters(k.deadLetter)
		return
	}
	if k.check {
		if next := d.checkNext[k.target]; next != nil {
			delete(d.checkNext, k.target)
			next()
		}
		return
	}
	if k.verify {
		if t := d.targets[k.target]; t != nil && t.verifyNext != nil {
			next := t.verifyNext
			t.verifyNext = nil
			next()
		}
		return
	}
	if k.isTarget {
		if t := d.targets[k.target]; t != nil {
			d.stepTarget(t, handoff.TimerFired{Timer: k.timer})
		}
		return
	}
	if s := d.sources[k.source]; s != nil {
		d.stepSource(s, handoff.TimerFired{Timer: k.timer})
	}
}

func (d *Driver) logEffect(l handoff.Log, key location.AuthorityKey, id handoff.Identity) {
	machine.LogEvent(d.log, l.Level).Str("event", l.Event).Str("object_kind", key.Kind.String()).Str("object_id", key.ID).
		Uint64("relocation_id", id.RelocationID).Uint64("target_attempt", id.TargetAttemptGeneration).Msg(l.Msg)
}

// props builds a kind's shared Props: the application's Props on the
// relocatable mailbox, with roam's supervisor, its actor made inside
// roam's host (hostactor.go).
func (d *Driver) props(props *actor.Props, staging bool) (*actor.Props, error) {
	producer, err := d.hostProducer(props)
	if err != nil {
		return nil, err
	}
	var opts []mailbox.Option
	if staging {
		opts = append(opts, mailbox.StartStaging())
	}
	// The mailbox and the context are made inside the spawn, on its
	// goroutine, where d.spawning names the incarnation (Driver.incarnate).
	produce := func() actor.Mailbox {
		obj := d.spawning.Load()
		if obj == nil {
			// Not inside Driver.incarnate, which cannot happen (the Props
			// are the driver's own, spawned only there): a mailbox that
			// dispatches nothing, and incarnate would refuse it.
			return mailbox.New(mailbox.StartStaging())
		}
		obj.mb = mailbox.New(append(opts, mailbox.WithHooks(obj))...)
		return obj.mb
	}
	// Proto.Actor's own spawner makes the mailbox and runs the init within
	// the spawn call, on the driver goroutine: a spawner of the kind's
	// Props could make them elsewhere or later, bound to whatever object
	// is spawning then.
	popts := []actor.PropsOption{actor.WithProducer(producer), actor.WithSpawnFunc(actor.DefaultSpawner), actor.WithMailbox(produce), actor.WithGuardian(restartIncarnation)}
	if !namesDispatcher(props) {
		// Pooled goroutines run the incarnations' turns, where Proto.Actor's
		// default would start one per run; a dispatcher the Props name is
		// theirs to keep.
		popts = append(popts, actor.WithDispatcher(machine.Dispatcher{Through: machine.DefaultThroughput}))
	}
	return props.Clone(append(popts,
		actor.WithOnInit(func(c actor.Context) {
			obj := d.spawning.Load()
			if obj == nil {
				return
			}
			// Before the incarnation's goroutine starts: its restart hook
			// keys the object by its PID.
			obj.pid = c.Self()
			if h, ok := c.Actor().(*host); ok {
				h.o = obj // the host's first instance; a restart's finds it by restarting
			}
			if d.node.ProtoActorCluster() != nil || obj.kind.ClusterKind {
				// Grain code reads its identity with cluster.GetClusterIdentity.
				// Without a Proto.Actor cluster there is no grain code, and the
				// context extension it needs would cost every idle object
				// about 250 bytes.
				pcluster.SetClusterIdentity(c, obj.clusterIdentity())
			}
		}))...), nil
}

// incarnate starts obj's incarnation under name from the kind's shared
// Props; the driver goroutine only. Proto.Actor's default spawner makes the
// mailbox and runs the Props' init inside SpawnNamed on the calling
// goroutine, where they read d.spawning. It spawns through roam's own root
// context (d.spawner): spawn middleware of the actor system's root context
// (Proto.Actor's middleware propagator, tracing) configures the Props it
// is given in place, and these Props are every incarnation's.
func (d *Driver) incarnate(obj *object, staging bool, name string) (*actor.PID, error) {
	obj.d = d
	obj.hc.o = obj
	props := obj.kind.open
	if staging {
		props = obj.kind.staging
	}
	d.spawning.Store(obj)
	pid, err := d.spawner.SpawnNamed(props, name)
	d.spawning.Store(nil)
	if err != nil {
		return nil, err
	}
	if obj.mb == nil {
		// Cannot happen with Proto.Actor's default spawner; never serve
		// an incarnation without its hooks (lease gate, stop guard).
		d.sys.Root.Stop(pid)
		return nil, fmt.Errorf("%w: kind %q: the incarnation's mailbox was not made inside its spawn", roamerr.ErrInvalidOperation, obj.kind.StableType)
	}
	if obj.pid == nil {
		obj.pid = pid // set by the init inside the spawn; never reached
	}
	if obj.kind.Checkpointed() && obj.cp == nil {
		obj.cp = &cpState{}
	}
	d.addLive(obj)
	return pid, nil
}

// addLive adds obj to the live incarnations, once.
func (d *Driver) addLive(obj *object) {
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	if obj.liveAt != 0 {
		return
	}
	if n := len(d.liveFree); n > 0 {
		obj.liveAt = d.liveFree[n-1] + 1
		d.liveFree = d.liveFree[:n-1]
		d.live[obj.liveAt-1] = obj
		return
	}
	d.live = append(d.live, obj)
	obj.liveAt = uint32(len(d.live))
}

// removeLive takes obj out of the live incarnations; its place is free.
func (d *Driver) removeLive(obj *object) {
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	if at := obj.liveAt; at != 0 {
		d.live[at-1] = nil
		d.liveFree = append(d.liveFree, at-1)
		obj.liveAt = 0
	}
}

// liveObjects are the live incarnations.
func (d *Driver) liveObjects() []*object {
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	objs := make([]*object, 0, len(d.live)-len(d.liveFree))
	for _, obj := range d.live {
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs
}

// restartIncarnation supervises incarnations: a failing one is restarted,
// never stopped (roam ends incarnations itself), after a delay that grows
// with each failure in a row (10 ms per failure, counted afresh after 10 s
// without one), so an actor that fails on every start — in Started, say —
// costs little instead of a CPU in a restart loop.
var restartIncarnation = actor.NewExponentialBackoffStrategy(10*time.Second, 10*time.Millisecond)

// RestartAlways supervises roam's own actors (incarnations, the relocation
// actor, the Spot service): a failing actor is restarted, never stopped.
// Proto.Actor's default strategy stops an actor after 10 failures in 10 s;
// roam refuses a stop it did not decide (stopguard), which would leave
// the actor suspended for good.
var RestartAlways = actor.NewRestartingStrategy()

// stop ends an incarnation's actor; the only way it stops.
func (d *Driver) stop(obj *object) {
	obj.moveMayStart()
	obj.flags.set(flagStopAllowed, true)
	d.removeLive(obj)
	restarting.Delete(obj.pid) // a restart under way ends with the actor
	d.sys.Root.Stop(obj.pid)
}

// Clock is the node's clock, which the driver reads and arms timers on.
func (d *Driver) Clock() machine.Clock { return d.clock }

// Shutdown stops, once the node has stopped, what the driver runs on an
// actor system that outlives the node (meshnode.Node.Attached): the
// relocation actor now, so that a next lifecycle on the same system can
// start its own, and every incarnation left after one Message Follow
// period. Until then the ended lifecycle's incarnations answer what still
// reaches them loudly (send_lease_ended, Unavailable), as they do when
// their lifecycle ends (endOwned), instead of letting it become a dead
// letter nobody of roam hears. A node with its own actor system needs none
// of it: the system's shutdown stops them all.
func (d *Driver) Shutdown() {
	d.sys.EventStream.Unsubscribe(d.events)
	d.FlushSendLogs()
	d.clock.AfterFunc(d.cfg.Handoff.FollowDuration, func() {
		for _, obj := range d.liveObjects() {
			d.stop(obj)
		}
	})
	if isClosed(d.node.Stopped()) {
		_ = d.sys.Root.StopFuture(d.self).Wait()
		d.loop.Close()
	}
}

// leaseChanged tells the driver the node's owner lease changed status.
type leaseChanged struct{ status lease.Status }

// onLeaseChanged: a fence lifted wakes every incarnation (their gates
// open again, their held messages run in order); a lease that ended ends
// every incarnation this lifecycle serves — another node may own them now.
func (d *Driver) onLeaseChanged(st lease.Status) {
	switch st {
	case lease.Valid:
		for _, obj := range d.objects {
			if obj.mb != nil {
				obj.mb.Wake()
			}
		}
	case lease.Ended:
		d.abandonRedeliveries()
		var wg sync.WaitGroup
		for _, obj := range d.objects {
			// A closing incarnation too: its close marker may wait behind
			// a gate that the ended lease keeps shut for good.
			if (obj.state == serving && obj.r().out == nil) || obj.closing {
				wg.Add(1)
				d.endOwned(obj, wg.Done)
			}
		}
		d.lifecycleEnded = make(chan struct{})
		go func(done chan struct{}) { wg.Wait(); close(done) }(d.lifecycleEnded)
	}
}

// FinishIncoming prepares a graceful stop: no new move lands on this node
// any more, a move into it that is still restoring is refused (its source
// serves again), and one past relay-ready — whose source can no longer
// take it back — is waited for until it committed or ended, within ctx.
// Without this a stop between relay-ready and commit would leave the
// object with a source that only forwards and a target that is gone.
func (d *Driver) FinishIncoming(ctx context.Context) error {
	gone := make(chan struct{}) // ends the deletions' watchers
	defer close(gone)
	type waiting struct {
		busy int
		next <-chan struct{} // closes when one of them ends
	}
	for {
		w, err := call(ctx, d, func() (waiting, error) {
			d.stopping = true
			n := targetrun.Stopping(maps.Values(d.targets), func(t *targetRun) *handoff.Target { return t.m }, d.stepTarget)
			// An Actor deletion under way ends too: its incarnation has
			// closed, and its record must not stay behind as an ended
			// owner's object.
			w := waiting{busy: n + len(d.deletions)}
			if w.busy == 0 {
				return w, nil
			}
			next := make(chan struct{})
			var once sync.Once
			ended := func() { once.Do(func() { close(next) }) }
			for _, t := range d.targets {
				if !t.m.Finished() {
					t.onDone = append(t.onDone, ended) // its Complete
				}
			}
			for _, del := range d.deletions {
				go func() {
					select {
					case <-del.done:
						ended()
					case <-next:
					case <-gone:
					}
				}()
			}
			w.next = next
			return w, nil
		})
		if err != nil || w.busy == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %d moves into node %s or Actor deletions on it did not finish before it stopped", roamerr.ErrDeadlineExceeded, w.busy, d.desc.GetNodeRid())
		case <-d.node.Stopped():
			// The driver's actor is gone with the node: nothing it runs
			// ends any more.
			return fmt.Errorf("%w: node %s has stopped with %d moves into it or Actor deletions on it unfinished", roamerr.ErrUnavailable, d.desc.GetNodeRid(), w.busy)
		case <-w.next:
		}
	}
}

// FollowQuiet waits until Message Follow has forwarded nothing for quiet
// (or ctx ends): a drained node that stops while callers still send to its
// old routes would drop what is in flight on the closing connections, and a
// dead-lettered send redelivered later could overtake the caller's next.
// A caller's first followed message tells its node the new route, so the
// traffic dies down within about a round trip of each caller's next send.
// The quiet period counts from the last move out's commit too, not only
// from the last message followed: a caller's node that has not yet heard
// the route hint of a move just made still sends on the old route, and a
// node that stopped right after its drain would lose those sends (a
// rolling restart of the chaos test lost one that way).
// It also waits until no move out of this node still holds messages (the
// hold from the cutover until the commit shows, or while reconciling): a
// drain's Relocate returns once the commit is in the store, possibly just
// before the source hands what it held to the target, and those messages
// must not stop with the node.
func (d *Driver) FollowQuiet(ctx context.Context, quiet time.Duration) error {
	for {
		holding, err := call(ctx, d, func() (bool, error) {
			for _, r := range d.sources {
				for _, p := range r.parts {
					if p.Held != nil || p.Parked != nil {
						return true, nil
					}
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("%w: Message Follow still busy: %w", roamerr.ErrDeadlineExceeded, err)
		}
		idle := machine.Since(d.clock, time.Unix(0, d.lastFollow.Load()))
		if idle >= quiet && !holding {
			return nil
		}
		wait := quiet - idle
		if holding {
			wait = 5 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: Message Follow still busy: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
		case <-machine.After(d.clock, max(wait, time.Millisecond)):
		}
	}
}

// WaitEnded waits, once the node's lease has ended, until every
// incarnation it served has failed what it held (requests answered
// Unavailable, sends counted), so the node's remote can be shut down
// without dropping those answers.
func (d *Driver) WaitEnded(ctx context.Context) error {
	ch, err := call(ctx, d, func() (chan struct{}, error) {
		if d.lifecycleEnded == nil {
			return nil, fmt.Errorf("%w: the lifecycle has not ended", roamerr.ErrInvalidOperation)
		}
		return d.lifecycleEnded, nil
	})
	if err != nil {
		return err
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: ending the lifecycle's incarnations: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	}
}

// nowServing makes obj this node's serving incarnation, unless the
// lifecycle has ended meanwhile: then it is ended at once.
func (d *Driver) nowServing(obj *object) {
	d.setState(obj, serving)
	if d.node.LeaseStatus() == lease.Ended {
		d.endOwned(obj, func() {})
	}
}

// endOwned ends an incarnation whose node lifecycle is over: its timers
// stop, and everything queued or arriving later fails loudly — requests
// with Unavailable, sends counted and logged — for one follow period, then
// the actor stops. Nothing of the application runs again (the gate is
// shut for good). done runs once what it held has been failed.
func (d *Driver) endOwned(obj *object, done func()) {
	d.setState(obj, ended)
	obj.moveMayStart()
	why := "the node's owner lease ended before the message was handled (a live node recovers the object by its kind's policy)"
	sink := d.endSink(obj, roamerr.CodeUnavailable, "send_lease_ended", why)
	_ = obj.mb.Do(func() {
		if obj.tm != nil {
			obj.tm.stopAll()
		}
	})
	err := obj.mb.SealFinal(func(saved []any) {
		for _, msg := range saved {
			if cm, ok := msg.(*closeMarker); ok {
				// Its close ends here: what was behind it is failed below.
				close(cm.done)
				continue
			}
			_, _, sender := actor.UnwrapEnvelope(msg)
			if obj.first != nil && operationOf(msg) == obj.first.operation {
				// A cold activation's first message that has not run: its
				// recovery root still holds it, and a live node that resumes
				// the activation runs it. Not a failure: its outcome is
				// another node's (run on the actor goroutine, like turns).
				to := sender
				if to == nil {
					to = noticeOf(msg) // a send whose caller waits for its dispatch
				}
				respondFailure(d.sys, to, msg, roamerr.CodeDeadlineExceeded, obj.key.ID,
					"the owner's lease ended before the first message ran; it runs where the activation is resumed")
				continue
			}
			sink(msg)
		}
		_, _ = obj.mb.Redirect(sink)
		d.clock.AfterFunc(d.cfg.Handoff.FollowDuration, func() { d.stop(obj) })
		done()
	})
	if err != nil {
		done()
		if !obj.closing { // a closed incarnation's own marker sealed it first
			d.log.Error().Str("event", "end_failed").Str("object_id", obj.key.ID).Err(err).Msg("ending an incarnation of an ended lifecycle failed")
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// operationOf is a queued message's HeaderOperation ("" without one).
func operationOf(msg any) string {
	if h, _, _ := actor.UnwrapEnvelope(msg); h != nil {
		return h.Get(HeaderOperation)
	}
	return ""
}
