package spot

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

func readyAt(id string) authority {
	return authority{v: location.Versioned{Key: location.Key(location.KindInstanceSpot, id), Version: 3,
		Record: &location.Record{State: messages.LifecycleState_LIFECYCLE_STATE_READY, ObjectGeneration: 1}}}
}

// Only a Ready authority with a live owner is cached: Missing, Creating and
// an ended owner never are, and an entry ends at RouteCacheMaxAge.
// Reference: docs/PROTOCOL.md §7.8, §12.2 item 17 (Missing, Creating and
// store failures are never cached).
func TestRouteCacheKeepsOnlyLiveReadyRoutes(t *testing.T) {
	c := newRouteCache(50*time.Millisecond, DefaultRouteCacheMaxRoutes)
	clock := machine.NewManual()
	c.clock = clock
	c.put("missing", authority{v: location.Versioned{Key: location.Key(location.KindInstanceSpot, "missing")}})
	creating := readyAt("creating")
	creating.v.Record = &location.Record{State: messages.LifecycleState_LIFECYCLE_STATE_CREATING}
	c.put("creating", creating)
	ended := readyAt("ended")
	ended.ended = true
	c.put("ended", ended)
	require.Zero(t, c.len())
	c.put("ready", readyAt("ready"))
	_, ok, _ := c.get("ready")
	require.True(t, ok)
	clock.Advance(49 * time.Millisecond)
	_, ok, _ = c.get("ready")
	require.True(t, ok, "the entry is kept until RouteCacheMaxAge")
	clock.Advance(time.Millisecond)
	_, ok, _ = c.get("ready")
	require.False(t, ok, "the entry ends at RouteCacheMaxAge")
	off := newRouteCache(0, DefaultRouteCacheMaxRoutes)
	off.put("ready", readyAt("ready"))
	_, ok, _ = off.get("ready")
	require.False(t, ok, "RouteCacheMaxAge 0 turns the cache off")
}

// The cache holds at most RouteCacheMaxRoutes routes: one more displaces
// one of them (its next call reads the store), and a negative bound is
// refused where the node is configured.
func TestRouteCacheHoldsAtMostItsBound(t *testing.T) {
	c := newRouteCache(time.Minute, 3)
	for i := range 5 {
		c.put(fmt.Sprint(i), readyAt(fmt.Sprint(i)))
		require.Equal(t, min(i+1, 3), c.len(), "routes cached after %d puts", i+1)
	}
	_, ok, _ := c.get("4")
	require.True(t, ok, "the newest route is cached")
	held := 0
	for i := range 5 {
		if _, ok, _ := c.get(fmt.Sprint(i)); ok {
			held++
		}
	}
	require.Equal(t, 3, held)
	// The two displaced routes wait, as aged-out ones do, for their next
	// resolve to drain them if their Spots moved.
	require.Len(t, c.expired, 2)
	require.Equal(t, DefaultRouteCacheMaxRoutes, RouteConfig{}.WithDefaults().RouteCacheMaxRoutes)
	require.ErrorIs(t, RouteConfig{RouteCacheMaxRoutes: -1}.WithDefaults().Validate(), roamerr.ErrInvalidOperation)
}

// The routes kept for their next resolve are bounded too: one more than
// the bound drains one of them at once, whether its Spot moved or not
// (forgotten, a call after a move could overtake what was sent on it).
// While it drains its Spot's calls wait, and the bound never displaces a
// route being drained: it leaves once its barrier is answered.
// Reference: PROTOCOL.md §7.8 (RouteCacheMaxRoutes).
func TestRouteCacheDrainsWhatItCannotKeep(t *testing.T) {
	c := newRouteCache(time.Minute, 2)
	type drained struct {
		id   string
		r    *cachedRoute
		idle <-chan struct{}
	}
	drains := make(chan drained, 8)
	c.drain = func(id string, r *cachedRoute, idle <-chan struct{}) { drains <- drained{id, r, idle} }
	for i := range 4 {
		c.put(fmt.Sprint(i), readyAt(fmt.Sprint(i)))
	}
	require.Len(t, c.expired, 2, "two routes displaced, kept")
	require.Empty(t, drains)
	c.put("4", readyAt("4")) // displaces a third: one kept route is drained
	var d drained
	select {
	case d = <-drains:
	default:
		t.Fatal("no route drained when the table of kept routes overflowed")
	}
	require.Len(t, c.expired, 2)
	require.NotContains(t, c.expired, d.id, "the drained route is no longer kept")
	<-d.idle // nobody was about to send on it
	_, ok, wait := c.get(d.id)
	require.False(t, ok)
	require.NotNil(t, wait, "a call to the drained route's Spot waits for the drain")
	_, putWait, _ := c.putUse(d.id, readyAt(d.id))
	require.NotNil(t, putWait, "so does a resolve")

	for i := 5; i < 12; i++ { // every further route displaces one not being drained
		c.put(fmt.Sprint(i), readyAt(fmt.Sprint(i)))
		require.Same(t, d.r, c.load(d.id), "the route being drained was displaced")
	}
	c.dropRoute(d.id, d.r) // its barrier was answered
	<-wait
	require.False(t, c.put(d.id, readyAt(d.id)), "the Spot did not move: no second drain")
	_, ok, _ = c.get(d.id)
	require.True(t, ok)

}

// Barriers that are never answered (owners paused) hold their routes: at
// most the bound of them wait; past it a route is forgotten, and said so,
// rather than memory growing with every new route.
// Reference: PROTOCOL.md §7.8 (RouteCacheMaxRoutes).
func TestRouteCacheBoundsTheDrainsItStarts(t *testing.T) {
	c := newRouteCache(time.Minute, 2)
	started := 0
	c.drain = func(string, *cachedRoute, <-chan struct{}) { started++ } // never answered
	var forgot []string
	c.forgot = func(id string) { forgot = append(forgot, id) }
	for i := 0; len(forgot) == 0; i++ {
		require.Less(t, i, 100, "no route forgotten")
		c.put(fmt.Sprint(i), readyAt(fmt.Sprint(i)))
		require.LessOrEqual(t, c.draining, 2, "routes waiting for a barrier")
	}
	require.Equal(t, 2, started)
	require.Equal(t, 2, c.draining)
	require.Len(t, c.expired, 2)
	require.Equal(t, 4, c.len(), "two routes cached, two being drained")
}

// A Message Follow hint marks a route draining once; while it drains,
// callers get a channel to wait on instead of the route, so nothing is
// sent down the old route behind its barrier; the drop releases them.
// Reference: PROTOCOL.md §7.8.
func TestRouteCacheHintDrainsBeforeDrop(t *testing.T) {
	c := newRouteCache(time.Minute, DefaultRouteCacheMaxRoutes)
	c.put("r", readyAt("r"))
	_, idle, first := c.hinted("r")
	<-idle // nobody was about to send on it
	_, _, second := c.hinted("r")
	require.True(t, first)
	require.False(t, second, "one barrier per route")
	_, ok, drained := c.get("r")
	require.False(t, ok, "not used while draining")
	require.NotNil(t, drained)
	select {
	case <-drained:
		t.Fatal("drained before the drop")
	default:
	}
	c.drop("r")
	<-drained
	_, ok, drained = c.get("r")
	require.False(t, ok)
	require.Nil(t, drained)
	_, _, hinted := c.hinted("absent")
	require.False(t, hinted)
}

// A call that took a cached route and has not sent on it yet holds back
// the route's barrier: a Message Follow hint that arrives in between (a
// loaded node may deschedule the caller between the two) would otherwise
// send the barrier first, let it come back, and drop the route, so the
// call's message would follow the old route behind later ones sent on the
// new route. The chat test caught that reordering under load.
// Reference: PROTOCOL.md §7.8 (a caller's order holds across a move).
func TestRouteBarrierWaitsForCallsAboutToSend(t *testing.T) {
	c := newRouteCache(time.Minute, DefaultRouteCacheMaxRoutes)
	c.put("r", readyAt("r"))
	_, ok, _, sent := c.use("r")
	require.True(t, ok)
	_, idle, hinted := c.hinted("r")
	require.True(t, hinted)
	select {
	case <-idle:
		t.Fatal("the barrier may not go out before the call has sent")
	default:
	}
	sent.sent()
	<-idle
	sent.sent() // a second call changes nothing
	_, ok, drained, _ := c.use("r")
	require.False(t, ok, "a draining route is not used")
	require.NotNil(t, drained)

	// A put (another call's store read) does not replace a route being
	// drained: its barrier still waits for the call that holds it.
	c.put("p", readyAt("p"))
	_, _, _, sentP := c.use("p")
	_, idleP, _ := c.hinted("p")
	c.put("p", readyAt("p"))
	select {
	case <-idleP:
		t.Fatal("the put released the barrier before the call sent")
	default:
	}
	sentP.sent()
	<-idleP

	// A route dropped (its owner left) while a call still holds it wakes
	// the barrier's wait too.
	c.put("q", readyAt("q"))
	_, _, _, sentQ := c.use("q")
	_, idle, _ = c.hinted("q")
	c.drop("q")
	<-idle
	sentQ.sent()
}

// The same under contention: calls take the route without a lock while the
// hint comes. Once the barrier may go (idle), no call still holds the route
// and none takes it any more; it waits for the drain instead.
// Reference: PROTOCOL.md §7.8.
func TestRouteBarrierWaitsForEveryCallUnderContention(t *testing.T) {
	for range 50 {
		c := newRouteCache(time.Minute, DefaultRouteCacheMaxRoutes)
		c.put("r", readyAt("r"))
		var holding, late, uses atomic.Int64
		var released atomic.Bool
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, ok, drained, sent := c.use("r")
					if !ok {
						require.NotNil(t, drained, "a hinted route is waited for, not missed")
						continue
					}
					holding.Add(1)
					uses.Add(1)
					if released.Load() {
						late.Add(1) // took the route after its barrier was let go
					}
					holding.Add(-1)
					sent.sent()
				}
			}()
		}
		for uses.Load() < 50 { // the calls are under way when the hint comes
			runtime.Gosched()
		}
		_, idle, ok := c.hinted("r")
		require.True(t, ok)
		<-idle
		released.Store(true)
		require.Zero(t, holding.Load(), "the barrier was let go while a call held the route")
		close(stop)
		wg.Wait()
		require.Zero(t, late.Load(), "a call took the route after the hint")
	}
}

// Concurrent and later deliveries of one operation run it once and get
// the same terminal result.
// Reference: PROTOCOL.md §7.2 (a redelivery of the same operation gets
// the retained terminal result; nothing runs twice).
func TestOperationRunsOnce(t *testing.T) {
	m := &Manager{results: map[string]*retained{}, cfg: Config{ResultRetention: time.Minute}, clock: machine.Real}
	var runs atomic.Int64
	var wg sync.WaitGroup
	replies := make([]*messages.SpotReply, 20)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = m.once("op-1", func() *messages.SpotReply {
				runs.Add(1)
				time.Sleep(10 * time.Millisecond)
				return &messages.SpotReply{Closed: true}
			})
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, runs.Load())
	for _, r := range replies {
		require.Same(t, replies[0], r)
	}
	other := m.once("op-2", func() *messages.SpotReply { runs.Add(1); return &messages.SpotReply{} })
	require.Equal(t, "op-2", other.GetOperationId())
	require.EqualValues(t, 2, runs.Load())
}

// The route cache can be turned off; the follow margin then does not
// apply. Reference: PROTOCOL.md §7.8 (spot.Disabled turns the cache off).
func TestRouteCacheCanBeDisabled(t *testing.T) {
	require.NoError(t, RouteConfig{RouteCacheMaxAge: Disabled, MessageFollowDuration: time.Second}.Validate())
	c := newRouteCache(Disabled, DefaultRouteCacheMaxRoutes)
	c.put("r", readyAt("r"))
	_, ok, _ := c.get("r")
	require.False(t, ok)
}

// A route that ages out is remembered until the next resolve. A resolve
// that names the same owner caches the new route at once; one that names
// another owner puts the old route back, with the calls that took it still
// counted, to be drained like a followed route before anyone uses the new
// one: a second resolve meanwhile waits for the drain.
// Reference: PROTOCOL.md §7.8.
func TestRouteCacheRemembersAnExpiredRoute(t *testing.T) {
	c := newRouteCache(20*time.Millisecond, DefaultRouteCacheMaxRoutes)
	clock := machine.NewManual()
	c.clock = clock
	ageOut := func() {
		clock.Advance(20 * time.Millisecond)
		_, ok, _ := c.get("r")
		require.False(t, ok, "the route aged out")
	}
	older, newer := readyAt("r"), readyAt("r")
	older.address, newer.address = "127.0.0.1:1", "127.0.0.1:2"
	c.put("r", older)
	ageOut()
	require.False(t, c.put("r", older), "the same owner needs no drain")
	ageOut()
	undrained := c.put("r", newer)
	require.True(t, undrained, "the old route must be drained before the new owner is used")
	a, idle, hinted := c.hinted("r")
	require.True(t, hinted)
	require.Equal(t, older.address, a.address, "the route drained is the one that aged out")
	<-idle
	_, wait, _ := c.putUse("r", newer)
	require.NotNil(t, wait, "a resolve during the drain waits for it")
	c.drop("r")
	<-wait
	require.False(t, c.put("r", newer))
	got, ok, _ := c.get("r")
	require.True(t, ok)
	require.Equal(t, newer.address, got.address)
	require.Empty(t, c.expired)
}

// The cold-activation order of candidates is a function of the Spot ID
// alone (not of the listing's order), and spreads IDs over the nodes by
// weight.
func TestCandidatesForASpotIDAreDeterministic(t *testing.T) {
	node := func(rid string, w uint32) location.VersionedNode {
		return location.VersionedNode{Node: &messages.NodeDescriptor{NodeRid: rid, Weight: w, InstanceTypes: []string{"cart"},
			Status: messages.NodeStatus_NODE_STATUS_SERVING}}
	}
	nodes := []location.VersionedNode{node("a", 1), node("b", 1), node("c", 2)}
	reversed := []location.VersionedNode{nodes[2], nodes[1], nodes[0]}
	first := map[string]int{}
	for i := 0; i < 4000; i++ {
		id := fmt.Sprintf("spot-%d", i)
		x, y := candidates(nodes, "cart", true, id), candidates(reversed, "cart", true, id)
		require.Len(t, x, 3)
		for j := range x {
			require.Equal(t, x[j].Node.GetNodeRid(), y[j].Node.GetNodeRid())
		}
		first[x[0].Node.GetNodeRid()]++
	}
	// Weight 2 against 1 and 1: about half the IDs go to c first.
	require.InDelta(t, 2000, first["c"], 300)
	require.InDelta(t, 1000, first["a"], 250)
}

// The sweep drops the cached routes of owner lifecycles that are no longer
// live (gone, or another lease), and only theirs.
// Reference: docs/PROTOCOL.md §7.8.
func TestRouteSweepDropsOnlyTheRoutesOfOwnersThatLeft(t *testing.T) {
	c := newRouteCache(time.Minute, DefaultRouteCacheMaxRoutes)
	owned := func(id, rid, lease string) authority {
		a := readyAt(id)
		a.v.Record.Owner = &messages.Owner{NodeRid: rid, LeaseId: lease}
		return a
	}
	c.put("a1", owned("a1", "node-a", "la"))
	c.put("a2", owned("a2", "node-a", "la"))
	c.put("b1", owned("b1", "node-b", "lb"))
	c.put("b1", owned("b1", "node-b", "lb")) // put again: counted once
	c.dropOwnersNotIn(map[string]string{"node-a": "la", "node-b": "lb"})
	require.Equal(t, 3, c.len())
	c.dropOwnersNotIn(map[string]string{"node-a": "la", "node-b": "lb-2"}) // node-b restarted
	require.Equal(t, 2, c.len())
	_, ok, _ := c.get("b1")
	require.False(t, ok)
	c.drop("a1")
	c.dropOwnersNotIn(map[string]string{})
	require.Zero(t, c.len())
	c.put("a3", owned("a3", "node-a", "la"))
	c.dropOwnersNotIn(map[string]string{"node-a": "la"})
	require.Equal(t, 1, c.len())
}

// The once-a-second sweep with 100,000 routes cached and no owner gone:
// it must not walk the routes (resolves, hints and drops wait for the
// cache's lock meanwhile).
func BenchmarkRouteSweepNobodyLeft(b *testing.B) {
	c := newRouteCache(time.Hour, DefaultRouteCacheMaxRoutes)
	live := map[string]string{}
	for n := range 3 {
		live[fmt.Sprintf("node-%d", n)] = "lease"
	}
	for i := range DefaultRouteCacheMaxRoutes {
		a := readyAt(fmt.Sprint(i))
		a.v.Record.Owner = &messages.Owner{NodeRid: fmt.Sprintf("node-%d", i%3), LeaseId: "lease"}
		c.put(fmt.Sprint(i), a)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.dropOwnersNotIn(live)
	}
}

// A call's operation id is unique within the process (a counter) and
// across processes (96 random bits drawn once per process).
func TestOperationIDsAreUnique(t *testing.T) {
	seen := make(map[string]bool, 100000)
	for i := 0; i < 100000; i++ {
		op := newOperationID()
		if seen[op] {
			t.Fatalf("operation id %q issued twice", op)
		}
		seen[op] = true
	}
	if len(opPrefix) != 25 || opPrefix[24] != '-' {
		t.Fatalf("prefix %q: want 24 hex digits and a dash", opPrefix)
	}
}
