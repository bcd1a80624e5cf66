// Package roam makes Proto.Actor actors and grains relocatable: an Actor or
// Instance Spot moves to another node while it keeps receiving messages at
// the same address, with its state, its unprocessed queue and its timers,
// nothing lost or duplicated. The new owner takes over only through a
// compare-and-set on a Location Store (Consul KV in production, memstore in
// one process).
//
// roam is an extension of the application's actor system, attached as
// Proto.Actor's own cluster is:
//
//	system := actor.NewActorSystem()
//	r, err := roam.New(system, roam.WithStore(store), roam.WithKinds(
//		roam.NewKind("cart", actor.PropsFromProducer(newCart), roam.PreserveState(), roam.Instance())))
//	err = r.Start(ctx) // starts the remote and claims the node in the store
//	reply, err := r.Spots().Request(ctx, "cart-42", &shop.Add{Sku: "tea"}, roam.InstanceSpot("cart"))
//
// With a Proto.Actor cluster, build its remote configuration with
// RemoteConfig and its identity lookup with IdentityLookup, start the member,
// then Start roam: relocatable kinds are resolved by roam, every other kind
// exactly as by Proto.Actor's own lookup.
package roam

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/extensions"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"

	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/session"
	"github.com/roamactors/roam/internal/sessionhost"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// ActorRef names the Actor id.
func ActorRef(id string) Ref { return extension.ActorRef(id) }

// InstanceSpotRef names the Instance Spot id.
func InstanceSpotRef(id string) Ref { return extension.InstanceSpotRef(id) }

// GrainID is the Spot ID of the Proto.Actor grain (kind, identity): the
// grain a generated client's cluster.Request(identity, kind, ...) reaches
// is the Instance Spot of that ID, and its kind is the proto service's
// name (service Cart in the .proto: kind "Cart"). Call it by
// Spot ID with Spots().Request(ctx, GrainID(kind, identity), msg), or move
// it with Relocate(ctx, GrainRef(kind, identity), node).
func GrainID(kind, identity string) string { return spot.GrainSpotID(kind, identity) }

// GrainRef names the Proto.Actor grain (kind, identity) (GrainID).
func GrainRef(kind, identity string) Ref { return InstanceSpotRef(GrainID(kind, identity)) }

// UserSpotRef names the User Spot id. Relocate moves the Spot's own
// incarnation; its member Actors stay where they are and move one by one
// (PerActor).
func UserSpotRef(id string) Ref { return extension.UserSpotRef(id) }

// KindOption configures a Kind.
type KindOption func(*Kind)

// Instance lets a first message cold-activate the kind as an Instance Spot
// (a grain: Proto.Actor's cluster.Request, or a call by Spot ID).
func Instance() KindOption { return func(k *Kind) { k.k.Instance = true } }

// ApplicationVersion is carried with a moved object; a node that hosts the
// kind at another version refuses the move before anything is sealed.
// Default "".
func ApplicationVersion(v string) KindOption { return func(k *Kind) { k.k.ApplicationVersion = v } }

// ReactivateEmpty lets an Instance Spot whose owner ended (crashed, cut
// off) be activated again, empty, by its next call. Default: it answers
// Unavailable until an operator accepts the loss (ReleaseEnded).
func ReactivateEmpty() KindOption { return func(k *Kind) { k.k.ReactivateEmpty = true } }

// CheckpointEvery makes the owner of an object of a PreserveStateWith kind
// capture its state into a checkpoint after every n handled messages (1:
// after each). Checkpoints bound what a crash of the owner loses: an
// object whose owner ended is recovered from its last checkpoint
// (docs/FAULTS.md, "Checkpoints and recovery").
func CheckpointEvery(n int) KindOption { return func(k *Kind) { k.k.CheckpointEvery = n } }

// CheckpointInterval captures an object's state at most d after the first
// message it handled since its last capture (at least 10 ms). Default for
// a PreserveStateWith kind that sets no checkpoint option: 1 s.
func CheckpointInterval(d time.Duration) KindOption {
	return func(k *Kind) { k.k.CheckpointInterval = d }
}

// CheckpointWhenIdle captures an object's state once it has handled no
// message for d after one (at least 10 ms).
func CheckpointWhenIdle(d time.Duration) KindOption { return func(k *Kind) { k.k.CheckpointIdle = d } }

// NoCheckpoints turns a PreserveStateWith kind's checkpoints off: its
// objects' state ends with an owner that crashes, and such an object waits
// for an operator (ReleaseEnded) unless the kind is ReactivateEmpty.
func NoCheckpoints() KindOption { return func(k *Kind) { k.k.NoCheckpoints = true } }

// RecoverByOperator: an object of the kind whose owner ended is not
// recovered by itself; it answers Unavailable (logged reactivation_refused)
// until an operator accepts the loss with ReleaseEnded.
func RecoverByOperator() KindOption { return func(k *Kind) { k.k.RecoverByOperator = true } }

// SpotWide makes a User Spot of the kind move together with its members
// (which then live on its node): one seal of them all, one payload, and one
// store transaction that changes every owner, at most MaxSpotWideMembers
// members. Default PerActor: the Spot moves alone and each member moves on
// its own. A SpotWide Spot's actor that implements RelocationReady is
// called on the target after the commit, before any of them handles a
// message.
func SpotWide() KindOption { return func(k *Kind) { k.k.SpotWide = true } }

// MaxSpotWideMembers is the most members a SpotWide User Spot moves with.
const MaxSpotWideMembers = relocation.MaxSpotWideMembers

// NewKind makes the relocatable kind name of props. The props keep their
// middleware, supervisor strategy and dispatcher; roam replaces the mailbox
// with its relocatable one. Props that name no dispatcher get roam's,
// which runs each run of the mailbox on a pooled goroutine instead of a
// new one (Proto.Actor's default): the actor must not leave its goroutine
// changed (unlock an OS thread it locked before its turn ends). roam spawns the incarnations itself, with
// Proto.Actor's default spawner and not through the system's root context:
// a spawner of the props and root-context spawn middleware (tracing,
// middleware propagation) do not apply to them; put middleware on the
// props. policy is required (DisableRelocation,
// RecreateOnRelocation, PreserveStateWith or PreserveState).
func NewKind(name string, props *actor.Props, policy Policy, opts ...KindOption) Kind {
	k := Kind{relocation.Kind{StableType: name, Props: props, Policy: policy.p}}
	for _, o := range opts {
		if o != nil {
			o(&k)
		}
	}
	return k
}

// FromClusterKind makes a relocatable kind of a Proto.Actor cluster kind
// (cluster.NewKind): its middleware delivers ClusterInit itself. Don't
// also register it with cluster.WithKinds.
func FromClusterKind(ck *pcluster.Kind, policy Policy, opts ...KindOption) Kind {
	if ck == nil {
		return Kind{} // refused by New: a kind needs a name and props
	}
	k := NewKind(ck.Kind, ck.Props, policy, opts...)
	k.k.ClusterKind = true
	return k
}

// Option configures roam on a node.
type Option func(*options)

type options struct {
	store      location.Store
	roots      location.RootStore
	name       string
	kinds      []relocation.Kind
	mesh       string
	host       string
	port       int
	advertised string
	tls        *meshnode.TLS
	plainTCP   bool
	limits     TransportLimits
	remoteOpts []remote.ConfigOption
	logger     *zerolog.Logger
	leaseTTL   time.Duration
	capacity   uint32
	weight     uint32
	onEvent    func(relocation.Event)
	inner      pcluster.IdentityLookup
	relocation relocation.Config
	// chunkLinkPort, if set, is WithChunkLinkPort's.
	chunkLinkPort *int
	spot          spot.Config
	session       session.Config
	placement     placement.Config
	// drainOnStop: Stop drains first (WithDrainOnStop).
	drainOnStop bool
	// checkpoints: WithCheckpointStore's.
	checkpoints location.CheckpointStore
	// errs are the options' own refusals, returned by New.
	errs []error
	// protoActorLevel: WithProtoActorLogLevel's.
	protoActorLevel *slog.Level
}

// WithCheckpointStore sets where the owners of stateful objects write
// their checkpoints, from which a crashed owner's objects are recovered
// (docs/FAULTS.md, "Checkpoints and recovery"). Default: the Location
// Store (memstore and consulstore keep checkpoints). An application's own
// blob store implements location.CheckpointStore and passes
// storetest.RunCheckpoints.
func WithCheckpointStore(s location.CheckpointStore) Option {
	return func(o *options) { o.checkpoints = s }
}

// WithStore sets the Location Store (required): memstore.New() in one
// process, consulstore.New(...) across processes.
func WithStore(s location.Store) Option { return func(o *options) { o.store = s } }

// refuse makes New return err (an option given a value out of range).
func refuse(err error) Option { return func(o *options) { o.errs = append(o.errs, err) } }

// WithKinds registers relocatable kinds. Every node that may host a kind
// registers it, at the same ApplicationVersion. Kinds are fixed at New:
// other nodes learn them from the store when the node starts.
func WithKinds(kinds ...Kind) Option {
	return func(o *options) {
		for _, k := range kinds {
			o.kinds = append(o.kinds, k.k)
		}
	}
}

// WithNodeName sets the node's stable name: unique among the mesh's live
// nodes (Start fails with roamerr.ErrAlreadyExists while another live node
// holds it; a crashed node's name is free once the store ended its lease),
// kept across restarts, and what Relocate takes as a target. Default:
// none; Relocate then takes the node's RID or its address (host:port).
func WithNodeName(name string) Option { return func(o *options) { o.name = name } }

// WithMesh sets the mesh (a partition of nodes and objects) the node
// serves. Default "default".
func WithMesh(mesh string) Option { return func(o *options) { o.mesh = mesh } }

// WithAddress sets where the remote roam starts listens, when the system
// has no Proto.Actor cluster. Default 127.0.0.1, port 0 (a free port).
func WithAddress(host string, port int) Option {
	return func(o *options) { o.host, o.port = host, port }
}

// WithAdvertisedHost sets the host:port peers dial, if not the listening
// address (containers, NAT).
func WithAdvertisedHost(hostPort string) Option { return func(o *options) { o.advertised = hostPort } }

// WithChunkLinkPort sets the port of the node's chunk link: a TCP listener
// beside the remote, on its host and with its TLS, where peers send the
// state of objects moving here, so that a large state does not hold up
// other messages between two nodes. Default 0: a free port, announced to
// peers when a move starts. -1: no link; state rides the remote's
// connection. Peers must reach the port: behind NAT or a firewall, fix
// the port and open it, or turn the link off.
func WithChunkLinkPort(port int) Option { return func(o *options) { o.chunkLinkPort = &port } }

// WithTLS makes every connection between nodes mutual TLS 1.3 with the
// cluster CA's certificates, each node's naming the node. Default: plain
// TCP, where anyone who reaches a node's port is trusted as a peer, which
// a node accepts on loopback only unless WithPlainTCP says otherwise.
func WithTLS(t *TLS) Option { return func(o *options) { o.tls = t.internal() } }

// WithPlainTCP lets the node listen on an address other than loopback
// without TLS. Any process that reaches its port is then taken for a
// member, as with plain Proto.Actor: use it only on a network that only
// your own processes reach. Without it, such a node does not start.
func WithPlainTCP() Option { return func(o *options) { o.plainTCP = true } }

// TransportLimits bound what other processes, members or not, can make a
// node hold through its port (docs/SECURITY.md). A zero field keeps its
// default.
type TransportLimits struct {
	// MaxConnections bounds the peer connections held at once; one more
	// is closed as it arrives. Default 1,024.
	MaxConnections int
	// MaxStreamsPerConnection bounds the streams one connection may open.
	// Default 16.
	MaxStreamsPerConnection uint32
	// FirstFrameTimeout bounds a connection's handshake and a stream's
	// wait for its first frame. Default 10 s.
	FirstFrameTimeout time.Duration
	// IdleConnection closes a connection without a stream for this long.
	// Default 2 minutes.
	IdleConnection time.Duration
	// MaxRemoteWatches and MaxRemoteWatchesPerPeer bound the watches other
	// processes hold on this node's actors, in all and per peer address.
	// Defaults 16,384 and 1,024.
	MaxRemoteWatches, MaxRemoteWatchesPerPeer int
}

// WithTransportLimits sets the node's TransportLimits. Negative values
// are refused by New.
func WithTransportLimits(l TransportLimits) Option { return func(o *options) { o.limits = l } }

// WithRemoteOptions are passed to Proto.Actor's remote.Configure.
func WithRemoteOptions(opts ...remote.ConfigOption) Option {
	return func(o *options) { o.remoteOpts = append(o.remoteOpts, opts...) }
}

// WithLogger sets roam's logger. Default: warnings and errors to stderr,
// as JSON unless stderr is a terminal.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = &l } }

// WithProtoActorLogLevel sets the least level of Proto.Actor's own log
// records that roam writes through its logger (WithLogger). Default
// slog.LevelWarn. It applies when the actor system logs through
// Proto.Actor's default logger (coloured text at info level to stderr):
// roam.New then replaces it, so that one output carries both. An actor
// system made with actor.WithLoggerFactory keeps the application's logger.
func WithProtoActorLogLevel(l slog.Level) Option { return func(o *options) { o.protoActorLevel = &l } }

// WithLeaseTTL sets the owner lease's TTL, whole seconds. Default 10 s.
func WithLeaseTTL(d time.Duration) Option { return func(o *options) { o.leaseTTL = d } }

// WithCapacity bounds the objects placed on the node (0: unbounded) and
// weighs it for placement (0: weight 1).
func WithCapacity(capacity, weight uint32) Option {
	return func(o *options) { o.capacity, o.weight = capacity, weight }
}

// WithDrainOnStop sets whether Stop drains the node first (default true).
// Without a drain, a stopped node's objects are recovered by other nodes
// like an ended owner's: Instance Spots of a ReactivateEmpty kind come
// back empty, others wait for ReleaseEnded (docs/STATUS.md).
func WithDrainOnStop(on bool) Option { return func(o *options) { o.drainOnStop = on } }

// WithOnEvent reports every move (started, committed, failed, …).
func WithOnEvent(f func(Event)) Option {
	return func(o *options) {
		o.onEvent = nil
		if f != nil {
			o.onEvent = func(e relocation.Event) { f(Event(e)) }
		}
	}
}

// WithInnerLookup sets the identity lookup of the kinds that are not
// roam's. Default: Proto.Actor's disthash.
func WithInnerLookup(l pcluster.IdentityLookup) Option { return func(o *options) { o.inner = l } }

// WithRelocationConfig tunes the hand-off (budgets, timeouts); zero fields
// keep their defaults.
func WithRelocationConfig(c RelocationConfig) Option {
	return func(o *options) { o.relocation = c.internal() }
}

// WithSpotConfig tunes Spots (route cache, limits); zero fields keep
// their defaults.
func WithSpotConfig(c SpotConfig) Option { return func(o *options) { o.spot = c.internal() } }

// WithSessionConfig bounds what a client Session holds while an Actor
// bound to it moves (default 1,024 messages and 1 MiB) and how long its
// seal lasts (SessionRelocationSealTimeout, default 3 s); zero fields keep
// the defaults (docs/SESSIONS.md).
func WithSessionConfig(c SessionConfig) Option {
	return func(o *options) { o.session = session.Config(c) }
}

// WithPlacement runs the placement director on the node (it directs only
// while it is the elected one, docs/PLACEMENT.md): it moves idle Actors
// and Instance Spots (RelocateIfIdle) from nodes that own more than the
// mean to nodes that own fewer, within the ledger's global rate,
// concurrency and per-object cooldown; with c.CoLocation.Enabled it also
// moves objects that talk to each other onto one node. c.Enabled is set
// by this option; zero fields keep the defaults. Give every node the same
// configuration.
func WithPlacement(c PlacementConfig) Option {
	return func(o *options) { o.placement = c.internal() }
}

// Placement is the node's director while the node runs with
// WithPlacement, else nil. It directs only while elected.
func (r *Roam) Placement() *PlacementDirector {
	e, err := r.started()
	if err != nil || e.Placement() == nil {
		return nil
	}
	return &PlacementDirector{e.Placement()}
}

// WithRoots sets the store of creation requests and activation recovery
// roots. Default: the Location Store (memstore and consulstore are one).
func WithRoots(r location.RootStore) Option { return func(o *options) { o.roots = r } }

// Roam is roam on one actor system.
type Roam struct {
	system *actor.ActorSystem
	o      options
	log    zerolog.Logger
	lookup *spot.IdentityLookup

	mu        sync.Mutex
	ext       *extension.Extension
	transport *meshnode.Transport
	stopped   bool
}

var extensionID = extensions.NextExtensionID()

// ExtensionID makes Roam a Proto.Actor extension.
func (r *Roam) ExtensionID() extensions.ExtensionID { return extensionID }

// Get returns the roam attached to system by New, nil if none.
func Get(system *actor.ActorSystem) *Roam {
	r, _ := system.Extensions.Get(extensionID).(*Roam)
	return r
}

// New attaches roam to system. Nothing reaches the network or the store
// until Start. InvalidOperation for a system roam is attached to already,
// NotConfigured without a store, and a kind's own error for an invalid
// kind.
func New(system *actor.ActorSystem, opts ...Option) (*Roam, error) {
	if system == nil {
		return nil, fmt.Errorf("%w: roam.New: nil actor system", roamerr.ErrInvalidOperation)
	}
	if Get(system) != nil {
		return nil, fmt.Errorf("%w: roam is attached to this actor system already (roam.Get)", roamerr.ErrInvalidOperation)
	}
	o := options{host: meshnode.DefaultHost, drainOnStop: true}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: roam.New: nil Option", roamerr.ErrInvalidOperation)
		}
		opt(&o)
	}
	if o.store == nil {
		return nil, fmt.Errorf("%w: roam.New: WithStore is required", roamerr.ErrNotConfigured)
	}
	if l := o.limits; l.MaxConnections < 0 || l.FirstFrameTimeout < 0 || l.IdleConnection < 0 || l.MaxRemoteWatches < 0 || l.MaxRemoteWatchesPerPeer < 0 {
		return nil, fmt.Errorf("%w: roam.New: TransportLimits must not be negative: %+v", roamerr.ErrInvalidOperation, l)
	}
	if o.port < 0 || o.port > 65535 {
		return nil, fmt.Errorf("%w: roam.New: WithAddress port %d outside 0..65535", roamerr.ErrInvalidOperation, o.port)
	}
	if o.host == "" {
		return nil, fmt.Errorf("%w: roam.New: WithAddress needs a host (127.0.0.1 for loopback, 0.0.0.0 for every interface)", roamerr.ErrInvalidOperation)
	}
	if p := o.chunkLinkPort; p != nil && (*p < -1 || *p > 65535) {
		return nil, fmt.Errorf("%w: roam.New: WithChunkLinkPort %d outside -1..65535", roamerr.ErrInvalidOperation, *p)
	}
	for _, err := range o.errs {
		return nil, err
	}
	for i, k := range o.kinds {
		if slices.ContainsFunc(o.kinds[:i], func(p relocation.Kind) bool { return p.StableType == k.StableType }) {
			return nil, fmt.Errorf("%w: kind %q registered twice", roamerr.ErrInvalidOperation, k.StableType)
		}
	}
	r := &Roam{system: system, o: o}
	if err := extension.Validate(r.extensionConfig(nil)); err != nil {
		return nil, fmt.Errorf("roam.New: %w", err)
	}
	if o.logger != nil {
		r.log = *o.logger
	} else {
		r.log = DefaultLogger(os.Stderr)
	}
	if meshnode.HasDefaultLogger(system) {
		min := slog.LevelWarn
		if o.protoActorLevel != nil {
			min = *o.protoActorLevel
		}
		// The system's components look its logger up as they log: the
		// logger they share changes in place.
		*system.Logger() = *meshnode.ProtoActorLogger(r.log, min).With("system", system.ID)
	}
	kinds := slices.Clone(o.kinds)
	r.lookup = spot.NewIdentityLookup(o.inner, func(kind string) bool {
		return slices.ContainsFunc(kinds, func(k relocation.Kind) bool { return k.StableType == kind && k.Instance })
	})
	system.Extensions.Register(r)
	return r, nil
}

// DefaultLogger is roam's logger when WithLogger is not given: warnings and
// errors to w, as JSON lines unless w is a terminal (then as readable
// lines).
func DefaultLogger(w io.Writer) zerolog.Logger {
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			w = zerolog.ConsoleWriter{Out: f, TimeFormat: time.RFC3339}
		}
	}
	return zerolog.New(w).Level(zerolog.WarnLevel).With().Timestamp().Logger()
}

// RemoteConfig is the Proto.Actor remote configuration for an application
// that runs a Proto.Actor cluster: pass it to cluster.Configure. It carries
// roam's guards (every frame checked before Proto.Actor decodes it, frame
// limits) and the WithTLS credentials; Start refuses a cluster whose
// remote was configured otherwise.
func (r *Roam) RemoteConfig(host string, port int, opts ...remote.ConfigOption) (*remote.Config, error) {
	return meshnode.RemoteConfig(r.system, host, port, meshnode.RemoteOptions{
		Logger: r.log, TLS: r.o.tls, PlainTCP: r.o.plainTCP, Limits: meshnode.Limits(r.o.limits), AdvertisedHost: r.o.advertised,
		Options: append(slices.Clone(r.o.remoteOpts), opts...),
	})
}

// IdentityLookup is the identity lookup for the application's Proto.Actor
// cluster (cluster.Configure): roam's kinds are resolved through the
// Location Store and follow their moves; every other kind goes to the
// inner lookup (WithInnerLookup; Proto.Actor's disthash by default).
func (r *Roam) IdentityLookup() pcluster.IdentityLookup { return r.lookup }

// Start claims the node in the Location Store and starts roam's actors on
// the system. A system with a Proto.Actor cluster must have started its
// member (StartMember) with RemoteConfig and IdentityLookup; a system
// without one must have no remote: Start starts it (WithAddress). If the
// node's owner lease ever ends without Stop (cut off from the store, paused
// too long), roam starts a new node lifecycle on the same system by itself.
func (r *Roam) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return fmt.Errorf("%w: roam was stopped; attach a new one to a new actor system", roamerr.ErrInvalidOperation)
	}
	if r.ext != nil {
		return fmt.Errorf("%w: roam was started already", roamerr.ErrInvalidOperation)
	}
	for _, k := range r.o.kinds {
		// Its props' cluster middleware would panic on every Started.
		if k.ClusterKind && !meshnode.HasProtoCluster(r.system) {
			return fmt.Errorf("%w: kind %q comes from a Proto.Actor cluster kind (FromClusterKind), but the actor system has no Proto.Actor cluster", roamerr.ErrNotConfigured, k.StableType)
		}
	}
	t, err := meshnode.Attach(r.system, func() (*remote.Config, error) { return r.RemoteConfig(r.o.host, r.o.port) })
	if err != nil {
		return err
	}
	ext, err := extension.Start(ctx, r.extensionConfig(t))
	if err != nil {
		t.StopUnused()
		return err
	}
	r.ext, r.transport = ext, t
	go r.watchSystem()
	return nil
}

// extensionConfig is the configuration Start starts the node with (t nil:
// for New's validation).
func (r *Roam) extensionConfig(t *meshnode.Transport) extension.Config {
	rel := r.o.relocation
	if r.o.checkpoints != nil {
		rel.Checkpoints = r.o.checkpoints
	}
	if p := r.o.chunkLinkPort; p != nil {
		rel.ChunkLinkPort = *p
	}
	if r.o.onEvent != nil {
		rel.OnEvent = r.o.onEvent
	}
	return extension.Config{
		Node: meshnode.Config{
			Store: r.o.store, Mesh: r.o.mesh, Name: r.o.name, LeaseTTL: r.o.leaseTTL, Capacity: r.o.capacity, Weight: r.o.weight,
			Logger: &r.log, Attach: t,
		},
		Kinds:            r.o.kinds,
		StopWithoutDrain: !r.o.drainOnStop,
		Relocation:       rel,
		Spot:             r.o.spot,
		Session:          r.o.session,
		Placement:        r.o.placement,
		Roots:            r.o.roots,
		Lookup:           r.lookup,
	}
}

// watchSystem stops roam when the application shuts its actor system down
// (directly, or with its Proto.Actor cluster) without Stop: the node would
// otherwise go on renewing its lease with nothing serving its objects,
// which no other node would then take over.
func (r *Roam) watchSystem() {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for range t.C {
		r.mu.Lock()
		stopped := r.stopped
		r.mu.Unlock()
		if stopped {
			return
		}
		if r.system.IsStopped() {
			r.log.Warn().Str("event", "actor_system_stopped").Str("node_rid", r.NodeRid()).
				Msg("the actor system was shut down before roam.Stop: roam stops now, so that other nodes take its objects over")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = r.stop(ctx, false) // nothing can move off a stopped system
			cancel()
			return
		}
	}
}

// started returns the running extension. InvalidOperation before Start
// and after Stop: no retry helps (between two of the node's lifecycles
// the extension itself answers Unavailable).
func (r *Roam) started() (*extension.Extension, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil *roam.Roam (roam.New makes one)", roamerr.ErrInvalidOperation)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopped:
		return nil, fmt.Errorf("%w: roam was stopped (Stop); attach a new one to a new actor system", roamerr.ErrInvalidOperation)
	case r.ext == nil:
		return nil, fmt.Errorf("%w: roam is not started: call Start first", roamerr.ErrInvalidOperation)
	}
	return r.ext, nil
}

// Stop drains the node (Drain; unless WithDrainOnStop(false)), tells the
// other nodes it is leaving and lets the messages still sent to it follow
// to the new owners, then releases the node's claim in the store and stops
// roam's actors and the remote roam started; the actor system and a
// Proto.Actor cluster are the application's. All of it is bounded by ctx:
// the drain takes at most two thirds of the time ctx leaves, so that the
// release still happens. What the drain did not move is recovered by other
// nodes like an ended owner's objects.
func (r *Roam) Stop(ctx context.Context) error { return r.stop(ctx, true) }

func (r *Roam) stop(ctx context.Context, drain bool) error {
	r.mu.Lock()
	ext, t := r.ext, r.transport
	r.stopped = true
	r.mu.Unlock()
	if ext == nil {
		return nil
	}
	var err error
	if drain {
		err = ext.Stop(ctx) // drains unless WithDrainOnStop(false)
	} else {
		err = ext.StopNow(ctx)
	}
	t.Stop()
	return err
}

// Drain empties this node for a rolling deploy: the node takes no new
// object, activation or move any more (its descriptor says DRAINING), and
// every Actor and Spot it serves moves, with its state, queue and
// timers, to the other live nodes, placed by their load and capacity. It
// returns when nothing movable is left or ctx ends; the result lists what
// could not move and why (a kind with DisableRelocation, no
// node with room). The node keeps serving what stayed; Stop then ends it.
// Stop drains by itself unless WithDrainOnStop(false).
func (r *Roam) Drain(ctx context.Context, opts DrainOptions) (DrainResult, error) {
	ext, err := r.started()
	if err != nil {
		return DrainResult{}, err
	}
	if opts.Concurrency < 0 || opts.Concurrency > drain.MaxConcurrency {
		return DrainResult{}, fmt.Errorf("%w: DrainOptions.Concurrency %d outside 1..%d (0: the default, 64)", roamerr.ErrInvalidOperation, opts.Concurrency, drain.MaxConcurrency)
	}
	res, err := ext.Drain(ctx, opts.internal())
	return drainResult(res), err
}

// Spots is the node's API of Spots by ID. Before Start and after Stop
// its calls answer roamerr.ErrInvalidOperation.
func (r *Roam) Spots() *Spots { return &Spots{r} }

// SpawnActor creates the relocatable Actor id of a registered kind on this
// node.
func (r *Roam) SpawnActor(ctx context.Context, kind, id string) (*actor.PID, error) {
	ext, err := r.started()
	if err != nil {
		return nil, err
	}
	return ext.SpawnActor(ctx, kind, id)
}

// OpenSession opens a client Session on this node. The Session stays here
// while the Actors bound to it move; it ends with Close, when this node
// stops, or — Unavailable — when a move of a bound Actor is not confirmed
// within the seal timeout.
func (r *Roam) OpenSession(opts SessionOptions) (*Session, error) {
	ext, err := r.started()
	if err != nil {
		return nil, err
	}
	s, err := ext.OpenSession(sessionhost.Options(opts))
	if err != nil {
		return nil, err
	}
	return &Session{s}, nil
}

// Resolve returns the current PID of ref from the store.
func (r *Roam) Resolve(ctx context.Context, ref Ref) (*actor.PID, error) {
	ext, err := r.started()
	if err != nil {
		return nil, err
	}
	return ext.Resolve(ctx, ref)
}

// Relocate moves ref to the node target, named by its RID, its stable
// name (WithNodeName) or its address, from any node: the owner is asked when it is
// another node. It returns once the target's commit is in the store; a
// move to the node that owns ref already returns at once, with a zero
// pause. NotFound when no live node has that name or RID, or ref does not
// exist.
func (r *Roam) Relocate(ctx context.Context, ref Ref, target string) (Outcome, error) {
	ext, err := r.started()
	if err != nil {
		return Outcome{}, err
	}
	out, err := ext.Relocate(ctx, ref, target)
	return Outcome(out), err
}

// RelocateIfIdle is Relocate for a move that the owner admits only if the
// object is idle when it would seal it: no message queued and no
// framework timer due within window (docs/PLACEMENT.md). A busy object is
// not moved and serves on where it is; the error is ErrUnavailable with
// ErrBusy. Messages that arrive once the idle object is sealed are held
// and follow it, as in any move.
func (r *Roam) RelocateIfIdle(ctx context.Context, ref Ref, target string, window time.Duration) (Outcome, error) {
	ext, err := r.started()
	if err != nil {
		return Outcome{}, err
	}
	out, err := ext.RelocateIfIdle(ctx, ref, target, window)
	return Outcome(out), err
}

// NodeName is the node's stable name ("" before Start).
func (r *Roam) NodeName() string {
	ext, err := r.started()
	if err != nil {
		return ""
	}
	return ext.NodeName()
}

// ReleaseEnded accepts that ref's owner ended and its in-memory state is
// lost, so the object can be created or activated again. It is for the
// objects that wait for an operator (RecoverByOperator, state without
// checkpoints): one whose kind a live node recovers by itself is refused
// (InvalidOperation), since forgetting its checkpoint would race that
// recovery. A User Spot's release takes its members with it; they wait
// with it rather than being recovered on their own.
func (r *Roam) ReleaseEnded(ctx context.Context, ref Ref) (bool, error) {
	ext, err := r.started()
	if err != nil {
		return false, err
	}
	return ext.ReleaseEnded(ctx, ref)
}

// NodeRid is the current node lifecycle's RID ("" before Start).
func (r *Roam) NodeRid() string {
	ext, err := r.started()
	if err != nil {
		return ""
	}
	return ext.NodeRid()
}

// NodeInfo is a live node of the mesh as the Location Store holds it.
type NodeInfo struct {
	Name    string // the stable name (WithNodeName)
	RID     string // the current lifecycle's RID
	Address string // the remote address
	// Draining: the node takes no new objects (Drain, or a Stop under way).
	Draining bool
	// Capacity is the node's capacity (0: unbounded) and Weight its
	// placement weight (WithCapacity).
	Capacity, Weight uint32
}

// Nodes lists the live nodes of this node's mesh, as the store holds them
// now.
func (r *Roam) Nodes(ctx context.Context) ([]NodeInfo, error) {
	ext, err := r.started()
	if err != nil {
		return nil, err
	}
	nodes, err := ext.Node().Store().ListNodes(ctx, ext.Node().Descriptor().GetMesh())
	if err != nil {
		return nil, roamerr.Keep(roamerr.ErrUnavailable, "roam: list nodes", err)
	}
	out := make([]NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, NodeInfo{Name: n.Node.GetName(), RID: n.Node.GetNodeRid(), Address: n.Node.GetAddress(),
			Draining: n.Node.GetStatus() == messages.NodeStatus_NODE_STATUS_DRAINING, Capacity: n.Node.GetCapacity(), Weight: n.Node.GetWeight()})
	}
	return out, nil
}

// System is the actor system roam is attached to.
func (r *Roam) System() *actor.ActorSystem { return r.system }

// DeleteActor ends the Actor ref for good, from any node: its incarnation
// handles the messages it accepted and stops, and its record goes with
// its membership in one store transaction; a User Spot it belonged to may
// then close, and the ID may be spawned again. Later messages to it fail
// (Stale or NotFound). False when there is no such Actor. Once started, a
// delete runs to its end on the owner even if ctx ends first (the caller
// then hears DeadlineExceeded); a second delete of the Actor waits for it.
// Never call it for an Actor from that Actor's own turn: the delete waits
// for the turn to end.
func (r *Roam) DeleteActor(ctx context.Context, ref Ref) (bool, error) {
	ext, err := r.started()
	if err != nil {
		return false, err
	}
	return ext.DeleteActor(ctx, ref)
}

// LeaveSpot takes the Actor ref out of the User Spot it is a member of,
// from any node; it then belongs to its node's Entry Spot and serves on.
// InvalidOperation when it is no User Spot's member.
func (r *Roam) LeaveSpot(ctx context.Context, ref Ref) error {
	ext, err := r.started()
	if err != nil {
		return err
	}
	return ext.LeaveSpot(ctx, ref)
}

// JoinSpot makes the Actor ref a member of the User Spot incarnation spot
// names, from any node (cross-node Actor Join). An Actor on another node
// than the Spot's moves there first, with its state, queue and timers, and
// that node's commit changes its owner and both memberships in one store
// transaction; on the Spot's node one transaction changes the memberships.
// Either way the first message the Actor handles after the commit is a
// *JoinedSpot, its Join callback. Already a member: nothing happens. Stale
// when the Spot is not Ready at that generation (or changed before the
// commit: the Actor then serves on where it landed, in its old Spot).
func (r *Roam) JoinSpot(ctx context.Context, ref Ref, s SpotRef) (Outcome, error) {
	ext, err := r.started()
	if err != nil {
		return Outcome{}, err
	}
	out, err := ext.JoinSpot(ctx, ref, spot.SpotRef(s))
	return Outcome(out), err
}

// DeliveryError is the error a reply stands for when roam answered a
// request in place of the object (a *messages.DeliveryFailed: the object
// is unavailable, gone, or moved past the follow window, or the request or
// its reply is over the size limit; for a grain request a
// *cluster.GrainErrorResponse with a class's Reason), typed like every
// roam error, with its refinement; nil for an application's own reply.
// Spots' Request does this itself; use it on replies to requests sent to
// an Actor's PID or through cluster.Request.
func DeliveryError(reply any) error { return relocation.DeliveryError(reply) }
