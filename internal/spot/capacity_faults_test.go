package spot_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// lossyStore answers the first Apply that match selects with
// ErrIndeterminate, after applying it when apply is set (the answer was
// lost) or not (the request was); reads of keys readErr names fail.
type lossyStore struct {
	*memstore.Store
	match   func(ops []location.Op) bool
	apply   bool
	fired   atomic.Bool
	readErr func(key location.AuthorityKey) error
}

func (s *lossyStore) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	if s.match(ops) && s.fired.CompareAndSwap(false, true) {
		if s.apply {
			if _, err := s.Store.Apply(ctx, ops); err != nil {
				return nil, err
			}
		}
		return nil, location.ErrIndeterminate
	}
	return s.Store.Apply(ctx, ops)
}

func (s *lossyStore) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if s.readErr != nil {
		if err := s.readErr(key); err != nil {
			return location.Versioned{}, err
		}
	}
	return s.Store.Read(ctx, key)
}

// ReadKeys reads each key through Read, so a read of several keys at
// once (location.KeysReader, as the embedded store has) meets it too.
func (s *lossyStore) ReadKeys(ctx context.Context, keys ...location.AuthorityKey) ([]location.Versioned, error) {
	return location.ReadKeysByRead(ctx, s.Read, keys...)
}

func (s *lossyStore) CompareAndSet(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	return location.CompareAndSetByApply(ctx, s.Apply, key, expected, rec)
}

// slotsSettle waits until a node's slots agree with its records: a slot
// freed in the background (a move's stray) goes a moment after the move.
func slotsSettle(t *testing.T, store location.Store, e *extension.Extension, capacity int) {
	t.Helper()
	var why string
	testwait.For(t, func() bool {
		_, why = slotsMatch(t, store, e, capacity)
		return why == ""
	}, "the node's slots agree with its records")
	require.Empty(t, why)
}

// A move's slot take before relay-ready whose answer is lost, applied or
// not: the retry takes another slot, the move commits, and the slot the
// lost take may hold is freed — only if the store shows it held for the
// moving object. Reference: docs/PROTOCOL.md §7.12.
func TestLostArrivalSlotTakeLeavesNoSlotHeld(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprintf("applied=%v", applied), func(t *testing.T) {
			s := &lossyStore{Store: memstore.New(), apply: applied, match: func(ops []location.Op) bool {
				takes := 0
				for _, op := range ops {
					switch op.Kind {
					case location.OpTakeSlot:
						takes++
					case location.OpCheckLease:
					default:
						return false // only the arrival's own take
					}
				}
				return takes > 0
			}}
			w := newWorld(t, s)
			const capacity = 3
			a := w.start(withCapacity(capacity))
			b := w.start()
			_, err := b.SpawnActor(ctx, "cart", "mover")
			require.NoError(t, err)
			_, err = b.Relocate(ctx, extension.ActorRef("mover"), a.NodeRid())
			require.NoError(t, err)
			require.True(t, s.fired.Load(), "the take's answer was lost")
			slotsSettle(t, s, a, capacity)
		})
	}
}

// A cold activation's Ready commit whose answer is lost and that did not
// land: the activation tries again over its own reservation and keeps its
// slot instead of taking a second one. Reference: docs/PROTOCOL.md §7.12.
func TestLostReadyCommitKeepsTheReservationsSlot(t *testing.T) {
	s := &lossyStore{Store: memstore.New()}
	s.match = func(ops []location.Op) bool {
		for _, op := range ops {
			if op.Kind == location.OpUpdate && op.Key.Kind == location.KindInstanceSpot &&
				op.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY {
				return true
			}
		}
		return false
	}
	w := newWorld(t, s)
	const capacity = 3
	a := w.start(withCapacity(capacity))
	_, err := request(t, a, "cart-y", "one", "cart")
	t.Logf("first call: %v", err) // its outcome may be unknown
	require.True(t, s.fired.Load())
	_, err = request(t, a, "cart-y", "two", "cart")
	require.NoError(t, err)
	slotsSettle(t, s, a, capacity)
}

// Many nodes creating User Spots on one node with plenty of room at once
// pick free slots that rarely collide: none fails while slots are free.
// Reference: docs/PROTOCOL.md §7.12.
func TestRemoteCreationsFindFreeSlots(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		const capacity = 200
		a := w.start(withCapacity(capacity)) // the only node hosting rooms
		others := []*extension.Extension{w.start(withKinds(w.cartKind("cart"))), w.start(withKinds(w.cartKind("cart"))), w.start(withKinds(w.cartKind("cart")))}
		const creates = 45
		errs := make([]error, creates)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range creates {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = others[i%len(others)].Spots().GetOrCreate(fmt.Sprintf("many-%d", i), "room").Do(ctx)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "many-%d", i)
		}
		require.Equal(t, creates, slotsAgree(t, store, a, capacity))
	})
}

// A remote creation whose reservation landed (with a pending slot of the
// target) but whose answer was lost, so that its command 47 was never
// sent: once the reservation is abandoned, the target, full, releases it
// with its fence and its slot serves again. Reference: docs/PROTOCOL.md
// §7.12, §7.2 (abandoned reservations).
func TestAbandonedRemoteReservationReleasesTheTargetsSlot(t *testing.T) {
	clock := machine.NewManualAt(time.Now())
	base := memstore.New(memstore.WithClock(clock))
	var failReads atomic.Bool
	s := &lossyStore{Store: base, apply: true}
	s.match = func(ops []location.Op) bool {
		for _, op := range ops {
			if op.Kind == location.OpTakeSlot && op.Key.Kind == location.KindUserSpot {
				failReads.Store(true)
				return true
			}
		}
		return false
	}
	s.readErr = func(key location.AuthorityKey) error {
		if key.Kind == location.KindUserSpot && failReads.Load() {
			return location.ErrUnavailable
		}
		return nil
	}
	w := newLogicalWorldOn(t, clock, base)
	a := w.start(withCapacity(1)) // the only node hosting rooms
	b := w.start(withKinds(w.cartKind("cart")), withStore(s))
	err := await(t, w, "the creation", func() error {
		_, err := b.Spots().GetOrCreate("lost", "room").Timeout(time.Second).Do(ctx)
		return err
	})
	require.Error(t, err, "the creator never learned its reservation landed")
	failReads.Store(false)
	_, err = a.SpawnActor(ctx, "cart", "first-try")
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded, "the abandoned reservation holds a's only slot until it is abandoned")
	i := 0
	_, err = past(t, w, roamerr.ErrCapacityExceeded, func() (any, error) {
		i++
		return a.SpawnActor(ctx, "cart", fmt.Sprintf("anything-%d", i))
	})
	require.NoError(t, err)
	_, err = base.Read(ctx, location.Key(location.KindUserSpot, "lost"))
	require.ErrorIs(t, err, location.ErrNotFound, "released with its fence")
	slotsAgree(t, base, a, 1)
}
