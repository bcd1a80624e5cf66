package roam_test

import (
	"context"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// watchedStore is a faulty store whose node claims are observed: how
// many are in flight, and the context error each one ended with.
type watchedStore struct {
	*faulty.Store
	claiming    atomic.Int32
	mu          sync.Mutex
	claimsEnded []error // ctx.Err() as each claim returned
}

func (w *watchedStore) ClaimNode(ctx context.Context, node *location.NodeDescriptor, ttl time.Duration) (location.Lease, error) {
	w.claiming.Add(1)
	defer w.claiming.Add(-1)
	ls, err := w.Store.ClaimNode(ctx, node, ttl)
	w.mu.Lock()
	w.claimsEnded = append(w.claimsEnded, ctx.Err())
	w.mu.Unlock()
	return ls, err
}

func (w *watchedStore) claims() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.claimsEnded...)
}

// A Stop while the rejoin's claim waits on a store that does not answer
// ends that claim: the rejoin's attempt runs under the Stop, not under its
// own timeout (which kept Stop waiting for it, and the attempt's goroutines
// alive after the node was meant to be gone).
func TestStopEndsTheRejoinsClaim(t *testing.T) {
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	w := &watchedStore{Store: f}
	a := start(t, w, roam.WithNodeName("a"))
	// Start's own claim is among them: only a later one is the rejoin's.
	started := len(w.claims())
	cutUntilLeaseEnds(t, f, store, a.NodeRid())
	// The store answers again, so the node learns its lease ended and
	// rejoins; its claims fail until the store is cut once more, and the
	// next claim then waits on the cut.
	failClaims(f, 10_000)
	f.Partition(false)
	testwait.For(t, func() bool { return len(w.claims()) > started }, "the rejoin never claimed")
	f.Partition(true)
	testwait.For(t, func() bool { return w.claiming.Load() > 0 }, "the rejoin's claim never waited on the cut store")

	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop(context.Background()) }()
	testwait.For(t, func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}, "Stop never returned")
	require.Zero(t, w.claiming.Load(), "a claim of the rejoin is still waiting after Stop returned")
	claims := w.claims()
	require.ErrorIs(t, claims[len(claims)-1], context.Canceled,
		"the rejoin's claim ran to its own deadline: Stop waited for it instead of ending it")
	f.Partition(false)
}

// goroutineHeader is the first line of a goroutine in a stack dump.
var goroutineHeader = regexp.MustCompile(`^goroutine (\d+) \[`)

// lifecycleGoroutines returns the stacks of the goroutines newer than
// after that run a node lifecycle's own machinery (the Extension's rejoin,
// sweeps and scans, the node's lease and claims, the operators' service),
// and the highest goroutine ID seen.
func lifecycleGoroutines(after int) (stacks []string, maxID int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		m := goroutineHeader.FindStringSubmatch(g)
		if m == nil {
			continue
		}
		id, _ := strconv.Atoi(m[1])
		maxID = max(maxID, id)
		if id <= after && !strings.Contains(g, "roam/internal/machine.(*worker).loop(") {
			// Older than after, unless a pooled worker (machine.Go): it
			// may have taken its work since.
			continue
		}
		for _, line := range strings.Split(g, "\n") {
			if strings.HasPrefix(line, "created by ") || strings.HasPrefix(line, "\t") {
				continue // only the frames the goroutine runs in
			}
			if strings.Contains(line, "roam/internal/extension.") || strings.Contains(line, "roam/internal/meshnode.(*Node)") ||
				strings.Contains(line, "roam/internal/operator.Serve") || strings.Contains(line, "roam/internal/operator.(*MoveFeed)") {
				stacks = append(stacks, g)
				break
			}
		}
	}
	return stacks, maxID
}

// After a rejoin, Stop ends every goroutine of the node's lifecycles, even
// with the store cut off and a sweep of the current lifecycle waiting on
// it: none is left to run on under a timeout of its own.
func TestStopAfterRejoinLeavesNoGoroutine(t *testing.T) {
	ctx := context.Background()
	_, baseline := lifecycleGoroutines(0)
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	w := &watchedStore{Store: f}
	a := start(t, w, roam.WithNodeName("a"), roam.WithDrainOnStop(false))
	rejoinAfterLeaseEnds(t, a, f, store)
	_, err = a.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)

	f.Partition(true)
	testwait.For(t, func() bool {
		stacks, _ := lifecycleGoroutines(baseline)
		for _, g := range stacks {
			if strings.Contains(g, "sweepEnded") && strings.Contains(g, "ListNodes") {
				return true
			}
		}
		return false
	}, "the lifecycle's sweep never waited on the cut store")
	_ = a.Stop(ctx) // the release fails on the cut store; the lease ends by itself
	// None of them still waits on the store (the cut stays until the
	// check): each ended its call when Stop began, not by its own timeout.
	stacks, _ := lifecycleGoroutines(baseline)
	for _, g := range stacks {
		require.NotContains(t, g, "location/faulty.(*Store).cut", "a goroutine of the node's lifecycles still waits on the store after Stop returned")
	}
	// A goroutine that Stop waited for may still be returning.
	testwait.For(t, func() bool {
		stacks, _ := lifecycleGoroutines(baseline)
		return len(stacks) == 0
	}, "goroutines of the node's lifecycles still run after Stop")
	f.Partition(false)
}
