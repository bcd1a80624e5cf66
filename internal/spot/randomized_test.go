package spot_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// typed reports whether err belongs to exactly one of roam's error
// classes (roamerr's package documentation).
func typed(err error) bool { return len(roamerrtest.ClassesOf(err)) == 1 }

// Random Spot operations from several goroutines on three nodes — cold
// activations, GetOrCreate, calls, moves, Close and CloseSelf on a few IDs
// — keep the invariants: every error is typed; a call that succeeded was
// handled exactly once and one that failed at most once; no record stays
// Creating or Closing; and at most one node serves each Spot, the one the
// store names.
// Reference: docs/PROTOCOL.md §7.2, §7.4, §7.6, §7.9, §10 (exactly once).
func TestRandomizedSpotOperations(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(3)
		const workers, opsPerWorker = 4, 60
		carts := []string{"rc-0", "rc-1", "rc-2"}
		rooms := []string{"rr-0", "rr-1", "rr-2"}
		var seq atomic.Int64
		var mu sync.Mutex
		succeeded := map[string]bool{} // request value → it succeeded
		lastErr := map[string]error{}
		var untyped []error
		errCount := map[string]int{}
		var wg sync.WaitGroup
		for g := 0; g < workers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(uint64(g), 42))
				for i := 0; i < opsPerWorker; i++ {
					n := w.nodes[rnd.IntN(len(w.nodes))]
					var err error
					switch op := rnd.IntN(10); {
					case op < 4: // a call with Instance intent to a cart
						v := fmt.Sprintf("v%d", seq.Add(1))
						_, err = n.Spots().Request(carts[rnd.IntN(len(carts))], wrapperspb.String(v)).InstanceSpot("cart").Timeout(10 * time.Second).Do(ctx)
						mu.Lock()
						succeeded[v] = err == nil
						lastErr[v] = err
						mu.Unlock()
					case op < 6: // GetOrCreate a room, then call it
						id := rooms[rnd.IntN(len(rooms))]
						if _, err = n.Spots().GetOrCreate(id, "room").Timeout(10 * time.Second).Do(ctx); err == nil {
							v := fmt.Sprintf("v%d", seq.Add(1))
							_, err = n.Spots().Request(id, wrapperspb.String(v)).Timeout(10 * time.Second).Do(ctx)
							mu.Lock()
							succeeded[v] = err == nil
							lastErr[v] = err
							mu.Unlock()
						}
					case op < 8: // move a cart from its owner to another node
						id := carts[rnd.IntN(len(carts))]
						ref, ferr := n.Spots().Find(ctx, id)
						if ferr != nil {
							err = ferr
							break
						}
						for _, owner := range w.nodes {
							if owner.NodeRid() == ref.NodeRid {
								_, err = owner.Relocate(ctx, extension.InstanceSpotRef(id), w.nodes[rnd.IntN(len(w.nodes))].NodeRid())
							}
						}
					case op < 9: // close a room
						id := rooms[rnd.IntN(len(rooms))]
						if ref, ferr := n.Spots().Find(ctx, id); ferr == nil {
							_, err = n.Spots().Close(ctx, ref)
						}
					default: // a cart closes itself
						v := "close"
						_, err = n.Spots().Request(carts[rnd.IntN(len(carts))], wrapperspb.String(v)).Timeout(10 * time.Second).Do(ctx)
					}
					if err != nil {
						mu.Lock()
						errCount[roamerr.Code(err)]++
						if c := roamerr.Code(err); c == roamerr.CodeTypeMismatch || c == roamerr.CodeDeadlineExceeded {
							t.Logf("op error: %v", err)
						}
						mu.Unlock()
					}
					if err != nil && !typed(err) {
						mu.Lock()
						untyped = append(untyped, err)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		require.Empty(t, untyped, "every error is one of roam's classes")
		t.Logf("errors by class: %v", errCount)

		handled := map[string]int{}
		w.mu.Lock()
		for _, vs := range w.handled {
			for _, v := range vs {
				handled[v]++
			}
		}
		w.mu.Unlock()
		mu.Lock()
		for v, err := range lastErr {
			if errors.Is(err, roamerr.ErrDeadlineExceeded) {
				t.Logf("%s: %v; handled %d times", v, err, handled[v])
			}
		}
		for v, ok := range succeeded {
			if ok {
				require.Equal(t, 1, handled[v], "%s succeeded: handled exactly once", v)
			} else {
				require.LessOrEqual(t, handled[v], 1, "%s failed: handled at most once", v)
			}
		}
		mu.Unlock()

		for _, id := range append(carts, rooms...) {
			var key location.AuthorityKey
			eventually(t, "no record of "+id+" stays Creating or Closing", func() bool {
				for _, kind := range []location.Kind{location.KindInstanceSpot, location.KindUserSpot} {
					v, err := store.Read(ctx, location.Key(kind, id))
					if errors.Is(err, location.ErrNotFound) {
						continue
					}
					if err != nil || v.Record.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
						return false
					}
					key = v.Key
				}
				return true
			})
			if key.ID == "" {
				continue // Missing
			}
			// A node whose lease a loaded machine let lapse has its objects
			// taken over: the record may name the new owner a moment before
			// its incarnation opens (never two serving meanwhile).
			eventually(t, id+" has exactly one serving incarnation, where the store says", func() bool {
				v, err := store.Read(ctx, key)
				if errors.Is(err, location.ErrNotFound) {
					// A cart's own close (its "close" handler asks for it)
					// ends after the call that asked: on a loaded machine
					// it may land after the settling above. Then no node
					// serves the cart.
					for _, n := range w.nodes {
						ok, err := n.Serving(ctx, key)
						require.NoError(t, err)
						if ok {
							return false
						}
					}
					return true
				}
				require.NoError(t, err)
				serving := 0
				for _, n := range w.nodes {
					ok, err := n.Serving(ctx, key)
					require.NoError(t, err)
					if ok {
						serving++
						if v.Record.GetOwner().GetNodeRid() != n.NodeRid() {
							return false // moved on since the read: look again
						}
					}
				}
				require.LessOrEqual(t, serving, 1, "%s has two serving incarnations", id)
				return serving == 1
			})
		}
		w.mu.Lock()
		if len(w.fences) > 0 {
			t.Logf("lease changes: %v", w.fences)
		}
		w.mu.Unlock()
	})
}

// Calls and moves keep going while a node leaves and another joins: every
// error is typed, a call that succeeded was handled exactly once and one
// that failed at most once, and afterwards each Instance Spot answers a
// call with Instance intent (reactivated on a live node if its owner left)
// and is served by exactly one live node, the one the store names.
// Reference: PROTOCOL.md §7.10 (reactivation after the owner ended), §7.4.
func TestInstanceSpotsSurviveANodeLeaving(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		t.Cleanup(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if t.Failed() && len(w.fences) > 0 {
				t.Logf("lease fences during the test: %v", w.fences)
			}
		})
		w.startN(3)
		var liveMu sync.Mutex
		live := append([]*extension.Extension(nil), w.nodes...)
		pick := func(rnd *rand.Rand) *extension.Extension {
			liveMu.Lock()
			defer liveMu.Unlock()
			return live[rnd.IntN(len(live))]
		}
		carts := []string{"nc-0", "nc-1", "nc-2", "nc-3", "nc-4"}
		var seq atomic.Int64
		var mu sync.Mutex
		succeeded := map[string]bool{}
		var untyped []error
		var wg sync.WaitGroup
		const workers, ops = 3, 80
		var done atomic.Int64
		for g := 0; g < workers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(uint64(g), 7))
				for i := 0; i < ops; i++ {
					n := pick(rnd)
					id := carts[rnd.IntN(len(carts))]
					var err error
					began := time.Now()
					if rnd.IntN(4) == 0 {
						if ref, ferr := n.Spots().Find(ctx, id); ferr == nil && ref.NodeRid == n.NodeRid() {
							_, err = n.Relocate(ctx, extension.InstanceSpotRef(id), pick(rnd).NodeRid())
						}
					} else {
						v := fmt.Sprintf("v%d", seq.Add(1))
						_, err = n.Spots().Request(id, wrapperspb.String(v)).InstanceSpot("cart").Timeout(10 * time.Second).Do(ctx)
						mu.Lock()
						succeeded[v] = err == nil
						mu.Unlock()
					}
					if time.Since(began) > 2*time.Second {
						t.Logf("slow op on %s: %v after %v", id, err, time.Since(began))
					}
					if err != nil && !typed(err) {
						mu.Lock()
						untyped = append(untyped, err)
						mu.Unlock()
					}
					done.Add(1)
				}
			}()
		}
		// Half-way, node 0 leaves (its lease and descriptor go) and a new
		// node joins.
		eventually(t, "half the operations", func() bool { return done.Load() >= workers*ops/2 })
		leaving := w.nodes[0]
		liveMu.Lock()
		live = live[1:]
		liveMu.Unlock()
		require.NoError(t, leaving.Stop(ctx))
		joined := w.start()
		liveMu.Lock()
		live = append(live, joined)
		liveMu.Unlock()
		wg.Wait()
		require.Empty(t, untyped, "every error is one of roam's classes")

		handled := map[string]int{}
		w.mu.Lock()
		for _, vs := range w.handled {
			for _, v := range vs {
				handled[v]++
			}
		}
		w.mu.Unlock()
		for v, ok := range succeeded {
			if ok {
				require.Equal(t, 1, handled[v], "%s succeeded: handled exactly once", v)
			} else {
				require.LessOrEqual(t, handled[v], 1, "%s failed: handled at most once", v)
			}
		}
		for _, id := range carts {
			// roam never resends a call after it left (PROTOCOL.md §7.4); the
			// caller may. A Spot whose move was cut off by the node leaving
			// is Unavailable until its source has reconciled (the restore
			// deadline, 10 s, and a cutover wait): retry until then.
			var err error
			for attempt, until := 0, time.Now().Add(40*time.Second); ; attempt++ {
				_, err = live[0].Spots().Request(id, wrapperspb.String(fmt.Sprintf("final-%s-%d", id, attempt))).InstanceSpot("cart").Timeout(20 * time.Second).Do(ctx)
				if !errors.Is(err, roamerr.ErrUnavailable) || time.Now().After(until) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				// Say where the store points and who serves, for diagnosis.
				v, rerr := store.Read(ctx, location.Key(location.KindInstanceSpot, id))
				t.Logf("%s: record %v (read error %v)", id, v.Record, rerr)
				for _, n := range live {
					ok, serr := n.Serving(ctx, v.Key)
					t.Logf("node %s at %s serving %v (%v)", n.NodeRid(), n.Node().Address(), ok, serr)
				}
			}
			require.NoError(t, err, "%s answers after the node left", id)
			v, err := store.Read(ctx, location.Key(location.KindInstanceSpot, id))
			require.NoError(t, err)
			serving := 0
			for _, n := range live {
				ok, err := n.Serving(ctx, v.Key)
				require.NoError(t, err)
				if ok {
					serving++
					require.Equal(t, v.Record.GetOwner().GetNodeRid(), n.NodeRid())
				}
			}
			require.Equal(t, 1, serving, "%s has exactly one serving incarnation", id)
		}
	})
}
