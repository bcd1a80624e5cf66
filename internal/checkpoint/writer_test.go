package checkpoint

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// heldStore holds each PutCheckpoint until the test releases it.
type heldStore struct {
	location.CheckpointStore
	entered  chan struct{} // a put has started and waits
	release  chan struct{} // closed: every put goes on
	released sync.Once
	returned atomic.Bool // a held put has returned
	// holdOnly, if set, is how many puts are held; later ones go through.
	holdOnly int32
	puts     atomic.Int32
}

// letGo releases the held puts and every later one.
func (s *heldStore) letGo() { s.released.Do(func() { close(s.release) }) }

func newHeldStore() *heldStore {
	return &heldStore{CheckpointStore: memstore.New(), entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (s *heldStore) PutCheckpoint(ctx context.Context, key location.AuthorityKey, v location.StoreVersion, data []byte) (location.StoreVersion, error) {
	if n := s.puts.Add(1); s.holdOnly > 0 && n > s.holdOnly {
		return s.CheckpointStore.PutCheckpoint(ctx, key, v, data)
	}
	s.entered <- struct{}{}
	<-s.release
	defer s.returned.Store(true)
	return s.CheckpointStore.PutCheckpoint(ctx, key, v, data)
}

// Stop returns only once the store call of a write under way has
// returned: nothing of the Writer is left running against the store.
func TestStopWaitsForTheWriteUnderWay(t *testing.T) {
	s := newHeldStore()
	w := NewWriter(Config{Store: s})
	w.Submit(key, cp(1, 1, 1, "a"))
	testwait.Recv(t, s.entered, "the write to reach the store")
	stopped := make(chan struct{})
	go func() { w.Stop(); close(stopped) }()
	require.False(t, w.Idle(), "a write is under way")
	s.letGo()
	testwait.Recv(t, stopped, "Stop to return")
	require.True(t, s.returned.Load(), "Stop returned while its write's store call was under way")
	require.True(t, w.Idle())
	w.Submit(key, cp(1, 1, 2, "b")) // dropped: the Writer stopped
	require.True(t, w.Idle())
}

// Forget does not wait for a write in flight of its object: a slow store
// would keep the tombstone from being written within the caller's
// deadline, and the closed object's state would come back with the next
// activation of its ID. The tombstone goes first; the write, judged again
// against it, is superseded. And the object is not left forgotten: a new
// incarnation's capture is written after it.
func TestForgetDoesNotWaitForTheWriteInFlight(t *testing.T) {
	s := newHeldStore()
	s.holdOnly = 1 // the capture's put; the tombstone's goes through
	w := NewWriter(Config{Store: s})
	t.Cleanup(w.Stop)
	t.Cleanup(s.letGo) // before Stop, which waits for the held write
	w.Submit(key, cp(1, 1, 1, "a"))
	testwait.Recv(t, s.entered, "the write to reach the store")
	forgot := make(chan error, 1)
	go func() { forgot <- w.Forget(context.Background(), key, 1, 1, "room") }()
	require.NoError(t, testwait.Recv(t, forgot, "Forget to write its tombstone while the capture's put is held"))
	require.True(t, stored(t, s, key).NoState, "the tombstone is stored")

	s.letGo()
	require.NoError(t, w.WaitIdle(context.Background()))
	require.True(t, stored(t, s, key).NoState, "the held capture did not land over the tombstone")
	require.EqualValues(t, 1, w.Stats().Superseded, "the held capture was judged again and superseded")

	w.Submit(key, cp(2, 1, 1, "b")) // the next incarnation of the ID
	require.NoError(t, w.WaitIdle(context.Background()))
	require.Equal(t, "b", string(stored(t, s, key).State), "a new incarnation's capture is written after the Forget")
}

// A tombstone is deleted TombstoneFor later on the node's clock, and no
// timer of the Writer outlives Stop: a stopped writer leaves a tombstone
// where it is.
func TestTombstoneSweepRunsOnTheNodeClockAndEndsWithStop(t *testing.T) {
	clock := machine.NewManual()
	s := memstore.New(memstore.WithClock(clock))
	w := NewWriter(Config{Store: s, Clock: clock})
	require.NoError(t, w.Forget(context.Background(), key, 1, 1, "room"))
	testwait.For(t, func() bool { return clock.Armed() == 1 }, "the tombstone's sweep to be armed")
	clock.Advance(TombstoneFor)
	testwait.For(t, func() bool {
		_, _, err := s.GetCheckpoint(context.Background(), key)
		return err != nil
	}, "the tombstone to be deleted")
	_, _, err := s.GetCheckpoint(context.Background(), key)
	require.ErrorIs(t, err, location.ErrNotFound)

	other := location.Key(location.KindActor, "closed")
	require.NoError(t, w.Forget(context.Background(), other, 1, 1, "room"))
	testwait.For(t, func() bool { return clock.Armed() == 1 }, "the second tombstone's sweep to be armed")
	w.Stop()
	require.Zero(t, clock.Armed(), "a timer of the writer outlived Stop")
	clock.Advance(2 * TombstoneFor)
	require.True(t, stored(t, s, other).NoState, "a stopped writer leaves its tombstone")
	_, err = w.Claim(context.Background(), other, Fence{2, 1, 0}, "room", "")
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "a stopped writer claims nothing")
}

// deafDeletes never answers a DeleteCheckpoint before its context ends:
// a store cut off, on a clock that does not move.
type deafDeletes struct {
	location.CheckpointStore
	entered chan struct{}
}

func (s deafDeletes) DeleteCheckpoint(ctx context.Context, _ location.AuthorityKey, _ location.StoreVersion) error {
	s.entered <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// A tombstone's sweep is best effort: one waiting on a store that does not
// answer ends with Stop, instead of holding it for its timeout — on a
// node's logical clock, which nobody moves any more, that would be never.
func TestStopEndsASweepTheStoreDoesNotAnswer(t *testing.T) {
	clock := machine.NewManual()
	s := deafDeletes{CheckpointStore: memstore.New(memstore.WithClock(clock)), entered: make(chan struct{}, 1)}
	w := NewWriter(Config{Store: s, Clock: clock})
	require.NoError(t, w.Forget(context.Background(), key, 1, 1, "room"))
	testwait.For(t, func() bool { return clock.Armed() == 1 }, "the tombstone's sweep to be armed")
	clock.Advance(TombstoneFor)
	testwait.Recv(t, s.entered, "the sweep's delete to reach the store")
	stopped := make(chan struct{})
	go func() { w.Stop(); close(stopped) }()
	testwait.Recv(t, stopped, "Stop to return while the sweep's delete is unanswered")
}

// WaitIdle returns when the last write ends — not before, and not later
// than its caller's context — and at once on a Writer with nothing to do.
func TestWaitIdleReturnsWhenTheLastWriteEnds(t *testing.T) {
	s := newHeldStore()
	w := NewWriter(Config{Store: s})
	defer w.Stop()
	require.NoError(t, w.WaitIdle(context.Background()), "nothing to write")
	w.Submit(key, cp(1, 1, 1, "a"))
	testwait.Recv(t, s.entered, "the write to reach the store")

	waiting := func(n int) func() bool {
		return func() bool {
			got := 0
			_ = w.loop.Do(context.Background(), func() { got = len(w.idle) })
			return got == n
		}
	}
	short, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- w.WaitIdle(short) }()
	testwait.For(t, waiting(1), "WaitIdle to wait for the write")
	cancel()
	require.ErrorIs(t, testwait.Recv(t, gaveUp, "WaitIdle to end with its caller's context"), roamerr.ErrDeadlineExceeded,
		"a write is under way and the caller gave up")
	testwait.For(t, waiting(0), "the waiter of the call that gave up to go")

	waited := make(chan error, 1)
	go func() { waited <- w.WaitIdle(context.Background()) }()
	testwait.For(t, waiting(1), "WaitIdle to wait for the write")
	select {
	case err := <-waited:
		t.Fatalf("WaitIdle returned (%v) while the write was held in the store", err)
	default:
	}
	s.letGo()
	require.NoError(t, testwait.Recv(t, waited, "WaitIdle to return once the write ended"))
	require.True(t, s.returned.Load(), "WaitIdle returned before the write's store call did")
	require.True(t, w.Idle())
}

// readCounter counts GetCheckpoint calls.
type readCounter struct {
	location.CheckpointStore
	reads atomic.Int32
}

func (s *readCounter) GetCheckpoint(ctx context.Context, key location.AuthorityKey) ([]byte, location.StoreVersion, error) {
	s.reads.Add(1)
	return s.CheckpointStore.GetCheckpoint(ctx, key)
}

// tracker is a submitter's own record of its stored version.
type tracker struct {
	mu      sync.Mutex
	v       location.StoreVersion
	ok      bool
	landed  []Fence
	landedV []location.StoreVersion
}

func (tr *tracker) Known() (location.StoreVersion, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.v, tr.ok
}

func (tr *tracker) Landed(v location.StoreVersion, f Fence) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.v, tr.ok = v, true
	tr.landed, tr.landedV = append(tr.landed, f), append(tr.landedV, v)
}

// A submitter that keeps its object's stored version (a node's objects
// do) has its writes start from it — one compare-and-set, no read — and
// is told where each landed; the Writer keeps no entry of its own for the
// object once its write ended, so an idle object costs the Writer
// nothing. A version gone stale (another writer's since) costs one
// conflict and a read, and the write still lands where it must.
func TestATrackedWriteStartsFromItsSubmittersVersionAndLeavesNoEntry(t *testing.T) {
	s := &readCounter{CheckpointStore: memstore.New()}
	w := newWriter(t, s)
	entries := func() int {
		n := -1
		require.NoError(t, w.loop.Do(context.Background(), func() { n = len(w.versions) }))
		return n
	}
	tr := &tracker{ok: true} // none stored, as a reservation proves
	w.SubmitTracked(key, cp(1, 1, 1, "a"), tr)
	waitIdle(t, w, "the first write")
	require.Zero(t, s.reads.Load(), "a known version is not read")
	require.Equal(t, []Fence{{1, 1, 1}}, tr.landed)
	require.Zero(t, entries(), "the submitter keeps the version")

	w.SubmitTracked(key, cp(1, 1, 2, "b"), tr)
	waitIdle(t, w, "the second write")
	require.Zero(t, s.reads.Load())
	require.Equal(t, []Fence{{1, 1, 1}, {1, 1, 2}}, tr.landed)
	require.Zero(t, entries())

	// Another writer's checkpoint (the object's next owner) lands in
	// between: the stale version conflicts, the read finds a later
	// incarnation's, and this capture is superseded, not written.
	other := newWriter(t, s)
	other.Submit(key, cp(1, 2, 1, "next owner"))
	waitIdle(t, other, "the next owner's write")
	before := s.reads.Load()
	w.SubmitTracked(key, cp(1, 1, 3, "late"), tr)
	waitIdle(t, w, "the late write")
	require.Equal(t, before+1, s.reads.Load(), "the conflict is read once")
	require.Equal(t, "next owner", string(stored(t, s, key).State))
	require.Len(t, tr.landed, 2, "a superseded capture did not land")
	require.Zero(t, entries())

	// A version the Writer learned itself (a claim) goes first, once.
	claimed, err := w.Claim(context.Background(), key, Fence{ObjectGeneration: 1, OwnerGeneration: 3}, "room", "")
	require.NoError(t, err)
	require.Equal(t, Fence{1, 3, 0}, claimed.Fence)
	reads := s.reads.Load()
	stale := &tracker{v: 1, ok: true}
	w.SubmitTracked(key, cp(1, 3, 1, "claimed"), stale)
	waitIdle(t, w, "the claimed incarnation's write")
	require.Equal(t, reads, s.reads.Load(), "the claim's version, not the tracker's stale one")
	require.Equal(t, "claimed", string(stored(t, s, key).State))
	require.Len(t, stale.landed, 1)
	require.Zero(t, entries())
}
