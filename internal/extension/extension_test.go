package extension_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/memstore"
	"github.com/roamactors/roam/roamerr"
)

type greeter struct{ greeted int64 }

func (g *greeter) Receive(c actor.Context) {
	if _, ok := c.Message().(*wrapperspb.StringValue); ok {
		g.greeted++
		c.Respond(wrapperspb.Int64(g.greeted))
	}
}

type greeterState struct{}

func (greeterState) Capture(a actor.Actor) ([]byte, error) {
	return []byte{byte(a.(*greeter).greeted)}, nil
}

func (greeterState) Restore(a actor.Actor, b []byte) error {
	a.(*greeter).greeted = int64(b[0])
	return nil
}

// The public API moves an Actor between two nodes with its state.
// Reference: docs/PROTOCOL.md §5 (Relocate on the public entry point).
func TestExtensionRelocatesAnActor(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	var exts []*extension.Extension
	for i := 0; i < 2; i++ {
		e, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: store}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Stop(ctx) })
		require.NoError(t, e.RegisterKind(extension.Kind{
			StableType: "greeter",
			Producer:   func() actor.Actor { return &greeter{} },
			Policy:     extension.PreserveStateWith(greeterState{}),
		}))
		exts = append(exts, e)
	}
	pid, err := exts[0].SpawnActor(ctx, "greeter", "g")
	require.NoError(t, err)
	hello := func() int64 {
		res, err := exts[0].System().Root.RequestFuture(pid, wrapperspb.String("hi"), 5*time.Second).Result()
		require.NoError(t, err)
		return res.(*wrapperspb.Int64Value).Value
	}
	require.EqualValues(t, 1, hello())
	out, err := exts[0].Relocate(ctx, extension.ActorRef("g"), exts[1].NodeRid())
	require.NoError(t, err)
	require.Equal(t, exts[1].NodeRid(), out.To)
	require.EqualValues(t, 2, hello())
	_, err = exts[1].Relocate(ctx, extension.Ref{Kind: 1, ID: "entry"}, exts[0].NodeRid())
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
}

// After Stop, nothing waits on the stopped node's actors: the driver's
// internal calls (here through Serving and a Spot close) return a typed
// error at once instead of blocking forever.
// Reference: no object or caller left stuck.
func TestCallsAfterStopNeverBlock(t *testing.T) {
	ctx := context.Background()
	e, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: memstore.New()}})
	require.NoError(t, err)
	require.NoError(t, e.Stop(ctx))
	_, err = e.Serving(ctx, extension.ActorRef("a"))
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
	_, err = e.SpawnActor(ctx, "greeter", "b")
	require.ErrorIs(t, err, roamerr.ErrUnavailable)
}

// An Actor of a RecoverByOperator kind whose node stopped keeps its
// record, naming the ended owner: the same ID cannot be spawned again
// (AlreadyExists) until an operator accepts the loss of its state with
// ReleaseEnded; a live owner's Actor is never released.
// Reference: PROTOCOL.md §7.10 (release of an ended owner's record).
func TestEndedOwnersActorIsReleasedByTheOperator(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	kinds := []extension.Kind{{StableType: "greeter", Producer: func() actor.Actor { return &greeter{} }, Policy: extension.PreserveStateWith(greeterState{}),
		RecoverByOperator: true}}
	a, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: store}, Kinds: kinds})
	require.NoError(t, err)
	b, err := extension.Start(ctx, extension.Config{Node: meshnode.Config{Store: store}, Kinds: kinds})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Stop(ctx) })
	_, err = a.SpawnActor(ctx, "greeter", "orphan")
	require.NoError(t, err)
	_, err = b.ReleaseEnded(ctx, extension.ActorRef("orphan"))
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation, "the owner is alive")
	require.NoError(t, a.StopNow(ctx)) // no drain: the Actor is an ended owner's

	_, err = b.SpawnActor(ctx, "greeter", "orphan")
	require.ErrorIs(t, err, roamerr.ErrAlreadyExists)
	// Taken for ended only a lease TTL after b first saw a's descriptor
	// gone (docs/FAULTS.md, "Other nodes take over a TTL after the last heartbeat").
	released, err := testwait.Past(t, roamerr.ErrOwnerEnding, func() (bool, error) {
		return b.ReleaseEnded(ctx, extension.ActorRef("orphan"))
	})
	require.NoError(t, err)
	require.True(t, released)
	pid, err := b.SpawnActor(ctx, "greeter", "orphan")
	require.NoError(t, err)
	res, err := b.System().Root.RequestFuture(pid, wrapperspb.String("hi"), 5*time.Second).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, res.(*wrapperspb.Int64Value).Value, "a new, empty Actor")
	released, err = b.ReleaseEnded(ctx, extension.ActorRef("missing"))
	require.NoError(t, err)
	require.False(t, released)
}
