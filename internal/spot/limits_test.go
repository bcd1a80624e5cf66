package spot_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

func withCapacity(n uint32) nodeOpt { return func(c *extension.Config) { c.Node.Capacity = n } }

// A node's Capacity bounds the incarnations it serves: a create placed on
// a full node moves on to another candidate, and with every candidate
// full the create and a cold activation (request or send) end
// CapacityExceeded, leaving no reservation behind.
// Reference: docs/PROTOCOL.md §7.2 (placement), §7.5 step 9.
func TestCapacityExceededWhenEveryCandidateIsFull(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(2, withCapacity(1))
		a := w.nodes[0]
		for _, id := range []string{"one", "two"} {
			res, err := a.Spots().GetOrCreate(id, "room").Do(ctx)
			require.NoError(t, err)
			require.Equal(t, spot.Created, res.State)
		}
		r1, _ := a.Spots().Find(ctx, "one")
		r2, _ := a.Spots().Find(ctx, "two")
		require.NotEqual(t, r1.NodeRid, r2.NodeRid, "the second went to the node with room")
		_, err := a.Spots().GetOrCreate("three", "room").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
		_, err = request(t, a, "four", "x", "cart")
		require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
		// A send that goes with a cold activation waits for its dispatch
		// notice, and so learns the activation's failure.
		_, err = a.Spots().Send("five", wrapperspb.String("x")).InstanceSpot("cart").Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
		require.Equal(t, 2, recordCount(t, store, location.KindUserSpot))
		require.Zero(t, recordCount(t, store, location.KindInstanceSpot))
	})
}

// A creation request over 1 MiB is refused before any store write.
// Reference: PROTOCOL.md §7.2 (a creation request is at most 1 MiB encoded).
func TestCreationRequestOver1MiBIsRefused(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		_, err := a.Spots().GetOrCreate("big", "room").Request(wrapperspb.String(strings.Repeat("x", spot.MaxCreateRequestBytes))).Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		require.Zero(t, recordCount(t, store, location.KindUserSpot))
		// Its own timeout: a 1 MiB creation written to Consul under the
		// race detector on a busy machine can outlast the default 5 s, and
		// what this checks is the limit, not the speed.
		res, err := a.Spots().GetOrCreate("big", "room").Request(wrapperspb.String(strings.Repeat("x", spot.MaxCreateRequestBytes-16))).
			Timeout(30 * time.Second).Do(ctx)
		require.NoError(t, err, "just under the limit")
		require.Equal(t, spot.Created, res.State)
		require.True(t, strings.HasPrefix(res.Reply.(*wrapperspb.StringValue).Value, "created:xxx"))
	})
}

// Query lists Ready Spots a bounded page at a time: size 1..1000.
// Reference: PROTOCOL.md §7.3.
func TestQueryIsBounded(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		for _, id := range []string{"q1", "q2", "q3"} {
			_, err := a.Spots().GetOrCreate(id, "room").Do(ctx)
			require.NoError(t, err)
		}
		_, err := a.Spots().Query(ctx, messages.SpotKind_SPOT_KIND_USER, 0, "")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		_, err = a.Spots().Query(ctx, messages.SpotKind_SPOT_KIND_USER, 1001, "")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		_, err = a.Spots().Query(ctx, messages.SpotKind_SPOT_KIND_ENTRY, 10, "")
		require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
		var ids []string
		after := ""
		for {
			page, err := a.Spots().Query(ctx, messages.SpotKind_SPOT_KIND_USER, 2, after)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page.Refs), 2)
			for _, r := range page.Refs {
				ids = append(ids, r.SpotID)
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
		require.ElementsMatch(t, []string{"q1", "q2", "q3"}, ids)
	})
}

// A call on a route whose incarnation is gone ends with a stale-route
// error; it is not resubmitted to whatever owns the ID now.
// Reference: PROTOCOL.md §7.4 (a stale route ends the call with ErrStale;
// it is never resubmitted to the current owner).
func TestStaleRouteEndsTheCall(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start(withKinds(w.cartKind("cart")))
		w.start() // the only node hosting rooms: the owner
		b := w.start(withKinds(w.cartKind("cart")))
		res, err := a.Spots().GetOrCreate("shed", "room").Do(ctx)
		require.NoError(t, err)
		_, err = request(t, b, "shed", "cache it")
		require.NoError(t, err)
		closed, err := a.Spots().Close(ctx, res.Ref)
		require.NoError(t, err)
		require.True(t, closed)
		again, err := a.Spots().GetOrCreate("shed", "room").Do(ctx)
		require.NoError(t, err)
		_, err = request(t, b, "shed", "on the stale route")
		require.ErrorIs(t, err, roamerr.ErrStale)
		n, err := request(t, b, "shed", "fresh resolve")
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the next call resolves the new incarnation")
		require.NotEqual(t, res.Ref.ObjectGeneration, again.Ref.ObjectGeneration)
		require.NotContains(t, w.handledOf("shed"), "on the stale route")
	})
}

// A GetOrCreate that finds another operation's attempt Creating waits for
// it within its own deadline and starts nothing; at the deadline it ends
// DeadlineExceeded, and the next call reads the store again.
// Reference: PROTOCOL.md §7.2 (convergence).
func TestGetOrCreateWaitsForAnotherAttemptWithinItsDeadline(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		key := location.Key(location.KindUserSpot, "pending")
		d := a.Node().Descriptor()
		creating := &location.Record{ObjectGeneration: 5, AuthorityOwnerGeneration: 1, StableType: "room",
			State: messages.LifecycleState_LIFECYCLE_STATE_CREATING, SpotKind: messages.SpotKind_SPOT_KIND_USER,
			Owner:          &messages.Owner{Mesh: d.GetMesh(), NodeRid: d.GetNodeRid(), NodeGeneration: d.GetNodeGeneration(), LeaseId: d.GetLeaseId()},
			CreationIntent: &messages.CreationIntent{OperationId: "someone-else"}}
		v, err := store.CompareAndSet(ctx, key, 0, creating)
		require.NoError(t, err)
		_, err = a.Spots().GetOrCreate("pending", "room").Timeout(300 * time.Millisecond).Do(ctx)
		require.ErrorIs(t, err, roamerr.ErrDeadlineExceeded)
		require.Zero(t, w.count("room").Load(), "no second factory")
		// The other attempt gives up: the next call competes and creates.
		_, err = store.Apply(ctx, []location.Op{location.DeleteOp(key, v)})
		require.NoError(t, err)
		res, err := a.Spots().GetOrCreate("pending", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, res.State)
	})
}

// A route cache that may outlive Message Follow is refused at start: the
// cache age must be at least 5 s shorter than the follow duration.
// Reference: PROTOCOL.md §7.8.
func TestRouteCacheLongerThanFollowIsRefusedAtStart(t *testing.T) {
	_, err := extension.Start(ctx, extension.Config{
		Node: meshnode.Config{Store: memstore.New(), Logger: testLogger(), LeaseTTL: 2 * time.Second},
		Spot: spot.Config{Routes: spot.RouteConfig{RouteCacheMaxAge: 26 * time.Second, MessageFollowDuration: 30 * time.Second}},
	})
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	e, err := extension.Start(ctx, extension.Config{
		Node: meshnode.Config{Store: memstore.New(), Logger: testLogger(), LeaseTTL: 2 * time.Second},
		Spot: spot.Config{Routes: spot.RouteConfig{RouteCacheMaxAge: 25 * time.Second, MessageFollowDuration: 30 * time.Second}},
	})
	require.NoError(t, err)
	require.NoError(t, e.Stop(ctx))
}

// A User Spot reservation still Creating long after its operation's
// deadline (its UserSpotCreate was lost, its owner still alive) does not block
// the ID forever: the next GetOrCreate releases it with its fence and
// creates.
// Reference: PROTOCOL.md §7.2 (waiters converge on Ready or Missing; an
// abandoned reservation is replaced with its fence).
func TestAbandonedReservationIsReleased(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start()
		d := a.Node().Descriptor()
		_, err := store.CompareAndSet(ctx, location.Key(location.KindUserSpot, "orphan"), 0, &location.Record{
			ObjectGeneration: 5, AuthorityOwnerGeneration: 1, StableType: "room",
			State: messages.LifecycleState_LIFECYCLE_STATE_CREATING, SpotKind: messages.SpotKind_SPOT_KIND_USER,
			Owner:          &messages.Owner{Mesh: d.GetMesh(), NodeRid: d.GetNodeRid(), NodeGeneration: d.GetNodeGeneration(), LeaseId: d.GetLeaseId()},
			CreationIntent: &messages.CreationIntent{OperationId: "lost", DeadlineUnixNanos: time.Now().Add(-time.Minute).UnixNano()},
		})
		require.NoError(t, err)
		res, err := a.Spots().GetOrCreate("orphan", "room").Do(ctx)
		require.NoError(t, err)
		require.Equal(t, spot.Created, res.State)
		require.Greater(t, res.Ref.ObjectGeneration, uint64(5))
		require.EqualValues(t, 1, w.count("room").Load())
	})
}

// Creations racing for the last slot of a node do not overshoot its
// Capacity: in-progress creations count with the serving ones.
// Reference: PROTOCOL.md §7.2 (placement: serving and pending count).
func TestConcurrentCreatesDoNotOvershootCapacity(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		a := w.start(withCapacity(2))
		results := make(chan error, 12)
		for i := 0; i < 12; i++ {
			go func() {
				_, err := a.Spots().GetOrCreate(fmt.Sprintf("race-%d", i), "room").Do(ctx)
				results <- err
			}()
		}
		created := 0
		for i := 0; i < 12; i++ {
			err := <-results
			if err == nil {
				created++
				continue
			}
			require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
		}
		require.LessOrEqual(t, created, 2)
		require.Positive(t, created)
		require.Equal(t, created, recordCount(t, store, location.KindUserSpot))
	})
}

// A cold activation that reaches a full node is passed on to another
// candidate with room; it ends CapacityExceeded only when every candidate
// is full, with nothing reserved.
// Reference: PROTOCOL.md §7.5 step 9.
func TestActivationPassesOnFromAFullNode(t *testing.T) {
	onBothStores(t, func(t *testing.T, store location.Store) {
		w := newWorld(t, store)
		w.startN(2, withCapacity(1))
		a := w.nodes[0]
		for _, id := range []string{"slot-1", "slot-2"} { // whichever node each picks, both fit
			_, err := request(t, a, id, "x", "cart")
			require.NoError(t, err, id)
		}
		r1, _ := a.Spots().Find(ctx, "slot-1")
		r2, _ := a.Spots().Find(ctx, "slot-2")
		require.NotEqual(t, r1.NodeRid, r2.NodeRid)
		_, err := request(t, a, "slot-3", "x", "cart")
		require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
		require.Equal(t, 2, recordCount(t, store, location.KindInstanceSpot))
	})
}

// A call whose message is larger than a node accepts fails at once with
// CapacityExceeded, before anything is resolved or sent.
func TestAMessageOverTheFrameLimitFailsAtTheCaller(t *testing.T) {
	w := newWorld(t, memstore.New())
	a := w.start(withKinds(w.cartKind("cart")))
	huge := wrapperspb.Bytes(make([]byte, meshnode.MaxMessageBytes+1))
	_, err := a.Spots().Request("anything", huge).InstanceSpot("cart").Do(ctx)
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
	_, err = a.Spots().Send("anything", huge).InstanceSpot("cart").Do(ctx)
	require.ErrorIs(t, err, roamerr.ErrCapacityExceeded)
	require.Zero(t, w.count("cart").Load(), "nothing was activated")
}
