package relocation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// relay sends "hi" to the PID a "send:<address>|<id>" names through its
// own context (Send), or asks it ("ask:…", Request); it counts what it
// gets otherwise.
type relay struct{ counter }

func (r *relay) Receive(c actor.Context) {
	if s, ok := c.Message().(*wrapperspb.StringValue); ok {
		if verb, to, ok := strings.Cut(s.Value, ":"); ok && (verb == "send" || verb == "ask") {
			addr, id, _ := strings.Cut(to, "|")
			if verb == "send" {
				c.Send(actor.NewPID(addr, id), wrapperspb.Int64(1))
			} else {
				c.Request(actor.NewPID(addr, id), wrapperspb.Int64(1))
			}
			return
		}
	}
	r.counter.Receive(c)
}

var relayKind = relocation.Kind{StableType: "relay", Producer: func() actor.Actor { return &relay{} }, Policy: relocation.RecreateOnRelocation()}

func sampledNode(t *testing.T, store location.Store) (*testNode, *placement.EdgeTable) {
	tb := placement.NewEdgeTable(100, time.Hour)
	return startNodeConfig(t, store, relocation.Config{Logger: testLogger(), SampleEvery: 1, Edges: tb}, relayKind), tb
}

// A message an object sends through its own context, to an object on its
// node or another, by Send or Request, is stamped with its sender and
// counted in the receiver's node's table; a node answers its table to a
// live member of the mesh, never to a stranger.
// Reference: docs/PLACEMENT.md §5 (sampling).
func TestSendsFromObjectsAreSampledIntoTheReceiversTable(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	a, tableA := sampledNode(t, store)
	b, tableB := sampledNode(t, store)
	x, err := a.driver.Spawn(ctx, "relay", "x")
	require.NoError(t, err)
	y, err := b.driver.Spawn(ctx, "relay", "y")
	require.NoError(t, err)
	z, err := a.driver.Spawn(ctx, "relay", "z")
	require.NoError(t, err)
	sys := a.node.System()
	for range 3 {
		sys.Root.Send(x, wrapperspb.String("send:"+y.Address+"|"+y.Id)) // remote
	}
	sys.Root.Send(x, wrapperspb.String("ask:"+z.Address+"|"+z.Id)) // local, a request
	testwait.For(t, func() bool { return tableB.Len() == 1 && tableA.Len() == 1 }, "both tables count an edge")

	rid := a.node.Descriptor().GetNodeRid()
	s, err := a.driver.Edges(ctx, b.node.Address(), 10)
	require.NoError(t, err)
	require.Equal(t, []placement.Edge{{From: location.Key(location.KindActor, "x"), To: location.Key(location.KindActor, "y"), FromNode: rid, Weight: 3}}, s.Edges)
	require.Equal(t, []placement.Load{{Key: location.Key(location.KindActor, "y"), Weight: 3}}, s.Loads, "y handled three messages")
	require.Equal(t, 3.0, s.NodeLoad)
	s, err = b.driver.Edges(ctx, a.node.Address(), 10)
	require.NoError(t, err)
	require.Equal(t, []placement.Edge{{From: location.Key(location.KindActor, "x"), To: location.Key(location.KindActor, "z"), FromNode: rid, Weight: 1}}, s.Edges)

	// Messages from outside any object are not stamped (the request is
	// handled after the send).
	sys.Root.Send(y, wrapperspb.Int64(1))
	_, err = sys.Root.RequestFuture(y, wrapperspb.String("count"), testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.Equal(t, 1, tableB.Len())

	stranger, err := meshnode.Start(ctx, meshnode.Config{Store: newStore(t)}) // of another store
	require.NoError(t, err)
	defer func() { _ = stranger.Stop(ctx) }()
	d := stranger.Descriptor()
	res, err := stranger.System().Root.RequestFuture(relocation.PID(b.node.Address()),
		&messages.EdgeQuery{Source: &messages.NodeRef{NodeRid: d.GetNodeRid(), NodeGeneration: d.GetNodeGeneration(), Address: stranger.Address()}, Max: 10},
		testwait.Patience(t)).Result()
	require.NoError(t, err)
	require.NotEmpty(t, res.(*messages.EdgeReply).GetReason(), "a node of another store is no member")
	require.Empty(t, res.(*messages.EdgeReply).GetEdges())
}
