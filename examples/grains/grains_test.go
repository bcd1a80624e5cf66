package grains_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/grains"
	"github.com/roamactors/roam/examples/grains/shoppb"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// A generated grain (Cart) and a hand-written relocatable kind (ticker)
// move between the members of a Proto.Actor cluster with their state,
// through their usual clients, while the plain Proto.Actor kind (greeter)
// keeps answering through Proto.Actor's own lookup.
func TestGrainsMoveWithStateWhileAPlainKindAnswers(t *testing.T) {
	// Parallel: a cluster of its own, and most of the time in Proto.Actor's
	// fixed sleeps (StartMember 1 s after joining, a graceful Shutdown
	// 2 s), not on the CPU. Parallel tests run after the serial ones, so
	// never beside the 63 MiB messages of errors_test.go, which could
	// starve the renewals of this cluster's default 10 s leases.
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := memstore.New()
	agent := test.NewInMemAgent()
	var nodes []*grains.Node
	for range 3 {
		n, err := grains.StartNode(ctx, test.NewTestProvider(agent), store)
		require.NoError(t, err)
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = n.Stop(context.Background())
		}
	})
	a := nodes[0]
	require.Same(t, a.Roam, roam.Get(a.System))
	timeout := cluster.WithTimeout(10 * time.Second)

	greet := func(name string) {
		t.Helper()
		res, err := a.Cluster.Request(name, grains.GreeterKind, &shoppb.Greet{Name: name}, timeout)
		require.NoError(t, err)
		require.NoError(t, roam.DeliveryError(res), "greet %s", name) // a typed failure, not a panic on its type
		require.Equal(t, "hello "+name, res.(*shoppb.Greeting).GetText())
	}
	greet("g1")

	cart := shoppb.GetCartGrainClient(a.Cluster, "alice")
	got, err := cart.Add(&shoppb.AddItem{Sku: "tea", Quantity: 2}, timeout)
	require.NoError(t, err)
	require.EqualValues(t, 1, got.GetChanges())
	tick := func() int64 {
		t.Helper()
		res, err := a.Cluster.Request("t1", grains.TickerKind, &shoppb.Tick{}, timeout)
		require.NoError(t, err)
		require.NoError(t, roam.DeliveryError(res), "tick") // a typed failure, not a panic on its type
		return res.(*shoppb.Ticks).GetValue()
	}
	require.EqualValues(t, 1, tick())

	// Move both relocatable grains to another node, from their owners.
	for _, id := range []string{roam.GrainID(grains.CartKind, "alice"), roam.GrainID(grains.TickerKind, "t1")} {
		ref, err := a.Roam.Spots().Find(ctx, id)
		require.NoError(t, err)
		var owner, target *grains.Node
		for _, n := range nodes {
			if n.Roam.NodeRid() == ref.NodeRid {
				owner = n
			} else if target == nil {
				target = n
			}
		}
		require.NotNil(t, owner, "the grain %s is owned by one of the nodes", id)
		_, err = owner.Roam.Relocate(ctx, roam.InstanceSpotRef(id), target.Roam.NodeRid())
		require.NoError(t, err)
		after, err := a.Roam.Spots().Find(ctx, id)
		require.NoError(t, err)
		require.Equal(t, target.Roam.NodeRid(), after.NodeRid, "%s moved", id)
		greet("g2")
	}

	got, err = cart.Add(&shoppb.AddItem{Sku: "tea", Quantity: 1}, timeout)
	require.NoError(t, err)
	require.EqualValues(t, 2, got.GetChanges(), "the cart kept its state across the move")
	require.EqualValues(t, 3, got.GetItems()["tea"])
	require.EqualValues(t, 2, tick(), "the ticker kept its count across the move")
	greet("g1")

	// The plain kind is Proto.Actor's: roam holds no record of it.
	_, err = a.Roam.Spots().Find(ctx, roam.GrainID(grains.GreeterKind, "g1"))
	require.True(t, errors.Is(err, roamerr.ErrNotFound), "got %v", err)
}

// roam attaches once per actor system, and a Proto.Actor cluster whose
// remote roam did not configure is refused at Start: it would lack roam's
// frame checks and limits.
func TestAttachRefusals(t *testing.T) {
	t.Parallel() // as TestGrainsMoveWithStateWhileAPlainKindAnswers
	ctx := context.Background()
	n, err := grains.StartNode(ctx, test.NewTestProvider(test.NewInMemAgent()), memstore.New())
	require.NoError(t, err)
	defer n.Stop(ctx)
	_, err = roam.New(n.System, roam.WithStore(memstore.New()))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	require.ErrorIs(t, n.Roam.Start(ctx), roamerr.ErrInvalidOperation, "started twice")

	system := actor.NewActorSystem()
	r, err := roam.New(system, roam.WithStore(memstore.New()))
	require.NoError(t, err)
	c := cluster.New(system, cluster.Configure("plain", test.NewTestProvider(test.NewInMemAgent()), r.IdentityLookup(), remote.Configure("127.0.0.1", 0)))
	c.StartMember()
	defer c.Shutdown(true)
	require.ErrorIs(t, r.Start(ctx), roamerr.ErrNotConfigured, "a remote without roam's guards")
}
