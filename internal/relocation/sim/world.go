package sim

import (
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/simkit"
)

// randStream is this simulation's stream of the random source (another
// simulation with the same seed draws differently).
const randStream = 0x9e3779b97f4a7c15

// unitStream is the stream Random draws the SpotWide units and their
// traffic from, so that what it drew from randStream before units were
// modelled stays as it was for every seed.
const unitStream = 0x5851f42d4c957f2d

// budgetStream is the stream Random draws the payload budget from, and
// joinStream the Joins.
const (
	budgetStream = 0x2545f4914f6cdd1d
	joinStream   = 0x4cf5ad432745937f
	// checkStream draws whether the world's nodes check a move's source
	// before its seal (Config.NoSourceCheck).
	checkStream = 0x9e3779b97f4a7c15
)

// Sabotage breaks one decision of the composed protocol on purpose, so a
// test can show that the checker catches what it is meant to catch.
type Sabotage int

const (
	// SabotageNone runs the protocol as the driver does.
	SabotageNone Sabotage = iota
	// SabotageSkipFenceOut answers a fence-out decision with FencedOut
	// without writing the move's RelocationId into the record: a target
	// CAS still in flight can then land after the source served again.
	SabotageSkipFenceOut
	// SabotageOpenWithoutCommit answers every CommitOwner with
	// StoreCommitted without writing the owner change: the target opens
	// while the store still names the source.
	SabotageOpenWithoutCommit
	// SabotageSkipSessionSeal seals a bound object's source without asking
	// its Session owner (command 42 is not sent; a forged "sealed" answer
	// comes from the owner's address instead): the Session keeps
	// routing to the source, and ignores the route update of a seal it
	// never made.
	SabotageSkipSessionSeal
	// SabotageHandleAfterSeal is a mailbox whose seal does not stop its
	// dispatch: a message that arrives while it is sealed is handled on
	// the source and still held for the target (docs/PROTOCOL.md §5.4:
	// after the seal the source handles nothing).
	SabotageHandleAfterSeal
	// SabotageSplitUnit is a store whose transaction is not atomic: of a
	// SpotWide commit it applies the Spot's owner change and drops its
	// members', so the Spot leaves its members behind.
	SabotageSplitUnit
	// SabotageCutoverBeforeRelayReady is a source that does not wait for
	// the target's relay-ready: right after the payload it relays and
	// sends the cutover, as if relay-ready had come (docs/PROTOCOL.md
	// §5.9, "Why the cutover waits for relay-ready"). A target that then
	// fails its restore can no longer give the object back.
	SabotageCutoverBeforeRelayReady
)

// Config is one simulation's shape and timing. Durations are logical.
type Config struct {
	Nodes, Objects, Clients int
	Handoff                 handoff.Config
	RestoreTimeout          time.Duration
	CapabilityTimeout       time.Duration
	LeaseTTL, LeaseMargin   time.Duration
	RenewEvery, RetryEvery  time.Duration
	// Horizon: faults, traffic and new moves happen before it; at it every
	// link heals and the store answers again.
	Horizon time.Duration
	// Settle: how long after the horizon every move must have reached its
	// end state (the liveness bound).
	Settle   time.Duration
	Sabotage Sabotage
	// Sessions binds every object to a client's Session (gateway.go);
	// SessionSealTimeout and SessionHoldLimit are its Session owners'.
	Sessions           bool
	SessionSealTimeout time.Duration
	SessionHoldLimit   int
	// Members makes object o (o < len(Members)) a SpotWide User Spot with
	// Members[o] members (0: an Actor). The members are Actors, numbered
	// after the Config.Objects objects in Spot order, spawned with their
	// Spot; a move of the Spot moves them as one unit (docs/PROTOCOL.md
	// §5.15), and none moves alone.
	Members []int
	// Capacity is every node's number of capacity slots (0: unbounded;
	// slots.go).
	Capacity uint32
	// Budget is every node's in-flight payload budget for its moves out
	// (budget.go; zero: unbounded).
	Budget PayloadBudget
	// RandomBudget: Random draws Budget, and bursts of moves out of one
	// node that wait for it, from a stream of their own (budget.go).
	RandomBudget bool
	// Joins: Random schedules cross-node Joins of Actors into the
	// SpotWide Spots, from a stream of their own (join.go).
	Joins bool
	// NoSourceCheck: the nodes do not offer the source check before the
	// seal (an older version's), so every target checks the source after
	// the Restore request (PROTOCOL.md §5.2, §5.7). Random draws it for
	// half the seeds, from a stream of its own.
	NoSourceCheck bool
}

// PayloadBudget is a node's in-flight payload budget (docs/PROTOCOL.md
// §5.3): bytes per peer and per node, and the chunk window; 0 is no
// bound.
type PayloadBudget struct{ PerPeer, PerNode, Window int64 }

// DefaultConfig is the configuration random schedules use: the hand-off's
// timings (docs/PROTOCOL.md §9) scaled down so a schedule spans a few
// logical seconds.
func DefaultConfig() Config {
	c := Config{
		Nodes: 3, Objects: 2, Clients: 2,
		Handoff: handoff.Config{
			ChunkLimit: 64, UnnegotiatedChunkLimit: 48,
			CutoverWaitTimeout: 100 * time.Millisecond,
			FollowDuration:     1 * time.Second,
			StoreRetryBackoff:  20 * time.Millisecond,
			CreditStep:         1,
		},
		RestoreTimeout:    600 * time.Millisecond,
		CapabilityTimeout: 300 * time.Millisecond,
		LeaseTTL:          3 * time.Second,
		LeaseMargin:       600 * time.Millisecond,
		RenewEvery:        time.Second,
		RetryEvery:        300 * time.Millisecond,
		Horizon:           3 * time.Second,
	}
	c.Settle = c.RestoreTimeout + 4*c.Handoff.CutoverWaitTimeout + 3*c.Handoff.FollowDuration + c.Handoff.AckPatience() + c.LeaseTTL + time.Second
	return c
}

// World is one simulation: nodes, store, network, clients and every move,
// driven by one seeded random source on a logical clock. It is not safe for
// concurrent use; run one World per goroutine.
type World struct {
	// The harness: clock and event queue, random source, trace and
	// violations.
	simkit.Harness
	cfg  Config
	seed uint64
	// tok numbers timers and capability queries, so that a stale one is
	// recognised when it fires or is answered.
	tok uint64

	nodes   []*Node
	store   *Store
	net     *Net
	clients []*Client
	objs    []*Object
	msgs    []*Msg
	moves   []*Move

	nextRelocID uint64
	nextIncID   int

	faults *Faults
	hooks  Hooks

	stats Stats
	// over is set at the horizon: faults stop, every link heals.
	over bool
}

// Hooks let a scenario act at chosen moments of the protocol. Each may be
// nil.
type Hooks struct {
	// SourceEffect is called before the driver runs a source effect.
	SourceEffect func(w *World, r *SourceRun, e handoff.Effect)
	// TargetEffect is called before the driver runs a target effect.
	TargetEffect func(w *World, t *TargetRun, e handoff.Effect)
	// Packet is called when a packet is sent; returning true drops it.
	Packet func(w *World, p *packet) bool
	// StoreMode may force the answer mode of a store call and, if late is
	// positive, its latency to the store (ok reports whether it decided).
	StoreMode func(w *World, n *Node, op *storeOp) (mode simkit.StoreMode, late time.Duration, ok bool)
}

// NewWorld builds a world from cfg and seed; faults may be nil (no faults).
func NewWorld(cfg Config, seed uint64, faults *Faults) *World {
	// The driver's derived hand-off settings (relocation.Config).
	if cfg.Handoff.SealPatience == 0 {
		cfg.Handoff.SealPatience = cfg.RestoreTimeout / 2
	}
	if cfg.Handoff.SessionSealWait == 0 {
		cfg.Handoff.SessionSealWait = cfg.CapabilityTimeout
	}
	w := &World{Harness: simkit.NewHarness(seed, randStream), cfg: cfg, seed: seed, faults: faults}
	if w.faults == nil {
		w.faults = &Faults{}
	}
	w.store = newStore(w)
	w.net = newNet(w)
	for i := 0; i < cfg.Nodes; i++ {
		w.nodes = append(w.nodes, newNodeIn(w, i))
	}
	for i := 0; i < cfg.Clients; i++ {
		w.clients = append(w.clients, &Client{w: w, id: i, route: map[ObjID]route{}, last: map[orderKey]uint64{}})
	}
	for i := 0; i < cfg.Objects; i++ {
		w.spawnObject(ObjID(i), w.nodes[i%cfg.Nodes])
	}
	w.spawnMembers()
	w.openSessions()
	for _, n := range w.nodes {
		n.startLease()
	}
	w.at(cfg.Horizon, "horizon", w.horizon)
	return w
}

// Seed is the world's seed.
func (w *World) Seed() uint64 { return w.seed }

func (w *World) wall(d time.Duration) time.Time { return simkit.Wall(d) }

func (w *World) logical(t time.Time) time.Duration { return simkit.Logical(t) }

// after schedules fn d from now. name labels the event for the reader of
// the call; nothing reads it.
func (w *World) after(d time.Duration, _ string, fn func()) { w.After(d, fn) }

func (w *World) at(t time.Duration, _ string, fn func()) { w.At(t, fn) }

// Run runs the schedule to its end (horizon plus settle) and checks the
// end-state invariants. It returns the violations found.
func (w *World) Run() []Violation {
	return w.RunSchedule(w.cfg.Horizon+w.cfg.Settle, w.checkEnd, w.checkSessions, w.classify)
}

// tracef adds a line to the trace when tracing. Callers on hot paths check
// w.Tracing() first so that nothing is formatted otherwise.
func (w *World) tracef(format string, args ...any) { w.Tracef(format, args...) }

// Violation is one broken invariant; Obj names the object ("o3"), Msg
// the message's id.
type Violation = simkit.Violation

func (w *World) violate(invariant, format string, args ...any) *Violation {
	return w.Violate(invariant, format, args...)
}

func (w *World) violateO(o ObjID, invariant, format string, args ...any) *Violation {
	v := w.Violate(invariant, format, args...)
	v.Obj = o.name()
	return v
}

// Stats counts what a schedule did.
type Stats struct {
	Steps, Moves, Committed, SourceServesAgain, FencedOut, Reinstated int
	Messages, Handled, FailedLoud, Unaccepted                         int
	LostCrash, LostEnded, LostInTransitFollow                         int
	Crashes, Stops, LeaseEnds, Cuts, StoreOutages                     int
	Fallbacks, IndeterminateCAS                                       int
	SessionRefused, SessionsClosed                                    int
	// Units: SpotWide moves started (members moved with them);
	// MemberMovesRefused: moves of a member alone, refused.
	Units, UnitMembersMoved, MemberMovesRefused int
	// BudgetWaits: moves that waited for the in-flight payload budget
	// before their seal; ChunksQueued: chunks that waited for it.
	BudgetWaits, ChunksQueued int
	// Joins: cross-node Joins started; Joined: committed with the Join;
	// JoinsRefused: committed without it (the Spot no longer took it).
	Joins, Joined, JoinsRefused int
	// SourceChecks: source checks before a seal a target answered
	// (SourceChecksRefused of them with a no or an unknown answer);
	// Prechecked: Restore requests that took a check's record instead of
	// reading.
	SourceChecks, SourceChecksRefused, Prechecked int
}

// Stats returns the schedule's figures (after Run).
func (w *World) Stats() Stats {
	s := w.stats
	s.Steps = w.Steps()
	return s
}

func (w *World) horizon() {
	w.over = true
	w.tracef("horizon: faults stop, links heal, the store answers")
	w.net.healAll()
	for _, n := range w.nodes {
		n.storeCut = false
	}
	w.store.down = false
}

func (w *World) node(name string) *Node {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

func (w *World) randDur(lo, hi time.Duration) time.Duration { return w.Rand.Dur(lo, hi) }

func (w *World) chance(p float64) bool { return w.Rand.Chance(p) }
