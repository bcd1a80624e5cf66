package roam_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam"
	"github.com/roamactors/roam/location/faulty"
	"github.com/roamactors/roam/location/memstore"
)

// spawnCounted spawns n counter Actors on r, each counted once, and returns
// their refs and counts.
func spawnCounted(t *testing.T, r *roam.Roam, prefix string, n int) ([]roam.Ref, map[roam.Ref]int64) {
	t.Helper()
	ctx := context.Background()
	var refs []roam.Ref
	counts := map[roam.Ref]int64{}
	for i := range n {
		ref := roam.ActorRef(fmt.Sprintf("%s-%d", prefix, i))
		_, err := r.SpawnActor(ctx, "counter", ref.ID)
		require.NoError(t, err)
		c, err := tick(ctx, r, ref)
		require.NoError(t, err)
		require.EqualValues(t, 1, c)
		refs = append(refs, ref)
		counts[ref] = 1
	}
	return refs, counts
}

// Two nodes drain at once, each a target of the other until it sees the
// other draining: every unit ends on the third node with its state, and
// neither drain leaves a unit behind. Reference: docs/OPERATIONS.md
// (a target that starts draining meanwhile is skipped).
func TestTwoNodesDrainAtOnce(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	a := start(t, store, roam.WithNodeName("node-a"))
	b := start(t, store, roam.WithNodeName("node-b"))
	c := start(t, store, roam.WithNodeName("node-c"))
	refsA, counts := spawnCounted(t, a, "a", 30)
	refsB, countsB := spawnCounted(t, b, "b", 30)
	for k, v := range countsB {
		counts[k] = v
	}
	var wg sync.WaitGroup
	results := make([]roam.DrainResult, 2)
	for i, r := range []*roam.Roam{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.Drain(ctx, roam.DrainOptions{Concurrency: 8})
			require.NoError(t, err)
			results[i] = res
		}()
	}
	wg.Wait()
	for i, res := range results {
		require.True(t, res.Complete(), "drain %d left %v", i, res.Failed)
	}
	owners := unitOwners(t, store)
	for _, ref := range append(refsA, refsB...) {
		require.Equal(t, c.NodeRid(), owners[ref], "%s", ref)
		n, err := tick(ctx, c, ref)
		require.NoError(t, err)
		require.Equal(t, counts[ref]+1, n, "%s lost its state", ref)
	}
}

// The store fails calls at random while a node drains: each unit either
// moved with its state or stayed, listed, and serving on the drained node;
// afterwards every unit answers once with its next count, on exactly the
// node the store names.
func TestDrainUnderStoreFaults(t *testing.T) {
	ctx := context.Background()
	inner := memstore.New()
	a := start(t, inner, roam.WithNodeName("node-a"))
	b := start(t, inner, roam.WithNodeName("node-b"))
	refs, counts := spawnCounted(t, a, "f", 40)
	// Only the draining node's view of the store is faulty: after its
	// units are placed, 30 % of its calls fail, some writes with an
	// unknown outcome (applied or not).
	f, err := faulty.New(inner, faulty.Config{})
	require.NoError(t, err)
	d := start(t, f, roam.WithNodeName("node-d"))
	refsD, countsD := spawnCounted(t, d, "d", 40)
	for k, v := range countsD {
		counts[k] = v
	}
	rnd := rand.New(rand.NewPCG(7, 11))
	script := make([]faulty.Fault, 3000)
	for i := range script {
		switch x := rnd.IntN(100); {
		case x < 15:
			script[i] = faulty.Unavailable
		case x < 22:
			script[i] = faulty.IndeterminateApplied
		case x < 30:
			script[i] = faulty.IndeterminateLost
		}
	}
	f.Inject(script...)
	res, err := d.Drain(ctx, roam.DrainOptions{Concurrency: 8})
	if err != nil {
		t.Logf("drain could not run: %v", err)
	}
	t.Logf("drain under faults: %d of %d moved, %d stayed", res.Moved, res.Total, len(res.Failed))
	onD := 0
	for _, ref := range refsD {
		if unitOwners(t, inner)[ref] == d.NodeRid() {
			onD++
		}
	}
	for _, u := range res.Failed {
		t.Logf("stayed: %s on the drained node: %v: %v", u.Key, unitOwners(t, inner)[u.Key] == d.NodeRid(), u.Err)
	}
	require.Equal(t, len(refsD), res.Total, "every unit found")
	require.Equal(t, res.Total, res.Moved+len(res.Failed), "every unit accounted for")
	require.Equal(t, len(res.Failed), onD, "exactly the units listed stayed")
	stayed := map[roam.Ref]bool{}
	for _, u := range res.Failed {
		stayed[u.Key] = true
	}
	owners := unitOwners(t, inner)
	for _, ref := range append(refs, refsD...) {
		owner := owners[ref]
		if stayed[ref] {
			require.Equal(t, d.NodeRid(), owner, "%s is listed as not moved but the store names another owner", ref)
		}
		if owner != d.NodeRid() {
			require.Contains(t, []string{a.NodeRid(), b.NodeRid()}, owner, "%s", ref)
		}
		n, err := tick(ctx, b, ref)
		require.NoError(t, err, "%s (owner %s) does not answer", ref, owner)
		require.Equal(t, counts[ref]+1, n, "%s lost its state or a call", ref)
	}
}
