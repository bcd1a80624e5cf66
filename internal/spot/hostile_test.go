package spot_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// A process that is not a node of the cluster, and names a real node as
// the source of its Spot commands, gets nothing done: its Close (48) is
// refused permission_denied and the Spot stays; its cold activation (39)
// activates nothing. A node of the cluster does both.
func TestOutsiderSpotCommandsAreRefused(t *testing.T) {
	store := memstore.New()
	w := newWorld(t, store)
	a := w.start(withKinds(w.cartKind("cart")))
	b := w.start()
	res, err := a.Spots().GetOrCreate("den", "room").Do(ctx)
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), res.Ref.NodeRid)
	v, err := store.Read(ctx, location.Key(location.KindUserSpot, "den"))
	require.NoError(t, err)

	outsider, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = outsider.Stop(context.Background()) })
	closeCmd := &messages.UserSpotClose{OperationId: uuid.NewString(), Ref: &messages.SpotRef{SpotId: "den", ObjectGeneration: res.Ref.ObjectGeneration},
		SourceNodeRid: a.NodeRid(), SourceNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
		TargetNodeRid: b.NodeRid(), TargetNodeGeneration: b.Node().Descriptor().GetNodeGeneration(),
		ExpectedOwnerGeneration: v.Record.GetAuthorityOwnerGeneration(), ExpectedStoreVersion: uint64(v.Version),
		DeadlineUnixNanos: time.Now().Add(5 * time.Second).UnixNano()}
	r, err := outsider.System().Root.RequestFuture(actor.NewPID(b.Node().Address(), spot.ServiceName), closeCmd, testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.Equal(t, roamerr.CodePermissionDenied, r.(*messages.SpotReply).GetFailureCode())
	require.NotContains(t, r.(*messages.SpotReply).GetFailureDetail(), b.NodeRid())
	after, err := store.Read(ctx, location.Key(location.KindUserSpot, "den"))
	require.NoError(t, err)
	require.Equal(t, v.Version, after.Version, "the Spot is untouched")

	// The same close, claiming a's address as its sender (without TLS a
	// sender's address is what it declares): b confirms the operation
	// with a, which never sent it.
	refusedBefore := b.Spots().Refused()
	spoofed := proto.Clone(closeCmd).(*messages.UserSpotClose)
	spoofed.OperationId = uuid.NewString()
	outsider.System().Root.RequestWithCustomSender(actor.NewPID(b.Node().Address(), spot.ServiceName), spoofed,
		actor.NewPID(a.Node().Address(), "nobody"))
	testwait.For(t, func() bool { return b.Spots().Refused() > refusedBefore }, "the spoofed close was not judged")
	after, err = store.Read(ctx, location.Key(location.KindUserSpot, "den"))
	require.NoError(t, err)
	require.Equal(t, v.Version, after.Version, "the Spot is untouched")

	// A cold activation of a Missing Spot, naming a as its source, with a
	// reply route back to the outsider.
	f := actor.NewFuture(outsider.System(), testwait.Patience(t))
	env := &actor.MessageEnvelope{Message: wrapperspb.String("1"), Sender: f.PID(),
		Header: map[string]string{relocation.HeaderOperation: uuid.NewString()}}
	first, err := relocation.ToWire("crate", env)
	require.NoError(t, err)
	outsider.System().Root.RequestWithCustomSender(actor.NewPID(a.Node().Address(), spot.ServiceName), &messages.SpotActivation{
		OperationId: env.Header.Get(relocation.HeaderOperation), RouteKind: 2, SpotId: "crate", StableType: "cart",
		TargetNodeRid: a.NodeRid(), TargetNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
		SourceNodeRid: a.NodeRid(), SourceNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
		DeadlineUnixNanos: time.Now().Add(5 * time.Second).UnixNano(), First: first,
	}, actor.NewPID(outsider.Address(), spot.ServiceName))
	reply, err := f.Result()
	require.NoError(t, err)
	require.ErrorIs(t, relocation.DeliveryError(reply), roamerr.ErrPermissionDenied)
	_, err = store.Read(ctx, location.Key(location.KindInstanceSpot, "crate"))
	require.ErrorIs(t, err, location.ErrNotFound, "nothing was activated for the outsider")
	require.Zero(t, w.count("cart").Load(), "no factory ran")
	// A node of the cluster activates it.
	_, err = request(t, a, "crate", "1", "cart")
	require.NoError(t, err)

	// The real source can still close it.
	closed, err := a.Spots().Close(ctx, res.Ref)
	require.NoError(t, err)
	require.True(t, closed)
}

// A flood of cold activations from one sender is held to the Spot
// service's in-flight limit: past it each is answered capacity_exceeded
// at once (not queued with its first message), the rest are judged — and
// an outsider's refused — and the node serves on.
func TestAnActivationFloodIsHeldToTheInFlightLimit(t *testing.T) {
	store := memstore.New()
	w := newWorld(t, store)
	a := w.start(withKinds(w.cartKind("cart")), func(c *extension.Config) { c.Spot.InFlight = spot.InFlightLimits{PerPeer: 8} })
	outsider, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = outsider.Stop(context.Background()) })

	const flood = 300
	futures := make([]*actor.Future, flood)
	for i := range futures {
		futures[i] = actor.NewFuture(outsider.System(), testwait.Patience(t))
		env := &actor.MessageEnvelope{Message: wrapperspb.String("1"), Sender: futures[i].PID(),
			Header: map[string]string{relocation.HeaderOperation: uuid.NewString()}}
		first, err := relocation.ToWire("c", env)
		require.NoError(t, err)
		outsider.System().Root.RequestWithCustomSender(actor.NewPID(a.Node().Address(), spot.ServiceName), &messages.SpotActivation{
			OperationId: env.Header.Get(relocation.HeaderOperation), RouteKind: 2, SpotId: fmt.Sprintf("crate-%d", i), StableType: "cart",
			TargetNodeRid: a.NodeRid(), TargetNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
			SourceNodeRid: a.NodeRid(), SourceNodeGeneration: a.Node().Descriptor().GetNodeGeneration(),
			DeadlineUnixNanos: time.Now().Add(time.Minute).UnixNano(), First: first,
		}, actor.NewPID(outsider.Address(), spot.ServiceName))
	}
	var full, denied int
	for _, f := range futures {
		reply, err := f.Result()
		require.NoError(t, err)
		switch err := relocation.DeliveryError(reply); {
		case errors.Is(err, roamerr.ErrCapacityExceeded):
			full++
		case errors.Is(err, roamerr.ErrPermissionDenied):
			denied++
		default:
			t.Fatalf("an outsider's activation answered %v", err)
		}
	}
	require.Positive(t, full, "the flood went past the limit")
	require.Positive(t, denied, "activations within the limit were judged")
	require.Zero(t, w.count("cart").Load(), "no factory ran")
	_, err = request(t, a, "crate-0", "1", "cart")
	require.NoError(t, err, "the node serves on")
}

// forgery is what an attacker who learnt a question's reply route answers
// it with: the answer a success would be, echoing what the question
// carries; nil for a question it leaves alone.
func forgery(q ask.Asked) proto.Message {
	switch m := q.Message.(type) {
	case *messages.CapabilityQuery:
		return &messages.CapabilityReply{Supported: true, MoveTicket: []byte("forged")}
	case *messages.RelocateRequest:
		return &messages.RelocateReply{}
	case *messages.UserSpotCreate:
		return &messages.SpotReply{OperationId: m.GetOperationId(), Result: messages.CreateResult_CREATE_RESULT_CREATED}
	case *messages.UserSpotClose:
		return &messages.SpotReply{OperationId: m.GetOperationId(), Closed: true}
	case *messages.CommandConfirm:
		return &messages.CommandConfirm{OperationId: m.GetOperationId(), Nonce: m.GetNonce(), Pending: true}
	case *messages.EdgeQuery:
		return &messages.EdgeReply{}
	}
	return nil
}

// Every question a node asks another is answered only by the node asked:
// an outsider that learnt each question's reply route (here from the
// test's observer; on a network, by watching it) answers it at once with
// what a success would be, and sprays Proto.Actor's numbered futures as
// well. Every forged answer is refused and counted, and each operation
// has its real outcome: the Spot is created where the store says, and
// moved where the move said.
func TestForgedAnswersToEveryQuestionAreRefused(t *testing.T) {
	store := memstore.New()
	w := newWorld(t, store)
	a := w.start()
	b := w.start()
	outsider, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = outsider.Stop(context.Background()) })

	var mu sync.Mutex
	asked := map[string]int{}
	var forged atomic.Int64
	ask.Observe(func(q ask.Asked) {
		msg := forgery(q)
		if msg == nil {
			return
		}
		mu.Lock()
		asked[fmt.Sprintf("%T", q.Message)]++
		mu.Unlock()
		forged.Add(1)
		outsider.System().Root.Send(q.Route, msg)
		for i := 1; i <= 20; i++ {
			outsider.System().Root.Send(actor.NewPID(q.Route.Address, "future$"+strconv.Itoa(i)), msg)
		}
	})
	t.Cleanup(func() { ask.Observe(nil) })
	before := ask.Refused()

	res, err := a.Spots().GetOrCreate("den", "room").Do(ctx)
	require.NoError(t, err)
	v, err := store.Read(ctx, location.Key(location.KindUserSpot, "den"))
	require.NoError(t, err)
	require.Equal(t, res.Ref.NodeRid, v.Record.GetOwner().GetNodeRid(), "created where the store says")
	other := a
	if res.Ref.NodeRid == a.NodeRid() {
		other = b
	}
	// A move asked of the node that does not own the Spot is forwarded to
	// its owner, which asks the target's capability.
	out, err := other.Relocate(ctx, location.Key(location.KindUserSpot, "den"), other.NodeRid())
	require.NoError(t, err)
	require.Equal(t, other.NodeRid(), out.To)
	v, err = store.Read(ctx, location.Key(location.KindUserSpot, "den"))
	require.NoError(t, err)
	require.Equal(t, other.NodeRid(), v.Record.GetOwner().GetNodeRid(), "moved where the move said")
	// The Spot's creator closes it on its new owner.
	ref := res.Ref
	ref.NodeRid = other.NodeRid()
	closed, err := a.Spots().Close(ctx, ref)
	require.NoError(t, err)
	require.True(t, closed)

	mu.Lock()
	t.Logf("questions forged: %v", asked)
	// The create runs on the node that places the Spot: asked of the other
	// node when it is placed there; the close is asked of the other then.
	require.Positive(t, asked["*messages.UserSpotCreate"]+asked["*messages.UserSpotClose"], "no Spot command was asked")
	for _, kind := range []string{"*messages.CommandConfirm", "*messages.RelocateRequest", "*messages.CapabilityQuery"} {
		require.Positive(t, asked[kind], "no %s was asked", kind)
	}
	mu.Unlock()
	testwait.For(t, func() bool { return ask.Refused()-before >= forged.Load() }, "a forged answer was not refused")
}
