// Package nodesim runs real roam nodes — the relocation driver, the Spot
// manager, the owner lease, rejoin — against a simulated Location Store
// and a logical clock, under a fault schedule drawn from one seed, and
// checks safety and liveness: nothing handled twice (but the documented
// repeated first message of a cold activation, counted apart), every
// error typed, and once the faults stop every node serves again (a lease
// that ended is rejoined) and every Spot answers within a stated bound of
// logical time.
//
// It is the node-level counterpart of the deterministic simulations
// (internal/relocation/sim, internal/spotsim), which run the pure
// machines: here the drivers themselves run, as hashicorp/raft's tests run
// NewRaft on an in-memory transport. The store is the embedded memstore on
// the world's clock, each node reaching it through its own faulty.Store
// (a cut from the store is a partition of that path); the transport is
// Proto.Actor's remote on loopback. The goroutines of the nodes make a
// run not replayable step for step, but its fault schedule is the seed's:
// a failing seed names the schedule that found it.
package nodesim

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// Config is one world: its size, its leases and its schedule.
type Config struct {
	// Nodes is the number of nodes (default 3).
	Nodes int
	// Spots is the number of Instance Spots the callers use (default 6).
	Spots int
	// LeaseTTL is every node's owner lease TTL, in logical time (default
	// 10 s).
	LeaseTTL time.Duration
	// Faults is the number of faults the schedule draws (default 4): a
	// node cut from the store for a fraction of a TTL up to three TTLs (its
	// lease then ends and it rejoins), or the store out for everyone.
	Faults int
	// Span is the logical time the faults are spread over (default 6
	// TTLs); the run heals everything at its end.
	Span time.Duration
	// Moves is the number of moves the schedule draws over the span
	// (default 8).
	Moves int
	// Bound is the logical time within which, once the faults stop, every
	// node must serve again and every Spot answer (default 4 TTLs: the
	// lease that ends last, the rejoin, the reactivation).
	Bound time.Duration
}

func (c *Config) defaults() {
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Spots == 0 {
		c.Spots = 6
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.Faults == 0 {
		c.Faults = 4
	}
	if c.Span == 0 {
		c.Span = 6 * c.LeaseTTL
	}
	if c.Moves == 0 {
		c.Moves = 8
	}
	if c.Bound == 0 {
		c.Bound = 4 * c.LeaseTTL
	}
}

// Node is one node of the world: the extension and its path to the store.
type Node struct {
	Name string
	Ext  *extension.Extension
	// path is this node's way to the store; a cut partitions it.
	path *faulty.Store
	// cutUntil is the logical time its cut heals (zero: not cut).
	cutUntil time.Time
}

// World is a run: the nodes, the store, the clock, the schedule and what
// the Spots handled.
type World struct {
	t     testing.TB
	cfg   Config
	seed  uint64
	rng   *simkit.Rand
	Clock *machine.Manual
	Store *memstore.Store
	Nodes []*Node
	start time.Time

	mu sync.Mutex
	// handled counts each call's value as the Spots handled it; asFirst
	// counts the handlings that were their incarnation's first message.
	handled map[string]int
	asFirst map[string]int
	// answered is every value whose call returned success.
	answered map[string]bool
	// untyped are the errors that fall in no roamerr class.
	untyped []string
	// log is the schedule as it ran, for the failure report.
	log []string
	// outage is the logical time a store outage for everyone heals.
	outage time.Time
	// ticked is closed (and replaced) at every step of the clock: a caller
	// whose call failed waits for it before trying again, so retries are
	// paced by logical time, not by a sleep.
	ticked chan struct{}
	// inflight counts the calls and moves under way: a step of the clock
	// waits (a little) for them, so logical time does not run past work
	// that only needs the CPU.
	inflight atomic.Int64
}

// New starts cfg.Nodes nodes on one memstore and one logical clock.
func New(t testing.TB, seed uint64, cfg Config) *World {
	t.Helper()
	testwait.NoLeaks(t)
	cfg.defaults()
	clock := machine.NewManualAt(time.Now())
	w := &World{
		t: t, cfg: cfg, seed: seed, rng: simkit.NewRand(seed, 0x6e6f6465),
		Clock: clock, Store: memstore.New(memstore.WithClock(clock)), start: clock.Now(),
		handled: map[string]int{}, asFirst: map[string]int{}, answered: map[string]bool{}, ticked: make(chan struct{}),
	}
	for i := 0; i < cfg.Nodes; i++ {
		w.Nodes = append(w.Nodes, w.startNode(fmt.Sprintf("n%d", i+1)))
	}
	return w
}

func (w *World) startNode(name string) *Node {
	w.t.Helper()
	path, err := faulty.New(w.Store, faulty.Config{})
	if err != nil {
		w.t.Fatal(err)
	}
	n := &Node{Name: name, path: path}
	cfg := extension.Config{
		Node: meshnode.Config{Name: name, Store: path, Logger: testlog.Logger(), LeaseTTL: w.cfg.LeaseTTL, Clock: w.Clock},
		Kinds: []extension.Kind{{StableType: "counter", Instance: true, ReactivateEmpty: true, Policy: extension.PreserveStateWith(counterState{}),
			Producer: func() actor.Actor { return &counter{w: w} }}},
		StopWithoutDrain: true,
	}
	n.Ext, err = extension.Start(context.Background(), cfg)
	if err != nil {
		w.t.Fatalf("start %s: %v", name, err)
	}
	w.t.Cleanup(func() { w.stopNode(n) })
	return n
}

// stopBound is the real time a node's Stop may take: stopping is bounded
// in real time whatever the node's clock does (nobody advances it now).
const stopBound = 15 * time.Second

// stopNode stops n; a Stop that outlasts stopBound fails the run with
// the goroutines still in roam's code, since a node that cannot stop is
// a liveness failure of its own.
func (w *World) stopNode(n *Node) {
	ctx, cancel := context.WithTimeout(context.Background(), stopBound)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- n.Ext.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err != nil {
			w.t.Errorf("seed %d: stop %s: %v", w.seed, n.Name, err)
		}
		return
	case <-time.After(stopBound - time.Second):
	}
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var roam []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "roamactors/roam/internal") && !strings.Contains(g, "nodesim.(*World).stopNode") {
			roam = append(roam, g)
		}
	}
	w.t.Errorf("seed %d: %s did not stop within %v; goroutines in roam:\n%s", w.seed, n.Name, stopBound-time.Second, strings.Join(roam, "\n\n"))
	<-stopped
}

// callStacks are the stacks of the calls under way, for a liveness
// failure's report.
func callStacks() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "nodesim.(*World).call(") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// counter is the Instance Spot kind: it records each value it handles.
type counter struct {
	w *World
	n int64
}

func (c *counter) Receive(ctx actor.Context) {
	if s, ok := ctx.Message().(*wrapperspb.StringValue); ok {
		c.w.mu.Lock()
		c.w.handled[s.Value]++
		if c.n == 0 {
			c.w.asFirst[s.Value]++
		}
		c.w.mu.Unlock()
		c.n++
		ctx.Respond(wrapperspb.Int64(c.n))
	}
}

// counterState moves a counter's count with it.
type counterState struct{}

func (counterState) Capture(a actor.Actor) ([]byte, error) {
	return strconv.AppendInt(nil, a.(*counter).n, 10), nil
}

func (counterState) Restore(a actor.Actor, b []byte) error {
	n, err := strconv.ParseInt(string(b), 10, 64)
	a.(*counter).n = n
	return err
}

// logf adds a line to the schedule's log, stamped with logical time.
func (w *World) logf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%9s  ", w.Clock.Now().Sub(w.start).Round(time.Millisecond))+fmt.Sprintf(format, args...))
}

// Log is the schedule as it ran.
func (w *World) Log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.log, "\n")
}

// reaching reports whether n's store path answers now.
func (w *World) reaching(n *Node) bool {
	now := w.Clock.Now()
	return !now.Before(n.cutUntil) && !now.Before(w.outage)
}

// step moves the clock by d in steps of a twentieth of the TTL, letting
// every node that reaches the store take its Ticks and answers after each
// (a cut node's renewal hangs until its own timeout on this clock).
func (w *World) step(d time.Duration) {
	w.t.Helper()
	tick := w.cfg.LeaseTTL / 20
	for d > 0 {
		s := min(d, tick)
		w.Clock.Advance(s)
		d -= s
		w.heal()
		w.mu.Lock()
		close(w.ticked)
		w.ticked = make(chan struct{})
		w.mu.Unlock()
		w.quiesce()
		for _, n := range w.Nodes {
			if w.reaching(n) {
				testwait.Within(w.t, 10*time.Second, func() bool { return n.Ext.Node().Settled() },
					fmt.Sprintf("%s's lease loop settled after a step of the logical clock", n.Name))
				// A rejoin's real work (a new actor system, the claim) goes
				// before the clock moves on, within reason: a rejoin that
				// waits on the clock itself must not hold it.
				for end := time.Now().Add(2 * time.Second); !n.Ext.Settled() && time.Now().Before(end); {
					time.Sleep(time.Millisecond)
				}
			}
		}
	}
}

// quiesce gives the calls and moves under way up to a few milliseconds of
// real time to finish before the clock moves on: what waits for the clock
// (a call to a cut node, a timeout) does not finish, and must not hold the
// clock back.
func (w *World) quiesce() {
	for end := time.Now().Add(20 * time.Millisecond); w.inflight.Load() > 0 && time.Now().Before(end); {
		time.Sleep(200 * time.Microsecond)
	}
}

// heal ends the cuts whose time has come.
func (w *World) heal() {
	now := w.Clock.Now()
	for _, n := range w.Nodes {
		if !n.cutUntil.IsZero() && !now.Before(n.cutUntil) {
			n.path.Partition(false)
			n.cutUntil = time.Time{}
			w.logf("%s reaches the store again", n.Name)
		}
	}
	if !w.outage.IsZero() && !now.Before(w.outage) {
		for _, n := range w.Nodes {
			if n.cutUntil.IsZero() {
				n.path.Partition(false)
			}
		}
		w.outage = time.Time{}
		w.logf("the store is back")
	}
}

// nextStep returns a channel closed at the clock's next step.
func (w *World) nextStep() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ticked
}

// spotID is the i-th Spot of the world.
func spotID(i int) string { return fmt.Sprintf("spot-%d", i) }

// call asks Spot i through node n to handle a new value; it records a
// success and checks that a failure is typed.
func (w *World) call(n *Node, i int, value string) error {
	w.inflight.Add(1)
	defer w.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	_, err := n.Ext.Spots().Request(spotID(i), wrapperspb.String(value)).InstanceSpot().Timeout(3 * w.cfg.LeaseTTL).Do(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.answered[value] = true
	case !typed(err):
		w.untyped = append(w.untyped, fmt.Sprintf("%s via %s: %v", value, n.Name, err))
	}
	return err
}

// event is one entry of the drawn schedule.
type event struct {
	at   time.Duration
	what string
	do   func()
}

// schedule draws the faults and moves of the run from the seed.
func (w *World) schedule() []event {
	var evs []event
	ttl := w.cfg.LeaseTTL
	for i := 0; i < w.cfg.Faults; i++ {
		at := w.rng.Dur(0, w.cfg.Span)
		if w.rng.Chance(0.25) {
			d := w.rng.Dur(ttl/4, 2*ttl)
			evs = append(evs, event{at, fmt.Sprintf("store out for everyone for %v", d), func() {
				until := w.Clock.Now().Add(d)
				if until.After(w.outage) {
					w.outage = until
				}
				for _, n := range w.Nodes {
					n.path.Partition(true)
				}
			}})
			continue
		}
		n := w.Nodes[w.rng.IntN(len(w.Nodes))]
		d := w.rng.Dur(ttl/4, 3*ttl)
		evs = append(evs, event{at, fmt.Sprintf("%s cut from the store for %v", n.Name, d), func() {
			until := w.Clock.Now().Add(d)
			if until.After(n.cutUntil) {
				n.cutUntil = until
			}
			n.path.Partition(true)
		}})
	}
	for i := 0; i < w.cfg.Moves; i++ {
		at := w.rng.Dur(0, w.cfg.Span)
		s, from, to := w.rng.IntN(w.cfg.Spots), w.Nodes[w.rng.IntN(len(w.Nodes))], w.Nodes[w.rng.IntN(len(w.Nodes))]
		evs = append(evs, event{at, fmt.Sprintf("move %s to %s (asked at %s)", spotID(s), to.Name, from.Name), func() {
			w.inflight.Add(1) // before the goroutine, so no step runs past it
			go func() {
				defer w.inflight.Add(-1)
				w.move(from, s, to)
			}()
		}})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// move asks from to move Spot s to to; any typed outcome is fine (the
// Spot may be cut off, moving, or not yet activated).
func (w *World) move(from *Node, s int, to *Node) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	_, err := from.Ext.Relocate(ctx, extension.InstanceSpotRef(spotID(s)), to.Ext.NodeRid())
	if err != nil && !typed(err) {
		w.mu.Lock()
		w.untyped = append(w.untyped, fmt.Sprintf("move %s: %v", spotID(s), err))
		w.mu.Unlock()
	}
	w.logf("move %s to %s: %v", spotID(s), to.Name, err)
}

// Run runs the schedule: every Spot is activated and called, the faults
// and moves happen at their logical times while callers keep calling,
// then everything heals and the liveness bound starts.
func (w *World) Run() {
	w.t.Helper()
	for i := 0; i < w.cfg.Spots; i++ {
		if err := w.call(w.Nodes[i%len(w.Nodes)], i, fmt.Sprintf("warm-%d", i)); err != nil {
			w.t.Fatalf("seed %d: activating %s: %v", w.seed, spotID(i), err)
		}
	}
	stop := make(chan struct{})
	var callers sync.WaitGroup
	for c := 0; c < 2; c++ {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				n := w.Nodes[(c+k)%len(w.Nodes)]
				next := w.nextStep()
				if w.call(n, (c*7+k)%w.cfg.Spots, fmt.Sprintf("c%d-%d", c, k)) != nil {
					select {
					case <-next:
					case <-stop:
					}
				}
			}
		}()
	}
	var at time.Duration
	for _, ev := range w.schedule() {
		w.step(ev.at - at)
		at = ev.at
		w.logf("%s", ev.what)
		ev.do()
	}
	w.step(w.cfg.Span - at)
	for _, n := range w.Nodes {
		n.cutUntil = time.Time{}
		n.path.Partition(false)
	}
	w.outage = time.Time{}
	w.logf("every fault healed")
	close(stop)
	callers.Wait()
	w.checkLive()
	w.checkSafe()
}

// checkLive: once the faults stop, every node serves again (its lease in
// force: a lifecycle whose lease ended has rejoined) and every Spot
// answers through every node, within Bound of logical time. The calls run
// beside the clock's steps (a call's timeout is on the clock).
func (w *World) checkLive() {
	w.t.Helper()
	healed := w.Clock.Now()
	type goal struct {
		what string
		done bool
		last error
	}
	var (
		goals []*goal
		wg    sync.WaitGroup
		quit  = make(chan struct{})
	)
	for _, n := range w.Nodes {
		goals = append(goals, &goal{what: n.Name + " serves (its lease in force)"})
	}
	for i := 0; i < w.cfg.Spots; i++ {
		for _, n := range w.Nodes {
			g := &goal{what: fmt.Sprintf("%s answers through %s", spotID(i), n.Name)}
			goals = append(goals, g)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; ; k++ {
					next := w.nextStep()
					err := w.call(n, i, fmt.Sprintf("live-%s-%d-%d", n.Name, i, k))
					w.mu.Lock()
					g.done, g.last = err == nil, err
					w.mu.Unlock()
					if err == nil {
						return
					}
					select {
					case <-next:
					case <-quit:
						return
					}
				}
			}()
		}
	}
	left := func() []string {
		w.mu.Lock()
		defer w.mu.Unlock()
		var out []string
		for k, g := range goals {
			if k < len(w.Nodes) {
				g.done = w.Nodes[k].Ext.Node().Valid()
			}
			if !g.done {
				what := g.what
				if g.last != nil {
					what += " (" + g.last.Error() + ")"
				}
				out = append(out, what)
			}
		}
		return out
	}
	for {
		pending := left()
		if len(pending) == 0 {
			break
		}
		if w.Clock.Now().Sub(healed) > w.cfg.Bound {
			close(quit)
			w.t.Fatalf("seed %d: %v after every fault healed, still not:\n  %s\nschedule:\n%s\ncalls under way:\n%s", w.seed, w.cfg.Bound, strings.Join(pending, "\n  "), w.Log(), callStacks())
		}
		w.step(w.cfg.LeaseTTL / 20)
	}
	close(quit)
	wg.Wait()
	w.logf("every node serves and every Spot answers, %v after the heal", w.Clock.Now().Sub(healed))
}

// checkSafe: no value handled twice, every answered value handled once,
// every error typed.
func (w *World) checkSafe() {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var bad []string
	for v, n := range w.handled {
		switch {
		case n == 2 && w.asFirst[v] == 2:
			// A cold activation's first message runs again when its owner
			// ended after the handler returned and before the recovery
			// pointer's removal landed: documented and warned
			// (docs/FAULTS.md, "Repeated first message"); counted apart.
			w.log = append(w.log, fmt.Sprintf("%s ran twice as a first message (repeated first message, docs/FAULTS.md)", v))
		case n > 1:
			bad = append(bad, fmt.Sprintf("%s handled %d times", v, n))
		}
	}
	for v := range w.answered {
		if w.handled[v] != 1 && !(w.handled[v] == 2 && w.asFirst[v] == 2) {
			bad = append(bad, fmt.Sprintf("%s answered but handled %d times", v, w.handled[v]))
		}
	}
	bad = append(bad, w.untyped...)
	if len(bad) > 0 {
		sort.Strings(bad)
		w.t.Fatalf("seed %d:\n  %s\nschedule:\n%s", w.seed, strings.Join(bad, "\n  "), strings.Join(w.log, "\n"))
	}
}

// typed reports whether err falls in exactly one roamerr class.
func typed(err error) bool { return len(roamerrtest.ClassesOf(err)) == 1 }
