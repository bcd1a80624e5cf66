package spot

import (
	"sync"
	"time"
)

// routeCache is the positive route cache (spec 002 §5, §6): only a Ready
// authority whose owner is alive is kept, for at most maxAge; Missing,
// Creating and store failures are never cached, so the next call reads the
// store again. A Message Follow hint, a stale route or a type mismatch
// drops the entry.
type routeCache struct {
	maxAge time.Duration
	mu     sync.Mutex
	routes map[string]cachedRoute
}

type cachedRoute struct {
	a        authority
	at       time.Time
	draining bool // a Message Follow hint came; the barrier is on its way
}

func newRouteCache(maxAge time.Duration) *routeCache {
	return &routeCache{maxAge: maxAge, routes: map[string]cachedRoute{}}
}

func (c *routeCache) get(id string) (authority, bool) {
	if c.maxAge <= 0 {
		return authority{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[id]
	if !ok {
		return authority{}, false
	}
	if time.Since(r.at) >= c.maxAge {
		delete(c.routes, id)
		return authority{}, false
	}
	return r.a, true
}

// put keeps a only when it is Ready with a live owner.
func (c *routeCache) put(id string, a authority) {
	if c.maxAge <= 0 || !a.ready() || a.ended {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.routes) >= maxCachedRoutes {
		for k := range c.routes { // drop an arbitrary entry: the cache only saves reads
			delete(c.routes, k)
			break
		}
	}
	c.routes[id] = cachedRoute{a: a, at: time.Now()}
}

// hinted marks id's route as followed and reports the route to drain, if
// it was cached and not already draining. Until drop, get keeps returning
// it, so this node's messages stay on one route, in order.
func (c *routeCache) hinted(id string) (authority, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.routes[id]
	if !ok || r.draining {
		return authority{}, false
	}
	r.draining = true
	c.routes[id] = r
	return r.a, true
}

func (c *routeCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.routes, id)
}

func (c *routeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.routes)
}

// maxCachedRoutes bounds the cache's memory.
const maxCachedRoutes = 100_000
