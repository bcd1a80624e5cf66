package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
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
	// its Session owner (SealSessions answered at once): the Session keeps
	// routing to the source, and ignores the route update of a seal it
	// never made.
	SabotageSkipSessionSeal
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
	// Sessions binds every object to a client's Session (session.go);
	// SessionSealTimeout and SessionHoldLimit are its Session owners'.
	Sessions           bool
	SessionSealTimeout time.Duration
	SessionHoldLimit   int
}

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

// base is the wall-clock instant of logical time 0 (the machines take
// absolute deadlines).
var base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// event is one scheduled step.
type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

// World is one simulation: nodes, store, network, clients and every move,
// driven by one seeded random source on a logical clock. It is not safe for
// concurrent use; run one World per goroutine.
type World struct {
	cfg   Config
	seed  uint64
	rng   *rand.Rand
	now   time.Duration
	seq   uint64
	queue []event
	steps int

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

	tracing bool
	trace   []string

	violations []Violation
	stats      Stats
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
	StoreMode func(w *World, n *Node, op *storeOp) (mode storeMode, late time.Duration, ok bool)
}

// NewWorld builds a world from cfg and seed; faults may be nil (no faults).
func NewWorld(cfg Config, seed uint64, faults *Faults) *World {
	w := &World{cfg: cfg, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), faults: faults}
	if w.faults == nil {
		w.faults = &Faults{}
	}
	w.store = newStore(w)
	w.net = newNet(w)
	for i := 0; i < cfg.Nodes; i++ {
		w.nodes = append(w.nodes, newNode(w, i))
	}
	for i := 0; i < cfg.Clients; i++ {
		w.clients = append(w.clients, &Client{w: w, id: i, route: map[ObjID]route{}, last: map[orderKey]uint64{}})
	}
	for i := 0; i < cfg.Objects; i++ {
		w.spawnObject(ObjID(i), w.nodes[i%cfg.Nodes])
	}
	w.openSessions()
	for _, n := range w.nodes {
		n.startLease()
	}
	w.at(cfg.Horizon, "horizon", w.horizon)
	return w
}

// Seed is the world's seed.
func (w *World) Seed() uint64 { return w.seed }

// Now is the logical time since the start.
func (w *World) Now() time.Duration { return w.now }

func (w *World) wall(d time.Duration) time.Time { return base.Add(d) }

func (w *World) logical(t time.Time) time.Duration { return t.Sub(base) }

// after schedules fn d from now; name is only used by the trace.
func (w *World) after(d time.Duration, name string, fn func()) {
	w.at(w.now+max(d, 0), name, fn)
}

func (w *World) at(t time.Duration, _ string, fn func()) {
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

// Run runs the schedule to its end (horizon plus settle) and checks the
// end-state invariants. It returns the violations found.
func (w *World) Run() []Violation {
	end := w.cfg.Horizon + w.cfg.Settle
	for len(w.queue) > 0 && len(w.violations) < 20 {
		if w.queue[0].at > end {
			break
		}
		e := w.pop()
		w.now = e.at
		e.fn()
		w.steps++
		if w.steps > maxSteps {
			w.violate("livelock", "more than %d steps before %s", maxSteps, end)
			break
		}
	}
	if w.now < end {
		w.now = end
	}
	w.checkEnd()
	w.checkSessions()
	w.classify()
	return w.violations
}

// tracef adds a line to the trace when tracing. Callers on hot paths check
// w.tracing first so that nothing is formatted otherwise.
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
	// Obj is the object concerned, -1 if none; Msg the message, 0 if none.
	Obj ObjID
	Msg uint64
	// Known names the known protocol defect this violation is an instance
	// of (empty: none). See known.go.
	Known string
}

func (v Violation) String() string {
	s := fmt.Sprintf("%.3fms %s: %s", float64(v.At)/float64(time.Millisecond), v.Invariant, v.Detail)
	if v.Known != "" {
		s += " [known: " + v.Known + "]"
	}
	return s
}

func (w *World) violate(invariant, format string, args ...any) {
	w.violateO(-1, invariant, format, args...)
}

func (w *World) violateO(o ObjID, invariant, format string, args ...any) {
	v := Violation{At: w.now, Invariant: invariant, Detail: fmt.Sprintf(format, args...), Obj: o}
	w.violations = append(w.violations, v)
	w.tracef("VIOLATION %s", v)
}

// Stats counts what a schedule did.
type Stats struct {
	Steps, Moves, Committed, SourceServesAgain, FencedOut, Reinstated int
	Messages, Handled, FailedLoud, Unaccepted                         int
	LostCrash, LostEnded, LostInTransitFollow                         int
	Crashes, Stops, LeaseEnds, Cuts, StoreOutages                     int
	Fallbacks, IndeterminateCAS                                       int
	SessionRefused, SessionsClosed                                    int
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

func (w *World) node(name string) *Node {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// randDur returns a uniform duration in [lo, hi].
func (w *World) randDur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func (w *World) chance(p float64) bool { return p > 0 && w.rng.Float64() < p }
