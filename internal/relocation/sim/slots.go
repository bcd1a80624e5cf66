package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/roamactors/roam/internal/relocation/capslots"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Capacity slots (docs/PROTOCOL.md §7.12, Config.Capacity): each node
// lifecycle owns slot indexes 0..C-1 in the store, under its lease. An
// object spawned on a node holds one; a move into a node takes one per
// participant, pending, before relay-ready (handoff.ArrivalSlots keeps
// the account), the target's commit turns them active and frees the
// source's (handoff.Commit's slot ops), and a move that did not commit
// frees what it took. Which indexes a take picks and how a store answer
// is judged are capslots' (View, Answer, Free); the loops around them are
// the driver's Slots.Take and Slots.Free over this world's store calls.
// The Spot manager's reclaim of abandoned reservations is not modelled.

// bounded: n counts its objects in capacity slots.
func (n *Node) bounded() bool { return n.view != nil }

func (n *Node) nodeKey() location.NodeKey { return location.NodeKey{NodeRid: n.name} }

func (n *Node) leaseID() location.LeaseID {
	return location.LeaseID(fmt.Sprintf("%s/%d", n.name, n.gen))
}

// spawnSlot gives an object spawned on n its slot (the lowest free), as
// the creation's transaction takes one.
func (w *World) spawnSlot(o ObjID, n *Node) {
	if !n.bounded() {
		return
	}
	slots := w.store.slots[n.idx]
	for i := uint32(0); i < w.cfg.Capacity; i++ {
		if _, held := slots[i]; !held {
			slots[i] = slotHolder{obj: o}
			w.store.recs[o].Slot = i + 1
			return
		}
	}
	panic(fmt.Sprintf("sim: node %s of capacity %d cannot hold o%d", n.name, w.cfg.Capacity, o))
}

// listSlots reads n's slots into its view (Slots.refresh).
func (n *Node) listSlots(deadline time.Duration, done func(error)) {
	w := n.w
	w.store.call(n, storeOp{kind: opListSlots, node: n.idx, why: "capacity slots"}, deadline, func(res storeRes) {
		if res.err != errNone {
			done(readError(res.err))
			return
		}
		n.view.Refreshed(res.slots, w.wall(w.Now()))
		done(nil)
	})
}

// takeSlots takes one slot of n for each holder, pending, in one
// transaction (Slots.Take with nothing else to write): slots a conflict
// shows held make it read n's slots and pick others, as capslots.Answer
// judges; done gets the slots taken (or that an unknown outcome may
// hold) and the error; picked is told each pick before its transaction.
func (n *Node) takeSlots(holders []location.AuthorityKey, deadline time.Duration, picked func([]uint32), done func([]uint32, error)) {
	w := n.w
	attempt := 1
	var try func()
	take := func(slots []uint32) {
		picked(slots)
		writes := make([]write, len(holders))
		for i, h := range holders {
			op := location.TakeSlotOp(n.nodeKey(), n.leaseID(), slots[i], h, true)
			writes[i] = write{slot: &op}
		}
		w.store.call(n, storeOp{kind: opApply, writes: writes, why: "take slots"}, deadline, func(res storeRes) {
			err := applyError(nil, res)
			o := capslots.Answer(err, 0, attempt, capslots.MaxAttempts)
			n.view.Took(slots, holders, o)
			switch o {
			case capslots.Took:
				done(slots, nil)
			case capslots.Retry:
				attempt++
				n.listSlots(deadline, func(err error) {
					if err != nil {
						done(nil, err)
						return
					}
					try()
				})
			case capslots.Exhausted:
				done(nil, fmt.Errorf("%w: node %s found its free capacity slots taken %d times", roamerr.ErrCapacityExceeded, n.name, attempt))
			case capslots.Unknown:
				done(slots, err)
			default:
				done(nil, err)
			}
		})
	}
	try = func() {
		slots, err := n.view.Pick(len(holders))
		if err != nil && n.view.ReadAgain(w.wall(w.Now())) {
			// It looks full: read again before saying so.
			n.listSlots(deadline, func(rerr error) {
				if rerr != nil {
					done(nil, rerr)
					return
				}
				slots, err := n.view.Pick(len(holders))
				if err != nil {
					done(nil, err)
					return
				}
				take(slots)
			})
			return
		}
		if err != nil {
			done(nil, err)
			return
		}
		take(slots)
	}
	if !n.view.Read() {
		n.listSlots(deadline, func(err error) {
			if err != nil {
				done(nil, err)
				return
			}
			try()
		})
		return
	}
	try()
}

// freeSlots frees the slots of n that the move t took and no record
// names, as the driver's Slots.Free does: capslots.Free judges each try on
// the store's listing (pending, one of t's participants, claimed by no
// other move running here) and says when it ends; it tries until then or
// until n's lease ends, each try bounded by a lease TTL.
func (n *Node) freeSlots(t *TargetRun, slots []uint32) {
	if !n.bounded() || len(slots) == 0 {
		return
	}
	w := n.w
	holders := make([]location.AuthorityKey, len(t.objs))
	for i, o := range t.objs {
		holders[i] = w.keyOf(o)
	}
	var settle time.Time
	if t.slotsSettle > 0 {
		settle = w.wall(t.slotsSettle)
	}
	f := n.view.BeginFree(slots, holders, settle)
	claimed := func(slot uint32) bool {
		if n.view.Taking(slot) {
			return true
		}
		for _, o := range n.targets {
			if o != t && slices.Contains(o.slots.Held(), slot) {
				return true
			}
		}
		return false
	}
	life := n.life
	end := func() {
		n.view.Freed(f)
		n.view.EndFree(f)
	}
	var try func(prev time.Duration)
	try = func(prev time.Duration) {
		if !n.alive || n.life != life {
			return // the lease ended with the lifecycle: it freed them
		}
		next := func(err error) {
			done, pause := f.Next(err, w.wall(w.Now()), prev)
			if done {
				end()
				return
			}
			w.after(pause, "free-retry", func() { try(pause) })
		}
		w.store.call(n, storeOp{kind: opListSlots, node: n.idx, why: "capacity slots to free"}, w.Now()+w.cfg.LeaseTTL, func(res storeRes) {
			if res.err != errNone {
				next(readError(res.err))
				return
			}
			// No Spot manager reserves here: no holder's record is read
			// (capslots.Free.Ops with no records).
			ops := f.Ops(f.Candidates(res.slots, claimed), n.name, nil, func(slot uint32) location.Op { return location.FreeSlotOp(n.nodeKey(), slot) })
			if len(ops) == 0 {
				next(nil)
				return
			}
			writes := make([]write, len(ops))
			for i := range ops {
				writes[i] = write{slot: &ops[i]}
			}
			w.store.call(n, storeOp{kind: opApply, writes: writes, why: "free slots"}, w.Now()+w.cfg.LeaseTTL, func(res storeRes) {
				next(applyError(nil, res))
			})
		})
	}
	try(0)
}

// applyError is a transaction's answer as the Location Store classes it:
// a conflict carries the current record of each record op (keys, in the
// transaction's order; none for a slot op) and the failed ops.
func applyError(keys []location.AuthorityKey, res storeRes) error {
	switch res.err {
	case errDeadline:
		// The Location Store's transaction whose context ended once it
		// was sent is indeterminate (consulstore: a write that may have
		// applied), not only a context's end.
		return simWriteError{text: res.err.String(), class: location.ErrIndeterminate}
	case errConflict:
	default:
		return writeError(location.AuthorityKey{}, res)
	}
	c := &location.ConflictError{Op: "apply", FailedOps: res.failed}
	for i, k := range keys {
		if k != (location.AuthorityKey{}) {
			c.Current = append(c.Current, versionedOf(k, res.recs[i]))
		}
	}
	return simWriteError{text: res.err.String(), class: c}
}

// checkSlots: every live node's slots in the store are exactly the
// objects whose records name it as their owner, each in the slot its
// record names, active (nothing pending or stray once the world settled).
func (w *World) checkSlots() {
	for _, n := range w.nodes {
		if !n.bounded() || !n.alive || n.ended || !w.store.leaseLive(n) {
			continue
		}
		slots := w.store.slots[n.idx]
		owned := map[ObjID]bool{}
		for _, o := range w.objs {
			rec := w.store.recs[o.id]
			if rec.OwnerNode != n.name || rec.OwnerNodeGen != n.gen {
				continue
			}
			owned[o.id] = true
			h, held := slots[rec.Slot-1]
			if rec.Slot == 0 || !held || h.obj != o.id || h.pending {
				w.violateO(o.id, "slots", "o%d's record %s names %s, whose slot for it is %v (held %v)", o.id, rec, n.name, h, held)
			}
		}
		var stray []uint32
		for i, h := range slots {
			if !owned[h.obj] || w.store.recs[h.obj].Slot != i+1 {
				stray = append(stray, i)
			}
		}
		if len(stray) > 0 {
			slices.Sort(stray)
			v := w.violate("slots", "%s holds slots %v that no record of its objects names (%d slots, %d objects)", n.name, stray, len(slots), len(owned))
			v.Obj = w.store.slots[n.idx][stray[0]].obj.name()
		}
	}
}
