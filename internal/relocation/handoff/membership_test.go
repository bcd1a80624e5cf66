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

// A Join needs its Spot Ready at the generation named; a Spot gone or
// changed is Stale, a store that cannot say Unavailable.
func TestJoinTarget(t *testing.T) {
	join := &messages.Membership{SpotId: "room", SpotGeneration: 3}
	ready := messages.LifecycleState_LIFECYCLE_STATE_READY
	spot := func(state messages.LifecycleState, gen uint64) location.Versioned {
		return location.Versioned{Version: 4, Record: &location.Record{State: state, ObjectGeneration: gen}}
	}
	require.NoError(t, JoinTarget(join, spot(ready, 3), nil))
	require.ErrorIs(t, JoinTarget(join, location.Versioned{}, fmt.Errorf("read: %w", location.ErrNotFound)), roamerr.ErrStale, "gone")
	require.ErrorIs(t, JoinTarget(join, spot(ready, 4), nil), roamerr.ErrStale, "created anew")
	require.ErrorIs(t, JoinTarget(join, spot(messages.LifecycleState_LIFECYCLE_STATE_CLOSING, 3), nil), roamerr.ErrStale, "closing")
	err := JoinTarget(join, location.Versioned{}, fmt.Errorf("read: %w", location.ErrIndeterminate))
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.NotErrorIs(t, err, roamerr.ErrStale)
}

// A Join on the Spot's node: the old Spot's count one less, the Actor's
// membership and the new Spot's count one more, at the versions read.
func TestJoinOps(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	join := &messages.Membership{SpotId: "room", SpotGeneration: 3}
	v := location.Versioned{Version: 7, Record: &location.Record{ObjectGeneration: 1, Membership: &messages.Membership{SpotId: "old", SpotGeneration: 1}}}
	sv := location.Versioned{Version: 4, Record: &location.Record{ObjectGeneration: 3, MemberCount: 2}}
	leave := LeaveOps(v.Record.GetMembership(), location.Versioned{Version: 9, Record: &location.Record{ObjectGeneration: 1, MemberCount: 1}})
	ops, next := JoinOps(key, v, join, sv, leave)
	require.Len(t, ops, 3)
	require.Equal(t, leave[0].Key, ops[0].Key, "the leave first")
	require.Equal(t, []any{key, location.StoreVersion(7)}, []any{ops[1].Key, ops[1].Version})
	require.Same(t, next, ops[1].Record)
	require.True(t, SameMembership(join, next.GetMembership()))
	require.Equal(t, []any{location.Key(location.KindUserSpot, "room"), location.StoreVersion(4)}, []any{ops[2].Key, ops[2].Version})
	require.Equal(t, uint32(3), ops[2].Record.GetMemberCount(), "one more")
	require.Equal(t, uint32(2), sv.Record.GetMemberCount(), "the record read is not changed")
	require.Equal(t, "old", v.Record.GetMembership().GetSpotId(), "the record read is not changed")
}

// A member's delete that lost a race goes on at the record's new version
// while it is still this incarnation's, here; it ends when the record is
// gone or another incarnation's, and is not ours under another owner.
func TestDeleteReread(t *testing.T) {
	owner := &messages.Owner{NodeRid: "n1", NodeGeneration: 2, LeaseId: "l"}
	v := location.Versioned{Version: 3, Record: &location.Record{Owner: owner, ObjectGeneration: 5}}
	at := func(o *messages.Owner, gen uint64) location.Versioned {
		return location.Versioned{Version: 4, Record: &location.Record{Owner: o, ObjectGeneration: gen}}
	}
	require.Equal(t, DeleteAgain, DeleteReread(v, at(owner, 5), true, owner))
	require.Equal(t, DeleteGone, DeleteReread(v, location.Versioned{}, false, owner))
	require.Equal(t, DeleteGone, DeleteReread(v, at(owner, 6), true, owner), "spawned again")
	require.Equal(t, DeleteNotOurs, DeleteReread(v, at(&messages.Owner{NodeRid: "n2", NodeGeneration: 1, LeaseId: "m"}, 5), true, owner))
	require.Equal(t, DeleteNotOurs, DeleteReread(v, at(&messages.Owner{NodeRid: "n1", NodeGeneration: 3, LeaseId: "l"}, 5), true, owner), "a later lifecycle of this node")
}

// A lost race pauses a race's pause; a store failure a store call's.
func TestDeletePause(t *testing.T) {
	top := func(n int) int { return n - 1 }
	pause, store := DeletePause(3, fmt.Errorf("apply: %w", location.ErrConflict), top)
	require.Equal(t, RacePause(3, top), pause)
	require.False(t, store)
	pause, store = DeletePause(3, fmt.Errorf("apply: %w", location.ErrIndeterminate), top)
	require.Equal(t, StorePause(4), pause)
	require.True(t, store)
}

// Only a valid Actor key is deleted, joins or leaves.
func TestActorKey(t *testing.T) {
	require.NoError(t, ActorKey(location.Key(location.KindActor, "a")))
	for _, key := range []location.AuthorityKey{
		location.Key(location.KindUserSpot, "room"),
		location.Key(location.KindInstanceSpot, "i"),
		location.Key(location.KindActor, ""),
	} {
		require.ErrorIs(t, ActorKey(key), roamerr.ErrInvalidOperation, "%s", key)
	}
}

// A missing record is no error; a failed read is Unavailable with its
// cause kept.
func TestRecordRead(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	for _, c := range []struct {
		name  string
		err   error
		found bool
		want  error
	}{
		{"read", nil, true, nil},
		{"none", fmt.Errorf("read: %w", location.ErrNotFound), false, nil},
		{"store down", fmt.Errorf("read: %w", location.ErrUnavailable), false, roamerr.ErrUnavailable},
		{"a typed failure keeps its class", fmt.Errorf("read: %w", roamerr.ErrDeadlineExceeded), false, roamerr.ErrDeadlineExceeded},
	} {
		found, err := RecordRead(key, c.err)
		require.Equal(t, c.found, found, c.name)
		if c.want == nil {
			require.NoError(t, err, c.name)
			continue
		}
		require.ErrorIs(t, err, c.want, c.name)
		require.ErrorIs(t, err, c.err, "%s: the cause is kept", c.name)
	}
}

// A membership changes only under the Actor's owner lifecycle.
func TestOwnedHere(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	owner := &messages.Owner{NodeRid: "n1", NodeGeneration: 2, LeaseId: "l"}
	at := func(o *messages.Owner) location.Versioned {
		return location.Versioned{Version: 4, Record: &location.Record{Owner: o}}
	}
	require.NoError(t, OwnedHere(key, at(owner), true, owner))
	require.ErrorIs(t, OwnedHere(key, location.Versioned{}, false, owner), roamerr.ErrNotFound)
	require.ErrorIs(t, OwnedHere(key, at(&messages.Owner{NodeRid: "n2", NodeGeneration: 2, LeaseId: "l"}), true, owner), roamerr.ErrNotFound)
	err := OwnedHere(key, at(&messages.Owner{NodeRid: "n1", NodeGeneration: 3, LeaseId: "l2"}), true, owner)
	require.ErrorIs(t, err, roamerr.ErrNotFound, "a later lifecycle of this node")
	require.Contains(t, err.Error(), "not owned by this node")
}

// A Leave takes a User Spot's member to this node's Entry Spot at the
// version read, after the ops that take it off its Spot's count; an Entry
// Spot's member, or no member, is refused.
func TestLeave(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	room := &messages.Membership{SpotId: "room", SpotGeneration: 3}
	v := location.Versioned{Key: key, Version: 9, Record: &location.Record{ObjectGeneration: 5, Membership: room}}
	require.NoError(t, Member(key, v, isEntry))
	for _, m := range []*messages.Membership{nil, {SpotId: "entry-n1", SpotGeneration: 1}} {
		nv := location.Versioned{Key: key, Version: 9, Record: &location.Record{Membership: m}}
		require.ErrorIs(t, Member(key, nv, isEntry), roamerr.ErrInvalidOperation, "%v", m)
	}

	leave := []location.Op{location.UpdateOp(location.Key(location.KindUserSpot, "room"), 2, &location.Record{})}
	ops := LeaveTxn(key, v, "entry-n1", leave)
	require.Len(t, ops, 2)
	require.Equal(t, leave[0], ops[0], "the Spot's count first, at the version read")
	require.Equal(t, key, ops[1].Key)
	require.Equal(t, location.StoreVersion(9), ops[1].Version)
	require.Equal(t, "entry-n1", ops[1].Record.GetMembership().GetSpotId())
	require.Equal(t, uint64(1), ops[1].Record.GetMembership().GetSpotGeneration())
	require.Equal(t, uint64(5), ops[1].Record.GetObjectGeneration())
	require.Equal(t, "room", v.Record.GetMembership().GetSpotId(), "the record read is not changed")
}
