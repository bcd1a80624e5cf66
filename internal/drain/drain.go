// Package drain empties a node for a rolling deploy: it moves every unit
// the node serves to other nodes with the ordinary hand-off, a bounded
// number at a time, placing each by the targets' load and capacity, and
// reports progress per unit (docs/OPERATIONS.md). The node has stopped
// taking new objects before Run starts (meshnode.Node.SetDraining); Run
// only decides where each unit goes and keeps count.
package drain

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
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
	r := &run{h: h, opts: opts, tries: map[location.AuthorityKey]int{}, lastErr: map[location.AuthorityKey]error{}, exhausted: map[location.AuthorityKey]bool{},
		pendingSince: map[location.AuthorityKey]time.Time{}, done: map[location.AuthorityKey]bool{},
		seen: map[location.AuthorityKey]bool{}, res: Result{Started: machine.Or(opts.Clock).Now()}, clock: machine.Or(opts.Clock)}
	err := r.loop(ctx)
	r.res.Finished = r.clock.Now()
	r.res.PauseP50, r.res.PauseP99 = percentile(r.pauses, 50), percentile(r.pauses, 99)
	sort.Slice(r.res.Failed, func(i, j int) bool { return r.res.Failed[i].Key.String() < r.res.Failed[j].Key.String() })
	return r.res, err
}

type run struct {
	h      Host
	opts   Options
	mu     sync.Mutex // guards everything below (the workers report here)
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
	clock        machine.Clock
	done         map[location.AuthorityKey]bool
	seen         map[location.AuthorityKey]bool
	goneN        int
	// refused: targets that refused a move as draining (for the rest of the
	// drain) — full ones are asked again each round.
	refused map[string]bool
}

func (r *run) loop(ctx context.Context) error {
	wait, idle := time.Millisecond, 50*time.Millisecond
	for {
		inv, err := r.h.Inventory(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, u := range inv.Unmovable {
			r.finish(UnitResult{Key: u.Key, Err: u.Err}, false)
		}
		pending := r.settleLeft(ctx, inv)
		var todo, spent []relocation.Unit
		r.mu.Lock()
		for _, u := range inv.Movable {
			switch {
			case r.done[u.Key]:
			case r.exhausted[u.Key]:
				spent = append(spent, u)
			default:
				todo = append(todo, u)
			}
		}
		r.mu.Unlock()
		if ctx.Err() != nil {
			for _, u := range append(todo, spent...) {
				r.finish(UnitResult{Key: u.Key, Err: fmt.Errorf("%w: drain ended before %s moved: %w", roamerr.ErrDeadlineExceeded, u.Key, ctx.Err())}, false)
			}
			// Units still moving, or gone without the store saying where.
			r.mu.Lock()
			var open []location.AuthorityKey
			for k := range r.seen {
				if !r.done[k] {
					open = append(open, k)
				}
			}
			r.mu.Unlock()
			for _, k := range open {
				r.finish(UnitResult{Key: k, Err: fmt.Errorf("%w: drain ended while %s was moving: %w", roamerr.ErrDeadlineExceeded, k, ctx.Err())}, false)
			}
			return nil
		}
		if len(todo) == 0 {
			if len(inv.Busy) == 0 && pending == 0 {
				for _, u := range spent {
					r.mu.Lock()
					err := r.lastErr[u.Key]
					r.mu.Unlock()
					r.finish(UnitResult{Key: u.Key, Err: err}, false)
				}
				return nil
			}
			// Moves in or out are under way: an arrival is a unit to move on.
			select {
			case <-ctx.Done():
			case <-machine.After(r.clock, wait): // pacing, on the node's clock
			}
			wait = min(2*wait, 100*time.Millisecond)
			continue
		}
		wait = time.Millisecond
		r.mu.Lock()
		before := r.res.Moved
		r.mu.Unlock()
		r.round(ctx, todo)
		r.mu.Lock()
		stuck := r.res.Moved == before
		r.mu.Unlock()
		if stuck {
			// Nothing moved: targets or the store are failing. Back off so
			// a short outage uses up time rather than every unit's tries.
			select {
			case <-ctx.Done():
			case <-machine.After(r.clock, idle): // pacing, on the node's clock
			}
			idle = min(2*idle, time.Second)
		} else {
			idle = 50 * time.Millisecond
		}
	}
}

// round moves todo with at most Concurrency moves at a time.
func (r *run) round(ctx context.Context, todo []relocation.Unit) {
	r.mu.Lock()
	for _, u := range todo {
		r.see(u.Key)
	}
	r.mu.Unlock()
	targets, err := r.h.Targets(ctx)
	if err != nil {
		for _, u := range todo {
			r.retry(u, UnitResult{Key: u.Key, Err: err})
		}
		return
	}
	p := newPlacer(targets)
	sem := make(chan struct{}, r.opts.Concurrency)
	var wg sync.WaitGroup
	for _, u := range todo {
		r.mu.Lock()
		t := p.pick(u.StableType, r.refused)
		r.mu.Unlock()
		if t == nil {
			err := fmt.Errorf("%w: every other node that serves %q is full or draining", roamerr.ErrCapacityExceeded, u.StableType)
			if !p.hosts(u.StableType) {
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
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func(u relocation.Unit, t *Target) {
			defer func() { <-sem; wg.Done() }()
			out, err := r.h.Move(ctx, u.Key, t.Rid)
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
				r.mu.Lock()
				if r.refused == nil {
					r.refused = map[string]bool{}
				}
				r.refused[t.Rid] = true
				r.mu.Unlock()
				r.retry(u, res)
			case errors.Is(err, roamerr.ErrInvalidOperation), errors.Is(err, roamerr.ErrTypeMismatch):
				r.finish(res, false)
			default:
				r.retry(u, res)
			}
		}(u, t)
	}
	wg.Wait()
}

func (r *run) isDone(key location.AuthorityKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done[key]
}

// settleLeft finishes the units found earlier that are no longer on the
// node although no move of theirs answered success: the store says where
// they are. A move can commit and still answer an error (its confirmation
// was lost); a unit can also be closed meanwhile. A unit the store still
// names this node for is pending: its source follows from the cutover on,
// before the target commits (or, by its restore deadline, gives up and the
// source serves it again). It returns how many are pending.
func (r *run) settleLeft(ctx context.Context, inv relocation.Inventory) (pending int) {
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
	r.mu.Lock()
	var left []location.AuthorityKey
	for k := range r.seen {
		if !r.done[k] && !here[k] {
			left = append(left, k)
		}
	}
	last := maps.Clone(r.lastErr)
	r.mu.Unlock()
	for _, k := range left {
		// The read decides, so a store that fails now and then is asked
		// again rather than the unit counted unknown.
		owner, err := r.h.Owner(ctx, k)
		for wait := 5 * time.Millisecond; err != nil && ctx.Err() == nil && wait < time.Second; wait *= 2 {
			// The pause ends with ctx too: on a node whose clock stands
			// still (logical time, a stopping node) it would never end.
			if machine.Sleep(ctx, r.clock, wait) != nil { // pacing, on the node's clock
				break
			}
			owner, err = r.h.Owner(ctx, k)
		}
		switch {
		case err != nil:
			r.finish(UnitResult{Key: k, Err: fmt.Errorf("%w: %s left the node, where to is unknown: %v", roamerr.ErrUnavailable, k, err)}, false)
		case owner == "":
			r.gone(k)
		case owner != r.h.Self():
			r.finish(UnitResult{Key: k, To: owner}, true)
		default:
			r.mu.Lock()
			since, ok := r.pendingSince[k]
			if !ok {
				since = r.clock.Now()
				r.pendingSince[k] = since
			}
			r.mu.Unlock()
			if machine.Since(r.clock, since) < pendingPatience {
				pending++
				continue
			}
			err := last[k]
			if err == nil {
				err = fmt.Errorf("%w: %s is owned here but no longer served", roamerr.ErrUnavailable, k)
			}
			r.finish(UnitResult{Key: k, Err: err}, false)
		}
	}
	return pending
}

// pendingPatience bounds how long a unit may be neither served here nor
// owned elsewhere: well past any move's restore deadline.
const pendingPatience = time.Minute

// retry counts a failed try; after attempts the unit is not tried again.
func (r *run) retry(u relocation.Unit, res UnitResult) {
	r.mu.Lock()
	r.tries[u.Key]++
	r.lastErr[u.Key] = res.Err
	if r.tries[u.Key] >= attempts {
		r.exhausted[u.Key] = true
	}
	r.mu.Unlock()
}

// gone forgets a unit that is no longer this node's to move.
func (r *run) gone(key location.AuthorityKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done[key] {
		r.done[key] = true
		r.goneN++
		r.res.Total = len(r.seen) - r.goneN
	}
}

// see counts a unit found (under mu).
func (r *run) see(key location.AuthorityKey) {
	r.seen[key] = true
	r.res.Total = len(r.seen) - r.goneN
}

func (r *run) finish(res UnitResult, moved bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
