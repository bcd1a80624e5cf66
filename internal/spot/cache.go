package spot

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/spot/spotcall"
	"github.com/roamactors/roam/messages"
)

// routeCache is the positive route cache (docs/PROTOCOL.md §7.8): only a Ready
// authority whose owner is alive is kept, for at most maxAge; Missing,
// Creating and store failures are never cached, so the next call reads the
// store again. A Message Follow hint, a stale route or a type mismatch
// drops the entry.
//
// Every call by Spot ID takes its route here (use) and says when it has
// sent on it (release), so that path takes no lock: the routes are in a
// sync.Map and a route's users and hint are one atomic word. With a lock
// there, a saturated node's calls queued on it: once a waiter has waited
// 1 ms, Go's mutex hands it over waiter by waiter, each unlocking caller
// yielding behind every runnable goroutine, and a call could spend seconds
// of its deadline on a look-up (BenchmarkRouteCacheSaturated). Entering,
// replacing and leaving the cache, and the hint, take mu: they are rare.
type routeCache struct {
	maxAge time.Duration
	// maxRoutes bounds the routes cached, and the aged-out ones kept
	// (RouteConfig.RouteCacheMaxRoutes): the cache's memory.
	maxRoutes int
	policy    spotcall.RoutePolicy // what is kept and for how long, shared with the simulation
	clock     machine.Clock        // the node's; routes age on it
	routes    sync.Map             // Spot ID → *cachedRoute; written only under mu

	mu sync.Mutex
	n  int // routes cached
	// expired holds the routes that left without a hint (aged out, or
	// displaced by maxRoutes) until their Spot's next resolve: one that
	// names another owner puts the old route back to be drained, with the
	// users it still counts (putUse). It holds at most maxRoutes; one more
	// drains one of them at once (keepExpiredLocked).
	expired map[string]*cachedRoute
	// drain sends a route's barrier once idle is closed and then drops the
	// route (Manager.drainRoute); forgot says that a route was forgotten
	// undrained. Both set before the cache is used.
	drain  func(id string, r *cachedRoute, idle <-chan struct{})
	forgot func(id string)
	// draining counts the routes keepExpiredLocked put back to drain and
	// that are still cached: at most maxRoutes, so that a node whose
	// barriers go unanswered (an owner paused) keeps its memory bounded.
	draining int
	// owners counts the cached routes of each owner lifecycle, so that the
	// sweep for owners that left (dropOwnersNotIn) walks the routes only
	// when one of them did: a node caching 100,000 routes does not stop
	// its calls once a second to check them all.
	owners map[routeOwner]int
}

type routeOwner struct{ rid, lease string }

func (o routeOwner) listed(live map[string]string) bool {
	return spotcall.OwnerListed(&messages.Owner{NodeRid: o.rid, LeaseId: o.lease}, live)
}

func ownerOf(r *cachedRoute) routeOwner {
	o := r.a.v.Record.GetOwner()
	return routeOwner{o.GetNodeRid(), o.GetLeaseId()}
}

type cachedRoute struct {
	a  authority // never changes once cached
	at time.Time
	// state is the calls that took this route from the cache and have not
	// sent on it yet (users, the low bits), and whether a Message Follow
	// hint came (hintedBit). Once hinted, users only go down: a hinted
	// route's barrier waits for them (idle), so nothing this node sends on
	// the route can be behind its barrier, and no new call takes it.
	state atomic.Uint64
	// drained and idle are made by the hint, before hintedBit is set (so a
	// call that sees the bit sees them). drained is closed when the route
	// leaves the cache; idle once users reach zero (or the route leaves).
	drained   chan struct{}
	idle      chan struct{}
	idleOnce  sync.Once
	leaveOnce sync.Once
	// kept: put back into the cache to be drained when the table of
	// routes kept for their next resolve was full (routeCache.draining).
	kept bool
}

const hintedBit = 1 << 63

// release ends one use of the route.
// routeUse is one use of a cached route, counted until its call sent
// (sent). A nil one counts nothing. One goroutine's, the call's.
type routeUse struct {
	r    *cachedRoute
	done bool
}

// sent ends the use, once: the call sent on the route, or gave up.
func (u *routeUse) sent() {
	if u != nil && !u.done {
		u.done = true
		u.r.release()
	}
}

func (r *cachedRoute) release() {
	if r.state.Add(^uint64(0)) == hintedBit { // hinted, and the last user sent
		r.idleOnce.Do(func() { close(r.idle) })
	}
}

// leave wakes whoever waits on a route that leaves the cache: callers
// waiting for its drain, and a barrier waiting for its users (they will
// not be counted any more).
func (r *cachedRoute) leave() {
	if r.state.Load()&hintedBit == 0 {
		return // nobody waits on an unhinted route
	}
	r.leaveOnce.Do(func() { close(r.drained) })
	r.idleOnce.Do(func() { close(r.idle) })
}

func newRouteCache(maxAge time.Duration, maxRoutes int) *routeCache {
	c := &routeCache{maxAge: maxAge, maxRoutes: maxRoutes, policy: spotcall.RoutePolicy{MaxAge: maxAge}, clock: machine.Real,
		expired: map[string]*cachedRoute{}, owners: map[routeOwner]int{}}
	// A cache of its own, without a node to send a barrier: the route
	// leaves once its users sent. A Manager sets its own.
	c.drain = func(id string, r *cachedRoute, idle <-chan struct{}) {
		machine.Go(func() {
			<-idle
			c.dropRoute(id, r)
		})
	}
	c.forgot = func(string) {}
	return c
}

func (c *routeCache) load(id string) *cachedRoute {
	v, ok := c.routes.Load(id)
	if !ok {
		return nil
	}
	return v.(*cachedRoute)
}

// use returns the cached route of id for a call that sends on it, with
// sent, which the caller must call once it has sent (or given up): a
// barrier down a hinted route waits for every such call. A route being
// drained is not returned: the caller gets the channel to wait on
// instead, so that nothing is sent down the old route after its barrier.
func (c *routeCache) use(id string) (a authority, ok bool, drained <-chan struct{}, use *routeUse) {
	if c.maxAge <= 0 {
		return authority{}, false, nil, nil
	}
	r := c.load(id)
	if r == nil {
		return authority{}, false, nil, nil
	}
	for {
		// One atomic step with the look-up of the hint: a hint that marks
		// the route after it makes this call wait for the drain, never
		// skip it; one before it is seen here.
		s := r.state.Load()
		switch {
		case s&hintedBit != 0:
			return authority{}, false, r.drained, nil
		case c.policy.Aged(machine.Since(c.clock, r.at)):
			c.expire(id, r)
			return authority{}, false, nil, nil
		}
		if r.state.CompareAndSwap(s, s+1) {
			return r.a, true, nil, &routeUse{r: r}
		}
	}
}

// get returns the cached route of id. A route being drained is not
// returned: the caller gets the channel to wait on instead, so that
// nothing is sent down the old route after its barrier.
func (c *routeCache) get(id string) (authority, bool, <-chan struct{}) {
	if c.maxAge <= 0 {
		return authority{}, false, nil
	}
	r := c.load(id)
	switch {
	case r == nil:
		return authority{}, false, nil
	case r.state.Load()&hintedBit != 0:
		return authority{}, false, r.drained
	case c.policy.Aged(machine.Since(c.clock, r.at)):
		c.expire(id, r)
		return authority{}, false, nil
	}
	return r.a, true, nil
}

// expire moves id's aged route r, if still cached, to expired.
func (c *routeCache) expire(id string, r *cachedRoute) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.removeLocked(id, r) {
		return
	}
	c.keepExpiredLocked(id, r)
}

// keepExpiredLocked keeps a route that left the cache without a hint
// until its Spot's next resolve, which drains it if the Spot moved. When
// maxRoutes are kept already, one of them is drained now instead, whether
// its Spot moved or not: forgotten, a call to its Spot after a move would
// go straight to the new owner, ahead of what this node sent on the old
// route (PROTOCOL.md §7.8). It goes back into the cache, being drained, so
// its Spot's calls wait for the barrier; a route drained so leaves within
// barrierTimeout, and one whose Spot did not move is answered in a round
// trip.
func (c *routeCache) keepExpiredLocked(id string, r *cachedRoute) {
	if len(c.expired) >= c.maxRoutes {
		for k, old := range c.expired {
			delete(c.expired, k)
			if c.draining >= c.maxRoutes {
				// As many drains are waiting for their barriers: memory
				// comes first, and this route's order with it.
				c.forgot(k)
				break
			}
			old.kept = true
			c.draining++
			c.routes.Store(k, old)
			c.n++
			c.owners[ownerOf(old)]++
			c.drain(k, old, c.hintLocked(old))
			break
		}
	}
	c.expired[id] = r
}

// removeLocked drops id's route if it is r (any route, r nil) and reports
// whether it did. It does not wake r's waiters (leave).
func (c *routeCache) removeLocked(id string, r *cachedRoute) bool {
	cur := c.load(id)
	if cur == nil || (r != nil && cur != r) {
		return false
	}
	c.routes.Delete(id)
	c.n--
	if cur.kept {
		c.draining--
	}
	o := ownerOf(cur)
	if c.owners[o]--; c.owners[o] <= 0 {
		delete(c.owners, o)
	}
	return true
}

// put caches a as putUse does, for a call that does not send on it.
func (c *routeCache) put(id string, a authority) (undrained bool) {
	use, _, undrained := c.putUse(id, a)
	use.sent()
	return undrained
}

// putUse keeps a, read from the store, only when it is Ready with a live
// owner, and counts the call that read it as a use of the route, as use
// does: sent must be called once it has sent. Between the read and the
// send a hint may come, and the route's barrier must not overtake the
// call's message.
//
// A route that is being drained stays: the call waits on wait and reads
// again (a route it sent on uncached would never be drained). So does a
// cached route of another incarnation (undrained; another call may have
// sent on it since this one read the store: two calls that found no
// route read at once, and the other cached an older owner): the call
// drains it (onHint) and reads again. Replaced at once, the next call
// would go straight to the newer owner, ahead of what the other call
// sent.
func (c *routeCache) putUse(id string, a authority) (use *routeUse, wait <-chan struct{}, undrained bool) {
	res := spotcall.Resolved{V: a.v, Ended: a.ended}
	if !c.policy.Keeps(res) {
		return nil, nil, false
	}
	a.owner = a.pid()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.load(id)
	if e := c.expired[id]; old == nil && e != nil {
		delete(c.expired, id)
		if !e.a.owner.Equal(a.owner) {
			// The Spot moved while its route was out of the cache: the
			// old route comes back, as a cached route of another
			// incarnation, and is drained (PutDrain) with every call
			// that took it still counted, before anyone uses the new one.
			c.routes.Store(id, e)
			c.n++
			c.owners[ownerOf(e)]++
			old = e
		}
	}
	var draining, same bool
	if old != nil {
		draining, same = old.state.Load()&hintedBit != 0, old.a.owner.Equal(a.owner)
	}
	switch c.policy.Put(res, old != nil, draining, same) {
	case spotcall.PutWait:
		return nil, old.drained, false
	case spotcall.PutDrain:
		return nil, nil, true
	case spotcall.PutSame:
		// One more use. A hint takes mu, so none comes between the look
		// and the count.
		old.state.Add(1)
		return &routeUse{r: old}, nil, false
	}
	delete(c.expired, id)
	if c.n >= c.maxRoutes {
		// Displace an arbitrary route (the cache only saves reads), one
		// not being drained: its callers wait for its barrier, and it
		// leaves by itself once answered. The displaced route is drained
		// at its next resolve if the Spot moved, as an aged-out route is.
		c.routes.Range(func(k, v any) bool {
			r := v.(*cachedRoute)
			if r.state.Load()&hintedBit != 0 {
				return true
			}
			c.removeLocked(k.(string), r)
			c.keepExpiredLocked(k.(string), r)
			return false
		})
	}
	r := &cachedRoute{a: a, at: c.clock.Now()}
	r.state.Store(1)
	c.routes.Store(id, r)
	c.n++
	c.owners[ownerOf(r)]++
	return &routeUse{r: r}, nil, false
}

// hinted marks id's route as followed and reports the route to drain, if
// it was cached and not already draining, with a channel closed once no
// call that took the route is still about to send on it. Until drop,
// callers wait instead of using it, so everything this node sent on the
// old route is ahead of the barrier, and nothing after it.
func (c *routeCache) hinted(id string) (authority, <-chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.load(id)
	if r == nil || r.state.Load()&hintedBit != 0 {
		return authority{}, nil, false
	}
	return r.a, c.hintLocked(r), true
}

// hintLocked marks the unhinted route r as being drained and returns the
// channel closed once no call that took it is still about to send on it.
func (c *routeCache) hintLocked(r *cachedRoute) <-chan struct{} {
	r.drained, r.idle = make(chan struct{}), make(chan struct{})
	if r.state.Or(hintedBit) == 0 { // nobody was about to send on it
		r.idleOnce.Do(func() { close(r.idle) })
	}
	return r.idle
}

// dropOwnersNotIn drops every cached route whose owner is not among the
// live (node RID → lease) pairs: a node that left takes its routes with it.
func (c *routeCache) dropOwnersNotIn(live map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gone := false
	for o := range c.owners {
		if !o.listed(live) {
			gone = true
			break
		}
	}
	if !gone {
		return
	}
	c.routes.Range(func(k, v any) bool {
		r := v.(*cachedRoute)
		if !ownerOf(r).listed(live) {
			r.leave()
			c.removeLocked(k.(string), r)
		}
		return true
	})
}

func (c *routeCache) drop(id string) { c.dropRoute(id, nil) }

// dropRoute drops id's route if it is r (any route, r nil) and wakes its
// waiters.
func (c *routeCache) dropRoute(id string, r *cachedRoute) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.load(id); cur != nil && (r == nil || cur == r) {
		cur.leave()
		c.removeLocked(id, cur)
	}
}

func (c *routeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
