package spotsim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/simkit"
)

// randStream is this simulation's stream of the random source (another
// simulation with the same seed draws differently).
const randStream = 0x5b07_51a1_c0ff_ee00

// Sabotage breaks one rule of the composed lifecycle on purpose, so a test
// can show that the checker catches what it is meant to catch.
type Sabotage int

const (
	// SabotageNone runs the machines as the driver does.
	SabotageNone Sabotage = iota
	// SabotageNoFence lets a node count itself the owner until it learns
	// that its lease ended, instead of fencing itself at its last good
	// renewal's send time + TTL − margin: a node cut from the store serves
	// on after the store ended its lease and another node took over.
	SabotageNoFence
	// SabotageNoIDQueue runs every SpotActivation on its own, in parallel,
	// instead of one per Spot ID in arrival order (manager.go's per-ID
	// queue) and without the Spot ID's lock.
	SabotageNoIDQueue
	// SabotageRevokeEarly makes the second node revoke another
	// lifecycle's lease as soon as it reads its descriptor, without
	// watching its heartbeat stand still for a TTL: the holder may still
	// count itself the owner.
	SabotageRevokeEarly
	// SabotageCheckpointNoJudge lands every checkpoint write, last writer
	// wins, instead of only one above the stored fence (checkpoint.Judge):
	// a late capture of an ended incarnation replaces the checkpoint its
	// successor claimed.
	SabotageCheckpointNoJudge
	// SabotageClaimNoFence makes a claim read the stored checkpoint
	// without rewriting it under the new incarnation's fence, so a late
	// capture of the incarnation it replaces still lands above it.
	SabotageClaimNoFence
	// SabotageNoTombstone closes an incarnation without replacing its
	// checkpoint by a tombstone (Writer.Forget): the next activation of
	// the ID claims the closed incarnation's state.
	SabotageNoTombstone
	// SabotageCheckpointNoLease lets the node's checkpoint writer write a
	// capture without checking that its lease is provably in force.
	SabotageCheckpointNoLease
	// SabotageClaimOlder makes a claim hand back the checkpoint stored
	// before the last one accepted (a claim reading a stale copy), not the
	// last.
	SabotageClaimOlder
	// SabotageClaimFailStartsEmpty answers a claim that failed to the
	// activation machine as a claim that found nothing stored, so the
	// incarnation starts without the state it should have.
	SabotageClaimFailStartsEmpty
	// SabotageCaptureUnderPointer captures after every handled message,
	// also while a cold activation's recovery pointer may still be in the
	// store (the first message's turn ran, its removal has not landed).
	SabotageCaptureUnderPointer
	// SabotageCloseNoSeal makes a close drain its incarnation's queue
	// instead of sealing admission behind what it had accepted: the close
	// marker steps back behind whatever arrived meanwhile, which runs.
	SabotageCloseNoSeal
	// SabotageReserveSkipsCheckpointCheck sends a cold activation's
	// reservation without its check that no checkpoint is stored
	// (location.OpCheckNoCheckpoint), yet answers it as if the check
	// passed: the incarnation starts empty over a stored state.
	SabotageReserveSkipsCheckpointCheck
)

// Config is one simulation's shape and timing. Durations are logical.
type Config struct {
	Nodes, Spots, Clients int
	// CallTimeout is every call's deadline (so every activation's) and
	// the Manager's DefaultTimeout (an abort's or a root deletion's own
	// timeout).
	CallTimeout time.Duration
	// The owner lease's settings (internal/meshnode/lease's Config: TTL,
	// Margin, RenewEvery, RetryEvery), which each lifecycle's keeper
	// runs with. Every renewal changes the descriptor's
	// version (the heartbeat); a lifecycle that watched it stand still for
	// LeaseTTL revokes the lease (internal/liveness). The store itself ends
	// a lease StoreExpiry after the last renewal it applied (Consul: 2×TTL;
	// never below LeaseTTL).
	LeaseTTL, LeaseMargin, RenewEvery, RetryEvery time.Duration
	StoreExpiry                                   time.Duration
	// RouteCacheMaxAge bounds a cached Ready route (docs/PROTOCOL.md §7.8).
	RouteCacheMaxAge time.Duration
	// RedeliveryWindow bounds one redelivery's wait for the store to name
	// a reachable owner; DeadLetterPatience how long a send may keep
	// dead-lettering before it fails loudly (redeliver.go: 10 s and 30 s
	// against a 10 s TTL; here the same multiples of LeaseTTL).
	RedeliveryWindow, DeadLetterPatience time.Duration
	// Linger: an ended lifecycle's process (its remote and the machines
	// still running on it) stays this long, then goes.
	Linger time.Duration
	// RestartMin, RestartMax: a crashed or ended node starts a new
	// lifecycle after a delay in this range.
	RestartMin, RestartMax time.Duration
	// Activation holds the machines' retry periods (Self is set per
	// lifecycle).
	Activation activation.Config
	// Horizon: faults and client traffic happen before it; at it every
	// link heals and the store answers again.
	Horizon time.Duration
	// ProbeAt: one request per Spot ID, from a client, after every
	// deadline of the traffic plus AbandonGrace has passed: an abandoned
	// reservation is released or resumed by it.
	ProbeAt time.Duration
	// End: the end-state invariants are checked here.
	End      time.Duration
	Sabotage Sabotage
}

// DefaultConfig is the configuration random schedules use: roam's timings
// scaled down so a schedule spans a few logical seconds; AbandonGrace is
// the machines' constant (5 s).
func DefaultConfig() Config {
	c := Config{
		Nodes: 3, Spots: 3, Clients: 3,
		CallTimeout:        time.Second,
		LeaseTTL:           3 * time.Second,
		StoreExpiry:        6 * time.Second,
		LeaseMargin:        600 * time.Millisecond,
		RenewEvery:         time.Second,
		RetryEvery:         300 * time.Millisecond,
		RouteCacheMaxAge:   3 * time.Second,
		RedeliveryWindow:   3 * time.Second,
		DeadLetterPatience: 9 * time.Second,
		Linger:             2500 * time.Millisecond,
		RestartMin:         100 * time.Millisecond,
		RestartMax:         1500 * time.Millisecond,
		Activation: activation.Config{
			SettleBackoff:  20 * time.Millisecond,
			ClearBackoff:   50 * time.Millisecond,
			ClearFor:       20 * time.Second,
			ReleaseBackoff: 20 * time.Millisecond,
			ReleaseFor:     9 * time.Second,
			// The world's store keeps the roots beside the records, as
			// the Location Store does when it is the Relocation Store.
			RootsInApply: true,
		},
		Horizon: 5 * time.Second,
	}
	c.ProbeAt = c.Horizon + c.CallTimeout + activation.AbandonGrace + 500*time.Millisecond
	c.End = c.ProbeAt + 2*c.CallTimeout + c.Linger
	return c
}

// World is one simulation: nodes and their lifecycles, the store, the
// network, clients and Spots, driven by one seeded random source on one
// logical clock. Not safe for concurrent use; run one World per goroutine.
type World struct {
	// The harness: clock and event queue, random source, trace and
	// violations.
	simkit.Harness
	cfg  Config
	seed uint64

	store   *Store
	net     *Net
	nodes   []*Node
	clients []*Client
	spots   []*Spot
	msgs    []*Msg
	lives   []*Life
	runners []*Runner

	nextInc, nextOp, nextAddr int

	faults *Faults
	hooks  Hooks

	stats Stats
	over  bool
	// discardedCommits: Ready commits sent by activations that then
	// discarded their staged incarnation; closesGivenUp: Instance Spot
	// closes that gave up on their Closing write (known.go).
	discardedCommits, closesGivenUp []incName
	// takeoversReleased: Spots whose record a failed resume deleted.
	takeoversReleased []*Spot
	// cps is the checkpoint store (checkpoint.go), per Spot index;
	// snapshots are the states claims hand to Stage effects, by index.
	cps       map[int]*simCheckpoint
	snapshots [][]*Msg
	// cpsPrev is what each Spot's checkpoint was before its last write
	// (what SabotageClaimOlder claims).
	cpsPrev map[int]*simCheckpoint
}

// Hooks let a scenario act at chosen moments. Each may be nil.
type Hooks struct {
	// Effect is called before a lifecycle's runner runs an effect.
	Effect func(w *World, r *Runner, e activation.Effect)
	// StoreMode may force the answer mode of a store call and, if late is
	// positive, its latency to the store (ok reports whether it decided).
	StoreMode func(w *World, l *Life, op *storeOp) (mode simkit.StoreMode, late time.Duration, ok bool)
	// Target may pick a cold activation's target node for a call (as a
	// caller with another view of the live nodes would); -1 keeps
	// call.go's choice.
	Target func(w *World, c *Client, s *Spot) int
	// Handled is called after an incarnation handled a message.
	Handled func(w *World, inc *Inc, m *Msg)
}

// NewWorld builds a world from cfg and seed; faults may be nil (none).
func NewWorld(cfg Config, seed uint64, faults *Faults) *World {
	w := &World{Harness: simkit.NewHarness(seed, randStream), cfg: cfg, seed: seed, faults: faults, cps: map[int]*simCheckpoint{}, cpsPrev: map[int]*simCheckpoint{}}
	if w.faults == nil {
		w.faults = &Faults{}
	}
	w.store = newStore(w)
	w.net = newNet(w)
	for i := range cfg.Spots {
		kind := activation.Kind{Registered: true}
		if i%2 == 1 {
			// Every other Spot is of a stateful kind that checkpoints
			// after every message (checkpoint.go).
			kind = activation.Kind{Registered: true, PreservesState: true, Checkpointed: true, CheckpointsInStore: true}
		}
		w.spots = append(w.spots, &Spot{w: w, idx: i, id: fmt.Sprintf("s%d", i+1), kind: kind, stableType: "counter"})
	}
	for i := range cfg.Nodes {
		n := &Node{w: w, idx: i, name: fmt.Sprintf("n%d", i+1)}
		w.nodes = append(w.nodes, n)
	}
	for i := range cfg.Clients {
		w.clients = append(w.clients, &Client{w: w, id: i, node: w.nodes[i%cfg.Nodes], last: map[orderKey]int{}, lastMsg: map[orderKey]*Msg{}})
	}
	for _, n := range w.nodes {
		n.start(true)
	}
	w.at(cfg.Horizon, w.horizon)
	return w
}

// Seed is the world's seed.
func (w *World) Seed() uint64 { return w.seed }

func (w *World) wall(d time.Duration) time.Time { return simkit.Wall(d) }

func (w *World) logical(t time.Time) time.Duration { return simkit.Logical(t) }

func (w *World) after(d time.Duration, fn func()) { w.After(d, fn) }

func (w *World) at(t time.Duration, fn func()) { w.At(t, fn) }

// Run runs the schedule to its end and checks the end-state invariants.
// It returns the violations found.
func (w *World) Run() []Violation {
	return w.RunSchedule(w.cfg.End, w.checkEnd, w.classify)
}

// tracef adds a line to the trace when tracing. Hot paths check
// w.Tracing() first so that nothing is formatted otherwise.
func (w *World) tracef(format string, args ...any) { w.Tracef(format, args...) }

// Violation is one broken invariant; Obj names the Spot (its ID), Msg
// the message's id.
type Violation = simkit.Violation

func (w *World) violate(invariant, format string, args ...any) *Violation {
	return w.Violate(invariant, format, args...)
}

// Stats counts what a schedule did.
type Stats struct {
	Steps                                                  int
	Calls, Messages, Handled, FailedLoud, FailedMaybe      int
	Unaccepted, LostCrash, LostEnded, LostTransit          int
	Activations, Activated, Forwarded, PassedOn, Resumed   int
	ActivationFailed, Recoveries, Clears, ClearGaveUp      int
	Closes, Released, Replayed, LateAfterMaybe             int
	Crashes, LeaseEnds, Restarts, Cuts, StoreOutages       int
	IndeterminateWrites, SlowWrites, ProbesOK, ProbesFail  int
	RefusedPreserved, ReactivatedEmpty, DeadLetters, Known int
	// Checkpoint figures (checkpoint.go): captures written, dropped as
	// superseded or fenced, claims, restores, and handled messages whose
	// effect a recovery lost (after the last checkpoint).
	CheckpointsWritten, CheckpointsSuperseded, CheckpointsFenced int
	// LeasesRevoked: leases another lifecycle revoked after watching their
	// heartbeat stand still for a TTL; LeasesExpired: ended by the store.
	LeasesRevoked, LeasesExpired          int
	Claims, Restores, LostAfterCheckpoint int
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

func (w *World) randDur(lo, hi time.Duration) time.Duration { return w.Rand.Dur(lo, hi) }

func (w *World) chance(p float64) bool { return w.Rand.Chance(p) }

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
