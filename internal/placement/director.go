package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/roamactors/roam/internal/failpoint"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Config is the director's configuration; zero fields take the defaults
// named on them.
type Config struct {
	// Enabled runs a director on the node (it directs only while elected,
	// docs/PLACEMENT.md §2). Default false.
	Enabled bool
	// Period between two rounds. Default 1 s.
	Period time.Duration
	// PageSize is how many records of each kind a round reads. Default 256.
	PageSize int
	// Limits the ledger enforces for every director. Default
	// DefaultLimits.
	Limits Limits
	// IdleWindow: a unit with a timer due within it is busy. Default
	// 100 ms.
	IdleWindow time.Duration
	// Margin is how many units above the mean a node may own before its
	// units are moved (balance by count). Default 1.
	Margin float64
	// BalanceBy is BalanceByCount (the number of units per node) or
	// BalanceByLoad (the messages sampled per node, with CoLocation's
	// sampling settings). Default BalanceByCount.
	BalanceBy string
	// LoadMargin is how far above the mean load a node may be before its
	// units are moved, as a fraction of the mean (balance by load).
	// Default 0.2.
	LoadMargin float64
	// AttemptTimeout bounds one attempt, reservation to outcome; its
	// reservation counts until then. Default 30 s.
	AttemptTimeout time.Duration
	// CoLocation moves objects that talk onto one node (§5). Default off.
	CoLocation CoLocation
	// Paused starts the director paused (Director.Resume starts its
	// rounds). Default false.
	Paused bool
	// OnAttempt, if set, is called with each attempt's outcome (Deferred
	// by the ledger included), from the director's turns, one at a time:
	// it must not block, nor call Stop (which waits for the turns).
	OnAttempt func(Attempt, Outcome)
	// MeterProvider for the attempt counters; default the global one.
	MeterProvider metric.MeterProvider
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Period == 0 {
		c.Period = time.Second
	}
	if c.PageSize == 0 {
		c.PageSize = 256
	}
	if c.Limits == (Limits{}) {
		c.Limits = DefaultLimits()
	}
	if c.IdleWindow == 0 {
		c.IdleWindow = 100 * time.Millisecond
	}
	if c.Margin == 0 {
		c.Margin = 1
	}
	if c.BalanceBy == "" {
		c.BalanceBy = BalanceByCount
	}
	if c.LoadMargin == 0 {
		c.LoadMargin = 0.2
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = 30 * time.Second
	}
	c.CoLocation = c.CoLocation.WithDefaults()
	return c
}

// Sampling reports whether the director reads the nodes' samples of
// their objects' traffic: for co-location or balance by load.
func (c Config) Sampling() bool { return c.CoLocation.Enabled || c.BalanceBy == BalanceByLoad }

// Validate reports an InvalidOperation for a configuration that cannot
// work (after WithDefaults).
func (c Config) Validate() error {
	if c.Period < 0 || c.PageSize < 1 || c.PageSize > location.MaxPageSize || c.IdleWindow < 0 || c.Margin < 0 || c.AttemptTimeout < 0 ||
		(c.BalanceBy != BalanceByCount && c.BalanceBy != BalanceByLoad) || c.LoadMargin < 0 {
		return fmt.Errorf("%w: placement config %+v", roamerr.ErrInvalidOperation, c)
	}
	if err := c.CoLocation.Validate(); err != nil {
		return err
	}
	return c.Limits.Validate()
}

// Env is what the director needs of its node.
type Env struct {
	Store location.Store
	Board location.Board
	Mesh  string
	// Self is this node lifecycle's descriptor.
	Self func() *location.NodeDescriptor
	// Move is RelocateIfIdle from any node, the target named by RID.
	Move func(ctx context.Context, key location.AuthorityKey, targetRid string, window time.Duration) error
	// Samples asks a live node for the edges and loads its table holds
	// (co-location and balance by load only).
	Samples func(ctx context.Context, node *location.NodeDescriptor) (Sample, error)
	Logger  zerolog.Logger
	// Clock is the node's: rounds, cooldowns and the ledger's times.
	// Default machine.Real.
	Clock machine.Clock
}

// LedgerKey is the placement ledger's note of mesh.
func LedgerKey(mesh string) location.NoteKey { return ledgerKey(mesh) }

// ledgerKey is the placement ledger's note.
func ledgerKey(mesh string) location.NoteKey {
	return location.NoteKey{Mesh: mesh, NodeRid: location.ClusterNotes, Name: "placement-ledger"}
}

// kinds are the relocation units the director balances: an Actor and an
// Instance Spot move alone; a User Spot is left where it was created.
var kinds = []location.Kind{location.KindActor, location.KindInstanceSpot}

// Director runs rounds of selection and attempts while its node is the
// elected director.
//
// It runs in the turns of one machine.Loop: Start, each period, and every
// answer of the store, the ledger, a node or a move is a turn, one at a
// time, so the bookkeeping the turns own needs no lock. The calls that
// block (store, board, Env.Move, Env.Samples) run on goroutines of their
// own (calls) that post their answers back as turns; the period and the
// pauses between a reconciliation's reads are loop timers on the
// director's clock. Stop ends the round under way (its calls run under
// quit, its pauses end), closes the loop and waits for the calls, so
// nothing of the director runs after Stop returns.
type Director struct {
	cfg  Config
	env  Env
	log  zerolog.Logger
	loop *machine.Loop[string]
	// onReal paces the rounds on real time while the failpoint
	// DirectorRoundsOnNodeClock is broken; its firing posts the round's
	// turn.
	onReal *machine.Timers[string]
	calls  sync.WaitGroup
	// quit ends with Stop: every store call and attempt of the director
	// is under it, so that a store that does not answer (the node cut
	// off) holds Stop no longer than the call under way takes to see it.
	// Their own timeouts are on the node's clock, which a stopping node
	// cannot count on to move.
	quit     context.Context
	stopCall context.CancelFunc
	stopped  sync.Once

	attempts metric.Int64Counter
	counts   [4]atomic.Int64 // by outcome: busy, committed, deferred, stale
	paused   atomic.Bool
	// passes counts the passes completed and counted the units the last
	// one found, for Progress.
	passes, counted atomic.Int64

	// Owned by the loop's turns (Stop reads them once the loop is done):
	cursor  map[location.Kind]string
	wrapped map[location.Kind]bool
	pass    map[string]int // units per owner RID seen in the pass under way
	census  map[string]int // the last complete pass's
	cooling map[string]time.Time
	ann     announcer
	// active: an announcement or a round is under way (from a period's
	// turn to the next arming); ended, once Stop's turn has run, closes
	// when it is over.
	active bool
	ended  chan struct{}
	// pauses are the reconciliations' pauses under way, by timer: each
	// goes on as if its deadline had passed when Stop ends it.
	pauses map[string]func()
}

// roundTimer names the period's timer; a reconciliation's pause is named
// by its attempt's operation (reconcileTimer).
const roundTimer = "round"

func reconcileTimer(op string) string { return "reconcile " + op }

// New checks cfg and builds a director; Start runs it.
func New(cfg Config, env Env) (*Director, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := cfg.MeterProvider
	if p == nil {
		p = otel.GetMeterProvider()
	}
	attempts, err := p.Meter("github.com/roamactors/roam/internal/placement").Int64Counter("roam.placement.attempts",
		metric.WithDescription("the director's attempts to move an idle unit, by outcome"))
	if err != nil {
		return nil, errors.Join(roamerr.ErrInvalidOperation, err)
	}
	if cfg.Sampling() && env.Samples == nil {
		return nil, fmt.Errorf("%w: co-location and balance by load need Env.Samples", roamerr.ErrNotConfigured)
	}
	d := &Director{cfg: cfg, env: env, log: env.Logger, attempts: attempts,
		loop: machine.NewLoop[string](machine.Or(env.Clock)), onReal: machine.NewTimers[string](machine.Real),
		cursor: map[location.Kind]string{}, wrapped: map[location.Kind]bool{}, pass: map[string]int{}, cooling: map[string]time.Time{}, pauses: map[string]func(){}}
	d.quit, d.stopCall = context.WithCancel(context.Background())
	d.paused.Store(cfg.Paused)
	return d, nil
}

// Pause stops planning at the next round (attempts under way finish);
// Resume starts again.
func (d *Director) Pause() { d.paused.Store(true) }

// Resume ends a Pause.
func (d *Director) Resume() { d.paused.Store(false) }

// clock is the director's clock (Env.Clock).
func (d *Director) clock() machine.Clock { return d.loop.Clock() }

// Start runs rounds every Period until Stop.
func (d *Director) Start() {
	d.loop.Post(func() {
		if d.quit.Err() != nil {
			return // stopped before it started
		}
		d.active = true
		d.ann.started = d.clock().Now()
		d.announce(d.arm)
	})
}

// arm schedules the next round a Period from now, unless Stop is waiting
// for the round that just ended.
func (d *Director) arm() {
	d.active = false
	if d.ended != nil {
		close(d.ended)
		return
	}
	if failpoint.DirectorRoundsOnNodeClock.Broken() {
		d.onReal.Arm(roundTimer, d.cfg.Period, func() { d.loop.Post(d.tick) })
		return
	}
	d.loop.Arm(roundTimer, d.cfg.Period, d.tick)
}

// tick is a period's turn: announce, then a round unless paused, then
// the next period.
func (d *Director) tick() {
	if d.quit.Err() != nil {
		return // a firing on real time that Stop's turn did not catch
	}
	d.active = true
	d.announce(func() {
		if d.paused.Load() {
			d.arm()
			return
		}
		d.round(d.arm)
	})
}

// call runs ask on a goroutine of its own (it blocks on the store or a
// peer; a turn must not) and posts the turn it returns. Once the loop is
// closed the answer is dropped.
func (d *Director) call(ask func() (answer func())) {
	d.calls.Add(1)
	go func() {
		defer d.calls.Done()
		d.loop.Post(ask())
	}()
}

// Stop ends the round under way: its store calls, gathering and attempts
// see quit end, its pauses end, and it starts no further attempt; the
// attempts that were asked are still recorded and counted. Then it closes
// the loop, waits for every call it started and withdraws the
// announcement: nothing of the director runs after Stop returns. Calls
// after the first wait for it and do nothing more.
func (d *Director) Stop() {
	d.stopped.Do(func() {
		d.stopCall()
		ended := make(chan struct{})
		d.loop.Post(func() { d.stopping(ended) }) // only Stop closes the loop
		<-ended
		d.loop.Close()
		d.onReal.Close()
		<-d.loop.Done()
		d.calls.Wait()
		d.withdraw() // the loop is done: ann is this goroutine's now
	})
}

// stopping is Stop's turn: no next period; the round under way, if any,
// ends with its pauses, and closes ended when it has.
func (d *Director) stopping(ended chan struct{}) {
	d.loop.Cancel(roundTimer)
	d.onReal.Cancel(roundTimer)
	if !d.active {
		close(ended)
		return
	}
	d.ended = ended
	var resume []func()
	for k, f := range d.pauses {
		if d.loop.Cancel(k) {
			resume = append(resume, f)
		}
		delete(d.pauses, k)
	}
	for _, f := range resume {
		f()
	}
}

// Progress is how many passes over every record this director completed
// and how many units the last one counted (on live owners, ready): a
// director that is elected makes progress through its pass every round.
func (d *Director) Progress() (passes int64, units int) {
	return d.passes.Load(), int(d.counted.Load())
}

// Outcomes are the counts of the attempts this director finished, by
// outcome.
func (d *Director) Outcomes() map[Outcome]int64 {
	out := map[Outcome]int64{}
	for i, o := range []Outcome{Busy, Committed, Deferred, Stale} {
		out[o] = d.counts[i].Load()
	}
	return out
}

func (d *Director) count(a Attempt, o Outcome) {
	i := slices.Index([]Outcome{Busy, Committed, Deferred, Stale}, o)
	d.counts[i].Add(1)
	d.attempts.Add(context.Background(), 1, metric.WithAttributes(attribute.String("outcome", string(o))))
	if d.cfg.OnAttempt != nil {
		d.cfg.OnAttempt(a, o)
	}
}

// round is the round under way, from the listing of the nodes to the
// last attempt's answer; owned by the turns.
type round struct {
	// ctx bounds the round's reads and gathering (not its attempts, each
	// of which has a deadline of its own).
	ctx    context.Context
	cancel context.CancelFunc
	then   func() // goes on once the round has ended
	nodes  []location.VersionedNode
	live   map[string]*location.NodeDescriptor
	// kind is the index in kinds of the next listing to read; page the
	// units read this round.
	kind int
	page []Unit
	// candidates are the nodes with their census; hostsOf their kinds.
	candidates []Node
	hostsOf    map[string]func(string) bool
	budget     int
	// asking: nodes asked for their samples and not answered.
	asking  int
	samples samples
	grouped map[location.AuthorityKey]bool
	moves   []Move
	// next is the first move not yet attempted; attempts are the cancels
	// of the attempts under way, by operation.
	next     int
	attempts map[string]context.CancelFunc
	moved    []Move
	tried    []Move
}

// round: if this node is the director, read the next page of each kind,
// plan moves from the last census, and run the attempts; then goes on.
func (d *Director) round(then func()) {
	ctx, cancel := machine.WithTimeout(d.quit, d.clock(), d.cfg.AttemptTimeout)
	rd := &round{ctx: ctx, cancel: cancel, then: then, attempts: map[string]context.CancelFunc{}}
	d.call(func() func() {
		nodes, err := d.env.Store.ListNodes(ctx, d.env.Mesh)
		return func() { d.listed(rd, nodes, err) }
	})
}

// endRound ends the round under way and goes on.
func (d *Director) endRound(rd *round) {
	rd.cancel()
	rd.then()
}

func (d *Director) listed(rd *round, nodes []location.VersionedNode, err error) {
	if err != nil {
		d.endRound(rd) // the store will answer again; nothing was started
		return
	}
	self := d.env.Self()
	electors := make([]Elector, 0, len(nodes))
	for _, n := range nodes {
		electors = append(electors, Elector{Rid: n.Node.GetNodeRid(), Generation: n.Node.GetNodeGeneration()})
	}
	if Elect(electors) != self.GetNodeRid() {
		// The pass under way ends here with its place in the listings:
		// elected again, a pass resumed where it stopped would make a
		// census of only the units after that place.
		d.census, d.pass = nil, map[string]int{}
		clear(d.cursor)
		clear(d.wrapped)
		d.endRound(rd)
		return
	}
	rd.nodes = nodes
	rd.live = map[string]*location.NodeDescriptor{}
	for _, n := range nodes {
		rd.live[n.Node.GetNodeRid()] = n.Node
	}
	d.listNext(rd)
}

// listNext reads the next page of the next kind whose listing has not
// wrapped in this pass, one kind after the other; then plans.
func (d *Director) listNext(rd *round) {
	for rd.kind < len(kinds) && d.wrapped[kinds[rd.kind]] {
		rd.kind++ // done for this pass: its units are counted once
	}
	if rd.kind == len(kinds) {
		d.plan(rd)
		return
	}
	k, after := kinds[rd.kind], d.cursor[kinds[rd.kind]]
	d.call(func() func() {
		p, err := d.env.Store.List(rd.ctx, k, location.PageRequest{Size: d.cfg.PageSize, After: after})
		return func() { d.paged(rd, k, p, err) }
	})
}

func (d *Director) paged(rd *round, k location.Kind, p location.Page, err error) {
	if err != nil {
		d.endRound(rd)
		return
	}
	for _, v := range p.Items {
		r := v.Record
		owner := r.GetOwner().GetNodeRid()
		if r.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY || rd.live[owner] == nil {
			continue
		}
		d.pass[owner]++
		rd.page = append(rd.page, Unit{Ref: v.Key, Key: v.Key.String(), StableType: r.GetStableType(), Owner: owner,
			OwnerGen: r.GetAuthorityOwnerGeneration(), ObjectGen: r.GetObjectGeneration(), SourceGen: r.GetOwner().GetNodeGeneration()})
	}
	d.cursor[k] = p.Next
	d.wrapped[k] = p.Next == ""
	rd.kind++
	d.listNext(rd)
}

// plan takes the census a completed pass makes and plans the round's
// moves from the last one.
func (d *Director) plan(rd *round) {
	if d.wrapped[kinds[0]] && d.wrapped[kinds[1]] {
		d.census, d.pass = d.pass, map[string]int{}
		clear(d.wrapped)
		units := 0
		for _, n := range d.census {
			units += n
		}
		d.counted.Store(int64(units))
		d.passes.Add(1)
	}
	if d.census == nil {
		d.endRound(rd) // no complete census yet
		return
	}
	for _, n := range rd.nodes {
		desc := n.Node
		rd.candidates = append(rd.candidates, Node{Rid: desc.GetNodeRid(), Units: d.census[desc.GetNodeRid()], Hosts: hosts(desc)})
	}
	// A unit whose last attempt ended lately waits out its cooldown here
	// too (the ledger has the final say): the next units of its node are
	// tried meanwhile, so a busy one does not starve the rest.
	now := d.clock().Now()
	for k, until := range d.cooling {
		if !until.After(now) {
			delete(d.cooling, k)
		}
	}
	rd.page = slices.DeleteFunc(rd.page, func(u Unit) bool { _, cooling := d.cooling[u.Key]; return cooling })
	rd.budget = 4 * d.cfg.Limits.Concurrency
	if !d.cfg.Sampling() {
		d.balanceByCount(rd)
		return
	}
	rd.hostsOf = map[string]func(string) bool{}
	for _, n := range rd.nodes {
		rd.hostsOf[n.Node.GetNodeRid()] = hosts(n.Node)
	}
	d.gather(rd)
}

// isCooling reports whether k's last attempt ended within its cooldown.
func (d *Director) isCooling(k location.AuthorityKey) bool { _, c := d.cooling[k.String()]; return c }

// colocate plans co-location from the samples gathered, if enabled, and
// resolves its plan; then balances by load.
func (d *Director) colocate(rd *round) {
	if !d.cfg.CoLocation.Enabled {
		d.balanceByLoad(rd)
		return
	}
	var plan []Placed
	plan, rd.grouped = CoLocate(rd.candidates, rd.samples.edges, d.cfg.CoLocation, d.isCooling, rd.budget)
	d.resolveThen(rd, plan, d.balanceByLoad)
}

// balanceByLoad evens out the load, if so configured, with the objects
// co-location did not take.
func (d *Director) balanceByLoad(rd *round) {
	if d.cfg.BalanceBy != BalanceByLoad {
		d.balanceByCount(rd)
		return
	}
	planned := map[location.AuthorityKey]bool{}
	for _, m := range rd.moves {
		planned[m.Unit.Ref] = true
	}
	// Objects that talk are co-location's; the others even out the load.
	skip := func(k location.AuthorityKey) bool { return d.isCooling(k) || rd.grouped[k] || planned[k] }
	plan := BalanceLoad(rd.samples.nodes, rd.samples.loads, d.cfg.LoadMargin, skip, rd.budget-len(rd.moves))
	d.resolveThen(rd, plan, d.balanceByCount)
}

// resolveThen resolves plan on a call of its own, adds its moves to the
// round's and goes on with then.
func (d *Director) resolveThen(rd *round, plan []Placed, then func(*round)) {
	hostsOf := rd.hostsOf
	d.call(func() func() {
		moves := d.resolve(rd.ctx, plan, hostsOf)
		return func() {
			rd.moves = append(rd.moves, moves...)
			then(rd)
		}
	})
}

// balanceByCount evens out the number of units, if so configured, then
// starts the attempts.
func (d *Director) balanceByCount(rd *round) {
	if d.cfg.BalanceBy == BalanceByCount {
		margin := d.cfg.Margin
		page := rd.page
		if d.cfg.CoLocation.Enabled {
			// Objects that talk are co-location's: balance by count moves
			// the others, and only off a node past co-location's own limit
			// (the slack, at least two above the mean), so the two policies
			// do not pull one object two ways.
			page = slices.DeleteFunc(page, func(u Unit) bool { return rd.grouped[u.Ref] })
			total := 0
			for _, n := range rd.candidates {
				total += n.Units
			}
			mean := float64(total) / float64(max(1, len(rd.candidates)))
			margin = max(margin, mean*d.cfg.CoLocation.Slack, 2)
		}
		rd.moves = append(rd.moves, Balance(rd.candidates, page, margin, rd.budget-len(rd.moves))...)
	}
	d.dispatch(rd)
}

// dispatch starts the round's next attempts while fewer than the
// ledger's concurrency are under way, and ends the round once every
// attempt has answered. A director that is stopping starts no more.
func (d *Director) dispatch(rd *round) {
	if d.quit.Err() != nil {
		rd.moves = rd.moves[:rd.next]
	}
	for rd.next < len(rd.moves) && len(rd.attempts) < d.cfg.Limits.Concurrency {
		m := rd.moves[rd.next]
		rd.next++
		d.attempt(rd, m)
	}
	if rd.next < len(rd.moves) || len(rd.attempts) > 0 {
		return // an attempt's end dispatches again
	}
	// Only a unit whose source was asked cools down here; one the ledger
	// deferred (rate, concurrency) is tried again next round.
	cool := max(d.cfg.Limits.Cooldown, d.cfg.Period)
	for _, m := range rd.tried {
		d.cooling[m.Unit.Key] = d.clock().Now().Add(cool)
	}
	// The census counted the moved units at their old owners: until the
	// next pass recounts, the committed moves are applied to it.
	for _, m := range rd.moved {
		d.census[m.Unit.Owner]--
		d.census[m.Target]++
	}
	d.endRound(rd)
}

// samples is a round's gathering of the nodes' tables.
type samples struct {
	edges []Edge
	loads []Load
	nodes []LoadNode // the nodes that answered, with their loads
}

// gather asks every live node for its table (docs/PLACEMENT.md §5), all
// at once; a node that does not answer is left out of this round. Once
// every node has answered it plans from the samples.
func (d *Director) gather(rd *round) {
	rd.asking = len(rd.nodes)
	if rd.asking == 0 {
		d.colocate(rd)
		return
	}
	for _, n := range rd.nodes {
		desc := n.Node
		d.call(func() func() {
			s, err := d.env.Samples(rd.ctx, desc)
			return func() { d.sampled(rd, desc, s, err) }
		})
	}
}

func (d *Director) sampled(rd *round, desc *location.NodeDescriptor, s Sample, err error) {
	rd.asking--
	if err != nil {
		// Its objects are planned without their own traffic this round;
		// the next asks again.
		d.log.Debug().Str("event", "placement_samples_unavailable").Str("node_rid", desc.GetNodeRid()).Err(err).Msg("a node's samples were not read")
	} else {
		rid := desc.GetNodeRid()
		for i := range s.Edges {
			s.Edges[i].ToNode = rid
		}
		for i := range s.Loads {
			s.Loads[i].Node = rid
		}
		rd.samples.edges = append(rd.samples.edges, s.Edges...)
		rd.samples.loads = append(rd.samples.loads, s.Loads...)
		rd.samples.nodes = append(rd.samples.nodes, LoadNode{Rid: rid, Load: s.NodeLoad})
	}
	if rd.asking == 0 {
		d.colocate(rd)
	}
}

// resolve reads each planned object's record afresh for its attempt's
// tuple; one that moved, is changing, or whose target does not host its
// kind is left to a later round, and so is one whose partners on the
// target (Placed.With) are not all owned there: a sample names where a
// sender was, which may be before it moved, and a move towards a partner
// that left would split the two again.
func (d *Director) resolve(ctx context.Context, plan []Placed, hostsOf map[string]func(string) bool) []Move {
	var out []Move
	for _, p := range plan {
		v, err := d.env.Store.Read(ctx, p.Key)
		if err != nil {
			continue
		}
		r := v.Record
		if r.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY || r.GetOwner().GetNodeRid() != p.From || hostsOf[p.To] == nil || !hostsOf[p.To](r.GetStableType()) {
			continue
		}
		owners := d.ownersOf(ctx, p)
		there := true
		for _, w := range p.With {
			if owners[w] != p.To {
				there = false
				break
			}
		}
		if !there || !stillWins(p, owners, d.cfg.CoLocation.Hysteresis) {
			continue
		}
		out = append(out, Move{Target: p.To, Unit: Unit{Ref: p.Key, Key: p.Key.String(), StableType: r.GetStableType(), Owner: p.From,
			OwnerGen: r.GetAuthorityOwnerGeneration(), ObjectGen: r.GetObjectGeneration(), SourceGen: r.GetOwner().GetNodeGeneration()}})
	}
	return out
}

// ownersOf reads where p's partners (With and Partners) are owned now,
// each once; one that cannot be read is left out.
func (d *Director) ownersOf(ctx context.Context, p Placed) map[location.AuthorityKey]string {
	owners := map[location.AuthorityKey]string{}
	read := func(k location.AuthorityKey) {
		if _, done := owners[k]; done {
			return
		}
		if v, err := d.env.Store.Read(ctx, k); err == nil {
			owners[k] = v.Record.GetOwner().GetNodeRid()
		}
	}
	for _, w := range p.With {
		read(w)
	}
	for _, q := range p.Partners {
		read(q.Key)
	}
	return owners
}

// stillWins reports whether p's target still beats its source by the
// hysteresis with its partners where the store has them (owners): the
// samples may place a partner where it was before it moved, possibly away
// from the node it has since joined this object on (a group of three
// whose members each moved towards another split again, and one moved
// twice). A plan without partners (balance by load) wins as planned.
func stillWins(p Placed, owners map[location.AuthorityKey]string, hysteresis float64) bool {
	if len(p.Partners) == 0 {
		return true
	}
	var here, there float64
	for _, q := range p.Partners {
		switch owners[q.Key] { // "" when gone or unreadable: counts nowhere
		case p.From:
			here += q.Weight
		case p.To:
			there += q.Weight
		}
	}
	return there > 0 && there >= (1+hysteresis)*here
}

// hosts reports whether a node takes a unit of a stable type: serving,
// and its descriptor lists the kind.
func hosts(n *location.NodeDescriptor) func(string) bool {
	return func(st string) bool {
		if n.GetStatus() == messages.NodeStatus_NODE_STATUS_DRAINING {
			return false
		}
		return slices.Contains(n.GetStableTypes(), st) || slices.Contains(n.GetInstanceTypes(), st)
	}
}

// attempt reserves m in the ledger, asks the source, and records the
// outcome (docs/PLACEMENT.md §4), each step a call whose answer is a
// turn; it ends with attempted.
func (d *Director) attempt(rd *round, m Move) {
	now := d.clock().Now()
	a := Attempt{Op: uuid.NewString(), Key: m.Unit.Key, SourceRid: m.Unit.Owner, SourceGen: m.Unit.SourceGen,
		ObjectGen: m.Unit.ObjectGen, OwnerGen: m.Unit.OwnerGen, TargetRid: m.Target, DeadlineMs: now.Add(d.cfg.AttemptTimeout).UnixMilli()}
	ctx, cancel := machine.WithDeadline(d.quit, d.clock(), now.Add(d.cfg.AttemptTimeout))
	rd.attempts[a.Op] = cancel
	d.call(func() func() {
		v, err := d.reserve(ctx, a)
		return func() { d.reserved(rd, m, a, ctx, v, err) }
	})
}

func (d *Director) reserved(rd *round, m Move, a Attempt, ctx context.Context, v Verdict, err error) {
	if err != nil {
		d.log.Warn().Str("event", "placement_reserve_failed").Str("object_id", m.Unit.Ref.ID).Err(err).Msg("the placement ledger could not be written; nothing was asked")
		d.attempted(rd, m, a, "", false)
		return
	}
	if !v.Go {
		d.count(a, v.Outcome)
		d.attempted(rd, m, a, v.Outcome, false)
		return
	}
	d.call(func() func() {
		err := d.env.Move(ctx, m.Unit.Ref, m.Target, d.cfg.IdleWindow)
		return func() { d.asked(rd, m, a, err) }
	})
}

// asked takes the source's answer; an ambiguous one is reconciled from
// the unit's record.
func (d *Director) asked(rd *round, m Move, a Attempt, err error) {
	if o, known := classify(err); known {
		d.decided(rd, m, a, o, err)
		return
	}
	d.reconcile(m.Unit, a, func(o Outcome) { d.decided(rd, m, a, o, err) })
}

// decided records a known outcome in the ledger; "" stays unknown.
func (d *Director) decided(rd *round, m Move, a Attempt, o Outcome, moveErr error) {
	if o == "" {
		d.log.Warn().Str("event", "placement_outcome_unknown").Str("object_id", m.Unit.Ref.ID).Str("operation", a.Op).Err(moveErr).
			Msg("an attempt's outcome stays unknown; its reservation counts until its deadline")
		d.attempted(rd, m, a, "", true)
		return
	}
	d.call(func() func() {
		err := d.finish(a, o)
		return func() {
			if err != nil {
				d.log.Warn().Str("event", "placement_finish_failed").Str("object_id", m.Unit.Ref.ID).Err(err).Msg("the outcome was not recorded; the reservation expires at its deadline")
			}
			d.count(a, o)
			if o == Committed {
				d.log.Info().Str("event", "placement_moved").Str("object_id", m.Unit.Ref.ID).Str("from", a.SourceRid).Str("to", a.TargetRid).Msg("an idle unit moved")
			}
			d.attempted(rd, m, a, o, true)
		}
	})
}

// attempted ends an attempt with its outcome ("" when it stays unknown);
// asked: the source was asked (the ledger reserved the attempt).
func (d *Director) attempted(rd *round, m Move, a Attempt, o Outcome, asked bool) {
	rd.attempts[a.Op]()
	delete(rd.attempts, a.Op)
	if asked {
		rd.tried = append(rd.tried, m)
	}
	if o == Committed {
		rd.moved = append(rd.moved, m)
	}
	d.dispatch(rd)
}

// classify maps a move's error to an outcome; known false: the answer
// was lost or the outcome is unknown, and the store decides.
func classify(err error) (Outcome, bool) {
	switch {
	case err == nil:
		return Committed, true
	case errors.Is(err, roamerr.ErrBusy):
		return Busy, true
	case errors.Is(err, roamerr.ErrNodeDraining), errors.Is(err, roamerr.ErrCapacityExceeded), errors.Is(err, roamerr.ErrNotConfigured):
		return Deferred, true
	case errors.Is(err, roamerr.ErrStale), errors.Is(err, roamerr.ErrConflict), errors.Is(err, roamerr.ErrNotFound),
		errors.Is(err, roamerr.ErrInvalidOperation), errors.Is(err, roamerr.ErrTypeMismatch), errors.Is(err, roamerr.ErrPermissionDenied):
		// The selection's evidence no longer holds (the unit moved, ended,
		// or cannot move alone).
		return Stale, true
	}
	return "", false // Unavailable, DeadlineExceeded: ambiguous
}

// reconcile decides an ambiguous attempt from the unit's record (settle)
// and goes on with then. A store error is asked again after a pause, until
// the attempt's deadline; "" then (unknown). The pauses are on the
// director's clock, as the deadline is: on real time, a node in logical
// time whose clock stood still would ask its failing store again and
// again and never reach the deadline. Stop ends a pause: unknown.
func (d *Director) reconcile(u Unit, a Attempt, then func(Outcome)) {
	d.reconcileAfter(u, a, 50*time.Millisecond, then)
}

// reconcileAfter reads u's record; if it does not decide, it reads again
// after wait (doubling, up to a second).
func (d *Director) reconcileAfter(u Unit, a Attempt, wait time.Duration, then func(Outcome)) {
	d.call(func() func() {
		ctx, cancel := machine.WithTimeout(d.quit, d.clock(), 5*time.Second)
		v, err := d.env.Store.Read(ctx, u.Ref)
		cancel()
		return func() {
			if o, decided := settle(a, v, err); decided {
				then(o)
				return
			}
			if d.quit.Err() != nil || d.clock().Now().Add(wait).After(time.UnixMilli(a.DeadlineMs)) {
				then("")
				return
			}
			k := reconcileTimer(a.Op)
			d.pauses[k] = func() { then("") }
			d.loop.Arm(k, wait, func() {
				delete(d.pauses, k)
				d.reconcileAfter(u, a, min(2*wait, time.Second), then)
			})
		}
	})
}

// settle decides an ambiguous attempt from the unit's record read (v,
// err): owned by the target → committed; still the source's at the
// selected generations → not committed, source unchanged (deferred);
// anything else → stale. A record not found is not proof that nothing
// happened: stale. A store error decides nothing.
func settle(a Attempt, v location.Versioned, err error) (o Outcome, decided bool) {
	switch {
	case errors.Is(err, location.ErrNotFound):
		return Stale, true
	case err != nil:
		return "", false
	}
	r := v.Record
	switch {
	case r.GetOwner().GetNodeRid() == a.TargetRid:
		return Committed, true
	case r.GetOwner().GetNodeRid() == a.SourceRid && r.GetAuthorityOwnerGeneration() == a.OwnerGen && r.GetObjectGeneration() == a.ObjectGen:
		return Deferred, true
	}
	return Stale, true
}

// reserve runs Ledger.Reserve against the stored ledger, by CAS.
func (d *Director) reserve(ctx context.Context, a Attempt) (Verdict, error) {
	var v Verdict
	err := d.update(ctx, func(l *Ledger) (bool, error) {
		var changed bool
		var err error
		v, changed, err = l.Reserve(a, d.cfg.Limits, d.clock().Now())
		return changed, err
	})
	return v, err
}

// finish runs Ledger.Finish against the stored ledger, by CAS.
func (d *Director) finish(a Attempt, o Outcome) error {
	ctx, cancel := machine.WithTimeout(d.quit, d.clock(), 10*time.Second)
	defer cancel()
	return d.update(ctx, func(l *Ledger) (bool, error) { return l.Finish(a, o, d.cfg.Limits, d.clock().Now()), nil })
}

// update reads the ledger, applies change and writes it back if changed,
// only at the version read; a lost race reads again.
func (d *Director) update(ctx context.Context, change func(*Ledger) (bool, error)) error {
	key := ledgerKey(d.env.Mesh)
	for {
		n, err := d.env.Board.ReadNote(ctx, key)
		if err != nil && !errors.Is(err, location.ErrNotFound) {
			return roamerr.Keep(roamerr.ErrUnavailable, "read the placement ledger", err)
		}
		l, err := Decode(n.Value)
		if err != nil {
			// Unreadable (written by something else): start a new ledger at
			// the version read, loudly. The reservations it held are lost,
			// so for up to AttemptTimeout more attempts may run at once
			// than the concurrency allows; a stuck director would be worse.
			d.log.Error().Str("event", "placement_ledger_reset").Err(err).Msg("the placement ledger was unreadable and is started anew")
			l = &Ledger{}
		}
		changed, err := change(l)
		if err != nil || !changed {
			return err
		}
		_, err = d.env.Board.WriteNote(ctx, key, n.Version, l.Encode(location.MaxNoteBytes))
		if errors.Is(err, location.ErrConflict) {
			continue
		}
		if err != nil {
			return roamerr.Keep(roamerr.ErrUnavailable, "write the placement ledger", err)
		}
		return nil
	}
}
