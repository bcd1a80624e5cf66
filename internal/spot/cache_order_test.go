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
	c := newRouteCache(time.Minute, DefaultRouteCacheMaxRoutes)
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

// A call that read its route from the store holds back that route's
// barrier until it has sent, as a call that took the route from the cache
// does: a hint between the read and the send (a loaded node descheduled
// the caller) would otherwise send the barrier first, let it come back and
// drop the route, and the call's next message, on the new owner's route,
// would overtake this one, still following. A call that reads while the
// route is being drained waits for the drain and reads again: a route it
// sent on uncached would never be drained.
// Reference: docs/PROTOCOL.md §7.8 (a caller's order holds across a move).
func TestARouteReadFromTheStoreHoldsItsBarrierUntilTheCallSent(t *testing.T) {
	c := newRouteCache(time.Minute, DefaultRouteCacheMaxRoutes)
	sent, wait, undrained := c.putUse("r", readyAt("r"))
	require.Nil(t, wait)
	require.False(t, undrained)
	_, idle, hinted := c.hinted("r")
	require.True(t, hinted)
	select {
	case <-idle:
		t.Fatal("the barrier may not go out before the call that read the route has sent")
	default:
	}
	sent.sent()
	<-idle

	sentAgain, wait, _ := c.putUse("r", readyAt("r"))
	require.NotNil(t, wait, "a route being drained is waited for, not bypassed")
	sentAgain.sent()
	select {
	case <-wait:
		t.Fatal("drained before the drop")
	default:
	}
	c.drop("r")
	<-wait
}
