package extension_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/roamerrtest"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

func assertOneClass(t *testing.T, err, want error) {
	t.Helper()
	roamerrtest.AssertOneClass(t, err, want)
}

// startFaulty starts one node on a memstore behind fault injection, with
// the greeter kind.
func startFaulty(t *testing.T) (*extension.Extension, *faulty.Store) {
	t.Helper()
	ctx := context.Background()
	f, err := faulty.New(memstore.New(), faulty.Config{})
	require.NoError(t, err)
	e, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: f}, Kinds: []extension.Kind{{
		StableType: "greeter",
		Producer:   func() actor.Actor { return &greeter{} },
		Policy:     extension.PreserveStateWith(greeterState{}),
	}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		f.Partition(false)
		_ = e.Stop(ctx)
	})
	return e, f
}

// A store outage is Unavailable and nothing else, whether the store said
// unavailable or indeterminate: SpawnActor, and a call to an Instance
// Spot whose authority cannot be read.
// Reference: roamerr's class table (location.ErrUnavailable and
// ErrIndeterminate are roamerr.ErrUnavailable).
func TestStoreOutageIsUnavailable(t *testing.T) {
	ctx := context.Background()
	e, f := startFaulty(t)

	f.InjectOn("apply", faulty.Unavailable)
	_, err := e.SpawnActor(ctx, "greeter", "a")
	assertOneClass(t, err, roamerr.ErrUnavailable)
	f.InjectOn("apply", faulty.IndeterminateLost)
	_, err = e.SpawnActor(ctx, "greeter", "a")
	assertOneClass(t, err, roamerr.ErrUnavailable)

	f.InjectOn("read", faulty.Unavailable, faulty.Unavailable, faulty.Unavailable, faulty.Unavailable)
	_, err = e.Spots().Request("cart", wrapperspb.String("hi")).InstanceSpot("greeter").Timeout(2 * time.Second).Do(ctx)
	assertOneClass(t, err, roamerr.ErrUnavailable)

	// The same spawn once the store answers again.
	_, err = e.SpawnActor(ctx, "greeter", "a")
	require.NoError(t, err)
}

// A store that stays cut off until the caller's deadline: a Spot call is
// DeadlineExceeded alone (its outcome unknown), never also Unavailable.
// Reference: roamerr's class table; docs/FAULTS.md.
func TestStorePartitionUntilTheDeadline(t *testing.T) {
	ctx := context.Background()
	e, f := startFaulty(t)
	f.Partition(true)
	_, err := e.Spots().Request("cart", wrapperspb.String("hi")).InstanceSpot("greeter").Timeout(300 * time.Millisecond).Do(ctx)
	assertOneClass(t, err, roamerr.ErrDeadlineExceeded)
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = e.SpawnActor(sctx, "greeter", "b")
	require.Error(t, err)
	require.Len(t, roamerrtest.ClassesOf(err), 1, "%v", err)
}

// A node that never existed is NotFound: a retry does not help.
// Reference: roamerr's class table (ErrNotFound: a Relocate target that
// never existed).
func TestRelocateToAnUnknownNodeIsNotFound(t *testing.T) {
	ctx := context.Background()
	e, _ := startFaulty(t)
	_, err := e.SpawnActor(ctx, "greeter", "g")
	require.NoError(t, err)
	_, err = e.Relocate(ctx, extension.ActorRef("g"), "no-such-node")
	assertOneClass(t, err, roamerr.ErrNotFound)
}

// A store conflict reaches the caller in the class the API documents,
// alone: a spawn that finds the ID taken is AlreadyExists, not also
// Conflict.
// Reference: roamerr's class table.
func TestSpawnOfATakenIDIsAlreadyExists(t *testing.T) {
	ctx := context.Background()
	e, _ := startFaulty(t)
	_, err := e.SpawnActor(ctx, "greeter", "twice")
	require.NoError(t, err)
	_, err = e.SpawnActor(ctx, "greeter", "twice")
	assertOneClass(t, err, roamerr.ErrAlreadyExists)
}

// conflictOnDelete changes a record just before the first transaction that
// deletes it, as another node's write would.
type conflictOnDelete struct {
	location.Store
	done atomic.Bool
}

func (s *conflictOnDelete) Apply(ctx context.Context, ops []location.Op) ([]location.StoreVersion, error) {
	for _, op := range ops {
		if op.Kind == location.OpDelete && s.done.CompareAndSwap(false, true) {
			v, err := s.Store.Read(ctx, op.Key)
			if err != nil {
				return nil, err
			}
			if _, err := s.Store.CompareAndSet(ctx, op.Key, v.Version, v.Record); err != nil {
				return nil, err
			}
		}
	}
	return s.Store.Apply(ctx, ops)
}

// A record that changed while ReleaseEnded released it is Conflict alone
// (a read again may succeed), not also the store's location.ErrConflict
// under another class.
// Reference: roamerr's class table; docs/PROTOCOL.md §7.10 (release of an ended owner's
// record).
func TestReleaseEndedThatLosesARaceIsConflict(t *testing.T) {
	ctx := context.Background()
	inner := memstore.New()
	store := &conflictOnDelete{Store: inner}
	kinds := []extension.Kind{{StableType: "greeter", Producer: func() actor.Actor { return &greeter{} }, Policy: extension.PreserveStateWith(greeterState{})}}
	a, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: store}, Roots: inner, Kinds: kinds})
	require.NoError(t, err)
	b, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: store}, Roots: inner, Kinds: kinds})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop(ctx) })
	_, err = a.SpawnActor(ctx, "greeter", "orphan")
	require.NoError(t, err)
	require.NoError(t, a.StopNow(ctx)) // no drain: the Actor is an ended owner's
	_, err = testwait.Past(t, roamerr.ErrOwnerEnding, func() (bool, error) {
		return b.ReleaseEnded(ctx, extension.ActorRef("orphan"))
	})
	assertOneClass(t, err, roamerr.ErrConflict)
	released, err := b.ReleaseEnded(ctx, extension.ActorRef("orphan"))
	require.NoError(t, err)
	require.True(t, released, "read again, the release goes through")
}
