package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/internal/operator"
	"github.com/roamactors/roam/internal/testlog"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// counter counts the strings it is sent and answers the count; the count
// moves with it.
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

// startNode runs a roam node named name on store, on an actor system of its own.
func startNode(t *testing.T, store location.Store, name string, opts ...roam.Option) *roam.Roam {
	t.Helper()
	system := actor.NewActorSystem()
	r, err := roam.New(system, append([]roam.Option{roam.WithStore(store), roam.WithKinds(counterKind), roam.WithNodeName(name),
		roam.WithLogger(*testlog.Logger()), roam.WithLeaseTTL(2e9), roam.WithDrainOnStop(false)}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		_ = r.Stop(context.Background())
		system.Shutdown()
	})
	return r
}

// ownedBy counts the Actors and Instance Spots rid owns.
func ownedBy(t *testing.T, store location.Store, rid string) int {
	t.Helper()
	n := 0
	c := newCtl(store, nil, nil)
	require.NoError(t, c.scan(context.Background(), []location.Kind{location.KindActor, location.KindInstanceSpot}, func(v location.Versioned) {
		if v.Record.GetOwner().GetNodeRid() == rid {
			n++
		}
	}))
	return n
}

// roamctl against three real nodes: move one Actor, drain a node, and
// watch both.
func TestAgainstRealNodes(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := startNode(t, store, "node-a")
	b := startNode(t, store, "node-b")
	startNode(t, store, "node-c")

	const actors = 12
	for i := range actors {
		_, err := a.SpawnActor(ctx, "counter", fmt.Sprintf("actor-%d", i))
		require.NoError(t, err)
	}
	moved := uint64(0) // the set-up's moves; a Spot placed on node-a is not moved
	for i := range 3 {
		id := fmt.Sprintf("spot-%d", i)
		_, err := b.Spots().Request(ctx, id, wrapperspb.String("tick"), roam.InstanceSpot("counter"))
		require.NoError(t, err)
		o, err := b.Relocate(ctx, roam.InstanceSpotRef(id), "node-a")
		require.NoError(t, err)
		if o.From != o.To {
			moved++
		}
	}
	require.Equal(t, actors+3, ownedBy(t, store, a.NodeRid()))
	// A move's target notes it just after Relocate returns on the source:
	// wait for node-a's moves note to hold the set-up's moves, so that
	// watch, which shows the moves noted after it starts, shows none.
	testwait.For(t, func() bool {
		f, _, err := operator.Feed(ctx, store, "default", a.NodeRid())
		require.NoError(t, err)
		return f.GetSeq() >= moved
	}, "node-a notes the moves of the set-up")

	// watch, from before the moves until it has seen them all: the move
	// and the drain's every unit.
	wc, wout, _ := testCtl(store)
	wc.json = true
	watched := make(chan error, 1)
	go func() { watched <- wc.Watch(ctx, actors+3) }()

	c, out, _ := testCtl(store)
	require.NoError(t, c.Move(ctx, "", "actor-0", "node-b"))
	t.Logf("move:\n%s", out)
	require.True(t, strings.HasPrefix(out.String(), "moved actor/\"actor-0\": node-a → node-b, pause "), out.String())
	v, err := store.Read(ctx, location.Key(location.KindActor, "actor-0"))
	require.NoError(t, err)
	require.Equal(t, b.NodeRid(), v.Record.GetOwner().GetNodeRid())

	c, out, _ = testCtl(store)
	require.NoError(t, c.Drain(ctx, "node-a", 4))
	t.Logf("drain:\n%s", out)
	require.Contains(t, out.String(), "drain of node-a DONE in ")
	require.Contains(t, out.String(), fmt.Sprintf(": %d moved, 0 failed, of %d\n", actors+2, actors+2))
	require.Contains(t, out.String(), "pause p50 ")
	require.Zero(t, ownedBy(t, store, a.NodeRid()))

	c, out, _ = testCtl(store)
	require.NoError(t, c.Nodes(ctx))
	t.Logf("nodes:\n%s", out)
	for _, l := range lines(out.String())[1:] {
		if l[0] == "node-a" {
			require.Equal(t, []string{"DRAINING", "0/-"}, []string{l[2], l[6]})
		}
	}
	c, out, _ = testCtl(store)
	require.NoError(t, c.Ls(ctx, "node-a"))
	require.Len(t, lines(out.String()), 2, out.String()) // its Entry Spot alone
	require.Equal(t, "entry", lines(out.String())[1][0])

	testwait.For(t, func() bool {
		select {
		case err := <-watched:
			require.NoError(t, err)
			return true
		default:
			return false
		}
	}, "watch sees every move")
	t.Logf("watch:\n%s", wout)
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(wout.String()), "\n") {
		var m moveLine
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		require.Equal(t, "node-a", m.From, l)
		require.NotEqual(t, "node-a", m.To, l)
		seen[m.Kind+"/"+m.ID] = true
	}
	require.Len(t, seen, actors+3)
	require.True(t, seen["actor/actor-0"])
	require.True(t, seen["instance_spot/spot-2"])
}

// placement against real nodes: the elected node (the oldest) runs no
// director, so none is shown; once it stops, the next oldest, which runs
// one, is shown, paused and then not.
func TestPlacementShowsTheDirectorOfRealNodes(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := startNode(t, store, "node-a")
	b := startNode(t, store, "node-b", roam.WithPlacement(roam.PlacementConfig{Paused: true}))
	startNode(t, store, "node-c")
	placementNow := func() placementJSON {
		c, out, _ := testCtl(store)
		c.json = true
		require.NoError(t, c.Placement(ctx))
		var got struct{ Placement []placementJSON }
		require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
		require.Len(t, got.Placement, 1)
		return got.Placement[0]
	}
	p := placementNow()
	require.Equal(t, "node-a", p.Elected)
	require.Empty(t, p.Director, "node-a is elected and runs no director")

	require.NoError(t, a.Stop(ctx))
	testwait.For(t, func() bool { p = placementNow(); return p.Director == "node-b" && p.DirectorPaused },
		"node-b, elected once node-a stopped, is shown as the director, paused")
	b.Placement().Resume()
	testwait.For(t, func() bool { p = placementNow(); return p.Director == "node-b" && !p.DirectorPaused },
		"and running once resumed")
}
