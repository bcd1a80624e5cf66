package location_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/location"
)

// Spot IDs are UTF-8 of 1..255 bytes; anything else is ErrInvalid.
// Reference: docs/PROTOCOL.md §7.1.
func TestValidateID(t *testing.T) {
	for _, ok := range []string{"a", strings.Repeat("x", 255), "🚀", "a/b%c d"} {
		require.NoError(t, location.ValidateID("id", ok), "%q", ok)
	}
	for _, bad := range []string{"", strings.Repeat("x", 256), "\xff", strings.Repeat("é", 128)} {
		require.ErrorIs(t, location.ValidateID("id", bad), location.ErrInvalid, "%q", bad)
	}
	require.ErrorIs(t, location.Key(0, "a").Validate(), location.ErrInvalid)
}

// A conflict matches ErrConflict, unwraps through fmt wrapping, and carries
// the current record of each key.
func TestConflictErrorMatches(t *testing.T) {
	k := location.Key(location.KindActor, "a")
	var err error = &location.ConflictError{Op: "cas", Current: []location.Versioned{{Key: k, Version: 7}}, FailedOps: []int{0}}
	wrapped := fmt.Errorf("commit: %w", err)
	require.ErrorIs(t, wrapped, location.ErrConflict)
	require.NotErrorIs(t, wrapped, location.ErrUnavailable)
	var c *location.ConflictError
	require.True(t, errors.As(wrapped, &c))
	cur, ok := c.CurrentOf(k)
	require.True(t, ok)
	require.EqualValues(t, 7, cur.Version)
	_, ok = c.CurrentOf(location.Key(location.KindActor, "b"))
	require.False(t, ok)
	require.Contains(t, err.Error(), "version 7")
}

func TestValidateTTL(t *testing.T) {
	require.NoError(t, location.ValidateTTL(time.Second))
	for _, bad := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 25 * time.Hour} {
		require.ErrorIs(t, location.ValidateTTL(bad), location.ErrInvalid, bad.String())
	}
}

// The Entry claim a node writes is a Ready Entry Spot owned by the node
// under its lease. Reference: PROTOCOL.md §3.4.
func TestEntryClaim(t *testing.T) {
	n := &location.NodeDescriptor{Mesh: "m", NodeRid: "r", NodeGeneration: 3, EntrySpotId: "roam-entry-x"}
	r := location.EntryClaim(n, "lease-1")
	require.EqualValues(t, 1, r.GetObjectGeneration())
	require.Equal(t, "r", r.GetOwner().GetNodeRid())
	require.EqualValues(t, 3, r.GetOwner().GetNodeGeneration())
	require.Equal(t, "lease-1", r.GetOwner().GetLeaseId())
	require.NoError(t, location.ValidateNode(n))
	n.NodeGeneration = 0
	require.ErrorIs(t, location.ValidateNode(n), location.ErrInvalid)
}
