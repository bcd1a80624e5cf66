package relocation_test

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
)

type panicky struct{ counter }

func (p *panicky) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*wrapperspb.BoolValue); ok && m.Value {
		panic("application bug")
	}
	p.counter.Receive(ctx)
}

type panickyState struct{}

func (panickyState) Capture(a actor.Actor) ([]byte, error) {
	return counterState{}.Capture(&a.(*panicky).counter)
}

func (panickyState) Restore(a actor.Actor, b []byte) error {
	return counterState{}.Restore(&a.(*panicky).counter, b)
}

// An application actor that fails more than 10 times in 10 s is restarted,
// not stopped: Proto.Actor's default strategy would stop it, roam refuses
// stops it did not decide, and the incarnation would stay suspended for
// good (requests timing out, sends waiting, moves stuck before the seal).
// roam supervises its actors with RestartAlways.
func TestAFailingIncarnationIsRestartedNotStuck(t *testing.T) {
	store := newStore(t)
	kind := relocation.Kind{StableType: "panicky", Producer: func() actor.Actor { return &panicky{} }, Policy: relocation.PreserveStateWith(panickyState{})}
	a := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, kind)
	b := startNodeConfig(t, store, relocation.Config{Logger: testLogger()}, kind)
	ctx := context.Background()
	key := location.Key(location.KindActor, "p1")
	pid, err := a.driver.Spawn(ctx, "panicky", key.ID)
	require.NoError(t, err)
	sys := a.node.System()
	for i := 0; i < 12; i++ {
		sys.Root.Send(pid, wrapperspb.Bool(true))
	}
	sys.Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, sys, pid), "the restarted incarnation serves the messages after the failures")
	_, err = a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, int64(1), get(t, sys, pid))
}
