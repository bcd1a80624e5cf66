package relocation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/capslots"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Capacity in the store (PROTOCOL.md §7.12). A node of capacity C > 0 owns
// slot indexes 0..C-1 in the Location Store, under its owner lease. Every
// transaction that brings an object onto the node takes a free slot in the
// same transaction (pending while the object is on its way in: a
// reservation, a move before relay-ready; active once it is committed
// here), and the record names the slot (capacity_slot), so the transaction
// that takes the object off the node (a close, a delete, a move's commit
// on the target) frees it. The node's lease ending frees them all. The
// store never holds two objects in one slot, so no number of concurrent
// activations, creations and moves, from any number of nodes, puts more
// than C objects on a node. A node of capacity 0 takes no slots.

// Slots is a node lifecycle's capacity slots: capslots.View decides, Slots
// reads and writes the store, under its lock.
type Slots struct {
	clock    machine.Clock
	store    location.Store
	capacity uint32
	node     location.NodeKey
	lease    location.LeaseID

	mu   sync.Mutex
	view *capslots.View
	// reclaim, if set, releases abandoned reservations holding slots of
	// this node (the Spot manager's); asked when no slot looks free.
	reclaim func(ctx context.Context)
}

// OnFull sets what releases abandoned reservations that hold this node's
// slots, asked when a take finds none free (at most once per
// capslots.FullReadEvery).
func (s *Slots) OnFull(reclaim func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reclaim = reclaim
}

func newSlots(store location.Store, desc *location.NodeDescriptor, clock machine.Clock) *Slots {
	return &Slots{
		clock: clock,
		store: store, capacity: desc.GetCapacity(),
		node:  location.NodeKey{Mesh: desc.GetMesh(), NodeRid: desc.GetNodeRid()},
		lease: location.LeaseID(desc.GetLeaseId()),
		view:  capslots.NewView(desc.GetNodeRid(), desc.GetCapacity()),
	}
}

// Bounded reports whether this node counts its objects in slots (capacity
// above 0).
func (s *Slots) Bounded() bool { return s != nil && s.capacity > 0 }

// Take applies the ops build returns for the slots it is given, plus the
// taking of one slot for each holder (pending or active), in one
// transaction. A slot found held already makes it read the node's slots
// and try other indexes; with none free it fails ErrCapacityExceeded. On
// an unbounded node it applies build(nil) alone.
func (s *Slots) Take(ctx context.Context, holders []location.AuthorityKey, pending bool, build func(slots []uint32) []location.Op) ([]location.StoreVersion, []uint32, error) {
	if !s.Bounded() || len(holders) == 0 {
		v, err := s.store.Apply(ctx, build(nil))
		return v, nil, err
	}
	s.mu.Lock()
	read := s.view.Read()
	s.mu.Unlock()
	if !read {
		if err := s.refresh(ctx); err != nil {
			return nil, nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		s.mu.Lock()
		slots, err := s.view.Pick(len(holders))
		again := err != nil && s.view.ReadAgain(s.clock.Now())
		reclaim := s.reclaim
		s.mu.Unlock()
		if again {
			// It looks full: read again (and release abandoned
			// reservations) before saying so.
			if reclaim != nil {
				reclaim(ctx)
			}
			if rerr := s.refresh(ctx); rerr != nil {
				return nil, nil, rerr
			}
			s.mu.Lock()
			slots, err = s.view.Pick(len(holders))
			s.mu.Unlock()
		}
		if err != nil {
			return nil, nil, err
		}
		ops := build(slots)
		first := len(ops)
		for i, h := range holders {
			ops = append(ops, location.TakeSlotOp(s.node, s.lease, slots[i], h, pending))
		}
		vers, err := s.store.Apply(ctx, ops)
		o := capslots.Answer(err, first, attempt, capslots.MaxAttempts)
		s.mu.Lock()
		s.view.Took(slots, holders, o)
		s.mu.Unlock()
		switch o {
		case capslots.Took:
			return vers[:first], slots, nil
		case capslots.Retry:
			if rerr := s.refresh(ctx); rerr != nil {
				return nil, nil, rerr
			}
		case capslots.Exhausted:
			return nil, nil, fmt.Errorf("%w: node %s found its free capacity slots taken %d times", roamerr.ErrCapacityExceeded, s.node.NodeRid, attempt)
		case capslots.Unknown:
			// The caller's transaction may need them freed.
			return nil, slots, err
		default:
			return nil, nil, err
		}
	}
}

// refresh reads the node's slots from the store.
func (s *Slots) refresh(ctx context.Context) error {
	list, err := s.store.ListSlots(ctx, s.node)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view.Refreshed(list, s.clock.Now())
	return nil
}

// freed forgets slots this node's transaction freed.
func (s *Slots) freed(slots ...uint32) {
	if !s.Bounded() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range slots {
		s.view.Drop(i)
	}
}

// SlotFreedElsewhere makes the view read the store's slots again before
// the next take: a move's commit on its target freed the slot an object
// held here (PROTOCOL.md §7.12), and which index it was is the record's,
// not the view's (the same object may hold another slot here by now, a
// later arrival's).
func (s *Slots) SlotFreedElsewhere() {
	if !s.Bounded() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view.Unread()
}

// SetOp turns slot of this node to holder, active or pending, in a
// transaction of this node (a reservation's commit).
func (s *Slots) SetOp(slot uint32, holder location.AuthorityKey, pending bool) location.Op {
	return location.SetSlotOp(s.node, s.lease, slot, holder, pending)
}

// FreeOp frees slot of this node.
func (s *Slots) FreeOp(slot uint32) location.Op { return location.FreeSlotOp(s.node, slot) }

// FreeRequest is what a free of a move's slots needs besides the slots.
type FreeRequest struct {
	// Holders are the move's participants, for whom its slots were taken.
	Holders []location.AuthorityKey
	// SettleUntil is zero unless a take of the slots had an unknown
	// outcome: its transaction may still apply until then.
	SettleUntil time.Time
	// Claimed says which slots a move running here holds now.
	Claimed func(slot uint32) bool
	// TryFor bounds each try (a store that never answers one is tried
	// again).
	TryFor time.Duration
	// Failing is told, once, that the free has failed this many tries in
	// a row, with the last error; it goes on trying.
	Failing func(tries int, err error)
}

// freeFailingAfter is how many tries in a row a free fails before it says
// so (FreeRequest.Failing).
const freeFailingAfter = 10

// Free frees, in transactions of their own, the slots of this node that a
// move's target took and no record names (the move did not commit here),
// as capslots.Free decides on the store's listing and the holders'
// records. It tries until a try succeeds past r.SettleUntil, the node's
// lease ends (which frees them too) or ctx ends.
func (s *Slots) Free(ctx context.Context, r FreeRequest, slots ...uint32) error {
	if !s.Bounded() || len(slots) == 0 {
		return nil
	}
	s.mu.Lock()
	f := s.view.BeginFree(slots, r.Holders, r.SettleUntil)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.view.Freed(f)
		s.view.EndFree(f)
		s.mu.Unlock()
	}()
	var pause time.Duration
	for failed := 0; ; {
		err := s.freeTry(ctx, r, f)
		done, next := f.Next(err, s.clock.Now(), pause)
		if done {
			if errors.Is(err, location.ErrLeaseEnded) {
				return nil
			}
			return err
		}
		if err != nil {
			if failed++; failed == freeFailingAfter && r.Failing != nil {
				r.Failing(failed, err)
			}
		} else {
			failed = 0
		}
		pause = next
		fire, t := machine.NewTimer(s.clock, pause)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil {
				err = ctx.Err()
			}
			return err
		case <-fire:
		}
	}
}

// freeTry is one try of f: the node's slots listed, the candidates'
// holders' records read, and the frees applied with their checks.
func (s *Slots) freeTry(ctx context.Context, r FreeRequest, f *capslots.Free) error {
	tctx, cancel := machine.WithTimeout(ctx, s.clock, r.TryFor)
	defer cancel()
	list, err := s.store.ListSlots(tctx, s.node)
	if err != nil {
		return err
	}
	cands := f.Candidates(list, func(slot uint32) bool {
		s.mu.Lock()
		taking := s.view.Taking(slot)
		s.mu.Unlock()
		return taking || r.Claimed(slot)
	})
	if len(cands) == 0 {
		return nil
	}
	records := map[location.AuthorityKey]location.Versioned{}
	for _, c := range cands {
		if _, ok := records[c.Holder]; ok {
			continue
		}
		v, err := s.store.Read(tctx, c.Holder)
		if err != nil && !errors.Is(err, location.ErrNotFound) {
			return err
		}
		records[c.Holder] = v // the zero Versioned when absent
	}
	ops := f.Ops(cands, s.node.NodeRid, func(k location.AuthorityKey) (location.Versioned, bool) {
		v := records[k]
		return v, v.Record != nil
	}, s.FreeOp)
	if len(ops) == 0 {
		return nil
	}
	_, err = s.store.Apply(tctx, ops)
	return err
}

// RecordSlot is the capacity slot rec's owner holds for it, if any.
func RecordSlot(rec *location.Record) (uint32, bool) { return handoff.RecordSlot(rec) }

// FreeRecordSlotOps are the ops that free the slot rec's owner holds for
// it: for the transaction that takes the object off that node.
func FreeRecordSlotOps(rec *location.Record) []location.Op { return handoff.FreeRecordSlotOps(rec) }

// WithSlot is rec naming slots[i] as its owner's capacity slot (none
// past the end of slots).
func WithSlot(rec *location.Record, slots []uint32, i int) *location.Record {
	return handoff.WithSlot(rec, slots, i)
}

// nodeKey and leaseID are what this node's slot ops name (zero when the
// node has no slots).
func (s *Slots) nodeKey() location.NodeKey {
	if s == nil {
		return location.NodeKey{}
	}
	return s.node
}

func (s *Slots) leaseID() location.LeaseID {
	if s == nil {
		return ""
	}
	return s.lease
}

// freedRecordSlot forgets the slot rec named if it is this node's: the
// transaction that deleted rec freed it.
func (d *Driver) freedRecordSlot(rec *location.Record) {
	if slot, ok := RecordSlot(rec); ok && rec.GetOwner().GetNodeRid() == d.desc.GetNodeRid() {
		d.slots.freed(slot)
	}
}

// TakeSlotOn applies build's ops with the taking of a slot of another node
// (node, under its lease, of capacity capacity) for holder: a reservation
// this node makes for an object that node is to create (PROTOCOL.md §7.2,
// the reservation fence's PendingCapacityDelta). It reads that node's
// slots and takes the lowest free one, reading again when another writer
// took it first; ErrCapacityExceeded when none is free.
func TakeSlotOn(ctx context.Context, store location.Store, node location.NodeKey, lease location.LeaseID, capacity uint32,
	holder location.AuthorityKey, pending bool, build func(slot uint32) []location.Op) ([]location.StoreVersion, error) {
	for attempt := 1; ; attempt++ {
		list, err := store.ListSlots(ctx, node)
		if err != nil {
			return nil, err
		}
		slot, err := capslots.PickOn(node.NodeRid, capacity, list, rand.IntN)
		if err != nil {
			return nil, err
		}
		ops := build(slot)
		first := len(ops)
		vers, err := store.Apply(ctx, append(ops, location.TakeSlotOp(node, lease, slot, holder, pending)))
		switch capslots.Answer(err, first, attempt, 2*capslots.MaxAttempts) {
		case capslots.Took:
			return vers[:first], nil
		case capslots.Retry:
		case capslots.Exhausted:
			return nil, fmt.Errorf("%w: node %s's free capacity slots were taken %d times", roamerr.ErrCapacityExceeded, node.NodeRid, attempt)
		default:
			return nil, err
		}
	}
}

// Mark records that slot is held by holder (a transaction of this node
// wrote it so).
func (s *Slots) Mark(slot uint32, holder location.AuthorityKey) {
	if !s.Bounded() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view.Hold(slot, holder)
}

// FreedRecordSlot forgets the slot rec named if it is this node's: a
// transaction that took rec's object off this node freed it.
func (d *Driver) FreedRecordSlot(rec *location.Record) { d.freedRecordSlot(rec) }
