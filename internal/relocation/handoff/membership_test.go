package handoff

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

func isEntry(id string) bool { return strings.HasPrefix(id, "entry-") }

// An Entry Spot's membership, or none, is no User Spot's; a User Spot's is
// that incarnation.
func TestUserSpotOf(t *testing.T) {
	user := &messages.Membership{SpotId: "room", SpotGeneration: 3}
	for _, c := range []struct {
		name string
		rec  *location.Record
		want *messages.Membership
	}{
		{"no record", nil, nil},
		{"no membership", &location.Record{}, nil},
		{"entry spot", &location.Record{Membership: &messages.Membership{SpotId: "entry-n1", SpotGeneration: 1}}, nil},
		{"user spot", &location.Record{Membership: user}, user},
	} {
		require.Equal(t, c.want, UserSpotOf(c.rec, isEntry), c.name)
	}
}

// Two memberships are the same only with the same Spot and generation.
func TestSameMembership(t *testing.T) {
	m := func(id string, g uint64) *messages.Membership {
		return &messages.Membership{SpotId: id, SpotGeneration: g}
	}
	require.True(t, SameMembership(m("a", 1), m("a", 1)))
	require.False(t, SameMembership(m("a", 1), m("a", 2)), "another incarnation")
	require.False(t, SameMembership(m("a", 1), m("b", 1)), "another Spot")
	require.True(t, SameMembership(nil, nil))
	require.False(t, SameMembership(nil, m("a", 1)))
}

// Leaving takes one off the count of the incarnation the member names, at
// the version read; a gone, recreated or empty Spot takes nothing.
func TestLeaveOps(t *testing.T) {
	ms := &messages.Membership{SpotId: "room", SpotGeneration: 3}
	spot := func(gen uint64, count uint32) location.Versioned {
		return location.Versioned{Version: 9, Record: &location.Record{ObjectGeneration: gen, MemberCount: count}}
	}
	ops := LeaveOps(ms, spot(3, 2))
	require.Len(t, ops, 1)
	want := location.UpdateOp(location.Key(location.KindUserSpot, "room"), 9, nil)
	require.Equal(t, []any{want.Kind, want.Key, want.Version}, []any{ops[0].Kind, ops[0].Key, ops[0].Version})
	require.Equal(t, uint32(1), ops[0].Record.GetMemberCount(), "one less")
	require.Equal(t, uint64(3), ops[0].Record.GetObjectGeneration())

	require.Empty(t, LeaveOps(nil, spot(3, 2)), "no User Spot's member")
	require.Empty(t, LeaveOps(ms, location.Versioned{}), "the Spot is gone")
	require.Empty(t, LeaveOps(ms, spot(4, 2)), "the Spot was created anew")
	require.Empty(t, LeaveOps(ms, spot(3, 0)), "it counts nobody")
}

// A membership write that lost a race is tried again after a pause, up to
// MaxMembershipTries; any other failure ends it Unavailable at once.
func TestMembershipRetry(t *testing.T) {
	conflict := fmt.Errorf("apply: %w", location.ErrConflict)
	top := func(n int) int { return n - 1 }
	for try := 0; try < MaxMembershipTries; try++ {
		pause, err := MembershipRetry("join", try, conflict, top)
		require.NoError(t, err, "try %d", try)
		require.Equal(t, RacePause(try, top), pause)
	}
	_, err := MembershipRetry("join", MaxMembershipTries, conflict, top)
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "the last try")
	require.Contains(t, err.Error(), "lost 17 races")

	_, err = MembershipRetry("join", 0, fmt.Errorf("read: %w", location.ErrIndeterminate), top)
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "not a race: no retry")
	require.ErrorIs(t, err, location.ErrIndeterminate, "the cause is kept")
	_, err = MembershipRetry("join", 0, fmt.Errorf("apply: %w", location.ErrLeaseEnded), top)
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "not a race: no retry")
}

// A race's pause grows with the try (up to 64 ms) and is jittered; a
// failed store call's grows by 50 ms a try up to a second.
func TestRetryPauses(t *testing.T) {
	low := func(int) int { return 0 }
	top := func(n int) int { return n - 1 }
	require.Equal(t, time.Millisecond, RacePause(0, top))
	require.Equal(t, time.Millisecond, RacePause(5, low))
	require.Equal(t, 32*time.Millisecond, RacePause(5, top))
	require.Equal(t, 64*time.Millisecond, RacePause(6, top))
	require.Equal(t, 64*time.Millisecond, RacePause(30, top), "at most 64 ms")

	require.Equal(t, 50*time.Millisecond, StorePause(1))
	require.Equal(t, 500*time.Millisecond, StorePause(10))
	require.Equal(t, time.Second, StorePause(100), "at most a second")
}
