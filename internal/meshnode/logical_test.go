package meshnode_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// The lease's promise, in logical time: the nodes and the store run on one
// manual clock, so no renewal is late because the machine was busy. A node
// cut off from the store fences itself strictly before the store ends its
// lease, and no later than TTL after its last renewal was sent; a node that
// reaches the store stays valid for as long as the test runs; once the cut
// heals, the cut node learns its lease ended. Each step of the clock waits
// until every renewal that can be answered has been.
// Reference: docs/PROTOCOL.md §3.4 (owner leases), §10; docs/FAULTS.md
// ("Lease fencing").
func TestLeaseFencesBeforeTheStoreEndsItInLogicalTime(t *testing.T) {
	const ttl = 10 * time.Second
	clock := machine.NewManualAt(time.Now())
	inner := memstore.New(memstore.WithClock(clock))
	f, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	start := func(store location.Store) *meshnode.Node {
		n, err := meshnode.Start(context.Background(), meshnode.Config{Store: store, LeaseTTL: ttl, Clock: clock})
		require.NoError(t, err)
		t.Cleanup(func() { _ = n.Stop(context.Background()) })
		return n
	}
	cut, healthy := start(f), start(inner)
	reaching := []*meshnode.Node{cut, healthy} // the nodes whose renewals the store answers
	step := func() {
		t.Helper()
		clock.Advance(100 * time.Millisecond)
		for _, n := range reaching {
			testwait.Within(t, 10*time.Second, func() bool { return n.Settled() }, "the lease loop settled: Ticks taken, answers stepped")
		}
	}
	for i := 0; i < 3*int(ttl/(100*time.Millisecond)); i++ { // three TTLs, both reaching the store
		step()
		require.True(t, cut.Valid(), "step %d: %v", i, cut.LeaseStatus())
		require.True(t, healthy.Valid(), "%v", healthy.LeaseStatus())
	}

	f.Partition(true)
	reaching = reaching[1:]
	cutAt := clock.Now()
	var fencedAt, endedAt time.Time
	for endedAt.IsZero() {
		step()
		if fencedAt.IsZero() && !cut.Valid() {
			fencedAt = clock.Now()
		}
		alive, err := inner.LeaseAlive(context.Background(), cut.Lease().ID)
		require.NoError(t, err)
		if !alive {
			endedAt = clock.Now()
		}
		require.True(t, healthy.Valid(), "the node that reaches the store fenced at %v", clock.Now().Sub(cutAt))
		require.Less(t, clock.Now().Sub(cutAt), 3*ttl, "the store never ended the cut node's lease")
	}
	require.False(t, fencedAt.IsZero(), "the store ended the lease while the cut node still counted itself the owner")
	require.True(t, fencedAt.Before(endedAt), "fenced at %v, the store ended the lease at %v", fencedAt.Sub(cutAt), endedAt.Sub(cutAt))
	require.LessOrEqual(t, fencedAt.Sub(cutAt), ttl, "fenced later than a TTL after the cut")
	_, _, err = cut.WriteLease()
	require.ErrorIs(t, err, location.ErrUnavailable)

	f.Partition(false)
	reaching = append(reaching, cut)
	for i := 0; ; i++ {
		step()
		if cut.LeaseStatus() == lease.Ended {
			break
		}
		require.Less(t, i, int(ttl/(100*time.Millisecond)), "the cut node never learned its lease ended")
	}
	_, _, err = cut.WriteLease()
	require.ErrorIs(t, err, location.ErrLeaseEnded)
	require.True(t, healthy.Valid())
}
