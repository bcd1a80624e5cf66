package release

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

var key = location.Key(location.KindActor, "a")

// A record is released only once its owner has provably ended: a live
// owner refuses it, an owner the store cannot judge makes it Unavailable.
func TestOwner(t *testing.T) {
	require.NoError(t, Owner(key, "n1", false, nil))
	require.ErrorIs(t, Owner(key, "n1", true, nil), roamerr.ErrInvalidOperation)
	err := Owner(key, "n1", false, fmt.Errorf("read: %w", location.ErrIndeterminate))
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.ErrorIs(t, err, location.ErrIndeterminate, "the cause is kept")
}

// A delete that lost a race is a Conflict; any other failure Unavailable.
func TestDeleted(t *testing.T) {
	require.NoError(t, Deleted(key, nil))
	require.ErrorIs(t, Deleted(key, fmt.Errorf("apply: %w", location.ErrConflict)), roamerr.ErrConflict)
	err := Deleted(key, errors.New("boom"))
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	require.NotErrorIs(t, err, roamerr.ErrConflict)
}

// Only other nodes that host the type (an Instance Spot's among their
// instance types) are asked.
func TestAsks(t *testing.T) {
	d := &location.NodeDescriptor{NodeRid: "n2", StableTypes: []string{"t"}, InstanceTypes: []string{"i"}}
	require.True(t, Asks(d, "n1", key, "t"))
	require.False(t, Asks(d, "n2", key, "t"), "this node answers for itself")
	require.False(t, Asks(d, "n1", key, "u"), "does not host it")
	require.False(t, Asks(d, "n1", key, "i"), "an Actor's type is not an instance type")
	require.True(t, Asks(d, "n1", location.Key(location.KindInstanceSpot, "s"), "i"))
	require.False(t, Asks(d, "n1", location.Key(location.KindInstanceSpot, "s"), "t"))
}

// A hosting node that recovers by itself refuses the release; one that
// cannot be asked, or does not say, makes it Unavailable.
func TestAnswered(t *testing.T) {
	yes, no := true, false
	require.NoError(t, Answered(key, "t", "n2", &no, nil))
	require.ErrorIs(t, Answered(key, "t", "n2", &yes, nil), roamerr.ErrInvalidOperation)
	require.ErrorIs(t, Answered(key, "t", "n2", nil, nil), roamerr.ErrUnavailable, "an older version")
	require.ErrorIs(t, Answered(key, "t", "n2", &no, errors.New("timeout")), roamerr.ErrUnavailable)
}

// A revocation that applied, or found the lease revoked, ends the owner;
// a conflict is a renewal; a gone descriptor is judged as missing.
func TestRevoked(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Revoke
	}{
		{nil, Ended},
		{fmt.Errorf("revoke: %w", location.ErrLeaseRevoked), Ended},
		{fmt.Errorf("revoke: %w", location.ErrConflict), Renewed},
		{fmt.Errorf("revoke: %w", location.ErrNotFound), Missing},
		{fmt.Errorf("revoke: %w", location.ErrIndeterminate), Unknown},
	} {
		require.Equal(t, c.want, Revoked(c.err), "%v", c.err)
	}
}
