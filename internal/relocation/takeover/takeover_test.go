package takeover

import (
	"errors"
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

var (
	ended = &messages.Owner{NodeRid: "n1", NodeGeneration: 1, LeaseId: "l1"}
	self  = &messages.Owner{NodeRid: "n2", NodeGeneration: 4, LeaseId: "l2"}
)

func ready(membership *messages.Membership) *location.Record {
	return &location.Record{Owner: ended, AuthorityOwnerGeneration: 7, ObjectGeneration: 3, RelocationId: 99,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY, StableType: "t", Membership: membership}
}

// A takeover writes the same incarnation under the next owner generation,
// no move under way; an Actor of the ended owner's Entry Spot joins this
// node's, a User Spot's member stays its member.
func TestClaim(t *testing.T) {
	actor := location.Key(location.KindActor, "a")
	room := &messages.Membership{SpotId: "room", SpotGeneration: 2}
	next, err := Claim(actor, ready(room), Kind{Registered: true, PreservesState: true}, self, "entry-n2", isEntry)
	require.NoError(t, err)
	require.Equal(t, self, next.GetOwner())
	require.Equal(t, uint64(8), next.GetAuthorityOwnerGeneration())
	require.Equal(t, uint64(3), next.GetObjectGeneration(), "the same incarnation")
	require.Zero(t, next.GetRelocationId())
	require.True(t, next.GetPreservesState())
	require.Equal(t, "room", next.GetMembership().GetSpotId(), "still the Spot's member")

	rec := ready(&messages.Membership{SpotId: "entry-n1", SpotGeneration: 1})
	next, err = Claim(actor, rec, Kind{Registered: true}, self, "entry-n2", isEntry)
	require.NoError(t, err)
	require.Equal(t, "entry-n2", next.GetMembership().GetSpotId(), "the ended Entry Spot went with its owner")
	require.Equal(t, "entry-n1", rec.GetMembership().GetSpotId(), "the record read is not changed")
	require.Equal(t, ended, rec.GetOwner())

	notReady := ready(nil)
	notReady.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
	for _, c := range []struct {
		name string
		key  location.AuthorityKey
		rec  *location.Record
		k    Kind
		want error
	}{
		{"an Instance Spot", location.Key(location.KindInstanceSpot, "i"), ready(nil), Kind{Registered: true}, roamerr.ErrInvalidOperation},
		{"unknown type", actor, ready(nil), Kind{}, roamerr.ErrNotFound},
		{"not Ready", actor, notReady, Kind{Registered: true}, roamerr.ErrInvalidOperation},
	} {
		next, err := Claim(c.key, c.rec, c.k, self, "entry-n2", isEntry)
		require.ErrorIs(t, err, c.want, c.name)
		require.Nil(t, next, c.name)
	}
}

// The store's answer to a takeover's write: applied is done; capacity or
// a plain fault fails it; a conflict or an unknown outcome is read back.
// After an unknown outcome, a later plain failure proves nothing: the
// write is unsettled.
func TestWriteAnswers(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	unknown := fmt.Errorf("apply: %w", location.ErrIndeterminate)
	conflict := fmt.Errorf("apply: %w", location.ErrConflict)
	full := fmt.Errorf("%w: full", roamerr.ErrCapacityExceeded)
	fault := errors.New("boom")
	for _, c := range []struct {
		name string
		err  error
		step Step
		fail error
	}{
		{"applied", nil, Done, nil},
		{"unknown", unknown, ReadBack, nil},
		{"conflict", conflict, ReadBack, nil},
		{"full", full, Fail, roamerr.ErrCapacityExceeded},
		{"fault", fault, Fail, roamerr.ErrUnavailable},
	} {
		w := Write{Key: key}
		step, err := w.Wrote(c.err)
		require.Equal(t, c.step, step, c.name)
		if c.fail != nil {
			require.ErrorIs(t, err, c.fail, c.name)
		}
	}

	w := Write{Key: key}
	_, _ = w.Wrote(unknown)
	step, _ := w.Read(false, true, nil, unknown)
	require.Equal(t, Again, step, "still at the version read: write again")
	for _, err := range []error{full, fault} {
		step, _ := w.Wrote(err)
		require.Equal(t, Unsettled, step, "after an unknown outcome: %v", err)
	}
}

// A read after a write's answer: landed is done; still at the version
// read is written again, up to MaxWrites, then unsettled; a read that
// fails is unsettled; anything else lost to another writer.
func TestWriteReads(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	unknown := fmt.Errorf("apply: %w", location.ErrIndeterminate)
	w := Write{Key: key}
	for i := 1; i < MaxWrites; i++ {
		_, _ = w.Wrote(unknown)
		step, _ := w.Read(false, true, nil, unknown)
		require.Equal(t, Again, step, "write %d", i)
	}
	_, _ = w.Wrote(unknown)
	step, _ := w.Read(false, true, nil, unknown)
	require.Equal(t, Unsettled, step, "MaxWrites writes")

	w = Write{Key: key}
	_, _ = w.Wrote(unknown)
	step, _ = w.Read(true, false, nil, unknown)
	require.Equal(t, Done, step)
	step, _ = w.Read(false, false, errors.New("store away"), unknown)
	require.Equal(t, Unsettled, step)
	step, err := w.Read(false, false, nil, location.ErrConflict)
	require.Equal(t, Fail, step)
	require.ErrorIs(t, err, roamerr.ErrConflict)
}

// A read shows the write landed when the record is next's (owner
// lifecycle, owner and object generations); still at v's version after an
// unknown outcome, the write may be sent again.
func TestLanded(t *testing.T) {
	v := location.Versioned{Version: 5, Record: ready(nil)}
	next, err := Claim(location.Key(location.KindActor, "a"), v.Record, Kind{Registered: true}, self, "entry-n2", isEntry)
	require.NoError(t, err)
	unknown := fmt.Errorf("apply: %w", location.ErrIndeterminate)
	conflict := fmt.Errorf("apply: %w", location.ErrConflict)
	other := &location.Record{Owner: &messages.Owner{NodeRid: "n3", NodeGeneration: 1, LeaseId: "l3"}, AuthorityOwnerGeneration: 8, ObjectGeneration: 3}
	otherIncarnation := &location.Record{Owner: self, AuthorityOwnerGeneration: 8, ObjectGeneration: 4}
	sameOwnerOtherLifecycle := &location.Record{Owner: &messages.Owner{NodeRid: "n2", NodeGeneration: 5, LeaseId: "l2"}, AuthorityOwnerGeneration: 8, ObjectGeneration: 3}
	for _, c := range []struct {
		name          string
		cur           location.Versioned
		rerr, werr    error
		landed, again bool
		err           bool
	}{
		{"landed", location.Versioned{Version: 6, Record: next}, nil, unknown, true, false, false},
		{"still v after an unknown outcome", v, nil, unknown, false, true, false},
		{"still v after a conflict", v, nil, conflict, false, false, false},
		{"another writer won", location.Versioned{Version: 6, Record: other}, nil, unknown, false, false, false},
		{"another incarnation", location.Versioned{Version: 6, Record: otherIncarnation}, nil, unknown, false, false, false},
		{"another lifecycle of this node", location.Versioned{Version: 6, Record: sameOwnerOtherLifecycle}, nil, unknown, false, false, false},
		{"gone", location.Versioned{}, location.ErrNotFound, unknown, false, false, false},
		{"store away", location.Versioned{}, errors.New("timeout"), unknown, false, false, true},
	} {
		landed, again, err := Landed(c.cur, c.rerr, v, next, c.werr)
		require.Equal(t, c.landed, landed, c.name)
		require.Equal(t, c.again, again, c.name)
		require.Equal(t, c.err, err != nil, c.name)
	}
}

// A settlement's look: landed is done, a failed read looks again later,
// still at the version read writes again, anything else is lost.
func TestSettle(t *testing.T) {
	key := location.Key(location.KindActor, "a")
	step, _ := Settle(true, false, nil, key)
	require.Equal(t, Done, step)
	step, _ = Settle(false, false, errors.New("store away"), key)
	require.Equal(t, ReadBack, step)
	step, _ = Settle(false, true, nil, key)
	require.Equal(t, Again, step)
	step, err := Settle(false, false, nil, key)
	require.Equal(t, Fail, step)
	require.ErrorIs(t, err, roamerr.ErrConflict)
}

// A failed restore is tried again a second later, then twice as long each
// time, up to half a minute.
func TestRestorePause(t *testing.T) {
	require.Equal(t, time.Second, RestorePause(1))
	require.Equal(t, 2*time.Second, RestorePause(2))
	require.Equal(t, 16*time.Second, RestorePause(5))
	require.Equal(t, 30*time.Second, RestorePause(6))
	require.Equal(t, 30*time.Second, RestorePause(100))
}
