package relocation_test

import (
	"context"
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Every incarnation of a kind spawns from one shared Props and finds its
// object inside the spawn (Proto.Actor's spawner makes the mailbox and
// runs the Props' init within SpawnNamed). A kind whose Props do not make
// the mailbox within the spawn (a spawner of the application's that
// answers a PID and spawns later, or never) cannot be bound: the spawn is
// refused with InvalidOperation and its record taken back, instead of an
// incarnation serving without the lease gate or the stop guard.
func TestAKindWhosePropsSpawnElsewhereIsRefused(t *testing.T) {
	later := func(sys *actor.ActorSystem, id string, _ *actor.Props, _ actor.SpawnerContext) (*actor.PID, error) {
		return sys.NewLocalPID(id), nil
	}
	kind := relocation.Kind{StableType: "elsewhere", Props: actor.PropsFromProducer(func() actor.Actor { return &counter{} }, actor.WithSpawnFunc(later)),
		Policy: relocation.RecreateOnRelocation()}
	store := newStore(t)
	n := startNodeWith(t, store, kind, counterKind)
	ctx := context.Background()

	_, err := n.driver.SpawnInstanceSpot(ctx, "elsewhere", "e-1")
	require.ErrorIs(t, err, roamerr.ErrInvalidOperation)
	_, err = store.Read(ctx, location.Key(location.KindInstanceSpot, "e-1"))
	require.True(t, errors.Is(err, location.ErrNotFound), "the refused spawn's record is taken back: %v", err)

	// The node's other kinds are unaffected.
	_, err = n.driver.SpawnInstanceSpot(ctx, "counter", "c-1")
	require.NoError(t, err)
}
