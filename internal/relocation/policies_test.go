package relocation_test

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Registering a relocatable kind without a policy is a start-up error, and
// so is registering one stable type twice.
// Reference: docs/PROTOCOL.md §2.4, §2.1.
func TestKindNeedsAPolicyAndAUniqueStableType(t *testing.T) {
	n := startNodeWith(t, newStore(t))
	err := n.driver.RegisterKind(relocation.Kind{StableType: "p", Producer: func() actor.Actor { return &counter{} }})
	require.ErrorIs(t, err, roamerr.ErrNotConfigured)
	require.NoError(t, n.driver.RegisterKind(counterKind))
	require.ErrorIs(t, n.driver.RegisterKind(counterKind), roamerr.ErrInvalidOperation)
	err = n.driver.RegisterKind(relocation.Kind{StableType: "", Producer: func() actor.Actor { return &counter{} }, Policy: relocation.RecreateOnRelocation()})
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
}

// A kind with DisableRelocation never moves and keeps serving.
// Reference: PROTOCOL.md §2.4 (relocation policies).
func TestDisableRelocationRefusesToMove(t *testing.T) {
	kind := relocation.Kind{StableType: "fixed", Producer: func() actor.Actor { return &counter{} }, Policy: relocation.DisableRelocation()}
	store := newStore(t)
	a, b := startNodeWith(t, store, kind), startNodeWith(t, store, kind)
	pid, err := a.driver.Spawn(context.Background(), "fixed", "x")
	require.NoError(t, err)
	_, err = a.driver.Relocate(context.Background(), location.Key(location.KindActor, "x"), b.node.Descriptor().GetNodeRid())
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	a.node.System().Root.Send(pid, wrapperspb.Int64(1))
	require.Equal(t, int64(1), get(t, a.node.System(), pid))
}

// RecreateOnRelocation moves the object's queue but not its state: the
// target runs a fresh instance.
// Reference: PROTOCOL.md §2.4 (relocation policies).
func TestRecreateOnRelocationStartsFresh(t *testing.T) {
	kind := relocation.Kind{StableType: "fresh", Producer: func() actor.Actor { return &counter{} }, Policy: relocation.RecreateOnRelocation()}
	store := newStore(t)
	a, b := startNodeWith(t, store, kind), startNodeWith(t, store, kind)
	ctx := context.Background()
	pid, err := a.driver.Spawn(ctx, "fresh", "y")
	require.NoError(t, err)
	sys := a.node.System()
	for i := int64(1); i <= 10; i++ {
		sys.Root.Send(pid, wrapperspb.Int64(i))
	}
	require.Equal(t, int64(10), get(t, sys, pid))
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "y"), b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, int64(0), get(t, sys, pid))
}

// closingCounter tells when its incarnation closes.
type closingCounter struct {
	counter
	closed chan relocation.ClosingReason
}

func (c *closingCounter) OnClosing(r relocation.ClosingReason) { c.closed <- r }

// An Instance Spot moves through the same target-only CAS as an Actor: the
// target writes owner and owner generation, no membership, and the source
// instance gets OnClosing(RelocationOut).
// Reference: PROTOCOL.md §5.11, §5.13, §12.1 item 1 (same CAS boundary).
func TestInstanceSpotMovesThroughTheSameCAS(t *testing.T) {
	closed := make(chan relocation.ClosingReason, 4)
	kind := relocation.Kind{StableType: "room", Producer: func() actor.Actor { return &closingCounter{closed: closed} },
		Policy: relocation.PreserveStateWith(closingState{})}
	shared := newStore(t)
	srcView, dstView := &writeRecorder{Store: shared}, &writeRecorder{Store: shared}
	a, b := startNodeWith(t, srcView, kind), startNodeWith(t, dstView, kind)
	ctx := context.Background()
	key := location.Key(location.KindInstanceSpot, "room/lobby 🚀")
	pid, err := a.driver.SpawnInstanceSpot(ctx, "room", key.ID)
	require.NoError(t, err)
	sys := a.node.System()
	for i := int64(1); i <= 100; i++ {
		sys.Root.Send(pid, wrapperspb.Int64(i))
	}
	before := srcView.wrote(key)
	out, err := a.driver.Relocate(ctx, key, b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	require.Equal(t, relocation.RelocationOut, <-closed)
	require.Equal(t, before, srcView.wrote(key))
	require.Equal(t, 1, dstView.wrote(key))
	v, err := shared.Read(ctx, key)
	require.NoError(t, err)
	require.Equal(t, b.node.Descriptor().GetNodeRid(), v.Record.GetOwner().GetNodeRid())
	require.Equal(t, out.RelocationID, v.Record.GetRelocationId())
	require.Equal(t, messages.SpotKind_SPOT_KIND_INSTANCE, v.Record.GetSpotKind())
	require.Nil(t, v.Record.GetMembership())
	require.Equal(t, int64(100), get(t, sys, pid))
}

type closingState struct{}

func (closingState) Capture(a actor.Actor) ([]byte, error) {
	return counterState{}.Capture(&a.(*closingCounter).counter)
}

func (closingState) Restore(a actor.Actor, b []byte) error {
	return counterState{}.Restore(&a.(*closingCounter).counter, b)
}
