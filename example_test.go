package roam_test

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/location/memstore"
)

// Two nodes share a Location Store; a relocatable kind is registered on
// both. A call by Spot ID activates the counter "c1" on some node, a
// Relocate from any node moves it by the target's name, and the next call
// finds it, with its count, on its new node.
func Example() {
	ctx := context.Background()
	store := memstore.New()
	kind := roam.NewKind("counter", actor.PropsFromProducer(func() actor.Actor { return &counter{} }),
		roam.PreserveState(), roam.Instance())
	a, _ := roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(kind), roam.WithNodeName("a"))
	b, _ := roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(kind), roam.WithNodeName("b"))
	for _, r := range []*roam.Roam{a, b} {
		if err := r.Start(ctx); err != nil {
			panic(err)
		}
		defer r.Stop(ctx)
	}
	call := func(r *roam.Roam) int64 {
		reply, err := r.Spots().Request(ctx, "c1", wrapperspb.String("tick"), roam.InstanceSpot("counter"))
		if err != nil {
			panic(err)
		}
		return reply.(*wrapperspb.Int64Value).GetValue()
	}
	fmt.Println(call(a), call(b))
	for _, to := range []string{"a", "b"} { // one of them is a move; the other returns at once
		if _, err := b.Relocate(ctx, roam.InstanceSpotRef("c1"), to); err != nil {
			panic(err)
		}
	}
	fmt.Println(call(a))
	// Output:
	// 1 2
	// 3
}

// An actor spawned by ID on this node, then moved by another node.
func ExampleRoam_SpawnActor() {
	ctx := context.Background()
	store := memstore.New()
	kind := roam.NewKind("counter", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState())
	a, _ := roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(kind), roam.WithNodeName("a"))
	b, _ := roam.New(actor.NewActorSystem(), roam.WithStore(store), roam.WithKinds(kind), roam.WithNodeName("b"))
	_ = a.Start(ctx)
	_ = b.Start(ctx)
	defer a.Stop(ctx)
	defer b.Stop(ctx)

	pid, _ := a.SpawnActor(ctx, "counter", "worker-1")
	fmt.Println(pid.Address == a.System().Address())
	out, err := b.Relocate(ctx, roam.ActorRef("worker-1"), "b")
	fmt.Println(out.From == a.NodeRid(), out.To == b.NodeRid(), err)
	// Output:
	// true
	// true true <nil>
}

// roam in an application that runs a Proto.Actor cluster: the cluster gets
// roam's remote configuration and identity lookup, the member starts, then
// roam. Kinds registered with cluster.WithKinds keep Proto.Actor's own
// lookup; roam's kinds (here a relocatable one) are resolved through the
// Location Store and follow their moves.
func ExampleRoam_IdentityLookup() {
	ctx := context.Background()
	system := actor.NewActorSystem()
	r, _ := roam.New(system, roam.WithStore(memstore.New()), roam.WithKinds(
		roam.NewKind("counter", actor.PropsFromProducer(func() actor.Actor { return &counter{} }), roam.PreserveState(), roam.Instance())))
	remoteConfig, _ := r.RemoteConfig("127.0.0.1", 0)
	c := cluster.New(system, cluster.Configure("shop", test.NewTestProvider(test.NewInMemAgent()), r.IdentityLookup(), remoteConfig,
		cluster.WithKinds(cluster.NewKind("plain", actor.PropsFromFunc(func(actor.Context) {})))))
	c.StartMember()
	defer c.Shutdown(true)
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	defer r.Stop(ctx)
	reply, err := c.Request("c1", "counter", wrapperspb.String("tick"))
	fmt.Println(reply.(*wrapperspb.Int64Value).GetValue(), err)
	// Output: 1 <nil>
}
