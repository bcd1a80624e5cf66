package spot

import (
	"sync"
	"time"
)

// routeCache is the positive route cache (docs/PROTOCOL.md §7.8): only a Ready
// authority whose owner is alive is kept, for at most maxAge; Missing,
// Creating and store failures are never cached, so the next call reads the
// store again. A Message Follow hint, a stale route or a type mismatch
// drops the entry.
type routeCache struct {
	maxAge  time.Duration
	mu      sync.Mutex
	routes  map[string]cachedRoute
	expired map[string]authority // routes that aged out, until the next resolve
	// owners counts the cached routes of each owner lifecycle, so that the
	// sweep for owners that left (dropOwnersNotIn) walks the routes only
	// when one of them did: a node caching 100,000 routes does not stop
	// its calls once a second to check them all.
	owners map[routeOwner]int
}

type routeOwner struct{ rid, lease string }

func ownerOf(r cachedRoute) routeOwner {
	o := r.a.v.Record.GetOwner()
	return routeOwner{o.GetNodeRid(), o.GetLeaseId()}
}

// setLocked caches r as id's route.
func (c *routeCache) setLocked(id string, r cachedRoute) {
	c.removeLocked(id)
	c.routes[id] = r
	c.owners[ownerOf(r)]++
}

// removeLocked drops id's route from the cache.
func (c *routeCache) removeLocked(id string) {
	r, ok := c.routes[id]
	if !ok {
		return
	}
	delete(c.routes, id)
	o := ownerOf(r)
	if c.owners[o]--; c.owners[o] <= 0 {
		delete(c.owners, o)
	}
}

type cachedRoute struct {
	a  authority
	at time.Time
	// drained is set once a Message Follow hint came and a RouteBarrier is
	// on its way down the route; it is closed when the route is dropped.
	drained chan struct{}
	// users counts calls that took this route from the cache and have not
	// sent on it yet; a hinted route's barrier waits for them (idle), so
	// nothing this node sends on the route can be behind its barrier.
	users int
	idle  chan struct{}
}

func newRouteCache(maxAge time.Duration) *routeCache {
	return &routeCache{maxAge: maxAge, routes: map[string]cachedRoute{}, expired: map[string]authority{}, owners: map[routeOwner]int{}}
}

// use returns the cached route of id for a call that sends on it, with
// sent, which the caller must call once it has sent (or given up): a
// barrier down a hinted route waits for every such call. A route being
// drained is not returned: the caller gets the channel to wait on
// instead, so that nothing is sent down the old route after its barrier.
func (c *routeCache) use(id string) (a authority, ok bool, drained <-chan struct{}, sent func()) {
	noop := func() {}
	if c.maxAge <= 0 {
		return authority{}, false, nil, noop
	}
	// One critical section with the look-up: a hint that marks the route
	// after it makes this call wait for the drain, never skip it.
	c.mu.Lock()
	defer c.mu.Unlock()
	r, found := c.routes[id]
	switch {
	case !found:
		return authority{}, false, nil, noop
	case r.drained != nil:
		return authority{}, false, r.drained, noop
	case time.Since(r.at) >= c.maxAge:
		c.removeLocked(id)
		if len(c.expired) >= maxCachedRoutes {
			clear(c.expired)
		}
		c.expired[id] = r.a
		return authority{}, false, nil, noop
	}
	r.users++
	c.routes[id] = r
	var once sync.Once
	ra := r.a
	return ra, true, nil, func() { once.Do(func() { c.release(id, ra) }) }
}

// release ends one use of id's route a.
func (c *routeCache) release(id string, a authority) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[id]
	if !ok || r.a.v.Version != a.v.Version || r.users == 0 {
		return
	}
	r.users--
	if r.users == 0 && r.idle != nil {
		close(r.idle)
		r.idle = nil
	}
	c.routes[id] = r
}

// get returns the cached route of id. A route being drained is not
// returned: the caller gets the channel to wait on instead, so that
// nothing is sent down the old route after its barrier.
func (c *routeCache) get(id string) (authority, bool, <-chan struct{}) {
	if c.maxAge <= 0 {
		return authority{}, false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[id]
	switch {
	case !ok:
		return authority{}, false, nil
	case r.drained != nil:
		return authority{}, false, r.drained
	case time.Since(r.at) >= c.maxAge:
		c.removeLocked(id)
		if len(c.expired) >= maxCachedRoutes {
			clear(c.expired) // only a refinement of order; memory stays bounded
		}
		c.expired[id] = r.a
		return authority{}, false, nil
	}
	return r.a, true, nil
}

// takeExpired returns the route of id that expired since the last call,
// if any: the caller drains it before using a different owner.
func (c *routeCache) takeExpired(id string) (authority, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.expired[id]
	delete(c.expired, id)
	return a, ok
}

// put keeps a only when it is Ready with a live owner.
func (c *routeCache) put(id string, a authority) {
	if c.maxAge <= 0 || !a.ready() || a.ended {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.routes[id]; ok && r.drained != nil {
		// Being drained: its barrier and its waiting callers own the
		// entry until drop; the next call reads the store again.
		return
	}
	delete(c.expired, id)
	a.owner = a.pid()
	if len(c.routes) >= maxCachedRoutes {
		for k, r := range c.routes { // drop an arbitrary entry: the cache only saves reads
			r.release()
			c.removeLocked(k)
			break
		}
	}
	c.setLocked(id, cachedRoute{a: a, at: time.Now()})
}

// hinted marks id's route as followed and reports the route to drain, if
// it was cached and not already draining, with a channel closed once no
// call that took the route is still about to send on it. Until drop,
// callers wait instead of using it, so everything this node sent on the
// old route is ahead of the barrier, and nothing after it.
func (c *routeCache) hinted(id string) (authority, <-chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[id]
	if !ok || r.drained != nil {
		return authority{}, nil, false
	}
	r.drained = make(chan struct{})
	idle := make(chan struct{})
	if r.users == 0 {
		close(idle)
	} else {
		r.idle = idle
	}
	c.routes[id] = r
	return r.a, idle, true
}

// dropOwnersNotIn drops every cached route whose owner is not among the
// live (node RID → lease) pairs: a node that left takes its routes with it.
func (c *routeCache) dropOwnersNotIn(live map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gone := false
	for o := range c.owners {
		if lease, ok := live[o.rid]; !ok || lease != o.lease {
			gone = true
			break
		}
	}
	if !gone {
		return
	}
	for id, r := range c.routes {
		o := ownerOf(r)
		if lease, ok := live[o.rid]; !ok || lease != o.lease {
			r.release()
			c.removeLocked(id)
		}
	}
}

func (c *routeCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.routes[id]; ok {
		r.release()
	}
	c.removeLocked(id)
}

// release wakes whoever waits on a route that leaves the cache: callers
// waiting for its drain, and a barrier waiting for its users (they will
// not be counted any more).
func (r cachedRoute) release() {
	if r.drained != nil {
		close(r.drained)
	}
	if r.idle != nil {
		close(r.idle)
	}
}

func (c *routeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.routes)
}

// maxCachedRoutes bounds the cache's memory.
const maxCachedRoutes = 100_000
