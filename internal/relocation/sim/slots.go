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
// hold) and the error.
func (n *Node) takeSlots(holders []location.AuthorityKey, deadline time.Duration, done func([]uint32, error)) {
	w := n.w
	attempt := 1
	var try func()
	take := func(slots []uint32) {
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

// freeSlots frees slots of n that no record names (taken for a move that
// did not commit here), as capslots.Free decides, trying until the store
// answers or n's lease ends (Slots.Free, for one lease TTL).
func (n *Node) freeSlots(slots []uint32) {
	if !n.bounded() || len(slots) == 0 {
		return
	}
	w := n.w
	f := n.view.BeginFree(slots)
	deadline := w.Now() + w.cfg.LeaseTTL
	life := n.life
	end := func() { n.view.EndFree(f) }
	var try func(wait time.Duration)
	try = func(wait time.Duration) {
		if !n.alive || n.life != life {
			return
		}
		again := func(err error) {
			if w.Now() >= deadline {
				w.tracef("%s capacity_slot_free_failed: %v", n.name, err)
				end()
				return
			}
			next := capslots.FreePause(wait)
			w.after(next, "free-retry", func() { try(next) })
		}
		w.store.call(n, storeOp{kind: opListSlots, node: n.idx, why: "capacity slots to free"}, deadline, func(res storeRes) {
			if res.err != errNone {
				again(readError(res.err))
				return
			}
			ops := f.Ops(res.slots, func(slot uint32) location.Op { return location.FreeSlotOp(n.nodeKey(), slot) })
			if len(ops) == 0 {
				n.view.Freed(f)
				end()
				return
			}
			writes := make([]write, len(ops))
			for i := range ops {
				writes[i] = write{slot: &ops[i]}
			}
			w.store.call(n, storeOp{kind: opApply, writes: writes, why: "free slots"}, deadline, func(res storeRes) {
				err := applyError(nil, res)
				if f.Ends(err) {
					n.view.Freed(f)
					end()
					return
				}
				again(err)
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
