package spot

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Calls by Spot ID from objects' turns on a saturated node: 800 tokens,
// each hop a new goroutine (as a mailbox is scheduled) that takes a cached
// route, works 2 µs and says it sent. "floor" is the same without the
// cache: the Go scheduler's own waits, when every token is always
// runnable. over-1ms-per-M counts hops that took over 1 ms per million,
// max-ms the slowest. With one lock around the cache, hops waited there
// in a convoy (~60,000 per million over 1 ms against ~130 for the floor);
// the cache's use and release now take no lock and stay near the floor.
func BenchmarkRouteCacheSaturated(b *testing.B) {
	b.Run("cache", func(b *testing.B) { saturate(b, true) })
	b.Run("floor", func(b *testing.B) { saturate(b, false) })
}

func saturate(b *testing.B, useCache bool) {
	c := newRouteCache(time.Hour, DefaultRouteCacheMaxRoutes)
	const ids, tokens = 5000, 800
	names := make([]string, ids)
	for i := range names {
		names[i] = fmt.Sprint(i)
		c.put(names[i], readyAt(names[i]))
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var mu sync.Mutex
	var waits []time.Duration
	var wg sync.WaitGroup
	var hop func(tok, n int)
	hop = func(tok, n int) {
		if left.Add(-1) < 0 {
			wg.Done()
			return
		}
		id := names[(tok*7919+n)%ids]
		start := time.Now()
		var use *routeUse
		if useCache {
			_, _, _, use = c.use(id)
		}
		work := time.Now()
		for time.Since(work) < 2*time.Microsecond {
		}
		use.sent()
		if d := time.Since(start); d > time.Millisecond {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
		}
		go hop(tok, n+1)
	}
	b.ResetTimer()
	wg.Add(tokens)
	for t := range tokens {
		go hop(t, 0)
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(waits)
	if len(waits) > 0 {
		b.ReportMetric(float64(waits[len(waits)-1].Milliseconds()), "max-ms")
	}
	b.ReportMetric(float64(len(waits))/float64(b.N)*1e6, "over-1ms-per-M")
}
