package pinned

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/testwait"
)

// An actor on a pinned dispatcher gets every message in order, its runs
// never overlap, and Close ends the goroutine: later messages still
// arrive, each run on a goroutine of its own.
func TestAPinnedActorGetsEverythingInOrderAndCloseEndsItsGoroutine(t *testing.T) {
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	before := runtime.NumGoroutine()
	d := New(300)
	var mu sync.Mutex
	var got []int
	var inTurn atomic.Int32
	overlapped := atomic.Bool{}
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(int); ok {
			if inTurn.Add(1) > 1 {
				overlapped.Store(true)
			}
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
			inTurn.Add(-1)
		}
	}, actor.WithDispatcher(d)))
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	const n = 20000
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		sys.Root.Send(pid, i)
		if i == n/2 {
			wg.Add(1)
			go func() { defer wg.Done(); d.Close() }() // mid-stream: nothing lost
		}
	}
	wg.Wait()
	testwait.For(t, func() bool { return count() == n }, "every message handled")
	require.False(t, overlapped.Load(), "two runs of the mailbox overlapped")
	mu.Lock()
	for i, v := range got {
		require.Equal(t, i, v, "out of order")
	}
	mu.Unlock()
	d.Close() // idempotent
	sys.Root.Stop(pid)
	testwait.For(t, func() bool { return runtime.NumGoroutine() <= before }, "the pinned goroutine to end after Close")
	require.Equal(t, 300, d.Throughput())
}
