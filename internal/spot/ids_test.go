package spot_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/roamerr"
)

// Spot IDs are UTF-8 of 1..255 bytes, byte-exact and case-sensitive;
// anything else is InvalidOperation.
// Reference: docs/PROTOCOL.md §7.1.
func TestSpotIDRules(t *testing.T) {
	for _, ok := range []string{"a", "Room", "room", "a/b %", "🚀", strings.Repeat("x", 255), "x-entry-not-a-uuid"} {
		require.NoError(t, spot.ValidateID(ok), "%q", ok)
	}
	for _, bad := range []string{"", strings.Repeat("x", 256), "\xff", strings.Repeat("é", 128)} {
		require.ErrorIs(t, spot.ValidateID(bad), roamerr.ErrInvalidOperation, "%q", bad)
		require.ErrorIs(t, spot.ValidateStableType(bad), roamerr.ErrInvalidOperation, "%q", bad)
	}
}

// The framework's Entry Spot ID format is reserved: a caller-given ID in it
// is InvalidOperation; every ID a node issues is in it.
// Reference: PROTOCOL.md §7.1 (the reserved Entry Spot form), §3.4.
func TestReservedEntryFormatIsRefused(t *testing.T) {
	issued := meshnode.NewEntrySpotID("roam")
	require.True(t, spot.IsReservedEntryID(issued), issued)
	require.ErrorIs(t, spot.ValidateID(issued), roamerr.ErrInvalidOperation)
	require.ErrorIs(t, spot.ValidateID("my-app-entry-3f2b8c1e-9d4a-4b7e-8f00-1a2b3c4d5e6f"), roamerr.ErrInvalidOperation)
	// Not reserved: upper case, another UUID version, no prefix.
	require.NoError(t, spot.ValidateID("roam-entry-3F2B8C1E-9D4A-4B7E-8F00-1A2B3C4D5E6F"))
	require.NoError(t, spot.ValidateID("roam-entry-3f2b8c1e-9d4a-1b7e-8f00-1a2b3c4d5e6f"))
	require.NoError(t, spot.ValidateID("-entry-3f2b8c1e-9d4a-4b7e-8f00-1a2b3c4d5e6f"))
}

// Create issues lowercase canonical UUID v4 IDs, which are valid Spot IDs
// and never reserved.
// Reference: PROTOCOL.md §7.2.
func TestNewIDIsALowercaseUUIDv4(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		id := spot.NewID()
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
		require.NoError(t, spot.ValidateID(id))
		require.False(t, seen[id])
		seen[id] = true
	}
}

// The route cache must expire at least 5 s before Message Follow ends.
// Reference: PROTOCOL.md §7.8, §9.
func TestRouteCacheMustBeShorterThanFollow(t *testing.T) {
	def := spot.RouteConfig{}.WithDefaults()
	require.Equal(t, 15*time.Second, def.RouteCacheMaxAge)
	require.Equal(t, 30*time.Second, def.MessageFollowDuration)
	require.NoError(t, def.Validate())
	require.NoError(t, spot.RouteConfig{RouteCacheMaxAge: 25 * time.Second, MessageFollowDuration: 30 * time.Second}.Validate())
	require.ErrorIs(t, spot.RouteConfig{RouteCacheMaxAge: 26 * time.Second, MessageFollowDuration: 30 * time.Second}.Validate(), roamerr.ErrInvalidOperation)
	require.ErrorIs(t, spot.RouteConfig{RouteCacheMaxAge: -2 * time.Second, MessageFollowDuration: 30 * time.Second}.Validate(), roamerr.ErrInvalidOperation)
	require.NoError(t, spot.RouteConfig{RouteCacheMaxAge: spot.Disabled, MessageFollowDuration: 30 * time.Second}.Validate())
}
