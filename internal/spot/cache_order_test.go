package spot

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A store read that names another incarnation than the route another call
// cached meanwhile does not replace it: that call may have sent on the
// cached route, and the next call, going straight to the newer owner,
// would overtake what it sent. The cached route stays, and the reader is
// told to drain it; once drained, the newer route is cached. A read of the
// same incarnation replaces the route as before.
// Reference: docs/PROTOCOL.md §7.8 (a caller's order holds across a move).
func TestAStoreReadDoesNotReplaceAnUndrainedRoute(t *testing.T) {
	c := newRouteCache(time.Minute)
	older, newer := readyAt("r"), readyAt("r")
	older.address, newer.address = "127.0.0.1:1", "127.0.0.1:2"
	require.False(t, c.put("r", older))
	require.True(t, c.put("r", newer), "the reader must drain the route cached meanwhile")
	a, ok, _ := c.get("r")
	require.True(t, ok)
	require.Equal(t, older.address, a.address, "the route another call may have sent on is kept until drained")

	_, idle, hinted := c.hinted("r")
	require.True(t, hinted)
	<-idle
	c.drop("r")
	require.False(t, c.put("r", newer))
	a, ok, _ = c.get("r")
	require.True(t, ok)
	require.Equal(t, newer.address, a.address)
	again := newer
	require.False(t, c.put("r", again), "the same incarnation needs no drain")
	require.Equal(t, 1, c.len())
}
