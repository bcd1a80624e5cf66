package spotsim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/roamactors/roam/internal/activation"
)

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
)

// Config is one simulation's shape and timing. Durations are logical.
type Config struct {
	Nodes, Spots, Clients int
	// CallTimeout is every call's deadline (so every activation's) and
	// the Manager's DefaultTimeout (an abort's or a root deletion's own
	// timeout).
	CallTimeout time.Duration
	// The owner lease (internal/meshnode/lease): renewals every RenewEvery, retries
	// every RetryEvery, a node fenced at its last good renewal's send time
	// + LeaseTTL − LeaseMargin. Every renewal changes the descriptor's
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
		},
		Horizon: 5 * time.Second,
	}
	c.ProbeAt = c.Horizon + c.CallTimeout + activation.AbandonGrace + 500*time.Millisecond
	c.End = c.ProbeAt + 2*c.CallTimeout + c.Linger
	return c
}

// base is the wall-clock instant of logical time 0 (the machines take
// absolute times).
var base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

// World is one simulation: nodes and their lifecycles, the store, the
// network, clients and Spots, driven by one seeded random source on one
// logical clock. Not safe for concurrent use; run one World per goroutine.
type World struct {
	cfg   Config
	seed  uint64
	rng   *rand.Rand
	now   time.Duration
	seq   uint64
	queue []event
	steps int

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

	tracing bool
	trace   []string

	violations []Violation
	stats      Stats
	over       bool
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
}

// Hooks let a scenario act at chosen moments. Each may be nil.
type Hooks struct {
	// Effect is called before a lifecycle's runner runs an effect.
	Effect func(w *World, r *Runner, e activation.Effect)
	// StoreMode may force the answer mode of a store call and, if late is
	// positive, its latency to the store (ok reports whether it decided).
	StoreMode func(w *World, l *Life, op *storeOp) (mode storeMode, late time.Duration, ok bool)
	// Target may pick a cold activation's target node for a call (as a
	// caller with another view of the live nodes would); -1 keeps
	// call.go's choice.
	Target func(w *World, c *Client, s *Spot) int
	// Handled is called after an incarnation handled a message.
	Handled func(w *World, inc *Inc, m *Msg)
}

// NewWorld builds a world from cfg and seed; faults may be nil (none).
func NewWorld(cfg Config, seed uint64, faults *Faults) *World {
	w := &World{cfg: cfg, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5b07_51a1_c0ff_ee00)), faults: faults, cps: map[int]*simCheckpoint{}}
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
			kind = activation.Kind{Registered: true, PreservesState: true, Checkpointed: true}
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

// Now is the logical time since the start.
func (w *World) Now() time.Duration { return w.now }

func (w *World) wall(d time.Duration) time.Time { return base.Add(d) }

func (w *World) logical(t time.Time) time.Duration { return t.Sub(base) }

func (w *World) after(d time.Duration, fn func()) { w.at(w.now+max(d, 0), fn) }

func (w *World) at(t time.Duration, fn func()) {
	if t < w.now {
		t = w.now
	}
	w.seq++
	w.queue = append(w.queue, event{at: t, seq: w.seq, fn: fn})
	w.up(len(w.queue) - 1)
}

func (w *World) less(i, j int) bool {
	a, b := &w.queue[i], &w.queue[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (w *World) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !w.less(i, p) {
			break
		}
		w.queue[i], w.queue[p] = w.queue[p], w.queue[i]
		i = p
	}
}

func (w *World) down(i int) {
	n := len(w.queue)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && w.less(r, l) {
			m = r
		}
		if !w.less(m, i) {
			return
		}
		w.queue[i], w.queue[m] = w.queue[m], w.queue[i]
		i = m
	}
}

func (w *World) pop() event {
	e := w.queue[0]
	last := len(w.queue) - 1
	w.queue[0] = w.queue[last]
	w.queue[last] = event{}
	w.queue = w.queue[:last]
	if last > 0 {
		w.down(0)
	}
	return e
}

// maxSteps bounds one schedule: a livelock is a failure, not a hang.
const maxSteps = 200000

// Run runs the schedule to its end and checks the end-state invariants.
// It returns the violations found.
func (w *World) Run() []Violation {
	for len(w.queue) > 0 && len(w.violations) < 20 {
		if w.queue[0].at > w.cfg.End {
			break
		}
		e := w.pop()
		w.now = e.at
		e.fn()
		w.steps++
		if w.steps > maxSteps {
			w.violate("livelock", "more than %d steps before %s", maxSteps, w.cfg.End)
			break
		}
	}
	if w.now < w.cfg.End {
		w.now = w.cfg.End
	}
	w.checkEnd()
	w.classify()
	return w.violations
}

// tracef adds a line to the trace when tracing. Hot paths check w.tracing
// first so that nothing is formatted otherwise.
func (w *World) tracef(format string, args ...any) {
	if !w.tracing {
		return
	}
	w.trace = append(w.trace, fmt.Sprintf("%10.3fms  ", float64(w.now)/float64(time.Millisecond))+fmt.Sprintf(format, args...))
}

// Trace returns the trace (empty unless tracing was on).
func (w *World) Trace() string { return strings.Join(w.trace, "\n") }

// SetTracing turns the trace on or off; call before Run.
func (w *World) SetTracing(on bool) { w.tracing = on }

// Violation is one broken invariant.
type Violation struct {
	At        time.Duration
	Invariant string
	Detail    string
	// Spot is the Spot ID concerned ("" if none); Msg the message (0 if
	// none).
	Spot string
	Msg  int
	// Known names the known defect this violation is an instance of
	// (empty: none). See known.go.
	Known string
}

func (v Violation) String() string {
	s := fmt.Sprintf("%.3fms %s: %s", float64(v.At)/float64(time.Millisecond), v.Invariant, v.Detail)
	if v.Known != "" {
		s += " [known: " + v.Known + "]"
	}
	return s
}

func (w *World) violate(invariant, format string, args ...any) *Violation {
	v := Violation{At: w.now, Invariant: invariant, Detail: fmt.Sprintf(format, args...)}
	w.violations = append(w.violations, v)
	w.tracef("VIOLATION %s", v)
	return &w.violations[len(w.violations)-1]
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
	s.Steps = w.steps
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

// randDur returns a uniform duration in [lo, hi].
func (w *World) randDur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func (w *World) chance(p float64) bool { return p > 0 && w.rng.Float64() < p }

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
