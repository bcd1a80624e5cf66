package roam_test

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

// counter counts the strings it is sent and answers the count; the count
// moves with it (roam.Stateful).
type counter struct{ n int64 }

func (c *counter) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*wrapperspb.StringValue); ok {
		c.n++
		ctx.Respond(wrapperspb.Int64(c.n))
	}
}

func (c *counter) CaptureState() ([]byte, error) { return proto.Marshal(wrapperspb.Int64(c.n)) }

func (c *counter) RestoreState(b []byte) error {
	var v wrapperspb.Int64Value
	err := proto.Unmarshal(b, &v)
	c.n = v.GetValue()
	return err
}

var counterKind = roam.NewKind("counter", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState(), roam.Instance())

// start runs roam on a new actor system of its own.
func start(t *testing.T, store location.Store, opts ...roam.Option) *roam.Roam {
	t.Helper()
	testwait.NoLeaks(t)
	system := actor.NewActorSystem()
	r, err := roam.New(system, append([]roam.Option{roam.WithStore(store), roam.WithKinds(counterKind),
		roam.WithLogger(*testlog.For(t)), roam.WithLeaseTTL(2e9)}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		_ = r.Stop(context.Background())
		system.Shutdown()
	})
	return r
}

func ask(t *testing.T, r *roam.Roam, id string) int64 {
	t.Helper()
	res, err := r.Spots().Request(context.Background(), id, wrapperspb.String("tick"), roam.InstanceSpot("counter"))
	require.NoError(t, err)
	return res.(*wrapperspb.Int64Value).GetValue()
}

// Relocate works from any node and takes the target's stable name; names
// are unique among live nodes and free again once their node stopped.
func TestRelocateFromAnyNodeByName(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("node-a"))
	b := start(t, store, roam.WithNodeName("node-b"))
	c := start(t, store, roam.WithNodeName("node-c"))
	require.Equal(t, "node-b", b.NodeName())

	_, err := a.SpawnActor(ctx, "counter", "walker")
	require.NoError(t, err)
	ref := roam.ActorRef("walker")
	out, err := c.Relocate(ctx, ref, "node-b") // c does not own it
	require.NoError(t, err)
	require.Equal(t, a.NodeRid(), out.From)
	require.Equal(t, b.NodeRid(), out.To)
	pid, err := c.Resolve(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, b.System().Address(), pid.Address)

	// By RID too, and from the owner itself; to where it is: at once.
	_, err = b.Relocate(ctx, ref, c.NodeRid())
	require.NoError(t, err)
	out, err = a.Relocate(ctx, ref, "node-c")
	require.NoError(t, err)
	require.Zero(t, out.Pause)
	require.Equal(t, c.NodeRid(), out.To)

	_, err = a.Relocate(ctx, ref, "node-z")
	require.ErrorIs(t, err, roamerr.ErrNotFound, "no such node")
	_, err = a.Relocate(ctx, roam.ActorRef("nobody"), "node-b")
	require.ErrorIs(t, err, roamerr.ErrNotFound, "no such actor")

	// A second live node cannot take a name; a stopped node's name is free.
	system := actor.NewActorSystem()
	defer system.Shutdown()
	dup, err := roam.New(system, roam.WithStore(store), roam.WithLogger(*testlog.Logger()), roam.WithNodeName("node-a"))
	require.NoError(t, err)
	require.ErrorIs(t, dup.Start(ctx), roamerr.ErrAlreadyExists)
	require.NoError(t, a.Stop(ctx))
	start(t, store, roam.WithNodeName("node-a"))
}

// A node whose owner lease ended (cut off from the store) starts a new
// lifecycle on the application's own actor system by itself: same system,
// same address and name, a new RID; the application's actors on the system
// live on, and the node takes work again.
func TestRejoinOnTheApplicationsSystem(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	f, err := faulty.New(store, faulty.Config{})
	require.NoError(t, err)
	a := start(t, f, roam.WithNodeName("node-a"))
	b := start(t, store, roam.WithNodeName("node-b"))
	app, err := a.System().Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*wrapperspb.StringValue); ok {
			c.Respond(wrapperspb.String("still here"))
		}
	}), "app")
	require.NoError(t, err)
	_, err = a.SpawnActor(ctx, "counter", "old")
	require.NoError(t, err)
	oldRid, address := a.NodeRid(), a.System().Address()
	lease := leaseOf(t, store, oldRid)
	require.NotEmpty(t, lease)

	f.Partition(true)
	testwait.For(t, func() bool {
		alive, err := store.LeaseAlive(ctx, location.LeaseID(lease))
		return err == nil && !alive
	}, "the store never ended the cut-off node's lease")
	f.Partition(false)
	testwait.For(t, func() bool { return a.NodeRid() != oldRid && a.NodeRid() != "" }, "the node never rejoined")
	require.Equal(t, address, a.System().Address())
	require.Equal(t, "node-a", a.NodeName())
	res, err := a.System().Root.RequestFuture(app, wrapperspb.String("?"), 10e9).Result()
	require.NoError(t, err)
	require.Equal(t, "still here", res.(*wrapperspb.StringValue).GetValue())

	// The new lifecycle takes work: an actor spawned there moves to b and
	// back, and the old lifecycle's Spot is recovered by a call.
	_, err = a.SpawnActor(ctx, "counter", "fresh")
	require.NoError(t, err)
	_, err = b.Relocate(ctx, roam.ActorRef("fresh"), "node-b")
	require.NoError(t, err)
	_, err = b.Relocate(ctx, roam.ActorRef("fresh"), "node-a")
	require.NoError(t, err)
	// The old lifecycle's Actor comes back by itself on a live node, from
	// its last checkpoint (its kind's default): no operator needed.
	testwait.For(t, func() bool {
		pid, err := b.Resolve(ctx, roam.ActorRef("old"))
		return err == nil && pid != nil
	}, "the old lifecycle's Actor was never recovered")
}

// leaseOf is the lease ID of the live node rid ("" if none).
func leaseOf(t *testing.T, store location.Store, rid string) string {
	t.Helper()
	nodes, err := store.ListNodes(context.Background(), "")
	require.NoError(t, err)
	for _, n := range nodes {
		if n.Node.GetNodeRid() == rid {
			return n.Node.GetLeaseId()
		}
	}
	return ""
}

// Transport limits are checked where they are given.
func TestNegativeTransportLimitsAreRefused(t *testing.T) {
	_, err := roam.New(actor.NewActorSystem(), roam.WithStore(memstore.New()), roam.WithTransportLimits(roam.TransportLimits{MaxConnections: -1}))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
}
