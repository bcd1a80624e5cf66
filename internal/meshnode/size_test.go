package meshnode_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// A node sending to a plain Proto.Actor process (gRPC's default 4 MiB
// receive limit) a message over that limit, between small ones: the large
// one is not sent and its sender is answered capacity_exceeded; the small
// ones arrive, in order, on a stream that goes on. Before, the frame ended
// the stream and every message queued with it.
func TestAMessageOverThePeersLimitIsDroppedAloneAndAnswered(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })

	peer := actor.NewActorSystem()
	r := remote.NewRemote(peer, remote.Configure("127.0.0.1", 0))
	r.Start()
	t.Cleanup(func() { r.Shutdown(false) })
	got := make(chan string, 16)
	inbox, err := peer.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if s, ok := c.Message().(*wrapperspb.StringValue); ok {
			got <- s.Value[:min(len(s.Value), 8)]
		}
	}), "inbox")
	require.NoError(t, err)

	to := actor.NewPID(peer.Address(), inbox.Id)
	n.System().Root.Send(to, wrapperspb.String("first"))
	big := n.System().Root.RequestFuture(to, wrapperspb.String(strings.Repeat("x", 5<<20)), testwait.Patience(t))
	n.System().Root.Send(to, wrapperspb.String("second"))

	reply, err := big.Result()
	require.NoError(t, err)
	f, ok := reply.(*messages.DeliveryFailed)
	require.True(t, ok, "got %T", reply)
	require.Equal(t, roamerr.CodeCapacityExceeded, f.GetCode())
	for _, want := range []string{"first", "second"} {
		select {
		case s := <-got:
			require.Equal(t, want, s)
		case <-time.After(testwait.Patience(t)):
			t.Fatalf("%q never arrived", want)
		}
	}
	n.System().Root.Send(to, wrapperspb.String("third"))
	select {
	case s := <-got:
		require.Equal(t, "third", s, "the stream goes on")
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the stream ended")
	}
}

// A reply over a plain peer's limit to its request is answered to the
// request as capacity_exceeded instead of being left to time out.
func TestAReplyOverThePeersLimitAnswersTheRequest(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	big, err := n.System().Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*wrapperspb.StringValue); ok {
			c.Respond(wrapperspb.String(strings.Repeat("x", 5<<20)))
		}
	}), "big")
	require.NoError(t, err)

	peer := actor.NewActorSystem()
	r := remote.NewRemote(peer, remote.Configure("127.0.0.1", 0))
	r.Start()
	t.Cleanup(func() { r.Shutdown(false) })
	reply, err := peer.Root.RequestFuture(actor.NewPID(n.Address(), big.Id), wrapperspb.String("give"), testwait.Patience(t)).Result()
	require.NoError(t, err)
	f, ok := reply.(*messages.DeliveryFailed)
	require.True(t, ok, "got %T", reply)
	require.Equal(t, roamerr.CodeCapacityExceeded, f.GetCode())
}
