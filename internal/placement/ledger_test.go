package placement

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/roamerr"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func att(op, key string) Attempt {
	return Attempt{Op: op, Key: key, SourceRid: "a", SourceGen: 1, ObjectGen: 2, OwnerGen: 3, TargetRid: "b", DeadlineMs: t0.Add(time.Minute).UnixMilli()}
}

// A repeat of an attempt keeps its identity: in flight it goes on, once
// finished it gets the recorded outcome; the same operation ID with
// another tuple never shares another attempt's result (Conflict).
// Reference: docs/PLACEMENT.md §4 (operation ID).
func TestRepeatsKeepTheirIdentity(t *testing.T) {
	lim := Limits{Rate: 10, Burst: 10, Concurrency: 4}
	l := &Ledger{}
	a := att("op1", "actor/x")
	v, changed, err := l.Reserve(a, lim, t0)
	require.NoError(t, err)
	require.True(t, v.Go)
	require.True(t, changed)
	v, changed, err = l.Reserve(a, lim, t0)
	require.NoError(t, err)
	require.True(t, v.Go, "a repeat in flight goes on")
	require.False(t, changed, "and takes no second slot")
	require.Len(t, l.InFlight, 1)

	other := a
	other.TargetRid = "c"
	_, _, err = l.Reserve(other, lim, t0)
	roamerrtest.AssertOneClass(t, err, roamerr.ErrConflict)

	require.True(t, l.Finish(a, Committed, lim, t0))
	require.False(t, l.Finish(a, Stale, lim, t0), "finished once")
	v, _, err = l.Reserve(a, lim, t0)
	require.NoError(t, err)
	require.False(t, v.Go)
	require.Equal(t, Committed, v.Outcome, "a repeat of a finished attempt gets its outcome")
	_, _, err = l.Reserve(other, lim, t0)
	roamerrtest.AssertOneClass(t, err, roamerr.ErrConflict)
}

// The ledger's limits: at most Concurrency in flight, at most Burst at
// once then Rate per second, one attempt per object at a time and none in
// its cooldown; a reservation past its deadline no longer counts.
func TestLimitsHold(t *testing.T) {
	lim := Limits{Rate: 2, Burst: 3, Concurrency: 2, Cooldown: 10 * time.Second}
	l := &Ledger{}
	reserve := func(op, key string, at time.Time) Verdict {
		t.Helper()
		v, _, err := l.Reserve(att(op, key), lim, at)
		require.NoError(t, err)
		return v
	}
	require.True(t, reserve("1", "k1", t0).Go)
	v := reserve("2", "k1", t0)
	require.Equal(t, Deferred, v.Outcome, "one attempt per object")
	require.True(t, reserve("3", "k2", t0).Go)
	v = reserve("4", "k3", t0)
	require.Equal(t, Deferred, v.Outcome)
	require.Contains(t, v.Why, "in flight")

	l.Finish(att("1", "k1"), Committed, lim, t0)
	l.Finish(att("3", "k2"), Busy, lim, t0)
	v = reserve("5", "k1", t0.Add(5*time.Second))
	require.Equal(t, Deferred, v.Outcome)
	require.Contains(t, v.Why, "cools down")
	require.True(t, reserve("6", "k1", t0.Add(11*time.Second)).Go, "after its cooldown")

	// The rate: the burst left one token at t0; refilled at 2/s.
	l2 := &Ledger{}
	lim2 := Limits{Rate: 2, Burst: 3, Concurrency: 100}
	n := 0
	for i := range 10 {
		v, _, err := l2.Reserve(att(fmt.Sprint("r", i), fmt.Sprint("k", i)), lim2, t0)
		require.NoError(t, err)
		if v.Go {
			n++
		}
	}
	require.Equal(t, 3, n, "the burst")
	v2, _, _ := l2.Reserve(att("later", "k-later"), lim2, t0.Add(499*time.Millisecond))
	require.Equal(t, Deferred, v2.Outcome)
	v2, _, _ = l2.Reserve(att("later2", "k-later2"), lim2, t0.Add(500*time.Millisecond))
	require.True(t, v2.Go, "one token after half a second at 2/s")

	// A reservation past its deadline frees its slot.
	l3 := &Ledger{}
	lim3 := Limits{Rate: 100, Burst: 100, Concurrency: 1}
	a := att("x", "kx")
	a.DeadlineMs = t0.Add(time.Second).UnixMilli()
	v3, _, _ := l3.Reserve(a, lim3, t0)
	require.True(t, v3.Go)
	v3, _, _ = l3.Reserve(att("y", "ky"), lim3, t0.Add(500*time.Millisecond))
	require.Equal(t, Deferred, v3.Outcome)
	v3, _, _ = l3.Reserve(att("y", "ky"), lim3, t0.Add(time.Second))
	require.True(t, v3.Go, "the expired reservation no longer counts")
}

// A ledger round-trips through its encoding and fits its size limit by
// dropping kept outcomes and cooldowns first, never a reservation.
func TestLedgerEncodingFits(t *testing.T) {
	lim := Limits{Rate: 1e6, Burst: 1e6, Concurrency: 8, Cooldown: time.Hour}
	l := &Ledger{}
	long := strings.Repeat("k", 250)
	for i := range 400 {
		a := att(fmt.Sprint("op", i), fmt.Sprint(long, i))
		v, _, err := l.Reserve(a, lim, t0)
		require.NoError(t, err)
		require.True(t, v.Go)
		if i < 395 {
			l.Finish(a, Committed, lim, t0)
		}
	}
	require.Len(t, l.InFlight, 5)
	b := l.Encode(64 << 10)
	require.LessOrEqual(t, len(b), 64<<10)
	back, err := Decode(b)
	require.NoError(t, err)
	require.Len(t, back.InFlight, 5, "reservations always stay")
	require.NotEmpty(t, back.Done)
	empty, err := Decode(nil)
	require.NoError(t, err)
	require.Empty(t, empty.InFlight)
	_, err = Decode([]byte("{"))
	roamerrtest.AssertOneClass(t, err, roamerr.ErrInvalidOperation)
}
