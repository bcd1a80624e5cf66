// Package cluster runs a roam node: a Proto.Actor actor system with remote
// on a loopback (or configured) port, whose descriptor and Entry Spot are
// claimed in the Location Store under an owner lease that the node renews,
// and released when it stops (docs/PROTOCOL.md §3.4).
//
// Every start is a new lifecycle: a new node RID and a new Entry Spot ID
// "<prefix>-entry-<lowercase uuid v4>", never reused, so a stale cleanup of
// an earlier lifecycle cannot touch this one.
package meshnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// ProtocolVersion is the roam wire protocol a node speaks.
const ProtocolVersion = 1

// Defaults of Config.
const (
	DefaultMesh        = "default"
	DefaultHost        = "127.0.0.1"
	DefaultEntryPrefix = "roam"
	DefaultLeaseTTL    = 10 * time.Second
)

// Config configures a Node. Zero fields take the documented defaults.
type Config struct {
	// Store is the Location Store. Required.
	Store location.Store
	// Mesh is the RouteMesh the node serves. Default "default".
	Mesh string
	// Name is the node's stable name, unique among the mesh's live nodes
	// (a second node with a taken name fails to start with
	// roamerr.ErrAlreadyExists; a crashed node's name is free once the
	// store ended its lease) and kept across restarts, unlike its RID:
	// Relocate takes it as the target. Default: none (Relocate then takes
	// the node's RID or address). With TLS the certificate must name it
	// (TLS), and a node without one takes the name its certificate names.
	Name string
	// Host and Port the remote listens on. Default 127.0.0.1, port 0 (a
	// free port, chosen by the OS).
	Host string
	Port int
	// AdvertisedHost, if set, is the host:port peers dial instead.
	AdvertisedHost string
	// EntryPrefix is the diagnostic prefix of the Entry Spot ID. Default
	// "roam". It must not contain "-entry-".
	EntryPrefix string
	// StableTypes the node can host, Capacity and Weight for placement.
	StableTypes []string
	// InstanceTypes are the StableTypes a first message may cold-activate
	// as Instance Spots here (PROTOCOL.md §7.5).
	InstanceTypes []string
	Capacity      uint32
	Weight        uint32
	// LeaseTTL of the owner lease, whole seconds. Default 10 s; the node
	// renews it every TTL/3.
	LeaseTTL time.Duration
	// LeaseMargin: the node fences itself (dispatches, fires and writes
	// nothing) this long before the earliest instant the store could end
	// its lease without a newer renewal. Default max(TTL/5, 500 ms).
	LeaseMargin time.Duration
	// Logger receives roam's and Proto.Actor's logs. Default: zerolog.Nop.
	Logger *zerolog.Logger
	// ProtoActorLogLevel is the least level of Proto.Actor's own logs that
	// is passed on. Default slog.LevelWarn.
	ProtoActorLogLevel *slog.Level
	// TLS, if set, makes every connection between nodes mutual TLS and
	// binds the senders of control messages to the peer's certificate.
	// Without it any process that reaches the node's port is trusted as a
	// peer (docs/SECURITY.md). Default: nil (plain TCP).
	TLS *TLS
	// Limits bound what peers can make the node hold through its port.
	Limits Limits
	// PlainTCP lets the node listen on an address other than loopback
	// without TLS, where any process that reaches its port is taken for a
	// member (docs/SECURITY.md). Without it, such a node does not start.
	PlainTCP bool
	// RemoteOptions are passed to Proto.Actor's remote. roam's frame
	// limits, guards and TLS credentials apply whatever they set.
	RemoteOptions []remote.ConfigOption
	// ProtoCluster, if set, makes the node a member of a Proto.Actor
	// cluster too, so that cluster.Request(identity, kind, msg) works on it.
	ProtoCluster *ProtoCluster
	// Attach, if set, runs the node lifecycle on an application's actor
	// system and remote (see Attach) instead of its own: Host, Port,
	// AdvertisedHost, TLS, RemoteOptions, ProtoCluster and
	// ProtoActorLogLevel are then the transport's, and Stop leaves the
	// system and remote running.
	Attach *Transport
	// Clock is the time every driver on the node reads and arms its timers
	// on. Default machine.Real; tests run a node in logical time with a
	// machine.Manual.
	Clock machine.Clock
}

// ProtoCluster joins the node to a Proto.Actor cluster. Proto.Actor's
// cluster starts the remote itself, so the node lets it.
type ProtoCluster struct {
	// Name of the cluster. Default "roam".
	Name string
	// Provider is the membership provider (Consul, Kubernetes, or
	// Proto.Actor's in-memory test provider). Required.
	Provider pcluster.ClusterProvider
	// Lookup resolves grain identities; the extension sets roam's, backed
	// by the Location Store (package spot). Required.
	Lookup pcluster.IdentityLookup
	// Options are passed to Proto.Actor's cluster.Configure.
	Options []pcluster.ConfigOption
}

// ValidateConfig refuses what Start would refuse of c, without starting
// anything, so that an application hears of a bad option where it gives
// it.
func ValidateConfig(c Config) error { return c.setDefaults() }

func (c *Config) setDefaults() error {
	if c.Store == nil {
		return fmt.Errorf("%w: cluster: Config.Store is required", location.ErrInvalid)
	}
	if c.Mesh == "" {
		c.Mesh = DefaultMesh
	}
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.EntryPrefix == "" {
		c.EntryPrefix = DefaultEntryPrefix
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	if c.ProtoActorLogLevel == nil {
		l := slog.LevelWarn
		c.ProtoActorLogLevel = &l
	}
	if err := location.ValidateID("mesh", c.Mesh); err != nil {
		return err
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("%w: port %d", location.ErrInvalid, c.Port)
	}
	if err := location.ValidateTTL(c.LeaseTTL); err != nil {
		return err
	}
	if _, err := (lease.Config{TTL: c.LeaseTTL, Margin: c.LeaseMargin}).WithDefaults(); err != nil {
		return fmt.Errorf("%w: %w", location.ErrInvalid, err)
	}
	if len(c.EntryPrefix)+len("-entry-")+36 > location.MaxIDBytes || containsEntryMarker(c.EntryPrefix) {
		return fmt.Errorf("%w: entry prefix %q", location.ErrInvalid, c.EntryPrefix)
	}
	return nil
}

// tlsName settles, with TLS, the name the node runs under: a node's TLS
// identity is its name, which its certificate must name.
func (c *Config) tlsName(link LinkSettings) error {
	if link.Server == nil {
		return nil
	}
	name, err := tlsNodeName(c.Name, link.Nodes)
	c.Name = name
	return err
}

func containsEntryMarker(s string) bool {
	for i := 0; i+len("-entry-") <= len(s); i++ {
		if s[i:i+len("-entry-")] == "-entry-" {
			return true
		}
	}
	return false
}

// entrySpotID matches the framework-issued Entry Spot ID format.
var entrySpotID = regexp.MustCompile(`^.+-entry-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// IsEntrySpotID reports whether id has the framework's Entry Spot ID format
// "<prefix>-entry-<lowercase uuid v4>", which no application ID may use.
func IsEntrySpotID(id string) bool { return entrySpotID.MatchString(id) }

// NewEntrySpotID issues a framework Entry Spot ID: "<prefix>-entry-<uuid v4>"
// (PROTOCOL.md §3.4, §7.1), the UUID generated apart from the node RID.
func NewEntrySpotID(prefix string) string { return prefix + "-entry-" + uuid.NewString() }

// Node is one running roam node.
type Node struct {
	cfg    Config
	link   LinkSettings
	log    zerolog.Logger
	system *actor.ActorSystem
	remote *remote.Remote
	// pcluster is the Proto.Actor cluster membership, when configured.
	pcluster *pcluster.Cluster
	// attached: the system and remote are an application's (Config.Attach)
	// and outlive this lifecycle.
	attached bool
	desc     *location.NodeDescriptor // as claimed; immutable
	lease    location.Lease
	// draining: the node takes no new object, move or activation
	// (SetDraining); it never goes back within a lifecycle.
	draining atomic.Bool
	members  *members

	// The owner lease's fence (package lease): keeper is the loop
	// goroutine's; status and validUntil publish its verdict to every
	// goroutine that asks Valid. validUntil is measured on the monotonic
	// clock from base, so a wall-clock step cannot extend it.
	keeper     *lease.Keeper
	base       time.Time
	status     atomic.Int32
	validUntil atomic.Int64
	watchMu    sync.Mutex
	watchers   []func(lease.Status)
	// published closes, and is replaced, at every publish: a write waiting
	// for its fence to lift (WaitWritable) looks again then. Under
	// watchMu.
	published chan struct{}

	// unsettled counts what the lease loop has yet to take: fired Ticks
	// and renewals sent whose answers the keeper has not stepped
	// (Settled). The first Tick counts as pending from Start.
	unsettled atomic.Int32

	leaseLost chan struct{}
	stopped   chan struct{} // closed when Stop has shut the actor system down
	stopRenew chan struct{}
	renewDone chan struct{}
	// life is cancelled when Stop begins: a renewal or orphan release in
	// flight then ends at once instead of outliving the node by its own
	// timeout. background counts the goroutines Stop waits for besides
	// the lease loop.
	life       context.Context
	endLife    context.CancelFunc
	background sync.WaitGroup
	stopOnce   sync.Once
	stopErr    error
}

// Start starts the actor system and remote, then claims the node's
// descriptor and Entry Spot under a new owner lease. A claim conflict is a
// start-up error (PROTOCOL.md §3.4); nothing is retried with another ID.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	var (
		system *actor.ActorSystem
		r      *remote.Remote
		pc     *pcluster.Cluster
		// node is published to the remote's guards once claimed.
		node *atomic.Pointer[Node]
		link LinkSettings
	)
	if t := cfg.Attach; t != nil {
		system, r, pc, node, link = t.system, t.remote, t.pc, &t.hooks.node, t.hooks.link
		if err := cfg.tlsName(link); err != nil {
			return nil, err
		}
	} else {
		system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(&zerologHandler{log: *cfg.Logger, min: *cfg.ProtoActorLogLevel})
		}))
		rcfg, err := RemoteConfig(system, cfg.Host, cfg.Port, RemoteOptions{Logger: *cfg.Logger, TLS: cfg.TLS, PlainTCP: cfg.PlainTCP, Limits: cfg.Limits, AdvertisedHost: cfg.AdvertisedHost, Options: cfg.RemoteOptions})
		if err != nil {
			return nil, err
		}
		hooks, _ := guardedConfigs.LoadAndDelete(rcfg) // the node's own: nobody else attaches to it
		node, link = &hooks.(*remoteHooks).node, hooks.(*remoteHooks).link
		if err := cfg.tlsName(link); err != nil {
			return nil, err
		}
		if p := cfg.ProtoCluster; p != nil {
			name := p.Name
			if name == "" {
				name = "roam"
			}
			pc = pcluster.New(system, pcluster.Configure(name, p.Provider, p.Lookup, rcfg, p.Options...))
			if err := startMember(pc); err != nil {
				system.Shutdown()
				return nil, err
			}
			r = pc.Remote
		} else {
			r = remote.NewRemote(system, rcfg)
			if err := startRemote(r); err != nil {
				system.Shutdown()
				return nil, err
			}
		}
	}
	n := &Node{
		link:      link,
		cfg:       cfg,
		attached:  cfg.Attach != nil,
		system:    system,
		remote:    r,
		pcluster:  pc,
		leaseLost: make(chan struct{}),
		stopped:   make(chan struct{}),
		stopRenew: make(chan struct{}),
		renewDone: make(chan struct{}),
	}
	n.life, n.endLife = context.WithCancel(context.Background())
	n.desc = &location.NodeDescriptor{
		Mesh:            cfg.Mesh,
		Name:            cfg.Name,
		NodeRid:         uuid.NewString(),
		NodeGeneration:  newNodeGeneration(),
		EntrySpotId:     NewEntrySpotID(cfg.EntryPrefix),
		Address:         system.Address(),
		StableTypes:     append([]string(nil), cfg.StableTypes...),
		InstanceTypes:   append([]string(nil), cfg.InstanceTypes...),
		Capacity:        cfg.Capacity,
		Weight:          cfg.Weight,
		Status:          messages.NodeStatus_NODE_STATUS_SERVING,
		ProtocolVersion: ProtocolVersion,
		LeaseTtlSeconds: uint32(cfg.LeaseTTL / time.Second),
	}
	n.members = newMembers(cfg.Store)
	ask.SetLogger(*cfg.Logger)
	n.log = cfg.Logger.With().Str("node_rid", n.desc.NodeRid).Str("address", n.desc.Address).Logger()
	n.base = n.Clock().Now()
	claimSent := n.base
	ls, err := n.claim(ctx, &claimSent)
	if err != nil {
		n.endLife()
		if !n.attached {
			n.shutdownTransport()
			waitReleased(n.desc.Address)
		}
		n.log.Error().Str("event", "node_claim_failed").Str("entry_spot_id", n.desc.EntrySpotId).Err(err).Msg("node descriptor and Entry Spot claim failed")
		if errors.Is(err, location.ErrNodeNameTaken) {
			return nil, fmt.Errorf("%w: cluster: node name %q is held by a live node of mesh %q (%v)", roamerr.ErrAlreadyExists, n.desc.Name, cfg.Mesh, err)
		}
		return nil, fmt.Errorf("cluster: claim node %s: %w", n.desc.Address, err)
	}
	n.lease = ls
	n.desc.LeaseId = string(ls.ID)
	keeper, err := lease.New(lease.Config{TTL: cfg.LeaseTTL, Margin: cfg.LeaseMargin}, claimSent)
	if err != nil { // checked by setDefaults; a claim is never left behind
		n.endLife()
		n.background.Wait() // the orphans' release, if the claim left one
		_ = cfg.Store.ReleaseNode(ctx, n.desc)
		if !n.attached {
			n.shutdownTransport()
		}
		return nil, fmt.Errorf("%w: %w", location.ErrInvalid, err)
	}
	n.keeper = keeper
	node.Store(n)
	n.publish()
	n.unsettled.Store(1) // the loop's first Tick
	n.log.Info().Str("event", "node_started").Str("entry_spot_id", n.desc.EntrySpotId).Str("lease_id", string(ls.ID)).Msg("node claimed")
	go n.leaseLoop()
	return n, nil
}

// claim claims the node's descriptor and Entry Spot, retrying within ctx
// while the store is unavailable or the outcome is indeterminate (a Consul
// agent refuses sessions for a moment after a leader election: "Missing
// node registration"). Each retry claims under a new identity (RID,
// generation, Entry Spot), since an indeterminate claim may have written
// the last one. Such a claim (an orphan) is released as soon as the store
// answers — it would hold the node's name, and be a second descriptor at
// the node's address, until its lease ended — and the name is retried for
// as long as Consul may keep an orphan's lease (twice its TTL). *sent is
// when the claim that succeeded was sent.
func (n *Node) claim(ctx context.Context, sent *time.Time) (location.Lease, error) {
	if _, ok := ctx.Deadline(); !ok {
		// A store that stays unavailable (a wrong address) fails the
		// start after a while rather than never.
		var cancel context.CancelFunc
		ctx, cancel = machine.WithTimeout(ctx, n.Clock(), claimPatience)
		defer cancel()
	}
	var orphans []*location.NodeDescriptor
	var unsure time.Time // the last indeterminate attempt
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		*sent = n.Clock().Now()
		ls, err := n.cfg.Store.ClaimNode(ctx, n.desc, n.cfg.LeaseTTL)
		if errors.Is(err, location.ErrIndeterminate) {
			unsure = n.Clock().Now()
			orphans = append(orphans, proto.Clone(n.desc).(*location.NodeDescriptor))
		}
		orphans = n.releaseOrphans(ctx, orphans)
		retry := errors.Is(err, location.ErrUnavailable) || errors.Is(err, location.ErrIndeterminate) ||
			errors.Is(err, location.ErrNodeNameTaken) && !unsure.IsZero() && machine.Since(n.Clock(), unsure) < 2*n.cfg.LeaseTTL+time.Second
		if err == nil || !retry || ctx.Err() != nil {
			if err == nil && len(orphans) > 0 {
				n.background.Add(1)
				go n.releaseOrphansLater(orphans)
			}
			return ls, err
		}
		n.log.Warn().Str("event", "node_claim_retry").Err(err).Dur("retry_in", wait).
			Msg("the Location Store did not take the node's claim; retrying under a new identity")
		select {
		case <-ctx.Done():
			return location.Lease{}, err
		case <-machine.After(machine.Real, wait): // pacing
		}
		n.desc.NodeRid, n.desc.NodeGeneration = uuid.NewString(), newNodeGeneration()
		n.desc.EntrySpotId = NewEntrySpotID(n.cfg.EntryPrefix)
		n.log = n.cfg.Logger.With().Str("node_rid", n.desc.NodeRid).Str("address", n.desc.Address).Logger()
	}
}

// releaseOrphans releases the claims of orphans the store holds and
// returns those it could not tell about.
func (n *Node) releaseOrphans(ctx context.Context, orphans []*location.NodeDescriptor) []*location.NodeDescriptor {
	left := orphans[:0]
	for _, o := range orphans {
		v, err := n.cfg.Store.ReadNode(ctx, location.NodeKeyOf(o))
		switch {
		case errors.Is(err, location.ErrNotFound):
		case err != nil:
			left = append(left, o)
		case v.Node.GetNodeGeneration() == o.GetNodeGeneration():
			if err := n.cfg.Store.ReleaseNode(ctx, v.Node); err != nil && !errors.Is(err, location.ErrNotFound) {
				left = append(left, o)
			}
		}
	}
	return left
}

// releaseOrphansLater goes on releasing orphans the node started without,
// until the store has none of them, their leases must have ended, or the
// node stops (they then end with their leases, as they would have).
func (n *Node) releaseOrphansLater(orphans []*location.NodeDescriptor) {
	defer n.background.Done()
	ctx, cancel := machine.WithTimeout(n.life, n.Clock(), 2*n.cfg.LeaseTTL+time.Second)
	defer cancel()
	for len(orphans) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-machine.After(machine.Real, time.Second): // pacing
		}
		orphans = n.releaseOrphans(ctx, orphans)
	}
}

// claimPatience is how long Start retries its claim when its context has
// no deadline: past a Consul leader election, whose agents refuse new
// sessions for a few seconds.
const claimPatience = 30 * time.Second

// MaxFrameBytes is the largest gRPC message a node sends or accepts. The
// endpoint writer batches up to 1,000 messages into one frame and gRPC drops
// the whole stream for a frame over its limit (4 MiB by default;
// docs/SECURITY.md, "Message sizes"); relocation keeps at most its
// in-flight budget (≤ 32 MiB) of chunks queued per peer, so frames stay
// well under this.
const MaxFrameBytes = 64 << 20

// waitReleased waits (briefly) until nothing listens on address any more:
// Proto.Actor starts gRPC's Serve on a goroutine, so a Stop that comes
// first leaves the listener open until that goroutine runs.
func waitReleased(address string) {
	deadline := machine.Real.Now().Add(2 * time.Second) // the OS's socket, real time
	for machine.Real.Now().Before(deadline) {
		l, err := net.Listen("tcp", address)
		if err == nil {
			l.Close()
			return
		}
		<-machine.After(machine.Real, 5*time.Millisecond)
	}
}

// startRemote turns Proto.Actor's panic on a failed listen into an error.
// startMember starts a Proto.Actor cluster member (and with it the remote),
// which panics on failure.
func startMember(c *pcluster.Cluster) (err error) {
	defer func() {
		if p := recover(); p != nil {
			class := location.ErrUnavailable
			if strings.Contains(fmt.Sprint(p), "listen") {
				class = roamerr.ErrInvalidOperation // as in startRemote
			}
			err = fmt.Errorf("%w: cluster: start Proto.Actor cluster member: %v", class, p)
		}
	}()
	c.StartMember()
	return nil
}

// ProtoActorCluster is the node's Proto.Actor cluster, nil unless
// Config.ProtoCluster was set.
func (n *Node) ProtoActorCluster() *pcluster.Cluster { return n.pcluster }

// A listen that fails is the application's to fix (a port in use, an
// address not of this host), not a fault that a retry of the same call
// outlives: InvalidOperation, with what to change.
func startRemote(r *remote.Remote) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: cluster: start remote: %v (give the node a free port, or 0 for any, on an address of this host: roam.WithAddress)", roamerr.ErrInvalidOperation, p)
		}
	}()
	r.Start()
	return nil
}

// leaseLoop runs the lease keeper: it sends the renewals the keeper asks
// for (one at a time, each bounded), feeds their answers and the clock back,
// and publishes every change of status before it tells the watchers, so
// that Valid turns false no later than the keeper decides to fence.
func (n *Node) leaseLoop() {
	defer close(n.renewDone)
	// A renewal still in flight when the loop ends (Stop) is cancelled
	// (n.life) and waited for: renewDone then means no goroutine of the
	// lease is left.
	var renewals sync.WaitGroup
	defer renewals.Wait()
	answers := make(chan lease.RenewAnswered, 1)
	clock := n.Clock()
	// fire outlives each arming: a timer stopped too late to keep its
	// Tick still delivers it, and a Tick is only a look at the clock.
	fire := make(chan time.Time, 4)
	var timer machine.Timer = stoppedTimer{}
	defer func() { timer.Stop() }()
	var ev lease.Event = lease.Tick{Now: clock.Now()}
	var last time.Time // the latest time the keeper was given
	for {
		// The keeper sees time only go forward: an answer made before a
		// Tick the loop took first must not step it back (it would lift
		// a fence the clock already passed).
		switch e := ev.(type) {
		case lease.Tick:
			e.Now = later(e.Now, last)
			last, ev = e.Now, e
		case lease.RenewAnswered:
			e.Now = later(e.Now, last)
			last, ev = e.Now, e
		}
		eff := n.keeper.Step(ev)
		n.publish() // every proof moves validUntil, not only a change of status
		if eff.Changed {
			n.changed(eff.Reason)
		}
		if n.keeper.Status() == lease.Ended {
			return // Settled holds from now on, whatever was counted
		}
		if eff.Renew {
			n.unsettled.Add(1) // until the keeper took its answer
			renewals.Add(1)
			go func() {
				defer renewals.Done()
				n.renew(answers)
			}()
		}
		timer.Stop()
		timer = clock.AfterFunc(max(machine.Until(clock, eff.WakeAt), 0), func() {
			n.unsettled.Add(1) // until the keeper stepped this Tick
			select {
			case fire <- clock.Now():
			default:
				n.unsettled.Add(-1) // Ticks are pending already: one look suffices
			}
		})
		// Settled only now: the next wake-up is armed, so a step of a
		// logical clock cannot pass it unseen.
		switch ev.(type) {
		case lease.Tick, lease.RenewAnswered:
			n.unsettled.Add(-1)
		}
		select {
		case <-n.stopRenew:
			eff := n.keeper.Step(lease.Stopped{Now: later(clock.Now(), last)})
			n.publish()
			if eff.Changed {
				n.changed(eff.Reason)
			}
			return
		case a := <-answers:
			ev = a
		case <-fire:
			// A Tick is a look at the clock now: a stale one from a timer
			// stopped too late looks at the same time as a fresh one.
			ev = lease.Tick{Now: clock.Now()}
		}
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// renew sends one renewal and reports its answer with its send time.
func (n *Node) renew(answers chan<- lease.RenewAnswered) {
	clock := n.Clock()
	sent := clock.Now()
	ctx, cancel := machine.WithTimeout(n.life, clock, n.keeper.RequestTimeout())
	err := n.cfg.Store.RenewLease(ctx, n.lease.ID)
	cancel()
	if n.life.Err() != nil {
		// Stop cancelled it, so it proves nothing; the loop may have
		// ended already (answers has room for the one renewal in flight,
		// so this never blocks), and no failure is logged for a stop.
		answers <- lease.RenewAnswered{SentAt: sent, Now: clock.Now(), Answer: lease.NoAnswer}
		return
	}
	a := lease.RenewAnswered{SentAt: sent, Now: clock.Now(), Answer: lease.Renewed}
	switch {
	case err == nil:
	case errors.Is(err, location.ErrNotFound):
		a.Answer = lease.Gone
	default:
		a.Answer = lease.NoAnswer
		n.log.Warn().Str("event", "lease_renew_failed").Str("lease_id", string(n.lease.ID)).Err(err).Msg("owner lease renewal failed; retrying")
	}
	answers <- a
}

// stoppedTimer is the lease loop's timer before its first arming.
type stoppedTimer struct{}

func (stoppedTimer) Stop() bool { return false }

// newNodeGeneration is a new node lifecycle's generation: wall-clock
// nanoseconds on the real clock whatever the node's clock, since it must
// differ from every earlier lifecycle's, those of earlier processes
// included.
func newNodeGeneration() uint64 { return uint64(machine.Real.Now().UnixNano()) }

// publish makes the keeper's verdict visible to Valid.
func (n *Node) publish() {
	n.validUntil.Store(int64(n.keeper.ValidUntil().Sub(n.base)))
	n.status.Store(int32(n.keeper.Status()))
	n.watchMu.Lock()
	if n.published != nil {
		close(n.published)
		n.published = nil
	}
	n.watchMu.Unlock()
}

// WaitWritable waits while the node is fenced — its lease not provably in
// force, as when a renewal came late on a starved machine — until a
// renewal proves it again (nil), the lease ends (location.ErrLeaseEnded)
// or ctx ends (its error). A write refused only for a fence is so retried
// within its caller's deadline instead of failing at once: the fence
// lifts by itself at the node's next renewal, as a caller's own retry
// would find (location.Leased).
func (n *Node) WaitWritable(ctx context.Context) error {
	for {
		n.watchMu.Lock()
		if n.published == nil {
			n.published = make(chan struct{})
		}
		next := n.published
		n.watchMu.Unlock()
		_, _, err := n.WriteLease()
		if !errors.Is(err, location.ErrFenced) {
			return err
		}
		select {
		case <-next:
		case <-n.leaseLost:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// changed logs a new status (already published) and tells the watchers.
func (n *Node) changed(reason string) {
	st := n.keeper.Status()
	switch st {
	case lease.Fenced:
		n.log.Error().Str("event", "owner_lease_fenced").Str("lease_id", string(n.lease.ID)).Str("reason", reason).
			Msg("owner lease not provably in force: serving nothing, writing nothing until a renewal proves it")
	case lease.Valid:
		n.log.Warn().Str("event", "owner_lease_unfenced").Str("lease_id", string(n.lease.ID)).Str("reason", reason).
			Msg("owner lease proved in force again: serving")
	case lease.Ended:
		ev := n.log.Info()
		if reason != "node stopped" {
			ev = n.log.Error()
		}
		ev.Str("event", "owner_lease_lost").Str("lease_id", string(n.lease.ID)).Str("reason", reason).
			Msg("owner lease ended; this node lifecycle owns nothing now")
	}
	n.watchMu.Lock()
	ws := slices.Clone(n.watchers)
	n.watchMu.Unlock()
	for _, w := range ws {
		w(st)
	}
	if st == lease.Ended {
		close(n.leaseLost) // after the watchers heard it
	}
}

// LeaseStatus is the lease's status now: Valid only while the last proof
// still covers this instant.
func (n *Node) LeaseStatus() lease.Status {
	st := lease.Status(n.status.Load())
	if st == lease.Valid && machine.Since(n.Clock(), n.base) >= time.Duration(n.validUntil.Load()) {
		return lease.Fenced // the keeper's timer has not fired yet; the clock has
	}
	return st
}

// Valid reports whether the node may act as an owner at this instant:
// dispatch, fire timers, serve calls, write owner records.
func (n *Node) Valid() bool { return n.LeaseStatus() == lease.Valid }

// LeaseTTL is the TTL of this node's owner lease.
func (n *Node) LeaseTTL() time.Duration { return n.cfg.LeaseTTL }

// Settled reports that the lease loop has taken every Tick its clock
// fired and every renewal answer that arrived, has armed its next
// wake-up, and has no renewal in flight; or that the lease ended. A node
// whose store does not answer (cut off) is not settled until its
// renewal's timeout passes on the clock: leave it out of the wait. A
// test that runs nodes in logical time waits for it between steps of its
// clock, as real time would have let the loop run and the store answer
// before the next renewal was due.
func (n *Node) Settled() bool {
	return n.unsettled.Load() == 0 || n.LeaseStatus() == lease.Ended
}

// Clock is the node's clock (Config.Clock).
func (n *Node) Clock() machine.Clock { return machine.Or(n.cfg.Clock) }

// WriteLease returns what a store write of this node must check in its own
// transaction (location.CheckLeaseOp), or why the node must not write now:
// ErrLeaseEnded once the lifecycle is over, ErrFenced (an ErrUnavailable)
// while fenced.
func (n *Node) WriteLease() (location.NodeKey, location.LeaseID, error) {
	switch n.LeaseStatus() {
	case lease.Valid:
		return location.NodeKeyOf(n.desc), n.lease.ID, nil
	case lease.Ended:
		return location.NodeKey{}, "", fmt.Errorf("%w: node %s", location.ErrLeaseEnded, n.desc.GetNodeRid())
	}
	return location.NodeKey{}, "", fmt.Errorf("%w: node %s is fenced", location.ErrFenced, n.desc.GetNodeRid())
}

// OnLeaseChange registers w to be told every change of the lease status,
// in order, from the lease goroutine; w must not block.
func (n *Node) OnLeaseChange(w func(lease.Status)) {
	n.watchMu.Lock()
	n.watchers = append(n.watchers, w)
	n.watchMu.Unlock()
}

// System is the node's actor system.
func (n *Node) System() *actor.ActorSystem { return n.system }

// Remote is the node's Proto.Actor remote.
func (n *Node) Remote() *remote.Remote { return n.remote }

// LinkSettings are the remote's host and TLS, for the chunk link.
func (n *Node) LinkSettings() LinkSettings { return n.link }

// Address is the remote address peers reach the node at.
func (n *Node) Address() string { return n.desc.GetAddress() }

// Store is the node's Location Store.
func (n *Node) Store() location.Store { return n.cfg.Store }

// Name is the node's stable name (Config.Name).
func (n *Node) Name() string { return n.desc.GetName() }

// EntrySpotID is this lifecycle's Entry Spot ID.
func (n *Node) EntrySpotID() string { return n.desc.GetEntrySpotId() }

// Descriptor returns a copy of the node's descriptor as claimed.
func (n *Node) Descriptor() *location.NodeDescriptor {
	return proto.Clone(n.desc).(*location.NodeDescriptor)
}

// Draining reports whether SetDraining has been called: the node takes no
// new object, move or activation any more.
func (n *Node) Draining() bool { return n.draining.Load() }

// SetDraining stops the node taking new objects, at once here and, through
// its descriptor's status DRAINING in the store, for every other node's
// placement (Store.UpdateNode under the node's lease). A lifecycle never
// serves new objects again once draining: only a new lifecycle does.
func (n *Node) SetDraining(ctx context.Context) error {
	if !n.draining.Swap(true) {
		n.log.Info().Str("event", "node_draining").Msg("the node takes no new objects")
	}
	key := location.NodeKeyOf(n.desc)
	// A store that fails now and then is retried for a few seconds (a
	// Stop without a deadline must not wait on an outage); the node stays
	// draining here either way.
	wait := 10 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := n.markDraining(ctx, key)
		if err == nil {
			return nil
		}
		transient := errors.Is(err, location.ErrConflict) || errors.Is(err, location.ErrUnavailable) || errors.Is(err, location.ErrIndeterminate)
		if !transient || errors.Is(err, location.ErrLeaseEnded) || attempt == 15 {
			return roamerr.Keep(roamerr.ErrUnavailable, "mark node draining", err)
		}
		select {
		case <-ctx.Done():
			return roamerr.Keep(roamerr.ErrUnavailable, "mark node draining", err)
		case <-machine.After(machine.Real, wait): // pacing
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// markDraining writes DRAINING into the stored descriptor once; an
// indeterminate write is settled by the next attempt's read.
func (n *Node) markDraining(ctx context.Context, key location.NodeKey) error {
	v, err := n.cfg.Store.ReadNode(ctx, key)
	if err != nil {
		return err
	}
	if v.Node.GetStatus() == messages.NodeStatus_NODE_STATUS_DRAINING {
		return nil
	}
	next := proto.Clone(v.Node).(*location.NodeDescriptor)
	next.Status = messages.NodeStatus_NODE_STATUS_DRAINING
	_, err = n.cfg.Store.UpdateNode(ctx, next, v.Version)
	return err
}

// Lease is the node's owner lease.
func (n *Node) Lease() location.Lease { return n.lease }

// LeaseLost is closed when the lease ends: the store reported it gone, or
// the node stopped.
func (n *Node) LeaseLost() <-chan struct{} { return n.leaseLost }

// Stopped is closed once Stop has shut the node's actor system down (an
// attached node: once it released its claims; its actors are then the
// relocation driver's and Spot manager's to stop): no
// actor of the node runs any more, so nothing waits on one after it.
func (n *Node) Stopped() <-chan struct{} { return n.stopped }

// Stopping is closed once Stop has begun, before the lease ends: a lease
// that ends after it ended because the node stops.
func (n *Node) Stopping() <-chan struct{} { return n.stopRenew }

// shutdownTransport stops the node's own remote and actor system (and its
// Proto.Actor cluster membership).
func (n *Node) shutdownTransport() {
	if n.pcluster != nil {
		_ = n.pcluster.Config.ClusterProvider.Shutdown(true) // leave the membership now
		n.pcluster.Shutdown(false)                           // shuts the actor system down too
		return
	}
	n.remote.Shutdown(false)
	n.system.Shutdown()
}

// Attached reports whether the node runs on an application's actor system
// (Config.Attach), which outlives it.
func (n *Node) Attached() bool { return n.attached }

// Stop releases the descriptor and Entry claim (only this lifecycle's) and
// shuts the remote and actor system down. A lease already lost is not an
// error of Stop. It is safe to call more than once.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() {
		// End the lease's verdict first: from here nothing of this node
		// dispatches or writes, before the claim is released.
		close(n.stopRenew)
		n.endLife()
		<-n.renewDone
		n.background.Wait()
		// Bounded even under a context without a deadline: a store that
		// does not answer must not keep the node from stopping, and the
		// lease ends by itself within its TTL anyway.
		rctx, cancel := machine.WithTimeout(ctx, machine.Real, n.cfg.LeaseTTL) // stopping: real time
		err := n.cfg.Store.ReleaseNode(rctx, n.desc)
		cancel()
		if err != nil && !errors.Is(err, location.ErrNotFound) {
			n.log.Warn().Str("event", "node_release_failed").Err(err).Msg("releasing node claim failed; it ends with the lease")
			n.stopErr = fmt.Errorf("cluster: release node %s: %w", n.desc.Address, err)
		}
		if !n.attached {
			n.shutdownTransport()
		}
		close(n.stopped)
		n.log.Info().Str("event", "node_stopped").Msg("node stopped")
	})
	return n.stopErr
}
