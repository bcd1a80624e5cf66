package drain

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Units go to the least loaded target per weight that hosts their type,
// never past a target's capacity.
func TestPlacerSpreadsByLoadWeightAndCapacity(t *testing.T) {
	p := newPlacer([]Target{
		{Rid: "a", StableTypes: []string{"x"}, Weight: 1, Serving: 0},
		{Rid: "b", StableTypes: []string{"x"}, Weight: 3, Serving: 0},
		{Rid: "c", StableTypes: []string{"x", "y"}, Weight: 1, Serving: 10, Capacity: 12},
	})
	got := map[string]int{}
	for range 400 {
		got[p.pick("x", nil).Rid]++
	}
	require.Equal(t, 2, got["c"], "c has room for 2 more")
	require.InDelta(t, 3, float64(got["b"])/float64(got["a"]), 0.1, "b weighs 3 times a: %v", got)
	require.Nil(t, p.pick("y", nil), "c, the only one hosting y, is full")
	require.Nil(t, p.pick("z", nil), "nobody hosts z")
	require.Equal(t, "a", p.pick("x", map[string]bool{"b": true}).Rid, "a refused target is skipped")
}

// fakeHost is a node's inventory and a mesh of targets as Run sees them:
// Move takes the unit off the inventory unless told to fail it.
type fakeHost struct {
	mu       sync.Mutex
	units    map[location.AuthorityKey]string
	targets  []Target
	fail     map[string]error // per target RID
	failUnit map[location.AuthorityKey]error
	// lostAnswer: the move of these commits, but answers an error.
	lostAnswer map[location.AuthorityKey]bool
	moved      map[location.AuthorityKey]string
	tries      map[location.AuthorityKey]int
	fixed      []relocation.UnitRefusal
	// ownerErr: Owner fails with it (the store failing); owners counts
	// the calls.
	ownerErr error
	owners   int
	// busy: units moving in or out, listed as such by every inventory.
	busy []location.AuthorityKey
	// holdMoves: Move waits for its context to end and answers its error;
	// moving counts the moves under way, started the moves asked for.
	holdMoves       bool
	moving, started int
}

func (h *fakeHost) Inventory(context.Context) (relocation.Inventory, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var inv relocation.Inventory
	for k, st := range h.units {
		inv.Movable = append(inv.Movable, relocation.Unit{Key: k, StableType: st})
	}
	inv.Unmovable = h.fixed
	inv.Busy = h.busy
	return inv, nil
}

func (h *fakeHost) Owner(_ context.Context, key location.AuthorityKey) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.owners++
	if h.ownerErr != nil {
		return "", h.ownerErr
	}
	if rid, ok := h.moved[key]; ok {
		return rid, nil
	}
	if _, ok := h.units[key]; ok {
		return "self", nil
	}
	return "", nil
}

func (h *fakeHost) Self() string { return "self" }

func (h *fakeHost) Targets(context.Context) ([]Target, error) {
	return append([]Target(nil), h.targets...), nil
}

func (h *fakeHost) Move(ctx context.Context, key location.AuthorityKey, rid string) (relocation.Outcome, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holdMoves {
		h.moving++
		h.started++
		h.mu.Unlock()
		<-ctx.Done()
		h.mu.Lock()
		h.moving--
		return relocation.Outcome{}, fmt.Errorf("%w: %w", roamerr.ErrDeadlineExceeded, ctx.Err())
	}
	h.tries[key]++
	if err := h.failUnit[key]; errors.Is(err, roamerr.ErrNotFound) {
		delete(h.units, key) // closed meanwhile
		return relocation.Outcome{}, err
	}
	if err := h.failUnit[key]; err != nil {
		return relocation.Outcome{}, err
	}
	if err := h.fail[rid]; err != nil {
		return relocation.Outcome{}, err
	}
	delete(h.units, key)
	h.moved[key] = rid
	if h.lostAnswer[key] {
		return relocation.Outcome{}, fmt.Errorf("%w: commit not confirmed", roamerr.ErrUnavailable)
	}
	return relocation.Outcome{Key: key, To: rid}, nil
}

// A drain moves every unit, skips a target that turns out to be draining,
// retries a unit a bounded number of times, and lists what stayed and why.
func TestRunMovesEveryUnitAndReportsTheRest(t *testing.T) {
	h := &fakeHost{units: map[location.AuthorityKey]string{}, moved: map[location.AuthorityKey]string{}, tries: map[location.AuthorityKey]int{},
		targets: []Target{{Rid: "b", StableTypes: []string{"x"}}, {Rid: "c", StableTypes: []string{"x"}}},
		fail:    map[string]error{"c": fmt.Errorf("%w: %w", roamerr.ErrUnavailable, roamerr.ErrNodeDraining)},
		failUnit: map[location.AuthorityKey]error{
			location.Key(location.KindActor, "stuck"): fmt.Errorf("%w: target busy", roamerr.ErrUnavailable),
			location.Key(location.KindActor, "gone"):  fmt.Errorf("%w: closed", roamerr.ErrNotFound),
		},
		fixed:      []relocation.UnitRefusal{{Unit: relocation.Unit{Key: location.Key(location.KindUserSpot, "room")}, Err: roamerr.ErrInvalidOperation}},
		lostAnswer: map[location.AuthorityKey]bool{location.Key(location.KindActor, "7"): true},
	}
	for i := range 50 {
		h.units[location.Key(location.KindActor, fmt.Sprint(i))] = "x"
	}
	h.units[location.Key(location.KindActor, "stuck")] = "x"
	h.units[location.Key(location.KindActor, "gone")] = "x"
	var progress []Progress
	res, err := Run(context.Background(), h, Options{Concurrency: 4, OnProgress: func(p Progress) { progress = append(progress, p) }})
	require.NoError(t, err)
	require.Equal(t, 50, res.Moved, "the move whose answer was lost counts as moved: the store says so")
	for k, rid := range h.moved {
		require.Equal(t, "b", rid, "%s went to the draining target", k)
	}
	require.Len(t, res.Failed, 2)
	require.Equal(t, "stuck", res.Failed[0].Key.ID)
	require.Equal(t, "room", res.Failed[1].Key.ID)
	require.ErrorIs(t, res.Failed[0].Err, roamerr.ErrUnavailable)
	require.Equal(t, attempts, h.tries[location.Key(location.KindActor, "stuck")])
	require.False(t, res.Complete())
	require.ErrorIs(t, res.Err(), roamerr.ErrUnavailable, "the first failure's class")
	last := progress[len(progress)-1]
	require.Equal(t, 52, last.Total, "gone is not counted")
	require.Equal(t, 0, last.Remaining())
}

// A drain whose context ends lists every unit not moved with the
// context's error.
func TestRunStopsAtItsContext(t *testing.T) {
	h := &fakeHost{units: map[location.AuthorityKey]string{location.Key(location.KindActor, "a"): "x"},
		moved: map[location.AuthorityKey]string{}, tries: map[location.AuthorityKey]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Run(ctx, h, Options{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	require.ErrorIs(t, res.Failed[0].Err, roamerr.ErrDeadlineExceeded)
}

// A unit that left the node while the store fails to say where is asked
// about again after pauses on the node's clock; a drain whose context ends
// meanwhile ends even when that clock stands still (logical time, a node
// stopping), with the unit failed. The pause once ignored the context.
func TestRunEndsAtItsContextInAPauseOnAStoppedClock(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	h := &fakeHost{units: map[location.AuthorityKey]string{key: "x"}, moved: map[location.AuthorityKey]string{}, tries: map[location.AuthorityKey]int{},
		targets:  []Target{{Rid: "b", StableTypes: []string{"x"}}},
		failUnit: map[location.AuthorityKey]error{key: fmt.Errorf("%w: closed", roamerr.ErrNotFound)},
		ownerErr: fmt.Errorf("%w: store down", roamerr.ErrUnavailable)}
	clock := machine.NewManual()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type ended struct {
		res Result
		err error
	}
	done := make(chan ended, 1)
	go func() {
		res, err := Run(ctx, h, Options{Clock: clock})
		done <- ended{res, err}
	}()
	owners := func() int { h.mu.Lock(); defer h.mu.Unlock(); return h.owners }
	// Let the drain's own pauses pass until the store has been asked once
	// and the drain waits to ask again.
	testwait.Within(t, 30*time.Second, func() bool {
		if clock.Armed() == 0 {
			return false
		}
		if owners() > 0 {
			return true
		}
		clock.Advance(time.Second)
		return false
	}, "the drain to ask the store where the unit went, then pause")
	cancel()
	e := testwait.Recv(t, done, "the drain to end at its context while its clock stands still")
	require.NoError(t, e.err)
	require.Len(t, e.res.Failed, 1)
	require.ErrorIs(t, e.res.Failed[0].Err, roamerr.ErrUnavailable)
}

// A drain that ends at its context while it waits for moves under way
// elsewhere leaves no timer behind on the node's clock: its pause was
// armed on the drain's loop, which Run closes before it returns. The
// pause once stayed armed on the clock after Run returned.
func TestRunLeavesNoTimerArmedWhenItsContextEndsInAPause(t *testing.T) {
	testwait.NoLeaks(t)
	h := &fakeHost{units: map[location.AuthorityKey]string{}, moved: map[location.AuthorityKey]string{}, tries: map[location.AuthorityKey]int{},
		busy: []location.AuthorityKey{location.Key(location.KindActor, "arriving")}}
	clock := machine.NewManual()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan Result, 1)
	go func() {
		res, err := Run(ctx, h, Options{Clock: clock})
		assert.NoError(t, err)
		done <- res
	}()
	testwait.For(t, func() bool { return clock.Armed() > 0 }, "the drain to pause while a unit is busy")
	cancel()
	res := testwait.Recv(t, done, "the drain to end at its context in its pause")
	require.Zero(t, res.Total, "a busy unit is not the drain's to move")
	require.Zero(t, clock.Armed(), "a timer of the drain outlived it")
}

// A drain whose context ends while moves are under way returns only once
// every move it asked for has answered, with each unit failed by the
// context: nothing it started runs on after it.
func TestRunReturnsAfterTheMovesItStartedAtItsContext(t *testing.T) {
	testwait.NoLeaks(t)
	h := &fakeHost{units: map[location.AuthorityKey]string{}, moved: map[location.AuthorityKey]string{}, tries: map[location.AuthorityKey]int{},
		targets: []Target{{Rid: "b", StableTypes: []string{"x"}}}, holdMoves: true}
	for i := range 5 {
		h.units[location.Key(location.KindActor, fmt.Sprint(i))] = "x"
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type ended struct {
		res    Result
		moving int
	}
	done := make(chan ended, 1)
	go func() {
		res, err := Run(ctx, h, Options{Concurrency: 2})
		assert.NoError(t, err)
		h.mu.Lock()
		defer h.mu.Unlock()
		done <- ended{res, h.moving}
	}()
	testwait.For(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.moving == 2 }, "two moves under way")
	cancel()
	e := testwait.Recv(t, done, "the drain to end at its context")
	require.Zero(t, e.moving, "Run returned with moves still under way")
	require.Equal(t, 2, h.started, "at most Concurrency moves at once, none started after the context ended")
	require.Len(t, e.res.Failed, 5)
	for _, f := range e.res.Failed {
		require.ErrorIs(t, f.Err, roamerr.ErrDeadlineExceeded, "%s", f.Key)
	}
}
