package meshnode_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/meshnode/lease"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// waitFor polls cond until it holds; the test's own deadline bounds it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testwait.Patience(t))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A node cut off from the store stops acting as an owner before any other
// node can see its lease as ended: at the instant the store reports the
// lease gone, the node is already fenced (writes refused locally); after
// the cut heals it learns the lease is gone and its lifecycle ends.
// Reference: docs/PROTOCOL.md §10 (one owner at a time), §3.4; docs/FAULTS.md
// ("Lease fencing").
func TestNodeFencesBeforeItsLeaseCanEnd(t *testing.T) {
	inner := memstore.New()
	f, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: f, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	defer n.Stop(context.Background())
	require.True(t, n.Valid())
	_, _, err = n.WriteLease()
	require.NoError(t, err)

	f.Partition(true)
	waitFor(t, "the store ends the lease", func() bool {
		alive, err := inner.LeaseAlive(context.Background(), n.Lease().ID)
		require.NoError(t, err)
		if !alive {
			require.False(t, n.Valid(), "the store ended the lease while the node still counted itself the owner")
		}
		return !alive
	})
	_, _, err = n.WriteLease()
	require.ErrorIs(t, err, location.ErrUnavailable)

	f.Partition(false)
	select {
	case <-n.LeaseLost():
	case <-time.After(testwait.Patience(t)):
		t.Fatal("the node never learned its lease ended")
	}
	require.Equal(t, lease.Ended, n.LeaseStatus())
	_, _, err = n.WriteLease()
	require.ErrorIs(t, err, location.ErrLeaseEnded)
}

// A fence whose lease never ended lifts at the first renewal that proves
// it: the node serves again with the same lifecycle. The store's lease
// clock stands still here, so the lease cannot end whatever the timing.
func TestFenceLiftsWhenARenewalProvesTheLease(t *testing.T) {
	inner, f, n, changes := fenceableNode(t)
	var seen []lease.Status

	f.Partition(true)
	seen = append(seen, testwait.Recv(t, changes, "the fence"))
	require.False(t, n.Valid())
	f.Partition(false)
	seen = append(seen, testwait.Recv(t, changes, "the fence to lift"))
	require.Equal(t, []lease.Status{lease.Fenced, lease.Valid}, seen)
	require.True(t, n.Valid())
	desc := n.Descriptor()
	got, err := inner.ReadNode(context.Background(), location.NodeKeyOf(desc))
	require.NoError(t, err)
	require.Equal(t, desc.GetNodeGeneration(), got.Node.GetNodeGeneration())
}

// Stop ends the lease's verdict before it releases the claim: nothing the
// node does after Stop can write under its lease.
// Reference: PROTOCOL.md §3.4.
func TestStopEndsTheLeaseFirst(t *testing.T) {
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New()})
	require.NoError(t, err)
	ended := make(chan struct{})
	n.OnLeaseChange(func(s lease.Status) {
		if s == lease.Ended {
			close(ended)
		}
	})
	require.NoError(t, n.Stop(context.Background()))
	<-ended
	require.False(t, n.Valid())
	_, _, err = n.WriteLease()
	require.ErrorIs(t, err, location.ErrLeaseEnded)
}

// Renewals keep the node Valid past its first TTL: every proof is
// published, not only a change of status.
func TestRenewalsKeepTheNodeValidPastTheTTL(t *testing.T) {
	// A 5 s TTL: the node fences after 4 s without a proof, far more than a
	// loaded machine delays an in-process renewal.
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: memstore.New(), LeaseTTL: 5 * time.Second})
	require.NoError(t, err)
	defer n.Stop(context.Background())
	start := time.Now()
	waitFor(t, "more than a TTL to pass", func() bool {
		require.True(t, n.Valid(), "fenced %s after start with a reachable store", time.Since(start))
		return time.Since(start) > 6*time.Second
	})
}

// A write refused only for a fence waits, within its context, for the
// renewal that lifts it (location.Leased with the node as its holder):
// a starved node's late renewal does not fail writes it could make a
// moment later. One whose context ends first fails ErrFenced.
func TestAWriteWaitsForItsFenceToLiftWithinItsContext(t *testing.T) {
	inner, f, n, changes := fenceableNode(t)
	store := location.Leased(inner, n)
	key := location.Key(location.KindActor, "a")
	rec := &location.Record{ObjectGeneration: 1}

	f.Partition(true)
	require.Equal(t, lease.Fenced, testwait.Recv(t, changes, "the fence"))
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := store.Apply(short, []location.Op{location.CreateOp(key, rec)})
	require.ErrorIs(t, err, location.ErrFenced, "a write whose context ended while fenced")

	wrote := make(chan error, 1)
	go func() {
		_, err := store.Apply(context.Background(), []location.Op{location.CreateOp(key, rec)})
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("the write answered (%v) while the node was fenced", err)
	default:
	}
	f.Partition(false)
	require.Equal(t, lease.Valid, testwait.Recv(t, changes, "the fence to lift"))
	require.NoError(t, testwait.Recv(t, wrote, "the waiting write once the fence lifted"))
	_, err = inner.Read(context.Background(), key)
	require.NoError(t, err)
}

// fenceableNode is a node with a 1 s lease whose path to the store the
// test can cut (f), and the lease changes it reports. The store's lease
// clock stands still, so the lease cannot end whatever the timing: a cut
// only fences the node.
func fenceableNode(t *testing.T) (*memstore.Store, *faulty.Store, *meshnode.Node, <-chan lease.Status) {
	t.Helper()
	inner := memstore.New(memstore.WithClock(memstore.NewManualClock()))
	f, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	n, err := meshnode.Start(context.Background(), meshnode.Config{Store: f, LeaseTTL: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	changes := make(chan lease.Status, 8)
	n.OnLeaseChange(func(s lease.Status) { changes <- s })
	return inner, f, n, changes
}
