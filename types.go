package roam

import (
	"context"
	"fmt"
	"github.com/roamactors/roam/roamerr"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/drain"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/sessionhost"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Every type a user passes or receives is declared here with its fields;
// the internal packages have their own, converted at this boundary, so
// that go doc shows what a value holds and internal refactors do not
// change the API.

// Ref names a relocatable object: ActorRef, InstanceSpotRef, UserSpotRef
// or GrainRef. Its String is how logs and roamctl print it.
type Ref = location.AuthorityKey

// JoinedSpot is the Join callback: the first message an Actor handles
// after it joined a User Spot (JoinSpot).
type JoinedSpot = messages.JoinedSpot

// SpotKind says whether a Spot is a User Spot or an Instance Spot
// (Spots.Query).
type SpotKind = messages.SpotKind

// The two kinds of Spot Spots.Query lists.
const (
	SpotKindUser     = messages.SpotKind_SPOT_KIND_USER
	SpotKindInstance = messages.SpotKind_SPOT_KIND_INSTANCE
)

// SpotRef is where a Spot was when it was looked up (Spots.Find, Create).
// It is no messaging target: call by SpotID, and Find again to learn where
// the Spot is now.
type SpotRef struct {
	// SpotID is the Spot's ID, unique in the store.
	SpotID string
	// ObjectGeneration is the incarnation: it grows each time the ID is
	// created again after a close.
	ObjectGeneration uint64
	// MeshName is the mesh the Spot lives in.
	MeshName string
	// NodeRid is the RID of the node lifecycle that owned it.
	NodeRid string
	// Kind is SpotKindUser or SpotKindInstance.
	Kind SpotKind
	// StableType is the Spot's kind (NewKind's name).
	StableType string
}

// CreateState is how a Create or GetOrCreate ended.
type CreateState int

// The ways a Create or GetOrCreate ends.
const (
	// Existing: a Ready incarnation of the same kind was there already.
	Existing CreateState = 1
	// Created: a new incarnation was committed Ready.
	Created CreateState = 2
	// Rejected: the create callback declined; nothing was created.
	Rejected CreateState = 3
)

func (s CreateState) String() string { return spot.CreateState(s).String() }

// CreateResult is how a Create or GetOrCreate ended.
type CreateResult struct {
	// State is Existing, Created or Rejected.
	State CreateState
	// Ref is the Spot (zero when Rejected).
	Ref SpotRef
	// Reply is what the create callback answered (Created, Rejected), if
	// anything.
	Reply proto.Message
}

func createResult(r spot.CreateResult) CreateResult {
	return CreateResult{State: CreateState(r.State), Ref: SpotRef(r.Ref), Reply: r.Reply}
}

// QueryPage is one page of Spots.Query.
type QueryPage struct {
	// Refs are the page's Spots, in ID order.
	Refs []SpotRef
	// Next is the cursor of the following page; "" on the last.
	Next string
}

// Outcome is what Relocate observed of one move, on the source.
type Outcome struct {
	// RelocationID identifies the move in logs and events.
	RelocationID uint64
	// Key is the object moved.
	Key Ref
	// From and To are the source's and the target's node RIDs.
	From, To string
	// Bytes is the state's size; Chunks how many chunks carried it.
	Bytes  uint64
	Chunks uint32
	// Requested, Sealed, RelayReady, CutoverSent and Committed are when
	// the source saw each phase (zero for a phase not reached, and all
	// zero for a move to the node that owns the object already).
	Requested, Sealed, RelayReady, CutoverSent, Committed time.Time
	// Pause is Sealed → Committed as the source saw it: how long messages
	// to the object waited. Event.Pause is the target's exact figure.
	Pause time.Duration
}

// Event is one finished move, as the target saw it (WithOnEvent).
type Event struct {
	// Key is the object that moved.
	Key Ref
	// RelocationID identifies the move.
	RelocationID uint64
	// From and To are the source's and the target's node RIDs.
	From, To string
	// Bytes and Chunks are the state's size and how many chunks carried it.
	Bytes  uint64
	Chunks uint32
	// Pause is seal (on the source) → dispatch open (on the target).
	Pause time.Duration
	// Fallback: the cutover did not arrive in time and the target went on
	// without it (the relay was complete).
	Fallback bool
	// Err is nil when the target opened; otherwise why the move ended there
	// without a commit.
	Err error
}

// TLS is the node's mutual TLS (WithTLS): every connection between nodes
// is TLS 1.3, accepted only from a peer whose certificate the cluster CA
// signed, and a node's identity is its name, which its certificate names
// (a URI SAN urn:roam:node:<name>; docs/SECURITY.md).
type TLS struct {
	// CertFile and KeyFile are this node's certificate (PEM; its chain may
	// follow it) and private key. The certificate must name the host peers
	// dial and the node, and allow server and client authentication.
	CertFile, KeyFile string
	// CAFile holds the PEM certificates of the cluster CA(s).
	CAFile string
}

func (t *TLS) internal() *meshnode.TLS {
	if t == nil {
		return nil
	}
	return &meshnode.TLS{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile}
}

// TLSFromDir is the TLS of a directory as `make certs` writes it: ca.pem,
// <name>.pem and <name>-key.pem; nil for an empty dir (plain TCP).
func TLSFromDir(dir, name string) *TLS {
	t := meshnode.TLSFromDir(dir, name)
	if t == nil {
		return nil
	}
	return &TLS{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile}
}

// ClientRemoteOptions are the Proto.Actor remote options of a process that
// is no roam node (a client) talking to nodes that use t, from host (its
// certificate must name that host). nil t: plain TCP.
func ClientRemoteOptions(t *TLS, host string) ([]remote.ConfigOption, error) {
	return meshnode.ClientRemoteOptions(t.internal(), host)
}

// DrainOptions tune Drain. Zero fields take their defaults.
type DrainOptions struct {
	// Concurrency is how many units move at once: 1 to 256, default 64.
	Concurrency int
	// OnProgress, if set, is called after each unit moved or failed, one
	// call at a time; keep it quick.
	OnProgress func(DrainProgress)
}

// DrainProgress is a drain's count after one unit.
type DrainProgress struct {
	// Total is the units found so far (arrivals during the drain add to
	// it); Moved and Failed how many moved and failed.
	Total, Moved, Failed int
	// Unit is the unit that just moved or failed.
	Unit DrainUnit
}

// DrainUnit is one unit of a drain (an object, or a SpotWide User Spot
// with its members) and how its move ended.
type DrainUnit struct {
	// Key is the unit's object.
	Key Ref
	// To is the target's node RID ("" when none was tried).
	To string
	// Pause and Bytes are the move's, when it moved.
	Pause time.Duration
	Bytes uint64
	// Err is nil when it moved, else why not.
	Err error
}

// DrainResult is a finished drain.
type DrainResult struct {
	// Total is the units found; Moved how many moved.
	Total, Moved int
	// Failed lists every unit that could not move, and why.
	Failed []DrainUnit
	// Started and Finished bound the drain.
	Started, Finished time.Time
	// PauseP50 and PauseP99 are of the units moved.
	PauseP50, PauseP99 time.Duration
}

func (o DrainOptions) internal() drain.Options {
	out := drain.Options{Concurrency: o.Concurrency}
	if f := o.OnProgress; f != nil {
		out.OnProgress = func(p drain.Progress) {
			f(DrainProgress{Total: p.Total, Moved: p.Moved, Failed: p.Failed, Unit: DrainUnit(p.Unit)})
		}
	}
	return out
}

func drainResult(r drain.Result) DrainResult {
	out := DrainResult{Total: r.Total, Moved: r.Moved, Started: r.Started, Finished: r.Finished, PauseP50: r.PauseP50, PauseP99: r.PauseP99}
	for _, u := range r.Failed {
		out.Failed = append(out.Failed, DrainUnit(u))
	}
	return out
}

// SessionConfig bounds the client Sessions of a node (WithSessionConfig).
// Zero fields take their defaults.
type SessionConfig struct {
	// HoldLimit is the most client messages one Session holds for an
	// Actor while it moves (default 1,024); HoldBytes their most bytes
	// (default 1 MiB). One more is refused CapacityExceeded.
	HoldLimit int
	HoldBytes int
	// SealTimeout ends a Session whose Actor's move is neither confirmed
	// nor aborted within it (default 3 s).
	SealTimeout time.Duration
	// RecoveryWait bounds how long a Session holds the client's messages
	// for an Actor whose node ended to serve again (default 60 s); past
	// it the Session is closed and the client told.
	RecoveryWait time.Duration
	// MaxSessions bounds the Sessions open on the node at once (default
	// 65,536).
	MaxSessions int
}

// SessionOptions configure one Session (OpenSession).
type SessionOptions struct {
	// OnPush receives the bound Actors' messages to the client, in the
	// order each sender sent them, one at a time on the Session's own
	// goroutine.
	OnPush func(msg any)
	// OnClose is called once when the Session ends: nil after Close, else
	// why (the seal timeout, the node stopping, a client too slow).
	OnClose func(err error)
	// OnRecovered, if set, is called (on a goroutine of its own) when a
	// bound Actor serves again after its node ended, from its last
	// checkpoint: what the client sent it shortly before may be lost.
	OnRecovered func(actorID string)
	// PushBuffer bounds the pushes waiting for OnPush (default 4,096); past
	// it the Session is closed with CapacityExceeded rather than a push
	// dropped.
	PushBuffer int
}

// Session is a client connection held by this node (OpenSession): Actors
// spawned bound to it get the client's messages wherever they move, in
// order, and their pushes to the Session's PID reach OnPush
// (docs/SESSIONS.md).
type Session struct{ s *sessionhost.Session }

// ID is the Session's ID.
func (s *Session) ID() string { return string(s.s.ID()) }

// PID is where the bound Actors' pushes to this client go.
func (s *Session) PID() *actor.PID { return s.s.PID() }

// Done is closed when the Session ended; Err says why.
func (s *Session) Done() <-chan struct{} { return s.s.Done() }

// Err is nil while open and after Close, else why the Session ended.
func (s *Session) Err() error { return s.s.Err() }

// SpawnActor creates the relocatable Actor id of the kind stableType on
// this node, bound to the Session: its first message is a SessionBound,
// the client's messages to id reach it wherever it moves, and its pushes
// to the SessionBound's PID reach OnPush.
func (s *Session) SpawnActor(ctx context.Context, stableType, id string) (*actor.PID, error) {
	return s.s.SpawnActor(ctx, stableType, id)
}

// Send sends msg to the bound Actor actorID one way, after every earlier
// message of this client to it. CapacityExceeded when the hold is full,
// NotFound when no Actor actorID is bound, Unavailable once closed.
func (s *Session) Send(actorID string, msg proto.Message) error { return s.s.Send(actorID, msg) }

// Request sends msg to the bound Actor actorID and waits for its reply
// within ctx, in order with Send.
func (s *Session) Request(ctx context.Context, actorID string, msg proto.Message) (proto.Message, error) {
	return s.s.Request(ctx, actorID, msg)
}

// Close ends the Session; its bound Actors stay.
func (s *Session) Close() { s.s.Close() }

// Kind is a relocatable kind (NewKind, FromClusterKind), registered with
// WithKinds.
type Kind struct{ k relocation.Kind }

// Name is the kind's stable name.
func (k Kind) Name() string { return k.k.StableType }

// Policy says what a move does with an object's state: DisableRelocation,
// RecreateOnRelocation, PreserveState or PreserveStateWith.
type Policy struct{ p relocation.Policy }

// DisableRelocation: objects of the kind never move; Relocate answers
// InvalidOperation and a drain leaves them.
func DisableRelocation() Policy { return Policy{relocation.DisableRelocation()} }

// RecreateOnRelocation: an object moves with its queue and timers but no
// state; the target starts a fresh actor from the props.
func RecreateOnRelocation() Policy { return Policy{relocation.RecreateOnRelocation()} }

// PreserveStateWith: adapter captures the actor's state on the source and
// restores it into a fresh actor on the target.
func PreserveStateWith(adapter StateAdapter) Policy {
	if adapter == nil {
		return Policy{relocation.PreserveStateWith(nil)} // refused by New
	}
	return Policy{relocation.PreserveStateWith(adapter)}
}

// PreserveState: the state is the Stateful the actor registered with
// KeepState, else the actor itself, which must then implement Stateful. A
// generated grain's actor is Proto.Actor's, not the application's: the
// application's grain implementation calls KeepState(ctx, itself) in its
// Init (examples/grains).
func PreserveState() Policy { return Policy{relocation.PreserveState()} }

// StateAdapter captures and restores an actor's state as bytes. Both run
// on the actor's own goroutine between turns.
type StateAdapter interface {
	Capture(a actor.Actor) ([]byte, error)
	Restore(a actor.Actor, state []byte) error
}

// Stateful is state that captures and restores itself (PreserveState). Both
// run on the actor's goroutine between turns.
type Stateful interface {
	CaptureState() ([]byte, error)
	RestoreState(state []byte) error
}

// KeepState registers, from an actor's turn (a grain's Init), the Stateful
// a PreserveState kind carries across moves, when it is not the actor
// itself. InvalidOperation outside a relocatable incarnation.
func KeepState(c actor.Context, s Stateful) error { return relocation.KeepState(c, s) }

// RelocationReady is implemented by a SpotWide User Spot's actor that
// wants to know, on the target, that it and its members moved: called after
// the commit, before any of them handles a message. The members open only
// once it returns: a LeaveSpot, DeleteActor or Relocate of a member, or a
// Relocate of the Spot, made from inside it fails at once with
// InvalidOperation; one it hands to another goroutine and waits for waits
// until that call's deadline, so do not wait for one.
type RelocationReady interface {
	OnRelocationReady(members []Ref)
}

// PlacementConfig configures the placement director (WithPlacement). Zero
// fields take their defaults (docs/PLACEMENT.md).
type PlacementConfig struct {
	// Period between two rounds. Default 1 s.
	Period time.Duration
	// PageSize is how many records of each kind a round reads. Default 256.
	PageSize int
	// Limits the ledger enforces for every director.
	Limits PlacementLimits
	// IdleWindow: a unit with a timer due within it is busy. Default 100 ms.
	IdleWindow time.Duration
	// Margin is how many units above the mean a node may own before its
	// units are moved (balance by count). Default 1.
	Margin float64
	// BalanceBy is "count" (units per node, the default) or "load"
	// (messages sampled per node).
	BalanceBy string
	// LoadMargin is how far above the mean load a node may be before its
	// units move, as a fraction of the mean (balance by load). Default 0.2.
	LoadMargin float64
	// AttemptTimeout bounds one attempt. Default 30 s.
	AttemptTimeout time.Duration
	// CoLocation moves objects that talk onto one node. Default off.
	CoLocation PlacementCoLocation
	// Paused starts the director paused (PlacementDirector.Resume).
	Paused bool
	// OnAttempt, if set, is called with each attempt and how it ended,
	// from the director's goroutines.
	OnAttempt func(PlacementAttempt, PlacementOutcome)
}

// PlacementLimits are the global limits of the directors' attempts. Zero
// fields take their defaults.
type PlacementLimits struct {
	// Rate is the most attempts started per second, with a burst of Burst.
	Rate, Burst float64
	// Concurrency is the most attempts in flight at once.
	Concurrency int
	// Cooldown is how long after an attempt on an object the next may
	// start.
	Cooldown time.Duration
}

// PlacementCoLocation configures communication-aware co-location: each
// node samples who sends to whom (a Spot call counts when made with From),
// and the director moves objects that talk onto one node.
type PlacementCoLocation struct {
	// Enabled turns it on. Default false.
	Enabled bool
	// SampleEvery: one message in SampleEvery is stamped with its sender.
	// Default 16.
	SampleEvery int
	// Hysteresis: an object moves only if its traffic with the target's
	// objects exceeds that with its own node's by this fraction. Default 0.5.
	Hysteresis float64
	// MinGain is the least cut in sampled messages a move must bring.
	// Default 4.
	MinGain float64
	// Slack is how far above the mean a move may fill its target, as a
	// fraction of the mean. Default 0.1.
	Slack float64
	// TableSize bounds each node's edge table. Default 16,384 edges.
	TableSize int
	// HalfLife: edge weights halve this often. Default 1 min.
	HalfLife time.Duration
}

// PlacementAttempt is one of the director's attempts to move one unit.
type PlacementAttempt struct {
	// Op is the attempt's operation ID.
	Op string
	// Key is the unit's object, as Ref.String prints it.
	Key string
	// SourceRid and TargetRid are the nodes it would move between.
	SourceRid, TargetRid string
}

// PlacementOutcome is how an attempt ended: "busy", "committed",
// "deferred" or "stale" (docs/PLACEMENT.md).
type PlacementOutcome string

// How a placement attempt ends.
const (
	PlacementBusy      PlacementOutcome = "busy"
	PlacementCommitted PlacementOutcome = "committed"
	PlacementDeferred  PlacementOutcome = "deferred"
	PlacementStale     PlacementOutcome = "stale"
)

func (c PlacementConfig) internal() placement.Config {
	out := placement.Config{
		Enabled: true, Period: c.Period, PageSize: c.PageSize, Limits: placement.Limits(c.Limits),
		IdleWindow: c.IdleWindow, Margin: c.Margin, BalanceBy: c.BalanceBy, LoadMargin: c.LoadMargin,
		AttemptTimeout: c.AttemptTimeout, CoLocation: placement.CoLocation(c.CoLocation), Paused: c.Paused,
	}
	if f := c.OnAttempt; f != nil {
		out.OnAttempt = func(a placement.Attempt, o placement.Outcome) {
			f(PlacementAttempt{Op: a.Op, Key: a.Key, SourceRid: a.SourceRid, TargetRid: a.TargetRid}, PlacementOutcome(o))
		}
	}
	return out
}

// PlacementDirector is a node's placement director (Roam.Placement).
type PlacementDirector struct{ d *placement.Director }

// Pause stops the director's rounds until Resume.
func (p *PlacementDirector) Pause() { p.d.Pause() }

// Resume starts its rounds again.
func (p *PlacementDirector) Resume() { p.d.Resume() }

// Outcomes counts the director's attempts by how they ended.
func (p *PlacementDirector) Outcomes() map[PlacementOutcome]int64 {
	out := map[PlacementOutcome]int64{}
	for k, v := range p.d.Outcomes() {
		out[PlacementOutcome(k)] = v
	}
	return out
}

// RelocationConfig tunes moves (WithRelocationConfig). Zero fields take
// their defaults (docs/PROTOCOL.md, "Settings").
type RelocationConfig struct {
	// RestoreTimeout bounds a move from the moment Relocate starts it to
	// the target's commit. Default 10 s.
	RestoreTimeout time.Duration
	// CapabilityTimeout bounds the target's answer to whether it can take
	// the object. Default 5 s.
	CapabilityTimeout time.Duration
	// CutoverWaitTimeout is how long the target waits for the cutover
	// before it goes on from the relay it has. Default 1 s.
	CutoverWaitTimeout time.Duration
	// FollowDuration is how long messages sent to an object's old owner
	// still follow it to the new one (MessageFollowDuration). Default 30 s.
	FollowDuration time.Duration
	// InFlightPayloadBudget bounds the state bytes in flight to one peer
	// (default 16 MiB, at most 32 MiB); NodeInFlightPayloadBudget to all
	// peers (default 0: no bound).
	InFlightPayloadBudget, NodeInFlightPayloadBudget int64
	// ChunkWindow bounds the state bytes handed to one peer's connection
	// and not yet credited, so that other messages between the two nodes
	// never queue behind more. Default 1 MiB.
	ChunkWindow int64
	// ChunkLimit is the largest state chunk sent. Default 256 KiB.
	ChunkLimit int
	// MaxPayloadLength is the largest state a node takes. Default 1 GiB.
	MaxPayloadLength uint64
}

func (c RelocationConfig) internal() relocation.Config {
	out := relocation.Config{
		RestoreTimeout: c.RestoreTimeout, CapabilityTimeout: c.CapabilityTimeout,
		InFlightPayloadBudget: c.InFlightPayloadBudget, NodeInFlightPayloadBudget: c.NodeInFlightPayloadBudget,
		ChunkWindow: c.ChunkWindow, MaxPayloadLength: c.MaxPayloadLength,
	}
	if c.CutoverWaitTimeout != 0 || c.FollowDuration != 0 || c.ChunkLimit != 0 {
		out.Handoff = handoff.DefaultConfig()
		if c.CutoverWaitTimeout != 0 {
			out.Handoff.CutoverWaitTimeout = c.CutoverWaitTimeout
		}
		if c.FollowDuration != 0 {
			out.Handoff.FollowDuration = c.FollowDuration
		}
		if c.ChunkLimit != 0 {
			out.Handoff.ChunkLimit = c.ChunkLimit
		}
	}
	return out
}

// SpotConfig tunes calls by Spot ID (WithSpotConfig). Zero fields take
// their defaults.
type SpotConfig struct {
	// DefaultTimeout is a call's deadline when it sets none (Timeout).
	// Default 5 s.
	DefaultTimeout time.Duration
	// RouteCacheMaxAge is how long a node trusts a Spot's cached route
	// before it reads the store again. Default 15 s; at least 5 s shorter
	// than RelocationConfig.FollowDuration; -1: no cache, and then one
	// caller's order is not kept across a move (docs/PROTOCOL.md §7.8).
	RouteCacheMaxAge time.Duration
	// RouteCacheMaxRoutes bounds the routes a node caches (default
	// 100,000; bench/RESULTS.md, section (i), measures the heap a route
	// holds): past it a new route displaces an arbitrary one, whose next
	// call reads the store. A node that calls more Spots than that within
	// RouteCacheMaxAge and wants none of those reads raises it. Negative
	// is invalid.
	RouteCacheMaxRoutes int
	// ResultRetention is how long a node keeps a create's or close's result
	// for a repeat of the same operation. Default 1 min.
	ResultRetention time.Duration
	// InFlightPerPeer bounds the Spots one sender has activations queued
	// for, plus its commands (default 256); InFlightTotal for all senders
	// (default 4,096); InFlightBytes the bytes of the messages queued
	// (default 256 MiB). One more is answered CapacityExceeded.
	InFlightPerPeer, InFlightTotal int
	InFlightBytes                  int64
}

func (c SpotConfig) internal() spot.Config {
	return spot.Config{
		DefaultTimeout: c.DefaultTimeout, ResultRetention: c.ResultRetention,
		Routes:   spot.RouteConfig{RouteCacheMaxAge: c.RouteCacheMaxAge, RouteCacheMaxRoutes: c.RouteCacheMaxRoutes},
		InFlight: spot.InFlightLimits{PerPeer: c.InFlightPerPeer, Total: c.InFlightTotal, Bytes: c.InFlightBytes},
	}
}

// Complete reports whether every unit moved.
func (r DrainResult) Complete() bool { return len(r.Failed) == 0 }

// Err is nil for a complete drain, else one error of the class of its
// first failure that counts the units that did not move.
func (r DrainResult) Err() error {
	if r.Complete() {
		return nil
	}
	f := r.Failed[0]
	return roamerr.Keep(roamerr.ErrUnavailable, fmt.Sprintf("drain: %d of %d units did not move (first: %s)", len(r.Failed), r.Total, f.Key), f.Err)
}

func init() { sessionhost.Unwrap = func(s any) *sessionhost.Session { return s.(*Session).s } }
