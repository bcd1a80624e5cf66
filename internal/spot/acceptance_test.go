package spot_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Three nodes, fifty goroutines each, call GetOrCreate on one Spot ID at
// once: exactly one reservation wins, the factory runs once, one Ready
// incarnation exists, one caller sees Created and every other Existing
// with that incarnation's SpotRef.
// Reference: docs/PROTOCOL.md §7.2, §12.2 item 7 (concurrent creates
// converge on one reservation and one factory run).
func TestConcurrentGetOrCreateConvergesOnOneFactoryRun(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		const perNode = 50
		var wg sync.WaitGroup
		results := make(chan spot.CreateResult, 3*perNode)
		errs := make(chan error, 3*perNode)
		for _, n := range w.nodes {
			for i := 0; i < perNode; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := n.Spots().GetOrCreate("lobby", "room").Timeout(20 * time.Second).Do(context.Background())
					if err != nil {
						errs <- err
						return
					}
					results <- res
				}()
			}
		}
		wg.Wait()
		close(results)
		close(errs)
		for err := range errs {
			t.Errorf("GetOrCreate: %v", err)
		}
		created, existing := 0, 0
		var gen uint64
		for r := range results {
			switch r.State {
			case spot.Created:
				created++
			case spot.Existing:
				existing++
			default:
				t.Errorf("unexpected state %s", r.State)
			}
			if gen == 0 {
				gen = r.Ref.ObjectGeneration
			}
			require.Equal(t, gen, r.Ref.ObjectGeneration, "every caller names the same incarnation")
		}
		require.Equal(t, 1, created)
		require.Equal(t, 3*perNode-1, existing)
		require.EqualValues(t, 1, w.count("room").Load(), "one factory run")
		v, err := store.Read(context.Background(), location.Key(location.KindUserSpot, "lobby"))
		require.NoError(t, err)
		require.Equal(t, messages.LifecycleState_LIFECYCLE_STATE_READY, v.Record.GetState())
		require.Equal(t, gen, v.Record.GetObjectGeneration())
		require.Nil(t, v.Record.GetCreationIntent(), "the creation intent is gone once Ready")
	})
}

// Three nodes, fifty goroutines each, send a first message with Instance
// intent to one Missing Spot ID: one instance is activated, every message
// is handled exactly once, and the first message the instance handles is
// the one whose activation created it (checked in the handler against the
// record's recovery pointer, which names that activation until its first
// handler completes).
// Reference: PROTOCOL.md §7.5, §7.6, §12.2 item 15 (only the node that
// won the reservation runs the factory, and the first message is always
// handled first).
func TestConcurrentFirstMessagesActivateOneInstance(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		const perNode = 50
		var wg sync.WaitGroup
		errs := make(chan error, 3*perNode)
		for ni, n := range w.nodes {
			for i := 0; i < perNode; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := n.Spots().Request("cart-1", wrapperspb.String(fmt.Sprintf("n%d-%d", ni, i))).
						InstanceSpot("cart").Timeout(20 * time.Second).Do(context.Background())
					if err != nil {
						errs <- err
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("request: %v", err)
		}
		require.EqualValues(t, 1, w.count("cart").Load(), "one instance")
		got := w.handledOf("cart-1")
		require.Len(t, got, 3*perNode)
		seen := map[string]int{}
		for _, v := range got {
			seen[v]++
		}
		for ni := range w.nodes {
			for i := 0; i < perNode; i++ {
				require.Equal(t, 1, seen[fmt.Sprintf("n%d-%d", ni, i)], "n%d-%d handled once", ni, i)
			}
		}
		w.mu.Lock()
		require.Empty(t, w.firstBad)
		require.Len(t, w.firstOps, 1)
		w.mu.Unlock()
		// The recovery pointer goes once the first handler completed, and
		// its root with it (PROTOCOL.md §7.5 step 12).
		eventually(t, "the recovery pointer is removed", func() bool {
			v, err := store.Read(context.Background(), location.Key(location.KindInstanceSpot, "cart-1"))
			return err == nil && v.Record.GetActivationRecovery() == nil
		})
	})
}
