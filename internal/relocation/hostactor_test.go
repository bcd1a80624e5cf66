package relocation_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

// selfAware answers "who" with whether its context's Actor is itself and
// whether Timers and KeepState find its incarnation; "fail" panics.
type selfAware struct{ counter }

func (s *selfAware) Receive(c actor.Context) {
	m, ok := c.Message().(*wrapperspb.StringValue)
	if !ok {
		s.counter.Receive(c)
		return
	}
	switch m.Value {
	case "fail":
		panic("application bug")
	case "who":
		_, timersErr := relocation.Timers(c)
		keepErr := relocation.KeepState(c, nil)
		c.Respond(wrapperspb.Bool(c.Actor() == actor.Actor(s) && timersErr == nil && keepErr == nil))
	default:
		s.counter.Receive(c)
	}
}

// roam runs the application's actor inside an actor of its own, the host,
// instead of middleware (which, like Context.Set, makes Proto.Actor give
// every context its extras: a fifth of an idle Spot's heap). So: an
// incarnation that served requests has no context extras; its actor sees
// itself as the context's Actor, and Timers and KeepState find the
// incarnation through the context it was given; all of it again after
// Proto.Actor restarts the actor (a new host, which finds its object by
// the mailbox's restart hook); and the restarted incarnation moves with
// its state.
func TestTheApplicationsActorRunsInsideRoamsHost(t *testing.T) {
	store := newStore(t)
	kind := relocation.Kind{StableType: "self-aware", Producer: func() actor.Actor { return &selfAware{} },
		Policy: relocation.PreserveStateWith(selfAwareState{})}
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, kind)
	b := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, kind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "s1")
	pid, err := a.driver.Spawn(ctx, "self-aware", key.ID)
	require.NoError(t, err)
	sys := a.node.System()
	who := func(sys *actor.ActorSystem) bool {
		t.Helper()
		res, err := sys.Root.RequestFuture(pid, wrapperspb.String("who"), 10*time.Second).Result()
		require.NoError(t, err)
		return res.(*wrapperspb.BoolValue).Value
	}
	sys.Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, sys, pid))
	require.True(t, who(sys), "the context's Actor is the application's; Timers and KeepState find the incarnation")
	extras, err := relocation.ContextExtras(ctx, a.driver, key)
	require.NoError(t, err)
	require.False(t, extras, "an incarnation that served requests has no context extras")

	sys.Root.Send(pid, wrapperspb.String("fail"))
	sys.Root.Send(pid, wrapperspb.Int64(1)) // a fresh instance counts from 1
	require.Equal(t, int64(1), get(t, sys, pid), "the restarted instance serves (from a fresh counter, as Proto.Actor restarts)")
	require.True(t, who(sys), "after a restart too")

	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, int64(1), get(t, sys, pid), "the restarted instance's state moved")
	require.True(t, who(sys), "on the target")
	extras, err = relocation.ContextExtras(ctx, b.driver, key)
	require.NoError(t, err)
	require.False(t, extras, "nor on the target")
}

type selfAwareState struct{}

func (selfAwareState) Capture(a actor.Actor) ([]byte, error) {
	return counterState{}.Capture(&a.(*selfAware).counter)
}

func (selfAwareState) Restore(a actor.Actor, b []byte) error {
	return counterState{}.Restore(&a.(*selfAware).counter, b)
}
