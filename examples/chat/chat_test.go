package chat_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/examples/chat"
	"github.com/roamactors/roam/examples/chat/chatpb"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/messages"
)

// A client connected to one node keeps chatting while the room and its
// own Actor move between nodes: every post reaches it once, the room
// handles them in order, the room's history and members move with it, and
// the client is never disconnected.
// Reference: docs/PROTOCOL.md §10 (nothing lost or handled twice, order
// per sender) on the chat example.
func TestRoomKeepsChattingWhileItMoves(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var nodes []*roam.Roam
	for _, name := range []string{"north", "south"} {
		system := actor.NewActorSystem()
		r, err := roam.New(system, roam.WithStore(store), roam.WithNodeName(name), roam.WithKinds(chat.Kinds()...),
			roam.WithLogger(*testlog.Logger()))
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		t.Cleanup(func() {
			_ = r.Stop(ctx)
			system.Shutdown()
		})
		_, err = chat.StartGateway(r, *testlog.Logger())
		require.NoError(t, err)
		nodes = append(nodes, r)
	}
	client := actor.NewActorSystem()
	r := remote.NewRemote(client, remote.Configure("127.0.0.1", 0))
	r.Start()
	t.Cleanup(func() { r.Shutdown(false) })

	var mu sync.Mutex
	var got []*chatpb.Posted
	var other []any // anything else the inbox got: refusals, a disconnection
	inbox := client.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch p := c.Message().(type) {
		case *chatpb.Posted:
			mu.Lock()
			got = append(got, p)
			mu.Unlock()
		case *chatpb.PostRefused, *chatpb.Disconnected:
			mu.Lock()
			other = append(other, p)
			mu.Unlock()
		}
	}))
	gateway := actor.NewPID(nodes[0].System().Address(), chat.GatewayName)
	connect := func(name string) {
		res, err := client.Root.RequestFuture(gateway, &chatpb.Connect{Name: name, Inbox: &messages.PID{Address: inbox.Address, Id: inbox.Id}}, 10*time.Second).Result()
		require.NoError(t, err)
		require.IsType(t, &chatpb.Connected{}, res, "%v", res)
	}
	connect("ann")
	// The hall is created on the other node: ann's Actor moves there to
	// join it, her Session stays on north.
	_, err := nodes[1].Spots().GetOrCreate(ctx, "hall", chat.StableType)
	require.NoError(t, err)
	res, err := client.Root.RequestFuture(gateway, &chatpb.Join{Room: "hall", Member: &chatpb.Member{Name: "ann"}}, 10*time.Second).Result()
	require.NoError(t, err)
	require.IsType(t, &chatpb.Joined{}, res, "%v", res)

	const posts = 300
	for i := 1; i <= posts; i++ {
		client.Root.Send(gateway, &chatpb.Post{Room: "hall", Name: "ann", Seq: uint64(i), Text: fmt.Sprint("line ", i)})
		if i%100 == 50 {
			for _, mv := range []*chatpb.Relocate{{Room: "hall", To: "north"}, {User: "ann", To: "south"}, {Room: "hall", To: "south"}, {User: "ann", To: "north"}} {
				res, err := client.Root.RequestFuture(gateway, mv, 10*time.Second).Result()
				require.NoError(t, err)
				require.Empty(t, res.(*chatpb.Relocated).GetError())
			}
		}
	}
	deadline := time.Now().Add(testwait.Patience(t))
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= posts {
			break
		}
		require.False(t, time.Now().After(deadline), "only %d of %d posts arrived", n, posts)
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, posts)
	require.Empty(t, other, "nothing refused, never disconnected")
	// Every post arrives once, and the room handled them in order (its index
	// follows the seq). Arrival order at the client is not checked: a room's
	// broadcasts just before and just after a move leave on two connections,
	// and nothing orders two connections (PROTOCOL.md §10).
	index := map[uint64]uint64{}
	for _, p := range got {
		_, dup := index[p.GetSeq()]
		require.False(t, dup, "seq %d delivered twice", p.GetSeq())
		index[p.GetSeq()] = p.GetIndex()
	}
	for seq := uint64(1); seq <= posts; seq++ {
		idx, ok := index[seq]
		require.True(t, ok, "seq %d never delivered", seq)
		require.Equal(t, seq-1, idx, "the room handled seq %d in order", seq)
	}
	// A post over MaxPostBytes is refused at the gateway, typed, and
	// reaches nobody.
	res, err = client.Root.RequestFuture(gateway, &chatpb.Post{Room: "hall", Name: "ann", Seq: posts + 1,
		Text: strings.Repeat("x", chat.MaxPostBytes)}, 10*time.Second).Result()
	require.NoError(t, err)
	require.Contains(t, res.(*chatpb.Ack).GetError(), "at most")
	// A second member joining now sees the last 100 posts, moved along.
	mu.Unlock()
	connect("bo")
	mu.Lock()
	res, err = client.Root.RequestFuture(gateway, &chatpb.Join{Room: "hall", Member: &chatpb.Member{Name: "bo"}}, 10*time.Second).Result()
	require.NoError(t, err)
	joined := res.(*chatpb.Joined)
	require.Len(t, joined.GetHistory(), chat.History)
	require.EqualValues(t, posts, joined.GetHistory()[chat.History-1].GetSeq())
	require.EqualValues(t, 2, joined.GetMembers())
}
