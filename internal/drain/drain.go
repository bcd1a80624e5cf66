// Package drain empties a node for a rolling deploy: it moves every unit
// the node serves to other nodes with the ordinary hand-off, a bounded
// number at a time, placing each by the targets' load and capacity, and
// reports progress per unit (docs/OPERATIONS.md). The node has stopped
// taking new objects before Run starts (meshnode.Node.SetDraining); Run
// only decides where each unit goes and keeps count.
package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Target is a node that may take units.
type Target struct {
	Rid, Name   string
	StableTypes []string
	// Weight is the node's placement weight (0 counts as 1).
	Weight int
	// Serving and Capacity are its load when asked (Capacity 0: unbounded).
	Serving, Capacity int
}

// Host is the draining node.
type Host interface {
	// Inventory lists the units the node serves now.
	Inventory(ctx context.Context) (relocation.Inventory, error)
	// Targets lists the live serving nodes that may take units, with their
	// load.
	Targets(ctx context.Context) ([]Target, error)
	// Move moves one unit to the node targetRid.
	Move(ctx context.Context, key location.AuthorityKey, targetRid string) (relocation.Outcome, error)
	// Owner reads the unit's owner in the store ("" when it has none): for
	// a unit that left the node although its move answered an error (the
	// answer was lost, the commit was not).
	Owner(ctx context.Context, key location.AuthorityKey) (string, error)
	// Self is the draining node's RID.
	Self() string
}

// Options tune a drain. Zero fields take the defaults written on them.
type Options struct {
	// Concurrency is how many units move at once. Default 64, at most 256
	// (a target keeps at most 256 unused move tickets per source node).
	Concurrency int
	// OnProgress, if set, is called after each unit moved or failed, one
	// call at a time; keep it quick.
	OnProgress func(Progress)
	// Clock times the drain and its patience with a unit left pending.
	// Default machine.Real; the extension passes the node's.
	Clock machine.Clock
}

// MaxConcurrency bounds Options.Concurrency.
const MaxConcurrency = 256

// Progress is a drain's count after one unit.
type Progress struct {
	// Total is the units found so far (arrivals during the drain add to it).
	Total, Moved, Failed int
	// Unit is the unit that just moved or failed.
	Unit UnitResult
}

// Remaining is what is left to move.
func (p Progress) Remaining() int { return p.Total - p.Moved - p.Failed }

// UnitResult is one unit's outcome.
type UnitResult struct {
	Key location.AuthorityKey
	// To is the target's node RID ("" when none was tried).
	To    string
	Pause time.Duration
	Bytes uint64
	Err   error
}

// Result is a finished drain.
type Result struct {
	Total, Moved int
	// Failed lists every unit that could not move, and why.
	Failed            []UnitResult
	Started, Finished time.Time
	// PauseP50 and PauseP99 of the units moved.
	PauseP50, PauseP99 time.Duration
}

// Complete reports whether every unit found moved.
func (r Result) Complete() bool { return len(r.Failed) == 0 }

// Err summarizes an incomplete drain as one error (nil when complete): of
// the class of its first failure.
func (r Result) Err() error {
	if r.Complete() {
		return nil
	}
	f := r.Failed[0]
	return roamerr.Keep(roamerr.ErrUnavailable, fmt.Sprintf("drain: %d of %d units did not move (first: %s)", len(r.Failed), r.Total, f.Key), f.Err)
}

// attempts bounds the tries of one unit: a target that started draining
// or filled up meanwhile is skipped and another tried, and a round in which
// nothing moved is followed by a pause (50 ms, doubling to 1 s).
const attempts = 6

// Run moves every unit of h to other nodes. It returns when nothing
// movable is left, or ctx ends (the units not moved by then are in Failed
// with ctx's error), with what it did; the error is for a drain that could
// not run at all (the inventory could not be read).
func Run(ctx context.Context, h Host, opts Options) (Result, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 64
	}
	opts.Concurrency = min(opts.Concurrency, MaxConcurrency)
	clock := machine.Or(opts.Clock)
	r := &run{h: h, opts: opts, ctx: ctx, clock: clock, loop: machine.NewLoop[pause](clock), ended: make(chan struct{}),
		tries: map[location.AuthorityKey]int{}, lastErr: map[location.AuthorityKey]error{}, exhausted: map[location.AuthorityKey]bool{},
		pendingSince: map[location.AuthorityKey]time.Time{}, done: map[location.AuthorityKey]bool{},
		seen: map[location.AuthorityKey]bool{}, res: Result{Started: clock.Now()},
		wait: time.Millisecond, idle: 50 * time.Millisecond}
	// A pause the drain is in ends with ctx, whichever clock it is on (one
	// that stands still: logical time, a stopping node).
	woke := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { defer close(woke); r.loop.Post(r.wake) })
	r.loop.Post(r.next)
	<-r.ended
	if !stop() {
		<-woke
	}
	// Nothing of the drain runs past here: no timer (Close cancels them),
	// no turn, no goroutine that was asking the host.
	r.loop.Close()
	<-r.loop.Done()
	r.calls.Wait()
	r.res.Finished = r.clock.Now()
	r.res.PauseP50, r.res.PauseP99 = percentile(r.pauses, 50), percentile(r.pauses, 99)
	// By kind name, then ID: a comparison that formats keys would allocate
	// twice per comparison, for every unit of a drain that fails whole.
	slices.SortFunc(r.res.Failed, func(a, b UnitResult) int {
		return cmp.Or(strings.Compare(location.KindName(a.Key.Kind), location.KindName(b.Key.Kind)), strings.Compare(a.Key.ID, b.Key.ID))
	})
	return r.res, r.err
}

// pause names the drain's timers: one pause at a time, between passes
// (round) or before asking the store again where a unit went (owner).
type pause string

const (
	roundPause pause = "round"
	ownerPause pause = "owner"
)

// run is one drain. It runs as a sequence of passes in the turns of loop:
// each pass reads the inventory, settles the units that left the node, and
// moves the rest in a round; the Host's calls run on goroutines of their
// own (calls) that post their answers back as turns. The fields from err
// on are owned by the loop's turns: no lock; Run reads them once the loop
// is done.
type run struct {
	h     Host
	opts  Options
	ctx   context.Context
	clock machine.Clock
	loop  *machine.Loop[pause]
	calls sync.WaitGroup
	// ended closes when the drain has its outcome (err).
	ended chan struct{}
	err   error

	res    Result
	pauses []time.Duration
	// tries per unit; done: units finished (moved, failed, or gone);
	// seen: every unit found; goneN: how many of them were not ours to move.
	tries map[location.AuthorityKey]int
	// lastErr: each unit's last failed try; exhausted: the units tried
	// attempts times, failed once no move of theirs is under way and they
	// still serve here (a try that answered an error may yet commit).
	lastErr   map[location.AuthorityKey]error
	exhausted map[location.AuthorityKey]bool
	// pendingSince: when a unit was first seen gone from the node while the
	// store still named it (settleLeft).
	pendingSince map[location.AuthorityKey]time.Time
	done         map[location.AuthorityKey]bool
	seen         map[location.AuthorityKey]bool
	goneN        int
	// refused: targets that refused a move as draining (for the rest of the
	// drain) — full ones are asked again each round.
	refused map[string]bool
	// wait: the pause while only moves in or out are under way; idle: the
	// pause after a round in which nothing moved.
	wait, idle time.Duration
	// resume continues the drain after the pause armed as pausing; it is
	// told whether ctx ended the pause.
	resume  func(ctxEnded bool)
	pausing pause
	// inFlight: moves asked of the host and not answered; round: the round
	// under way (nil between rounds).
	inFlight int
	round    *round
}

// call runs ask on a goroutine of its own (the host's calls block on the
// store and the network, a turn must not) and posts the turn it returns.
func (r *run) call(ask func() (answer func())) {
	r.calls.Add(1)
	go func() {
		defer r.calls.Done()
		r.loop.Post(ask())
	}()
}

// end gives Run its outcome. Nothing is under way then: no call, no pause.
func (r *run) end(err error) {
	r.err = err
	close(r.ended)
}

// pauseFor continues with then once d has passed on the drain's clock, or
// at once when ctx has ended.
func (r *run) pauseFor(k pause, d time.Duration, then func(ctxEnded bool)) {
	if r.ctx.Err() != nil {
		then(true)
		return
	}
	r.resume, r.pausing = then, k
	r.loop.Arm(k, d, func() { r.resumeAfter(false) })
}

// wake ends the pause under way, if any, as ctx ended.
func (r *run) wake() {
	if r.resume != nil && r.loop.Cancel(r.pausing) {
		r.resumeAfter(true)
	}
}

func (r *run) resumeAfter(ctxEnded bool) {
	then := r.resume
	r.resume = nil
	then(ctxEnded)
}

// next starts a pass: it reads the inventory.
func (r *run) next() {
	r.call(func() func() {
		inv, err := r.h.Inventory(r.ctx)
		return func() { r.inventoried(inv, err) }
	})
}

func (r *run) inventoried(inv relocation.Inventory, err error) {
	if err != nil {
		if r.ctx.Err() != nil {
			r.end(nil)
			return
		}
		r.end(err)
		return
	}
	for _, u := range inv.Unmovable {
		r.finish(UnitResult{Key: u.Key, Err: u.Err}, false)
	}
	r.settleLeft(inv)
}

// settled goes on with the pass once the units that left the node are
// settled, pending of them still named here by the store.
func (r *run) settled(inv relocation.Inventory, pending int) {
	var todo, spent []relocation.Unit
	for _, u := range inv.Movable {
		switch {
		case r.done[u.Key]:
		case r.exhausted[u.Key]:
			spent = append(spent, u)
		default:
			todo = append(todo, u)
		}
	}
	if err := r.ctx.Err(); err != nil {
		for _, u := range append(todo, spent...) {
			r.finish(UnitResult{Key: u.Key, Err: fmt.Errorf("%w: drain ended before %s moved: %w", roamerr.ErrDeadlineExceeded, u.Key, err)}, false)
		}
		// Units still moving, or gone without the store saying where.
		var open []location.AuthorityKey
		for k := range r.seen {
			if !r.done[k] {
				open = append(open, k)
			}
		}
		for _, k := range open {
			r.finish(UnitResult{Key: k, Err: fmt.Errorf("%w: drain ended while %s was moving: %w", roamerr.ErrDeadlineExceeded, k, err)}, false)
		}
		r.end(nil)
		return
	}
	if len(todo) == 0 {
		if len(inv.Busy) == 0 && pending == 0 {
			for _, u := range spent {
				r.finish(UnitResult{Key: u.Key, Err: r.lastErr[u.Key]}, false)
			}
			r.end(nil)
			return
		}
		// Moves in or out are under way: an arrival is a unit to move on.
		r.pauseFor(roundPause, r.wait, func(bool) { r.next() })
		r.wait = min(2*r.wait, 100*time.Millisecond)
		return
	}
	r.wait = time.Millisecond
	before := r.res.Moved
	r.startRound(todo, func() {
		if r.res.Moved == before {
			// Nothing moved: targets or the store are failing. Back off so
			// a short outage uses up time rather than every unit's tries.
			r.pauseFor(roundPause, r.idle, func(bool) { r.next() })
			r.idle = min(2*r.idle, time.Second)
			return
		}
		r.idle = 50 * time.Millisecond
		r.next()
	})
}

// round is one pass's moves: todo in order, at most Concurrency at a time.
type round struct {
	todo []relocation.Unit
	p    *placer
	// next: the first unit of todo not yet placed; held: the target picked
	// for todo[next], waiting for a move to end.
	next int
	held *Target
	then func()
}

// startRound moves todo with at most Concurrency moves at a time, then
// continues with then once every move it started has answered.
func (r *run) startRound(todo []relocation.Unit, then func()) {
	for _, u := range todo {
		r.see(u.Key)
	}
	r.call(func() func() {
		targets, err := r.h.Targets(r.ctx)
		return func() {
			if err != nil {
				for _, u := range todo {
					r.retry(u, UnitResult{Key: u.Key, Err: err})
				}
				then()
				return
			}
			r.round = &round{todo: todo, p: newPlacer(targets), then: then}
			r.dispatch()
		}
	})
}

// dispatch starts the round's next moves while fewer than Concurrency are
// under way, and ends the round once all of its moves have answered. A
// drain whose ctx ended starts no more.
func (r *run) dispatch() {
	rd := r.round
	for rd.next < len(rd.todo) {
		u := rd.todo[rd.next]
		if rd.held == nil {
			rd.held = rd.p.pick(u.StableType, r.refused)
		}
		if rd.held == nil {
			rd.next++
			err := fmt.Errorf("%w: every other node that serves %q is full or draining", roamerr.ErrCapacityExceeded, u.StableType)
			if !rd.p.hosts(u.StableType) {
				// Nobody to ask again (the last node of a kind stopping):
				// no point in waiting.
				// NotFound, not CapacityExceeded: no node is full, there
				// is none to go to (start one that registers the kind).
				r.finish(UnitResult{Key: u.Key, Err: fmt.Errorf("%w: no other live node serves kind %q: start one that registers it, or Stop without a drain", roamerr.ErrNotFound, u.StableType)}, false)
				continue
			}
			r.retry(u, UnitResult{Key: u.Key, Err: err})
			continue
		}
		if r.ctx.Err() != nil {
			rd.next, rd.held = len(rd.todo), nil
			break
		}
		if r.inFlight == r.opts.Concurrency {
			return // a move's answer dispatches again
		}
		t := rd.held
		rd.next, rd.held = rd.next+1, nil
		r.inFlight++
		r.call(func() func() {
			out, err := r.h.Move(r.ctx, u.Key, t.Rid)
			return func() { r.moved(u, t, out, err) }
		})
	}
	if r.inFlight == 0 {
		r.round = nil
		rd.then()
	}
}

// moved takes a move's answer.
func (r *run) moved(u relocation.Unit, t *Target, out relocation.Outcome, err error) {
	r.inFlight--
	res := UnitResult{Key: u.Key, To: t.Rid, Pause: out.Pause, Bytes: out.Bytes, Err: err}
	switch {
	case err == nil:
		r.finish(res, true)
	case errors.Is(err, roamerr.ErrNotFound):
		// It left the node (moved by an earlier try whose answer was
		// lost, by someone else, or closed): settleLeft asks the store
		// once the inventory no longer lists it.
		r.retry(u, res)
	case errors.Is(err, roamerr.ErrNodeDraining):
		if r.refused == nil {
			r.refused = map[string]bool{}
		}
		r.refused[t.Rid] = true
		r.retry(u, res)
	case errors.Is(err, roamerr.ErrInvalidOperation), errors.Is(err, roamerr.ErrTypeMismatch):
		r.finish(res, false)
	default:
		r.retry(u, res)
	}
	r.dispatch()
}

// settleLeft finishes the units found earlier that are no longer on the
// node although no move of theirs answered success: the store says where
// they are. A move can commit and still answer an error (its confirmation
// was lost); a unit can also be closed meanwhile. A unit the store still
// names this node for is pending: its source follows from the cutover on,
// before the target commits (or, by its restore deadline, gives up and the
// source serves it again). It asks about one unit at a time, then goes on
// with settled and how many are pending.
func (r *run) settleLeft(inv relocation.Inventory) {
	here := map[location.AuthorityKey]bool{}
	for _, u := range inv.Movable {
		here[u.Key] = true
	}
	for _, u := range inv.Unmovable {
		here[u.Key] = true
	}
	for _, k := range inv.Busy {
		here[k] = true
	}
	var left []location.AuthorityKey
	for k := range r.seen {
		if !r.done[k] && !here[k] {
			left = append(left, k)
		}
	}
	r.settleNext(inv, left, 0)
}

func (r *run) settleNext(inv relocation.Inventory, left []location.AuthorityKey, pending int) {
	if len(left) == 0 {
		r.settled(inv, pending)
		return
	}
	k := left[0]
	r.askOwner(k, 5*time.Millisecond, func(owner string, err error) {
		if r.settle(k, owner, err) {
			pending++
		}
		r.settleNext(inv, left[1:], pending)
	})
}

// askOwner reads k's owner from the store and gives then the answer. The
// read decides, so a store that fails now and then is asked again after
// wait (doubling, while under a second) rather than the unit counted
// unknown; the pause ends with ctx too.
func (r *run) askOwner(k location.AuthorityKey, wait time.Duration, then func(owner string, err error)) {
	r.call(func() func() {
		owner, err := r.h.Owner(r.ctx, k)
		return func() {
			if err == nil || r.ctx.Err() != nil || wait >= time.Second {
				then(owner, err)
				return
			}
			r.pauseFor(ownerPause, wait, func(ctxEnded bool) {
				if ctxEnded {
					then(owner, err)
					return
				}
				r.askOwner(k, 2*wait, then)
			})
		}
	})
}

// settle finishes k, which left the node, by what the store answered, and
// reports whether it is still pending.
func (r *run) settle(k location.AuthorityKey, owner string, err error) (pending bool) {
	switch {
	case err != nil:
		r.finish(UnitResult{Key: k, Err: fmt.Errorf("%w: %s left the node, where to is unknown: %v", roamerr.ErrUnavailable, k, err)}, false)
	case owner == "":
		r.gone(k)
	case owner != r.h.Self():
		r.finish(UnitResult{Key: k, To: owner}, true)
	default:
		since, ok := r.pendingSince[k]
		if !ok {
			since = r.clock.Now()
			r.pendingSince[k] = since
		}
		if machine.Since(r.clock, since) < pendingPatience {
			return true
		}
		err := r.lastErr[k]
		if err == nil {
			err = fmt.Errorf("%w: %s is owned here but no longer served", roamerr.ErrUnavailable, k)
		}
		r.finish(UnitResult{Key: k, Err: err}, false)
	}
	return false
}

// pendingPatience bounds how long a unit may be neither served here nor
// owned elsewhere: well past any move's restore deadline.
const pendingPatience = time.Minute

// retry counts a failed try; after attempts the unit is not tried again.
func (r *run) retry(u relocation.Unit, res UnitResult) {
	r.tries[u.Key]++
	r.lastErr[u.Key] = res.Err
	if r.tries[u.Key] >= attempts {
		r.exhausted[u.Key] = true
	}
}

// gone forgets a unit that is no longer this node's to move.
func (r *run) gone(key location.AuthorityKey) {
	if !r.done[key] {
		r.done[key] = true
		r.goneN++
		r.res.Total = len(r.seen) - r.goneN
	}
}

// see counts a unit found.
func (r *run) see(key location.AuthorityKey) {
	r.seen[key] = true
	r.res.Total = len(r.seen) - r.goneN
}

func (r *run) finish(res UnitResult, moved bool) {
	if r.done[res.Key] {
		return
	}
	r.done[res.Key] = true
	r.see(res.Key)
	if moved {
		r.res.Moved++
		if res.Pause > 0 { // unknown for a move whose answer was lost
			r.pauses = append(r.pauses, res.Pause)
		}
	} else {
		r.res.Failed = append(r.res.Failed, res)
	}
	if r.opts.OnProgress != nil {
		r.opts.OnProgress(Progress{Total: r.res.Total, Moved: r.res.Moved, Failed: len(r.res.Failed), Unit: res})
	}
}

// placer spreads units over targets: each goes to the target hosting its
// type with the least load per weight, counting what this drain already
// sent there, and never past a target's capacity.
type placer struct {
	targets []*Target
	sent    map[string]int
}

func newPlacer(ts []Target) *placer {
	p := &placer{sent: map[string]int{}}
	for i := range ts {
		p.targets = append(p.targets, &ts[i])
	}
	return p
}

func (p *placer) pick(stableType string, refused map[string]bool) *Target {
	var best *Target
	var bestScore float64
	for _, t := range p.targets {
		if refused[t.Rid] || !slices.Contains(t.StableTypes, stableType) {
			continue
		}
		load := t.Serving + p.sent[t.Rid]
		if t.Capacity > 0 && load >= t.Capacity {
			continue
		}
		score := float64(load+1) / float64(max(t.Weight, 1))
		if best == nil || score < bestScore {
			best, bestScore = t, score
		}
	}
	if best != nil {
		p.sent[best.Rid]++
	}
	return best
}

// hosts reports whether any target serves stableType.
func (p *placer) hosts(stableType string) bool {
	return slices.ContainsFunc(p.targets, func(t *Target) bool { return slices.Contains(t.StableTypes, stableType) })
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
