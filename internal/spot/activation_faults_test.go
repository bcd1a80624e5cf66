package spot_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/roamerr"
)

// Cold activations while the store's transactions fail in every way it
// may — refused, or answered unknown with the write applied or not — on
// the reservations (with their recovery roots in the same transaction),
// the Ready commits and the pointers' removals: every error is typed, no
// first message runs twice, one that succeeded ran once, and afterwards
// every Spot answers (none is left Creating, or Ready with nothing
// serving it). Two nodes on one store, each node's calls faulty.
// Reference: docs/PROTOCOL.md §7.5 (steps 8–12), §7.7; location.OpCreateRoot.
func TestColdActivationsUnderStoreFaults(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		rnd := rand.New(rand.NewPCG(7, 11))
		var stores []*faulty.Store
		for i := 0; i < 2; i++ {
			f, err := faulty.New(store, faulty.Config{})
			require.NoError(t, err)
			// A fault on about a third of the transactions, in a fixed
			// pattern; reads, leases and listings pass.
			script := make([]faulty.Fault, 300)
			for j := range script {
				if rnd.IntN(3) == 0 {
					script[j] = []faulty.Fault{faulty.Unavailable, faulty.IndeterminateApplied, faulty.IndeterminateLost}[rnd.IntN(3)]
				}
			}
			f.InjectOn("apply", script...)
			stores = append(stores, f)
			w.start(withStore(f))
		}
		const ids, workers = 24, 6
		var mu sync.Mutex
		succeeded := map[string]bool{} // value → its request succeeded
		var wg sync.WaitGroup
		for g := 0; g < workers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < ids; i += workers {
					id, v := fmt.Sprintf("faulty-%d", i), fmt.Sprintf("first-%d", i)
					_, err := w.nodes[i%2].Spots().Request(id, wrapperspb.String(v)).InstanceSpot("cart").Timeout(3 * time.Second).Do(ctx)
					if err != nil && !typed(err) {
						t.Errorf("%s: untyped error %v", id, err)
					}
					mu.Lock()
					succeeded[v] = err == nil
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		// Every Spot answers in the end: a reservation left behind is
		// resumed or replaced once abandoned (5 s past its deadline).
		for i := 0; i < ids; i++ {
			id := fmt.Sprintf("faulty-%d", i)
			failed := 0 // attempts that failed: one whose reply was lost may have run
			eventually(t, id+" to answer after the faults", func() bool {
				_, err := w.nodes[(i+1)%2].Spots().Request(id, wrapperspb.String("after-"+id)).InstanceSpot("cart").Timeout(3 * time.Second).Do(ctx)
				if err != nil && !errors.Is(err, roamerr.ErrUnavailable) && !errors.Is(err, roamerr.ErrDeadlineExceeded) && !errors.Is(err, roamerr.ErrStale) {
					t.Fatalf("%s after the faults: %v", id, err)
				}
				if err != nil {
					failed++
				}
				return err == nil
			})
			handled := w.handledOf(id)
			counts := map[string]int{}
			for _, v := range handled {
				counts[v]++
			}
			first := fmt.Sprintf("first-%d", i)
			require.LessOrEqual(t, counts[first], 1, "%s: first message handled %d times (%v)", id, counts[first], handled)
			if succeeded[first] {
				require.Equal(t, 1, counts[first], "%s: a first message that succeeded ran %d times", id, counts[first])
			}
			require.GreaterOrEqual(t, counts["after-"+id], 1, "%s: %v", id, handled)
			require.LessOrEqual(t, counts["after-"+id], 1+failed, "%s: more runs than failed attempts: %v", id, handled)
		}
		var faults int
		for _, f := range stores {
			s := f.Stats()
			faults += s.Unavailable + s.IndeterminateApplied + s.IndeterminateLost
		}
		ok := 0
		for _, s := range succeeded {
			if s {
				ok++
			}
		}
		t.Logf("%d of %d first requests succeeded under %d faults", ok, ids, faults)
		require.Positive(t, faults, "no fault was injected")
	})
}
