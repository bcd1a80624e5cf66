package roam_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// heldAnswerStore is one node's view of a shared store: it applies the
// first write that hold selects, then keeps its answer from the node
// until the node next reads the key it wrote (a store answer slow to come
// back: the write is visible to everyone else meanwhile).
type heldAnswerStore struct {
	*memstore.Store
	hold    atomic.Pointer[func(ops []location.Op) bool]
	held    atomic.Pointer[location.AuthorityKey]
	release chan struct{}
	once    sync.Once
}

func (s *heldAnswerStore) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	h := s.hold.Load()
	if h == nil || !(*h)(ops) || !s.hold.CompareAndSwap(h, nil) {
		return s.Store.Apply(ctx, ops)
	}
	v, err := s.Store.Apply(ctx, ops)
	s.held.Store(&ops[0].Key)
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return v, err
}

func (s *heldAnswerStore) Read(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	if k := s.held.Load(); k != nil && *k == key {
		s.once.Do(func() { close(s.release) })
	}
	return s.Store.Read(ctx, key)
}

// ReadKeys reads each key through Read, so a read of several keys at
// once (location.KeysReader, as the embedded store has) meets it too.
func (s *heldAnswerStore) ReadKeys(ctx context.Context, keys ...location.AuthorityKey) ([]location.Versioned, error) {
	return location.ReadKeysByRead(ctx, s.Read, keys...)
}

// Relocate returns once the commit is visible in the store, before the
// target may serve. A Close asked right after it, which reads that record
// on the new owner, waits for the arrival there instead of answering
// "moving": here the target's commit answer is held until the target's
// node reads the record, which only the Close does meanwhile.
func TestCloseRightAfterAMoveWaitsForTheArrival(t *testing.T) {
	ctx := context.Background()
	shared := memstore.New()
	store := &heldAnswerStore{Store: shared, release: make(chan struct{})}
	a := start(t, shared, roam.WithNodeName("node-a"), roam.WithKinds(clubhouse))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(clubhouse))
	ref := spotOnNode(t, "den", "clubhouse", a, b)
	key := roam.UserSpotRef("den")
	hold := func(ops []location.Op) bool {
		return ops[0].Key == key && ops[0].Kind == location.OpUpdate && ops[0].Record.GetOwner().GetNodeRid() == b.NodeRid()
	}
	store.hold.Store(&hold)
	out, err := a.Relocate(ctx, key, b.NodeName())
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), out.To)
	require.NotNil(t, store.held.Load(), "the target's commit was not the write held")
	ref.NodeRid = b.NodeRid()
	closed, err := a.Spots().Close(ctx, ref)
	require.NoError(t, err, "a Close right after Relocate returned")
	require.True(t, closed)
	_, err = shared.Read(ctx, key)
	require.ErrorIs(t, err, location.ErrNotFound, "the closed Spot's record is gone")
}

// A Relocate asked of the node a move is arriving at waits for the
// arrival; past its caller's deadline it says DeadlineExceeded, not a
// store failure of a context that ended.
func TestRelocateDuringAnArrivalPastItsDeadlineIsDeadlineExceeded(t *testing.T) {
	ctx := context.Background()
	shared := memstore.New()
	store := &heldAnswerStore{Store: shared, release: make(chan struct{})}
	t.Cleanup(func() { store.once.Do(func() { close(store.release) }) })
	a := start(t, shared, roam.WithNodeName("node-a"), roam.WithKinds(clubhouse))
	b := start(t, store, roam.WithNodeName("node-b"), roam.WithKinds(clubhouse))
	spotOnNode(t, "den", "clubhouse", a, b)
	key := roam.UserSpotRef("den")
	hold := func(ops []location.Op) bool {
		return ops[0].Key == key && ops[0].Kind == location.OpUpdate && ops[0].Record.GetOwner().GetNodeRid() == b.NodeRid()
	}
	store.hold.Store(&hold)
	_, err := a.Relocate(ctx, key, b.NodeName())
	require.NoError(t, err)
	require.NotNil(t, store.held.Load(), "the target's commit was not the write held")
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = b.Relocate(short, key, a.NodeName())
	require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded, "a move back asked while the first still arrives: %v", err)
	store.once.Do(func() { close(store.release) })
	_, err = testwait.Past(t, roamerr.ErrUnavailable, func() (roam.Outcome, error) { return b.Relocate(ctx, key, a.NodeName()) })
	require.NoError(t, err, "once the arrival ended, the move back is made")
}
