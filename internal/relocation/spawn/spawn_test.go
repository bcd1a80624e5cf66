package spawn

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var self = &messages.Owner{NodeRid: "n1", NodeGeneration: 2, LeaseId: "l"}

func spec(key location.AuthorityKey) Spec {
	return Spec{Key: key, StableType: "t", Generation: 42, Owner: self, EntrySpotID: "entry-n1"}
}

func member(s Spec) Spec {
	s.Member = &messages.Membership{SpotId: "room", SpotGeneration: 7}
	s.SpotAt = location.Versioned{Key: location.Key(location.KindUserSpot, "room"), Version: 11,
		Record: &location.Record{ObjectGeneration: 7, MemberCount: 3}}
	return s
}

// Only a registered kind and a valid key are spawned.
func TestAdmit(t *testing.T) {
	require.NoError(t, Admit(location.Key(location.KindActor, "a"), "t", true))
	require.ErrorIs(t, Admit(location.Key(location.KindActor, "a"), "t", false), roamerr.ErrNotFound)
	require.ErrorIs(t, Admit(location.Key(location.KindActor, ""), "t", true), roamerr.ErrInvalidOperation)
}

// A spawn creates a Ready record owned here at owner generation 1, only
// where there is none; an Actor joins this node's Entry Spot, a member
// its User Spot, whose count goes up at the version read in the same
// transaction; an Instance Spot is of the instance kind.
func TestCreate(t *testing.T) {
	actor := location.Key(location.KindActor, "a")
	s := spec(actor)
	s.PreservesState = true
	s.Session = &messages.SessionBinding{SessionId: "s1", OwnerAddress: "h:1"}
	rec, ops := s.Create()
	require.Len(t, ops, 1)
	require.Equal(t, location.OpCreate, ops[0].Kind)
	require.Equal(t, actor, ops[0].Key)
	require.Same(t, rec, ops[0].Record, "the slot the driver names in rec is what the op creates")
	require.Equal(t, uint64(42), rec.GetObjectGeneration())
	require.Equal(t, uint64(1), rec.GetAuthorityOwnerGeneration())
	require.Equal(t, messages.LifecycleState_LIFECYCLE_STATE_READY, rec.GetState())
	require.Equal(t, self, rec.GetOwner())
	require.Equal(t, "t", rec.GetStableType())
	require.True(t, rec.GetPreservesState())
	require.Equal(t, "s1", rec.GetSessionId())
	require.Equal(t, "h:1", rec.GetSessionOwnerAddress())
	require.Equal(t, "entry-n1", rec.GetMembership().GetSpotId())
	require.Equal(t, uint64(1), rec.GetMembership().GetSpotGeneration())
	require.Zero(t, rec.GetRelocationId())

	m := member(spec(actor))
	rec, ops = m.Create()
	require.Len(t, ops, 2)
	require.Equal(t, "room", rec.GetMembership().GetSpotId())
	require.Equal(t, uint64(7), rec.GetMembership().GetSpotGeneration())
	require.Equal(t, location.OpUpdate, ops[1].Kind)
	require.Equal(t, m.SpotAt.Key, ops[1].Key)
	require.Equal(t, location.StoreVersion(11), ops[1].Version, "at the version the spawn read")
	require.Equal(t, uint32(4), ops[1].Record.GetMemberCount())
	require.Equal(t, uint32(3), m.SpotAt.Record.GetMemberCount(), "the Spot's record read is not changed")

	rec, ops = spec(location.Key(location.KindInstanceSpot, "i")).Create()
	require.Len(t, ops, 1)
	require.Nil(t, rec.GetMembership())
	require.Equal(t, messages.SpotKind_SPOT_KIND_INSTANCE, rec.GetSpotKind())
	require.Empty(t, rec.GetSessionId())
}

// The transaction's answer: applied, an unknown outcome read back, or a
// typed failure — Stale only when the member's Spot is at another
// version than the spawn read.
func TestWrote(t *testing.T) {
	actor := location.Key(location.KindActor, "a")
	plain, joined := spec(actor), member(spec(actor))
	conflictAt := func(v location.StoreVersion) error {
		return &location.ConflictError{Op: "apply", Current: []location.Versioned{{Key: joined.SpotAt.Key, Version: v}}}
	}
	for _, c := range []struct {
		name string
		s    Spec
		err  error
		step Step
		want error
	}{
		{"applied", plain, nil, Done, nil},
		{"indeterminate", plain, fmt.Errorf("apply: %w", location.ErrIndeterminate), ReadBack, nil},
		{"no free slot", plain, fmt.Errorf("take: %w", roamerr.ErrCapacityExceeded), Fail, roamerr.ErrCapacityExceeded},
		{"the ID exists", plain, &location.ConflictError{Op: "apply"}, Fail, roamerr.ErrAlreadyExists},
		{"the member's Spot changed", joined, conflictAt(12), Fail, roamerr.ErrStale},
		{"the Spot at the version read: the ID exists", joined, conflictAt(11), Fail, roamerr.ErrAlreadyExists},
		{"a conflict naming no Spot", joined, &location.ConflictError{Op: "apply"}, Fail, roamerr.ErrAlreadyExists},
		{"the Spot changed, but no member spawn", plain, conflictAt(12), Fail, roamerr.ErrAlreadyExists},
		{"store down", plain, fmt.Errorf("apply: %w", location.ErrUnavailable), Fail, roamerr.ErrUnavailable},
		{"lease ended", plain, fmt.Errorf("apply: %w", location.ErrLeaseEnded), Fail, roamerr.ErrUnavailable},
	} {
		step, err := c.s.Wrote(c.err)
		require.Equal(t, c.step, step, c.name)
		if c.want == nil {
			require.NoError(t, err, c.name)
			continue
		}
		require.ErrorIs(t, err, c.want, c.name)
		for _, other := range []error{roamerr.ErrCapacityExceeded, roamerr.ErrAlreadyExists, roamerr.ErrStale, roamerr.ErrUnavailable} {
			if other != c.want {
				require.NotErrorIs(t, err, other, "%s: one class", c.name)
			}
		}
	}
}

// What a read back after an unknown outcome found, and what the spawn
// answers then.
func TestRead(t *testing.T) {
	s := spec(location.Key(location.KindActor, "a"))
	rec, _ := s.Create()
	other := &location.Record{ObjectGeneration: 41, Owner: self}
	for _, c := range []struct {
		name string
		v    location.Versioned
		err  error
		want Look
	}{
		{"landed", location.Versioned{Version: 3, Record: rec}, nil, Landed},
		{"a copy of it landed", location.Versioned{Version: 3, Record: &location.Record{
			ObjectGeneration: 42, AuthorityOwnerGeneration: 1, State: rec.GetState(), StableType: "t", Owner: self,
			Membership: &messages.Membership{SpotId: "entry-n1", SpotGeneration: 1}}}, nil, Landed},
		{"absent", location.Versioned{}, fmt.Errorf("read: %w", location.ErrNotFound), Absent},
		{"another record", location.Versioned{Version: 3, Record: other}, nil, Taken},
		{"store down", location.Versioned{}, fmt.Errorf("read: %w", location.ErrUnavailable), Unknown},
	} {
		require.Equal(t, c.want, Read(c.v, c.err, rec), c.name)
	}
	require.ErrorIs(t, s.Failure(s.Exists()), roamerr.ErrAlreadyExists)
	require.ErrorIs(t, s.Failure(fmt.Errorf("apply: %w", location.ErrIndeterminate)), roamerr.ErrUnavailable, "given up unknown")
}

// The watch for a given-up spawn reads after 50 ms, then twice as long
// each time up to 5 s, for a minute.
func TestWatch(t *testing.T) {
	start := time.Unix(1000, 0)
	w := NewWatch(start)
	now := start
	var pauses []time.Duration
	for {
		p, ok := w.Next(now)
		if !ok {
			break
		}
		pauses = append(pauses, p)
		now = now.Add(p)
	}
	require.Equal(t, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond}, pauses[:7])
	for _, p := range pauses[7:] {
		require.Equal(t, 5*time.Second, p)
	}
	require.False(t, now.Before(start.Add(WatchFor)), "watches the whole minute")
	require.True(t, now.Before(start.Add(WatchFor+5*time.Second)), "and not longer")
	_, ok := NewWatch(start).Next(start.Add(WatchFor))
	require.False(t, ok)
}

// A late landing of the given-up record is removed; anything else is
// left, and a failed read or none is looked at again.
func TestLateRead(t *testing.T) {
	rec, _ := spec(location.Key(location.KindActor, "a")).Create()
	require.Equal(t, Remove, LateRead(location.Versioned{Version: 2, Record: rec}, nil, rec))
	require.Equal(t, Leave, LateRead(location.Versioned{Version: 2, Record: &location.Record{ObjectGeneration: 43}}, nil, rec))
	require.Equal(t, Watching, LateRead(location.Versioned{}, fmt.Errorf("read: %w", location.ErrNotFound), rec))
	require.Equal(t, Watching, LateRead(location.Versioned{}, errors.New("read: connection refused"), rec))
}
