package extension_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location/faulty"
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

// A lifecycle retired by a rejoin stops off its clock's timer: the
// release of its claim may wait 10 s of real time on a store that does
// not answer, and a logical clock runs its timers inside
// Advance, where that wait held every timer of every node on the clock.
// The node is cut off past its lease, hears it ended once the store
// answers again, and rejoins, keeping the old lifecycle up for the follow
// period; it is cut off again before that ends, and the clock's steps
// must go on past the old lifecycle's stop.
func TestARetiredLifecycleStopsOffTheClock(t *testing.T) {
	clock := machine.NewManualAt(time.Now())
	path, err := faulty.New(memstore.New(memstore.WithClock(clock)), faulty.Config{})
	require.NoError(t, err)
	const ttl = time.Hour
	e, err := extension.Start(context.Background(), extension.Config{
		Node: meshnode.Config{Store: path, LeaseTTL: ttl, Clock: clock}, StopWithoutDrain: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		path.Partition(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	old := e.Node()
	path.Partition(true)
	clock.Advance(2 * ttl) // the store ends the lease
	path.Partition(false)
	testwait.For(t, func() bool {
		select {
		case <-old.LeaseLost():
			return e.Node() != old // rejoined; old is retired
		default:
		}
		clock.Advance(time.Second) // renewals, the old lifecycle's end
		return false
	}, "the rejoin after the lease ended")
	path.Partition(true)
	// One step at a time, each on a goroutine: a step that never returns
	// leaves stepping set.
	var stepping atomic.Bool
	testwait.For(t, func() bool {
		if stepping.Load() {
			return false
		}
		select {
		case <-old.Stopping():
			// Its stop began, and the step that began it returned: with
			// the store cut off, the release it waits for cannot have
			// ended.
			select {
			case <-old.Stopped():
				t.Fatal("the clock's step returned only once the retired lifecycle's release had ended")
			default:
			}
			return true
		default:
		}
		stepping.Store(true)
		go func() {
			defer stepping.Store(false)
			clock.Advance(time.Second)
		}()
		return false
	}, "the clock's steps to go on past the retired lifecycle's stop")
}
