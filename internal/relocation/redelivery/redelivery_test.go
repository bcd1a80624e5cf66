package redelivery

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/roamerr"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func policy() Policy {
	return Policy{FollowDuration: 3 * time.Second, Window: 10 * time.Second, Patience: 30 * time.Second,
		Backoff: 50 * time.Millisecond, BackoffMax: 2 * time.Second}
}

// A drain waits the follow period, at most the redelivery window; a
// delivery older than that is not drained.
func TestDrainWindow(t *testing.T) {
	p := policy()
	require.Equal(t, 3*time.Second, p.DrainWindow())
	p.FollowDuration = 20 * time.Second
	require.Equal(t, 10*time.Second, p.DrainWindow(), "at most the window")
	p.FollowDuration = 0
	require.Equal(t, 10*time.Second, p.DrainWindow(), "no follow period: the window")

	p = policy()
	require.True(t, p.Drains(t0, t0.Add(3*time.Second)))
	require.False(t, p.Drains(t0, t0.Add(3*time.Second+1)))
}

// A dead letter, event by event: the first of a send with nothing held
// goes at once; the same send again is held for a pause that doubles
// with each dead letter up to the maximum; later sends of the object
// queue behind a running pause; past the patience the send fails.
func TestDeadLetterRedelivery(t *testing.T) {
	p := policy()
	require.Equal(t, Decision{Verdict: Now}, p.DeadLettered(Send{N: 1, First: t0}, t0, false, false))
	require.Equal(t, Decision{Verdict: Hold}, p.DeadLettered(Send{N: 1, First: t0}, t0, true, true),
		"a first dead letter queues behind the object's held sends, in order")
	// The send's 2nd, 3rd, ... dead letter.
	waits := []time.Duration{100, 200, 400, 800, 1600, 2000, 2000}
	for i, want := range waits {
		n := i + 2
		d := p.DeadLettered(Send{N: n, First: t0}, t0.Add(time.Second), false, false)
		require.Equal(t, Decision{Verdict: Hold, Arm: true, After: want * time.Millisecond}, d, "dead letter %d", n)
	}
	require.Equal(t, Decision{Verdict: Hold, Arm: true, After: 50 * time.Millisecond}, p.DeadLettered(Send{N: 1, First: t0}, t0, true, false),
		"held with no pause running: one is armed")
	require.Equal(t, Decision{Verdict: Hold}, p.DeadLettered(Send{N: 3, First: t0}, t0, true, true), "one pause per object")
	require.Equal(t, Decision{Verdict: Now}, p.DeadLettered(Send{N: 1, First: t0}, t0.Add(30*time.Second), false, false), "at the patience: still")
	require.Equal(t, Decision{Verdict: Fail}, p.DeadLettered(Send{N: 5, First: t0}, t0.Add(30*time.Second+1), true, true), "past it: fails loudly")
	p.BackoffMax = time.Hour
	require.Equal(t, 50*time.Millisecond<<6, p.DeadLettered(Send{N: 20, First: t0}, t0, false, false).After, "the doubling stops at 2^6")
}

// Bookkeeping is swept at most once per patience, a send's kept twice
// the patience; an object's dead letter is logged once per follow period.
func TestDeadLetterBookkeeping(t *testing.T) {
	p := policy()
	require.False(t, p.SweepDue(t0, t0.Add(30*time.Second)))
	require.True(t, p.SweepDue(t0, t0.Add(30*time.Second+1)))
	require.False(t, p.Forgotten(t0, t0.Add(60*time.Second)))
	require.True(t, p.Forgotten(t0, t0.Add(60*time.Second+1)))
	require.True(t, p.LogDue(time.Time{}, false, t0), "never logged")
	require.False(t, p.LogDue(t0, true, t0.Add(3*time.Second)))
	require.True(t, p.LogDue(t0, true, t0.Add(3*time.Second+1)))
}

// A look-up of the owner is tried again, paced 50 ms doubling to 1 s,
// until it finds one or the object is gone.
func TestResolveAgain(t *testing.T) {
	unavailable := fmt.Errorf("%w: store down", roamerr.ErrUnavailable)
	var waits []time.Duration
	wait := time.Duration(0)
	for range 7 {
		again, after := ResolveAgain(unavailable, wait)
		require.True(t, again)
		waits = append(waits, after)
		wait = after
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}, waits)
	again, _ := ResolveAgain(nil, wait)
	require.False(t, again, "found")
	again, _ = ResolveAgain(fmt.Errorf("%w: gone", roamerr.ErrNotFound), wait)
	require.False(t, again, "the object is gone: final")
}

// A batch is delivered, or fails loudly: Unavailable once the lifecycle
// ended (whatever the look-up found), else with the look-up's error.
func TestBatchOutcome(t *testing.T) {
	require.Equal(t, Deliver, Batch(false, nil))
	require.Equal(t, FailNoOwner, Batch(false, roamerr.ErrNotFound))
	require.Equal(t, Abandon, Batch(true, nil))
	require.Equal(t, Abandon, Batch(true, roamerr.ErrNotFound))
}
