package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/roamactors/roam/internal/placement"
)

// placement names the elected director (Elect: the oldest lifecycle,
// then the lowest RID) and reads
// the ledger: the reservations in flight and the recent outcomes.
func TestPlacementShowsTheDirectorAndItsLedger(t *testing.T) {
	store := manualStore()
	old := claim(t, store, "m", "old", 0)
	young := claim(t, store, "m", "young", 0)
	director := map[string]string{old.NodeRid: "old", young.NodeRid: "young"}[placement.Elect([]placement.Elector{
		{Rid: old.NodeRid, Generation: old.NodeGeneration}, {Rid: young.NodeRid, Generation: young.NodeGeneration}})]
	c, out, _ := testCtl(store)
	ctx := context.Background()
	require.NoError(t, c.Placement(ctx))
	require.Contains(t, out.String(), "m", "a mesh with no ledger yet is shown")

	l := &placement.Ledger{}
	lim := placement.Limits{Rate: 10, Burst: 10, Concurrency: 4}
	now := time.Now()
	a := placement.Attempt{Op: "op-1", Key: `actor/"x"`, SourceRid: old.NodeRid, TargetRid: young.NodeRid, DeadlineMs: now.Add(time.Minute).UnixMilli()}
	b := a
	b.Op, b.Key = "op-2", `actor/"y"`
	for _, x := range []placement.Attempt{a, b} {
		v, _, err := l.Reserve(x, lim, now)
		require.NoError(t, err)
		require.True(t, v.Go)
	}
	l.Finish(b, placement.Busy, lim, now)
	_, err := store.WriteNote(ctx, placement.LedgerKey("m"), 0, l.Encode(1<<16))
	require.NoError(t, err)

	c, out, _ = testCtl(store)
	c.json = true
	require.NoError(t, c.Placement(ctx))
	var got struct{ Placement []placementJSON }
	require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
	require.Len(t, got.Placement, 1)
	p := got.Placement[0]
	require.Equal(t, director, p.Director)
	require.True(t, p.Ledger)
	require.Len(t, p.InFlight, 1)
	require.Equal(t, "op-1", p.InFlight[0].Op)
	require.Equal(t, 1, p.Recent[placement.Busy])

	c, out, _ = testCtl(store)
	require.NoError(t, c.Placement(ctx))
	require.Contains(t, out.String(), `actor/"x" old -> young`)
}
