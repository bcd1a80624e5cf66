package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/location/memstore"
)

// announce writes n's director announcement, as a director running on n
// does.
func announce(t *testing.T, store *memstore.Store, n *location.NodeDescriptor, paused bool) {
	t.Helper()
	b, err := json.Marshal(placement.Announcement{Rid: n.NodeRid, Generation: n.NodeGeneration, StartedMs: time.Now().UnixMilli(), Paused: paused})
	require.NoError(t, err)
	key := placement.AnnouncementKey(n.Mesh, n.NodeRid)
	var version location.StoreVersion
	if note, err := store.ReadNote(context.Background(), key); err == nil {
		version = note.Version
	}
	_, err = store.WriteNote(context.Background(), key, version, b)
	require.NoError(t, err)
}

// placementOf1 is the placement of the one mesh of store, as
// placement --json shows it.
func placementOf1(t *testing.T, store *memstore.Store) placementJSON {
	t.Helper()
	c, out, _ := testCtl(store)
	c.json = true
	require.NoError(t, c.Placement(context.Background()))
	var got struct{ Placement []placementJSON }
	require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
	require.Len(t, got.Placement, 1)
	return got.Placement[0]
}

// A director is shown only where one runs: on the elected node (the
// oldest lifecycle), announced by the director itself. Before, the
// elected node was shown whether it ran a director or not, a draining
// one included.
func TestPlacementShowsADirectorOnlyWhereOneRuns(t *testing.T) {
	store := manualStore()
	nodes := []*location.NodeDescriptor{claim(t, store, "m", "n1", 0), claim(t, store, "m", "n2", 0), claim(t, store, "m", "n3", 0)}
	var electors []placement.Elector
	for _, n := range nodes {
		electors = append(electors, placement.Elector{Rid: n.NodeRid, Generation: n.NodeGeneration})
	}
	var elected, other *location.NodeDescriptor
	for _, n := range nodes {
		if n.NodeRid == placement.Elect(electors) {
			elected = n
		} else {
			other = n
		}
	}
	drainingNode(t, store, elected)

	p := placementOf1(t, store)
	require.Empty(t, p.Director, "no node runs a director")
	require.Equal(t, elected.Name, p.Elected)
	c, out, _ := testCtl(store)
	require.NoError(t, c.Placement(context.Background()))
	require.Equal(t, "-", lines(out.String())[1][1])
	require.Contains(t, out.String(), "m: no director runs: the elected node, "+elected.Name+" (the oldest), runs none")

	// A director on a node that is not elected does not direct.
	announce(t, store, other, false)
	require.Empty(t, placementOf1(t, store).Director)

	// The elected node's own, draining or not.
	announce(t, store, elected, true)
	p = placementOf1(t, store)
	require.Equal(t, elected.Name, p.Director)
	require.True(t, p.DirectorPaused)
	c, out, _ = testCtl(store)
	require.NoError(t, c.Placement(context.Background()))
	require.Equal(t, []string{elected.Name, "(paused)"}, lines(out.String())[1][1:3])
	announce(t, store, elected, false)
	require.False(t, placementOf1(t, store).DirectorPaused)

	// An announcement of an earlier lifecycle under the same RID does not count.
	stale := proto.Clone(elected).(*location.NodeDescriptor)
	stale.NodeGeneration--
	announce(t, store, stale, false)
	require.Empty(t, placementOf1(t, store).Director)
}

// placement names the elected director (Elect: the oldest lifecycle,
// then the lowest RID) and reads
// the ledger: the reservations in flight and the recent outcomes.
func TestPlacementShowsTheDirectorAndItsLedger(t *testing.T) {
	store := manualStore()
	old := claim(t, store, "m", "old", 0)
	young := claim(t, store, "m", "young", 0)
	elected := placement.Elect([]placement.Elector{
		{Rid: old.NodeRid, Generation: old.NodeGeneration}, {Rid: young.NodeRid, Generation: young.NodeGeneration}})
	byRid := map[string]*location.NodeDescriptor{old.NodeRid: old, young.NodeRid: young}
	director := byRid[elected].Name
	announce(t, store, byRid[elected], false)
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
