package roam_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/consulstore"
	"github.com/roamactors/roam/location/consulstore/consultest"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// bothStores runs f on memstore and on a real Consul.
func bothStores(t *testing.T, f func(t *testing.T, store location.Store)) {
	t.Run("memstore", func(t *testing.T) { f(t, memstore.New()) })
	t.Run("consul", func(t *testing.T) {
		srv := consultest.Start(t)
		s, err := consulstore.New(consulstore.Config{Address: srv.Addr, Prefix: "roam-drain-test"})
		require.NoError(t, err)
		f(t, s)
	})
}

// unitOwners maps every Actor and Instance Spot record to its owner RID.
func unitOwners(t *testing.T, store location.Store) map[location.AuthorityKey]string {
	t.Helper()
	out := map[location.AuthorityKey]string{}
	for _, k := range []location.Kind{location.KindActor, location.KindInstanceSpot} {
		page := location.PageRequest{Size: 1000}
		for {
			p, err := store.List(context.Background(), k, page)
			require.NoError(t, err)
			for _, v := range p.Items {
				out[v.Key] = v.Record.GetOwner().GetNodeRid()
			}
			if p.Next == "" {
				break
			}
			page.After = p.Next
		}
	}
	return out
}

// tick asks a unit (an Actor through its resolved route, an Instance Spot by
// its ID) to count once and returns the count.
func tick(ctx context.Context, r *roam.Roam, ref roam.Ref) (int64, error) {
	if ref.Kind == location.KindInstanceSpot {
		res, err := r.Spots().Request(ctx, ref.ID, wrapperspb.String("tick"), roam.InstanceSpot("counter"))
		if err != nil {
			return 0, err
		}
		return res.(*wrapperspb.Int64Value).GetValue(), nil
	}
	pid, err := r.Resolve(ctx, ref)
	if err != nil {
		return 0, err
	}
	res, err := r.System().Root.RequestFuture(pid, wrapperspb.String("tick"), 30*time.Second).Result()
	if err != nil {
		return 0, err
	}
	if err := roam.DeliveryError(res); err != nil {
		return 0, err
	}
	return res.(*wrapperspb.Int64Value).GetValue(), nil
}

// A drained node's every unit is served elsewhere with its state, while
// callers keep calling: no call is lost or counted twice. Meanwhile the
// draining node takes no move and no activation. Reference:
// docs/OPERATIONS.md (draining a node); docs/PROTOCOL.md §5 (the hand-off).
func TestDrainMovesEveryUnitWithItsState(t *testing.T) {
	bothStores(t, func(t *testing.T, store location.Store) {
		ctx := context.Background()
		a := start(t, store, roam.WithNodeName("node-a"))
		b := start(t, store, roam.WithNodeName("node-b"))
		c := start(t, store, roam.WithNodeName("node-c"))

		var units []roam.Ref
		for i := range 20 {
			id := fmt.Sprintf("actor-%d", i)
			_, err := a.SpawnActor(ctx, "counter", id)
			require.NoError(t, err)
			units = append(units, roam.ActorRef(id))
		}
		for i := range 20 {
			ref := roam.InstanceSpotRef(fmt.Sprintf("spot-%d", i))
			_, err := tick(ctx, b, ref) // activated wherever placement puts it
			require.NoError(t, err)
			_, err = b.Relocate(ctx, ref, "node-a")
			require.NoError(t, err)
			units = append(units, ref)
		}
		counts := map[roam.Ref]*atomic.Int64{}
		for _, u := range units {
			counts[u] = &atomic.Int64{}
		}
		for _, u := range units[20:] {
			counts[u].Store(1) // its activating call
		}

		// Callers on b and c call every unit in turn during the drain; each
		// answer must be the unit's next count.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var calls atomic.Int64
		errs := make(chan error, 64)
		for w, caller := range []*roam.Roam{b, c} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					u := units[(i*2+w)%len(units)]
					cctx, cancel := context.WithTimeout(ctx, time.Minute)
					n, err := tick(cctx, caller, u)
					cancel()
					if err != nil {
						errs <- fmt.Errorf("%s: %w", u, err)
						return
					}
					if want := counts[u].Add(1); n != want {
						errs <- fmt.Errorf("%s answered %d, want %d (a call lost or counted twice)", u, n, want)
						return
					}
					calls.Add(1)
				}
			}()
		}
		// The drain starts while calls are flowing.
		testwait.For(t, func() bool { return calls.Load() >= 20 }, "callers under way")
		var progressed atomic.Int64
		res, err := a.Drain(ctx, roam.DrainOptions{Concurrency: 8, OnProgress: func(p roam.DrainProgress) { progressed.Add(1) }})
		require.NoError(t, err)
		before := calls.Load()
		testwait.For(t, func() bool { return calls.Load() >= before+40 }, "callers go on after the drain")
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		require.True(t, res.Complete(), "failed: %v", res.Failed)
		require.Equal(t, len(units), res.Moved)
		require.EqualValues(t, len(units), progressed.Load())

		owners := unitOwners(t, store)
		for _, u := range units {
			require.NotEqual(t, a.NodeRid(), owners[u], "%s still on the drained node", u)
			require.Contains(t, []string{b.NodeRid(), c.NodeRid()}, owners[u])
		}
		// Every unit kept its count: one more call answers the next.
		for _, u := range units {
			n, err := tick(ctx, b, u)
			require.NoError(t, err)
			require.Equal(t, counts[u].Add(1), n, "%s lost its state", u)
		}

		// The draining node takes nothing new: a move to it is refused at
		// once, new Instance Spots are placed elsewhere.
		_, err = b.Relocate(ctx, units[0], "node-a")
		require.ErrorIs(t, err, roamerr.ErrNodeDraining)
		require.ErrorIs(t, err, roamerr.ErrUnavailable)
		for i := range 20 {
			ref := roam.InstanceSpotRef(fmt.Sprintf("late-%d", i))
			_, err := tick(ctx, a, ref)
			require.NoError(t, err)
			require.NotEqual(t, a.NodeRid(), unitOwners(t, store)[ref], "%s was activated on the draining node", ref)
		}
		nodes, err := b.Nodes(ctx)
		require.NoError(t, err)
		for _, n := range nodes {
			require.Equal(t, n.Name == "node-a", n.Draining, "node %s", n.Name)
		}
	})
}

// Stop drains first: a stopped node's units carry on elsewhere with their
// state; WithDrainOnStop(false) ends them with the node instead.
func TestStopDrainsFirst(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("node-a"))
	b := start(t, store, roam.WithNodeName("node-b"))
	for i := range 10 {
		_, err := a.SpawnActor(ctx, "counter", fmt.Sprintf("s-%d", i))
		require.NoError(t, err)
		n, err := tick(ctx, b, roam.ActorRef(fmt.Sprintf("s-%d", i)))
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	}
	require.NoError(t, a.Stop(ctx))
	for i := range 10 {
		n, err := tick(ctx, b, roam.ActorRef(fmt.Sprintf("s-%d", i)))
		require.NoError(t, err)
		require.EqualValues(t, 2, n, "the count moved with the actor")
	}

	c := start(t, store, roam.WithNodeName("node-c"), roam.WithDrainOnStop(false))
	_, err := c.SpawnActor(ctx, "stays", "x")
	require.ErrorIs(t, err, roamerr.ErrNotFound, "no kind stays")
	_, err = c.SpawnActor(ctx, "counter", "x")
	require.NoError(t, err)
	require.NoError(t, c.Stop(ctx))
	_, err = tick(ctx, b, roam.ActorRef("x"))
	require.ErrorIs(t, err, roamerr.ErrUnavailable, "an ended owner's actor, not drained")
}

var _ = actor.NewPID
