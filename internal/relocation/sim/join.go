package sim

import (
	"slices"

	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// StartJoin is the driver's JoinSpot of Actor o into SpotWide Spot spot
// across nodes (docs/PROTOCOL.md §7.10): read as the driver reads them,
// the Spot's record must take the Actor (handoff.JoinTarget) and name
// another node than the Actor's; o then moves there with the Join, which
// that node admits (admit.Join) and its commit writes with the move
// (handoff.Commit's Join). A member, a Spot, or a Spot on o's own node is
// not joined here (that Join is the store's alone).
func (w *World) StartJoin(o, spot ObjID) bool {
	if w.objs[o].spot >= 0 || w.isSpot(o) || !w.isSpot(spot) {
		return false
	}
	join := &messages.Membership{SpotId: spot.name(), SpotGeneration: 1}
	sv := versionedOf(w.keyOf(spot), w.store.recs[spot])
	if handoff.JoinTarget(join, sv, nil) != nil {
		return false
	}
	owner := w.node(sv.Record.GetOwner().GetNodeRid())
	for _, n := range w.nodes {
		if n.objects[o] != nil && n.alive && n == owner {
			return false
		}
	}
	if !w.startMove(o, owner, join) {
		return false
	}
	w.stats.Joins++
	w.tracef("move #%d carries a Join of o%d into Spot o%d", w.nextRelocID, o, spot)
	return true
}

// spotFacts are what node n knows of the User Spot a Join names, for
// admit.Join (the driver's admitJoin).
func (n *Node) spotFacts(join *messages.Membership) admit.Spot {
	spot := n.w.objOfKey(location.Key(location.KindUserSpot, join.GetSpotId()))
	inc := n.objects[spot]
	if inc == nil {
		return admit.Spot{Arriving: n.arriving(spot) != nil}
	}
	return admit.Spot{Here: true, Serving: inc.state == sServing, Generation: 1, Moving: inc.out != nil}
}

// joined keeps the world's units as the store has them: a record that
// now names a Spot makes its object that Spot's member. (The sim models
// no leave: a member stays one.)
func (w *World) joined(o ObjID, spotID string) {
	if spotID == "" || w.objs[o].spot >= 0 {
		return
	}
	spot := w.objOfKey(location.Key(location.KindUserSpot, spotID))
	w.objs[o].spot = spot
	w.objs[spot].members = append(w.objs[spot].members, o)
	slices.Sort(w.objs[spot].members)
	w.stats.Joined++
}

// joinTraffic schedules, from the join stream, one to three Joins of a
// random Actor that is no member into a random SpotWide Spot
// (Config.Joins).
func (w *World) joinTraffic(rng *simkit.Rand) {
	if !w.cfg.Joins {
		return
	}
	var actors, spots []ObjID
	for _, o := range w.objs {
		switch {
		case w.isSpot(o.id):
			spots = append(spots, o.id)
		case o.spot < 0:
			actors = append(actors, o.id)
		}
	}
	if len(actors) == 0 || len(spots) == 0 {
		return
	}
	for k := 1 + rng.IntN(3); k > 0; k-- {
		at, o, spot := rng.Dur(0, w.cfg.Horizon*4/5), actors[rng.IntN(len(actors))], spots[rng.IntN(len(spots))]
		w.at(at, "join", func() {
			if !w.over {
				w.StartJoin(o, spot)
			}
		})
	}
}
