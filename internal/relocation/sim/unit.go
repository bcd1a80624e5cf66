package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// maxSpotWideMembers is relocation.MaxSpotWideMembers (the bound
// admit.SpotWide and admit.Members apply); the sim's units are far below.
const maxSpotWideMembers = 120

// spawnMembers spawns every Spot's members (Config.Members) on its node,
// after the Config.Objects objects: each member's record names its Spot,
// the Spot's counts them.
func (w *World) spawnMembers() {
	for o, k := range w.cfg.Members {
		if k == 0 || o >= w.cfg.Objects {
			continue
		}
		spot := w.objs[o]
		n := w.node(w.store.recs[o].OwnerNode)
		for j := 0; j < k; j++ {
			id := ObjID(len(w.objs))
			w.spawnObject(id, n)
			w.objs[id].spot = spot.id
			w.store.recs[id].Member = spot.id.name()
			spot.members = append(spot.members, id)
		}
		w.store.recs[o].MemberCount = uint32(k)
	}
}

// isSpot: o is a SpotWide User Spot.
func (w *World) isSpot(o ObjID) bool { return len(w.objs[o].members) > 0 }

// keyOf is o's authority key: a Spot's is a User Spot's, every other
// object's an Actor's.
func (w *World) keyOf(o ObjID) location.AuthorityKey {
	if w.isSpot(o) {
		return location.Key(location.KindUserSpot, o.name())
	}
	return location.Key(location.KindActor, o.name())
}

// objOfKey is the object a key names.
func (w *World) objOfKey(key location.AuthorityKey) ObjID {
	i, err := strconv.Atoi(strings.TrimPrefix(key.ID, "o"))
	if err != nil || i < 0 || i >= len(w.objs) {
		panic(fmt.Sprintf("sim: no object %s", key))
	}
	return ObjID(i)
}

// unitOf is what a move of o out of src takes with it, as the driver's
// spotWideMembers decides with admit.SpotWide on this node's facts: the
// Spot's members serving here, as many as its record counts (the driver
// reads that record first; the sim reads the store's truth). A member's
// own move is refused before this (startSource).
func (w *World) unitOf(o ObjID, src *Node) ([]*Inc, error) {
	spot := w.objs[o]
	if len(spot.members) == 0 {
		return nil, nil
	}
	var incs []*Inc
	var cands []admit.Member
	for _, m := range spot.members {
		inc := src.objects[m]
		if inc == nil {
			continue
		}
		incs = append(incs, inc)
		cands = append(cands, admit.Member{Key: w.keyOf(m),
			Busy: inc.state != sServing || inc.mode != mOpen || inc.out != nil})
	}
	picked, _, err := admit.SpotWide(w.keyOf(o), src.objects[o].joining, int(w.store.recs[o].MemberCount), cands, maxSpotWideMembers)
	if err != nil {
		return nil, err
	}
	out := make([]*Inc, len(picked))
	for i, j := range picked {
		out[i] = incs[j]
	}
	return out, nil
}

// participants are a prepare's members as a Restore request names them.
func (w *World) participants(ms []prepMember) []*messages.Participant {
	out := make([]*messages.Participant, len(ms))
	for i, m := range ms {
		out[i] = &messages.Participant{Object: &messages.ObjectRef{Kind: location.KindActor, Id: m.obj.name(), ObjectGeneration: 1, StableType: "member"},
			OwnerGeneration: m.ownerGen, NewOwnerGeneration: m.newOwner}
	}
	return out
}

// drawUnits draws, from the unit stream, which of cfg's objects are
// SpotWide Spots and how many members each has (1–3), and whether the
// nodes count their objects in capacity slots: half the schedules, with
// room for what each node starts with and at most all the objects.
func drawUnits(cfg *Config, rng *simkit.Rand) {
	cfg.Members = make([]int, cfg.Objects)
	start := make([]int, cfg.Nodes)
	total := 0
	for o := range cfg.Members {
		if rng.IntN(2) == 0 {
			cfg.Members[o] = 1 + rng.IntN(3)
		}
		start[o%cfg.Nodes] += 1 + cfg.Members[o]
		total += 1 + cfg.Members[o]
	}
	if rng.IntN(2) == 0 {
		least := slices.Max(start)
		cfg.Capacity = uint32(least + rng.IntN(total-least+1))
	}
}

// unitTraffic schedules, from the unit stream, sends to the members and
// moves of a member alone (which the driver refuses: it moves with its
// Spot).
func (w *World) unitTraffic(rng *simkit.Rand) {
	var members []ObjID
	for _, o := range w.objs {
		if o.spot >= 0 {
			members = append(members, o.id)
		}
	}
	if len(members) == 0 {
		return
	}
	h := w.cfg.Horizon
	for _, c := range w.clients {
		for k := 2 + rng.IntN(6); k > 0; k-- {
			w.scheduleSend(rng.Dur(0, h), c, members[rng.IntN(len(members))], rng.IntN(2) == 0, rng.IntN(5) == 0)
		}
	}
	for k := rng.IntN(2); k > 0; k-- {
		at, o, pick := rng.Dur(0, h*4/5), members[rng.IntN(len(members))], rng.IntN(w.cfg.Nodes-1)
		w.at(at, "member-move", func() {
			if w.over {
				return
			}
			for _, n := range w.nodes {
				if n.objects[o] != nil && n.alive {
					w.StartMove(o, w.nodes[(n.idx+1+pick)%w.cfg.Nodes])
					return
				}
			}
		})
	}
}

// checkUnits: every SpotWide unit is whole in the store — each member's
// record names its Spot's owner (node and lifecycle) and the Spot, and
// the Spot's record counts its members.
func (w *World) checkUnits() {
	for _, o := range w.objs {
		if len(o.members) == 0 {
			continue
		}
		rec := w.store.recs[o.id]
		if int(rec.MemberCount) != len(o.members) {
			w.violateO(o.id, "member-count", "Spot o%d's record %s counts %d members, it has %d", o.id, rec, rec.MemberCount, len(o.members))
		}
		for _, m := range o.members {
			mr := w.store.recs[m]
			if mr.OwnerNode != rec.OwnerNode || mr.OwnerNodeGen != rec.OwnerNodeGen || mr.Member != o.id.name() {
				w.violateO(o.id, "unit-split", "member o%d's record %s does not follow its Spot o%d's %s", m, mr, o.id, rec)
			}
		}
	}
}
