package relocation_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// A finished move leaves nothing behind once the machines' last timers
// fired: the source's incarnation answers Unavailable for one follow
// period after Message Follow ended and then stops, and both runs are
// dropped with their timers, on the timer set of each node.
func TestAFinishedMoveLeavesNoRunNorTimer(t *testing.T) {
	store := newStore(t)
	cfg := shortFollow(nil)
	a, b := startNodeConfig(t, store, cfg, counterKind), startNodeConfig(t, store, cfg, counterKind)
	ctx := context.Background()
	_, err := a.driver.Spawn(ctx, "counter", "gone")
	require.NoError(t, err)
	_, err = a.driver.Relocate(ctx, location.Key(location.KindActor, "gone"), b.node.Descriptor().GetNodeRid())
	require.NoError(t, err)
	testwait.For(t, func() bool {
		sources, targets, live := relocation.Runs(a.driver)
		return sources == 0 && targets == 0 && live == 0 && relocation.RunningTimers(a.driver) == 0
	}, "the source's run, timers or incarnation outlived the stub")
	testwait.For(t, func() bool {
		sources, targets, live := relocation.Runs(b.driver)
		return sources == 0 && targets == 0 && live == 1 && relocation.RunningTimers(b.driver) == 0
	}, "the target's run or timers outlived its last stretch")
}
