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

// ApplyOpCount counts what a transaction makes on Consul: each op, one
// more for a slot take's check, and one lease check for each distinct
// (node, lease) of the slot writes that no OpCheckLease already makes.
func TestApplyOpCount(t *testing.T) {
	a := location.NodeKey{Mesh: "m", NodeRid: "a"}
	b := location.NodeKey{Mesh: "m", NodeRid: "b"}
	holder := location.Key(location.KindActor, "x")
	rec := &location.Record{}
	upd := location.UpdateOp(holder, 3, rec)
	for _, c := range []struct {
		name string
		ops  []location.Op
		want int
	}{
		{"a record write", []location.Op{upd}, 1},
		{"with its lease check", []location.Op{upd, location.CheckLeaseOp(a, "la")}, 2},
		{"a take under the checked lease", []location.Op{upd, location.TakeSlotOp(a, "la", 0, holder, false), location.CheckLeaseOp(a, "la")}, 4},
		{"a take under another node's lease", []location.Op{upd, location.TakeSlotOp(b, "lb", 0, holder, true), location.CheckLeaseOp(a, "la")}, 5},
		{"two takes and a set on one other lease", []location.Op{upd, location.TakeSlotOp(b, "lb", 0, holder, true),
			location.TakeSlotOp(b, "lb", 1, holder, true), location.SetSlotOp(b, "lb", 2, holder, false)}, 1 + 3 + 2 + 1},
		{"a free checks nothing", []location.Op{upd, location.FreeSlotOp(b, 4)}, 2},
	} {
		require.Equal(t, c.want, location.ApplyOpCount(c.ops), c.name)
	}
}
