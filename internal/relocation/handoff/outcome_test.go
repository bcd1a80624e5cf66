package handoff

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// A record read after the cutover answers the caller who asked for the
// move: the target's commit, the move fenced out (the source serves
// again), the object owned by a third node, or — the record still at the
// source, or gone — not yet.
func TestCommitShownToTheCaller(t *testing.T) {
	const id = 7
	cases := []struct {
		name string
		v    RecordView
		done bool
		err  error
	}{
		{"committed by the target", RecordView{Present: true, OwnerNodeRid: "tgt", RelocationID: id}, true, nil},
		{"fenced out", RecordView{Present: true, OwnerNodeRid: "src", RelocationID: id}, true, roamerr.ErrUnavailable},
		{"owned by a third node", RecordView{Present: true, OwnerNodeRid: "other", RelocationID: 3}, true, roamerr.ErrStale},
		{"the target, by another move", RecordView{Present: true, OwnerNodeRid: "tgt", RelocationID: 3}, true, roamerr.ErrStale},
		{"still at the source", RecordView{Present: true, OwnerNodeRid: "src", RelocationID: 3}, false, nil},
		{"no record", RecordView{}, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done, err := CommitShown(id, objKey, "tgt", "src", tc.v)
			require.Equal(t, tc.done, done)
			if tc.err == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.err)
			}
		})
	}
}

// The caller waits past the restore deadline by a cutover wait and a
// restore timeout: the fence-out of a target that never commits comes
// only then.
func TestCommitPatience(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CutoverWaitTimeout = 3 * time.Second
	require.Equal(t, deadline.Add(5*time.Second), cfg.CommitPatience(deadline, 2*time.Second))
}

// An idle-only move is busy at the seal with a message queued or a timer
// due within the window; any other move never is, and asks no timer.
func TestBusyAtSeal(t *testing.T) {
	asked := 0
	due := func(name string, ok bool) func(time.Duration) (string, bool) {
		return func(w time.Duration) (string, bool) {
			asked++
			require.Equal(t, time.Second, w)
			return name, ok
		}
	}
	require.NoError(t, BusyAtSeal(objKey, false, 3, time.Second, due("tick", true)))
	require.Zero(t, asked, "not idle-only: no timer asked")
	err := BusyAtSeal(objKey, true, 2, time.Second, due("", false))
	require.ErrorIs(t, err, roamerr.ErrBusy)
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.Contains(t, err.Error(), "2 messages queued at the seal")
	err = BusyAtSeal(objKey, true, 0, time.Second, due("tick", true))
	require.ErrorIs(t, err, roamerr.ErrBusy)
	require.Contains(t, err.Error(), `timer "tick" is due within 1s`)
	require.NoError(t, BusyAtSeal(objKey, true, 0, time.Second, due("", false)))
}

// VerifySource tries again only while nothing is known of the source: its
// node unreachable, the store unavailable or its answer unknown — paced
// 5 ms doubling to 500 ms. A verdict (verified, a record not at the
// fence, capacity exceeded, the source's node gone) is answered at once.
func TestVerifyAgain(t *testing.T) {
	unreachable := fmt.Errorf("%w: source node not connected", roamerr.ErrUnavailable)
	for _, tc := range []struct {
		name  string
		err   error
		peer  bool
		again bool
	}{
		{"verified", nil, false, false},
		{"the source's node unreachable", unreachable, true, true},
		{"the source's node gone", fmt.Errorf("%w: no such member", roamerr.ErrStale), true, false},
		{"the store unavailable", fmt.Errorf("read: %w", location.ErrUnavailable), false, true},
		{"the store's answer unknown", location.ErrIndeterminate, false, true},
		{"not at the fence", testID.JudgeSource(RecordView{}, 1), false, false},
		{"capacity exceeded", roamerr.ErrCapacityExceeded, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			again, after := VerifyAgain(tc.err, tc.peer, 0)
			require.Equal(t, tc.again, again)
			if again {
				require.Equal(t, FirstVerifyWait, after)
			}
		})
	}
	var waits []time.Duration
	wait := time.Duration(0)
	for range 9 {
		_, wait = VerifyAgain(location.ErrIndeterminate, false, wait)
		waits = append(waits, wait)
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 500 * ms, 500 * ms}, waits)
}

// A pause that ends before the restore deadline is taken whole; one that
// reaches it ends at the deadline and ends the tries, and a deadline
// already past ends them at once.
func TestVerifyPause(t *testing.T) {
	now := time.Unix(100, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		deadline time.Time
		wait     time.Duration
		pause    time.Duration
		expired  bool
	}{
		{"before the deadline", now.Add(50 * ms), 40 * ms, 40 * ms, false},
		{"ends at the deadline", now.Add(40 * ms), 40 * ms, 40 * ms, true},
		{"past the deadline", now.Add(30 * ms), 40 * ms, 30 * ms, true},
		{"the deadline passed", now.Add(-ms), 40 * ms, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pause, expired := VerifyPause(now, tc.deadline, tc.wait)
			require.Equal(t, tc.pause, pause)
			require.Equal(t, tc.expired, expired)
		})
	}
}
