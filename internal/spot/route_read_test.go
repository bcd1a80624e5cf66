package spot_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// heldReads counts the reads of one Spot ID's keys and holds them while
// gate is set, until it is closed.
type heldReads struct {
	location.Store
	location.RootStore
	id    string
	reads atomic.Int64
	mu    sync.Mutex
	gate  chan struct{}
}

func (h *heldReads) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if key.ID == h.id {
		h.reads.Add(1)
		h.mu.Lock()
		gate := h.gate
		h.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return location.Versioned{}, ctx.Err()
			}
		}
	}
	return h.Store.Read(ctx, key)
}

// heldRouteWorld is a world where the cart id is Ready on one node, and a
// second node (caller, its route cache empty) is about to call it, with
// the store holding every read of id until gate is closed (release does
// that and lets later reads through); before is the reads of id so far.
func heldRouteWorld(t *testing.T, id string) (w *world, store *heldReads, caller *extension.Extension, release func(), before int64) {
	mem := memstore.New()
	store = &heldReads{Store: mem, RootStore: mem, id: id}
	w = newWorld(t, store)
	_, err := request(t, w.start(), id, "1", "cart")
	require.NoError(t, err)
	caller = w.start()
	gate := make(chan struct{})
	store.mu.Lock()
	store.gate = gate
	store.mu.Unlock()
	release = func() {
		store.mu.Lock()
		store.gate = nil
		store.mu.Unlock()
		close(gate)
	}
	return w, store, caller, release, store.reads.Load()
}

// Calls on one node that need a Spot's route while a store read of it is
// on its way take that read's answer: the callers of a busy Spot whose
// route was dropped (after a move's drain, or aged out) make one read
// between them, not two each (the Instance and the User key).
// Reference: docs/PROTOCOL.md §7.8.
func TestCallsNeedingOneRouteShareOneStoreRead(t *testing.T) {
	w, store, caller, release, before := heldRouteWorld(t, "shared-cart")

	const callers = 8
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := caller.Spots().Request("shared-cart", wrapperspb.String("x")).Timeout(10 * time.Second).Do(ctx)
			errs <- err
		}()
	}
	w.eventually(t, "seven calls waiting on the first one's read", func() bool {
		return spot.RouteReadSharers(caller.Spots(), "shared-cart") == callers-1
	})
	release()
	for range callers {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 2, store.reads.Load()-before, "one resolve: the Instance and the User key, once")
	got, err := request(t, caller, "shared-cart", "y")
	require.NoError(t, err)
	require.EqualValues(t, callers+2, got, "every call reached the Spot once")
}

// A call whose read others joined, and that gives up (its caller
// cancelled), does not end theirs: they read again for themselves.
func TestARouteReadCutByItsCallerIsReadAgainByTheOthers(t *testing.T) {
	w, store, caller, release, before := heldRouteWorld(t, "cut-cart")

	first, cancel := context.WithCancel(ctx)
	firstErr := make(chan error, 1)
	go func() {
		_, err := caller.Spots().Request("cut-cart", wrapperspb.String("x")).Timeout(10 * time.Second).Do(first)
		firstErr <- err
	}()
	w.eventually(t, "the first call's read at the store", func() bool { return store.reads.Load() > before })
	secondErr := make(chan error, 1)
	go func() {
		_, err := caller.Spots().Request("cut-cart", wrapperspb.String("y")).Timeout(10 * time.Second).Do(ctx)
		secondErr <- err
	}()
	w.eventually(t, "the second call waiting on the first one's read", func() bool {
		return spot.RouteReadSharers(caller.Spots(), "cut-cart") == 1
	})
	cancel()
	require.ErrorIs(t, <-firstErr, context.Canceled)
	w.eventually(t, "the second call's own read at the store", func() bool { return store.reads.Load()-before == 4 })
	release()
	require.NoError(t, <-secondErr)
	got, err := request(t, caller, "cut-cart", "z")
	require.NoError(t, err)
	require.EqualValues(t, 3, got, "the second call reached the Spot, the cancelled one did not")
}
