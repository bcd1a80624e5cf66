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
	// by the ledger included), from the director's goroutines.
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
type Director struct {
	cfg  Config
	env  Env
	log  zerolog.Logger
	stop chan struct{}
	done chan struct{}
	// quit ends with Stop: every store call and attempt of the director
	// is under it, so that a store that does not answer (the node cut
	// off) holds Stop no longer than the call under way takes to see it.
	// Their own timeouts are on the node's clock, which a stopping node
	// cannot count on to move.
	quit     context.Context
	stopCall context.CancelFunc

	attempts metric.Int64Counter
	counts   [4]atomic.Int64 // by outcome: busy, committed, deferred, stale
	paused   atomic.Bool
	// passes counts the passes completed and counted the units the last
	// one found, for Progress.
	passes, counted atomic.Int64

	// The round's goroutine only:
	cursor  map[location.Kind]string
	wrapped map[location.Kind]bool
	pass    map[string]int // units per owner RID seen in the pass under way
	census  map[string]int // the last complete pass's
	cooling map[string]time.Time
	ann     announcer
}

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
	d := &Director{cfg: cfg, env: env, log: env.Logger, attempts: attempts, stop: make(chan struct{}), done: make(chan struct{}),
		cursor: map[location.Kind]string{}, wrapped: map[location.Kind]bool{}, pass: map[string]int{}, cooling: map[string]time.Time{}}
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
func (d *Director) clock() machine.Clock { return machine.Or(d.env.Clock) }

// Start runs rounds every Period until Stop.
func (d *Director) Start() {
	go func() {
		defer close(d.done)
		defer d.withdraw()
		d.ann.started = d.clock().Now()
		d.announce()
		for {
			clock := d.clock()
			if failpoint.DirectorRoundsOnNodeClock.Broken() {
				clock = machine.Real
			}
			fire, t := machine.NewTimer(clock, d.cfg.Period)
			select {
			case <-d.stop:
				t.Stop()
				return
			case <-fire:
			}
			d.announce()
			if !d.paused.Load() {
				d.round()
			}
		}
	}()
}

// Stop ends the rounds and waits for the one under way (its attempts
// included).
func (d *Director) Stop() {
	select {
	case <-d.stop:
	default:
		d.stopCall()
		close(d.stop)
	}
	<-d.done
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

// round: if this node is the director, read the next page of each kind,
// plan moves from the last census, and run the attempts.
func (d *Director) round() {
	ctx, cancel := machine.WithTimeout(d.quit, d.clock(), d.cfg.AttemptTimeout)
	defer cancel()
	self := d.env.Self()
	nodes, err := d.env.Store.ListNodes(ctx, d.env.Mesh)
	if err != nil {
		return // the store will answer again; nothing was started
	}
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
		return
	}
	live := map[string]*location.NodeDescriptor{}
	for _, n := range nodes {
		live[n.Node.GetNodeRid()] = n.Node
	}
	var page []Unit
	for _, k := range kinds {
		if d.wrapped[k] {
			continue // done for this pass: its units are counted once
		}
		p, err := d.env.Store.List(ctx, k, location.PageRequest{Size: d.cfg.PageSize, After: d.cursor[k]})
		if err != nil {
			return
		}
		for _, v := range p.Items {
			r := v.Record
			owner := r.GetOwner().GetNodeRid()
			if r.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY || live[owner] == nil {
				continue
			}
			d.pass[owner]++
			page = append(page, Unit{Ref: v.Key, Key: v.Key.String(), StableType: r.GetStableType(), Owner: owner,
				OwnerGen: r.GetAuthorityOwnerGeneration(), ObjectGen: r.GetObjectGeneration(), SourceGen: r.GetOwner().GetNodeGeneration()})
		}
		d.cursor[k] = p.Next
		d.wrapped[k] = p.Next == ""
	}
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
		return // no complete census yet
	}
	var candidates []Node
	for _, n := range nodes {
		desc := n.Node
		candidates = append(candidates, Node{Rid: desc.GetNodeRid(), Units: d.census[desc.GetNodeRid()], Hosts: hosts(desc)})
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
	page = slices.DeleteFunc(page, func(u Unit) bool { _, cooling := d.cooling[u.Key]; return cooling })
	budget := 4 * d.cfg.Limits.Concurrency
	var (
		moves   []Move
		grouped map[location.AuthorityKey]bool
	)
	if d.cfg.Sampling() {
		samples := d.gather(ctx, nodes)
		hostsOf := map[string]func(string) bool{}
		for _, n := range nodes {
			hostsOf[n.Node.GetNodeRid()] = hosts(n.Node)
		}
		cooling := func(k location.AuthorityKey) bool { _, c := d.cooling[k.String()]; return c }
		if d.cfg.CoLocation.Enabled {
			var plan []Placed
			plan, grouped = CoLocate(candidates, samples.edges, d.cfg.CoLocation, cooling, budget)
			moves = d.resolve(ctx, plan, hostsOf)
		}
		if d.cfg.BalanceBy == BalanceByLoad {
			planned := map[location.AuthorityKey]bool{}
			for _, m := range moves {
				planned[m.Unit.Ref] = true
			}
			// Objects that talk are co-location's; the others even out
			// the load.
			skip := func(k location.AuthorityKey) bool { return cooling(k) || grouped[k] || planned[k] }
			plan := BalanceLoad(samples.nodes, samples.loads, d.cfg.LoadMargin, skip, budget-len(moves))
			moves = append(moves, d.resolve(ctx, plan, hostsOf)...)
		}
	}
	if d.cfg.BalanceBy == BalanceByCount {
		margin := d.cfg.Margin
		if d.cfg.CoLocation.Enabled {
			// Objects that talk are co-location's: balance by count moves
			// the others, and only off a node past co-location's own limit
			// (the slack, at least two above the mean), so the two policies
			// do not pull one object two ways.
			page = slices.DeleteFunc(page, func(u Unit) bool { return grouped[u.Ref] })
			total := 0
			for _, n := range candidates {
				total += n.Units
			}
			mean := float64(total) / float64(max(1, len(candidates)))
			margin = max(margin, mean*d.cfg.CoLocation.Slack, 2)
		}
		moves = append(moves, Balance(candidates, page, margin, budget-len(moves))...)
	}
	if len(moves) == 0 {
		return
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		moved []Move
		tried []Move
	)
	sem := make(chan struct{}, d.cfg.Limits.Concurrency)
	for _, m := range moves {
		select {
		case <-d.stop:
			wg.Wait()
			return
		case sem <- struct{}{}:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o, asked := d.attempt(m)
			mu.Lock()
			defer mu.Unlock()
			if asked {
				tried = append(tried, m)
			}
			if o == Committed {
				moved = append(moved, m)
			}
		}()
	}
	wg.Wait()
	// Only a unit whose source was asked cools down here; one the ledger
	// deferred (rate, concurrency) is tried again next round.
	cool := max(d.cfg.Limits.Cooldown, d.cfg.Period)
	for _, m := range tried {
		d.cooling[m.Unit.Key] = d.clock().Now().Add(cool)
	}
	// The census counted the moved units at their old owners: until the
	// next pass recounts, the committed moves are applied to it.
	for _, m := range moved {
		d.census[m.Unit.Owner]--
		d.census[m.Target]++
	}
}

// samples is a round's gathering of the nodes' tables.
type samples struct {
	edges []Edge
	loads []Load
	nodes []LoadNode // the nodes that answered, with their loads
}

// gather asks every live node for its table (docs/PLACEMENT.md §5); a
// node that does not answer is left out of this round.
func (d *Director) gather(ctx context.Context, nodes []location.VersionedNode) samples {
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out samples
	)
	for _, n := range nodes {
		wg.Add(1)
		go func(desc *location.NodeDescriptor) {
			defer wg.Done()
			s, err := d.env.Samples(ctx, desc)
			if err != nil {
				// Its objects are planned without their own traffic this
				// round; the next asks again.
				d.log.Debug().Str("event", "placement_samples_unavailable").Str("node_rid", desc.GetNodeRid()).Err(err).Msg("a node's samples were not read")
				return
			}
			rid := desc.GetNodeRid()
			for i := range s.Edges {
				s.Edges[i].ToNode = rid
			}
			for i := range s.Loads {
				s.Loads[i].Node = rid
			}
			mu.Lock()
			out.edges = append(out.edges, s.Edges...)
			out.loads = append(out.loads, s.Loads...)
			out.nodes = append(out.nodes, LoadNode{Rid: rid, Load: s.NodeLoad})
			mu.Unlock()
		}(n.Node)
	}
	wg.Wait()
	return out
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
// outcome (docs/PLACEMENT.md §4); "" when it stays unknown. asked: the
// source was asked (the ledger reserved the attempt).
func (d *Director) attempt(m Move) (o Outcome, asked bool) {
	now := d.clock().Now()
	a := Attempt{Op: uuid.NewString(), Key: m.Unit.Key, SourceRid: m.Unit.Owner, SourceGen: m.Unit.SourceGen,
		ObjectGen: m.Unit.ObjectGen, OwnerGen: m.Unit.OwnerGen, TargetRid: m.Target, DeadlineMs: now.Add(d.cfg.AttemptTimeout).UnixMilli()}
	ctx, cancel := machine.WithDeadline(d.quit, d.clock(), now.Add(d.cfg.AttemptTimeout))
	defer cancel()
	v, err := d.reserve(ctx, a)
	if err != nil {
		d.log.Warn().Str("event", "placement_reserve_failed").Str("object_id", m.Unit.Ref.ID).Err(err).Msg("the placement ledger could not be written; nothing was asked")
		return "", false
	}
	if !v.Go {
		d.count(a, v.Outcome)
		return v.Outcome, false
	}
	err = d.env.Move(ctx, m.Unit.Ref, m.Target, d.cfg.IdleWindow)
	o, known := classify(err)
	asked = true
	if !known {
		o = d.reconcile(m.Unit, a)
	}
	if o == "" {
		d.log.Warn().Str("event", "placement_outcome_unknown").Str("object_id", m.Unit.Ref.ID).Str("operation", a.Op).Err(err).
			Msg("an attempt's outcome stays unknown; its reservation counts until its deadline")
		return "", true
	}
	if err := d.finish(a, o); err != nil {
		d.log.Warn().Str("event", "placement_finish_failed").Str("object_id", m.Unit.Ref.ID).Err(err).Msg("the outcome was not recorded; the reservation expires at its deadline")
	}
	d.count(a, o)
	if o == Committed {
		d.log.Info().Str("event", "placement_moved").Str("object_id", m.Unit.Ref.ID).Str("from", a.SourceRid).Str("to", a.TargetRid).Msg("an idle unit moved")
	}
	return o, true
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

// reconcile decides an ambiguous attempt from the unit's record: owned by
// the target → committed; still the source's at the selected generations
// → not committed, source unchanged (deferred); anything else → stale. A
// record not found is not proof that nothing happened: stale. A store
// error is retried until the attempt's deadline; "" then (unknown).
func (d *Director) reconcile(u Unit, a Attempt) Outcome {
	deadline := time.UnixMilli(a.DeadlineMs)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		ctx, cancel := machine.WithTimeout(d.quit, d.clock(), 5*time.Second)
		v, err := d.env.Store.Read(ctx, u.Ref)
		cancel()
		switch {
		case errors.Is(err, location.ErrNotFound):
			return Stale
		case err == nil:
			r := v.Record
			switch {
			case r.GetOwner().GetNodeRid() == a.TargetRid:
				return Committed
			case r.GetOwner().GetNodeRid() == a.SourceRid && r.GetAuthorityOwnerGeneration() == a.OwnerGen && r.GetObjectGeneration() == a.ObjectGen:
				return Deferred
			}
			return Stale
		}
		if d.clock().Now().Add(wait).After(deadline) {
			return ""
		}
		select {
		case <-machine.After(machine.Real, wait): // pacing
		case <-d.stop:
			return ""
		}
	}
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
