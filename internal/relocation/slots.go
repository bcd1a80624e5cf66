package relocation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/roamactors/roam/internal/machine"
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

// maxSlotAttempts bounds how often a take retries after finding a slot
// it thought free already held (another node's reservation for this one,
// or a stale view): each retry first reads the node's slots again.
const maxSlotAttempts = 8

// Slots is a node lifecycle's view of its own capacity slots: which it
// knows held, and which a transaction of its own is taking. The store
// decides; the view only picks indexes likely to be free.
type Slots struct {
	clock    machine.Clock
	store    location.Store
	capacity uint32
	node     location.NodeKey
	lease    location.LeaseID

	mu sync.Mutex
	// held are the slots the store holds, as last read or written here;
	// byHolder indexes them by holder (holdLocked, dropLocked keep both).
	held     map[uint32]location.AuthorityKey
	byHolder map[location.AuthorityKey]uint32
	// taking are the indexes a transaction of this node is taking now.
	taking map[uint32]bool
	// freeing are the indexes a Free is freeing now: not picked, whatever
	// a read says, until the Free ends (an earlier try of it may have
	// applied, and its retry must not free a slot taken since).
	freeing map[uint32]bool
	// read: held has been read from the store since the node started.
	read     bool
	lastRead time.Time
	// reclaim, if set, releases abandoned reservations holding slots of
	// this node (the Spot manager's); asked when no slot looks free.
	reclaim func(ctx context.Context)
}

// OnFull sets what releases abandoned reservations that hold this node's
// slots, asked when a take finds none free (at most once per
// fullReadEvery).
func (s *Slots) OnFull(reclaim func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reclaim = reclaim
}

// fullReadEvery bounds how often a node that looks full reads its slots
// again: a view can over-count (a slot freed by another node's
// transaction, a read that raced a free), and a full node must notice.
const fullReadEvery = 100 * time.Millisecond

func newSlots(store location.Store, desc *location.NodeDescriptor, clock machine.Clock) *Slots {
	return &Slots{
		clock: clock,
		store: store, capacity: desc.GetCapacity(),
		node:  location.NodeKey{Mesh: desc.GetMesh(), NodeRid: desc.GetNodeRid()},
		lease: location.LeaseID(desc.GetLeaseId()),
		held:  map[uint32]location.AuthorityKey{}, byHolder: map[location.AuthorityKey]uint32{},
		taking: map[uint32]bool{}, freeing: map[uint32]bool{},
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
	read := s.read
	s.mu.Unlock()
	if !read {
		if err := s.refresh(ctx); err != nil {
			return nil, nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		slots, err := s.pick(len(holders))
		if err != nil && s.readAgain() {
			// It looks full: read again (and release abandoned
			// reservations) before saying so.
			s.mu.Lock()
			reclaim := s.reclaim
			s.mu.Unlock()
			if reclaim != nil {
				reclaim(ctx)
			}
			if rerr := s.refresh(ctx); rerr != nil {
				return nil, nil, rerr
			}
			slots, err = s.pick(len(holders))
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
		var ce *location.ConflictError
		switch {
		case err == nil:
			s.settle(slots, holders, true)
			return vers[:first], slots, nil
		case errors.As(err, &ce) && slotConflict(ce, first) && attempt < maxSlotAttempts:
			s.settle(slots, nil, false)
			if rerr := s.refresh(ctx); rerr != nil {
				return nil, nil, rerr
			}
		case errors.As(err, &ce) && slotConflict(ce, first):
			s.settle(slots, nil, false)
			return nil, nil, fmt.Errorf("%w: node %s found its free capacity slots taken %d times", roamerr.ErrCapacityExceeded, s.node.NodeRid, attempt)
		case errors.Is(err, location.ErrIndeterminate):
			// The slots may be held now: count them until a read says,
			// and give them to the caller, whose transaction may need
			// them freed.
			s.settle(slots, holders, true)
			s.mu.Lock()
			s.read = false
			s.mu.Unlock()
			return nil, slots, err
		default:
			s.settle(slots, nil, false)
			return nil, nil, err
		}
	}
}

// slotConflict reports whether a failed op of ce is a slot take (at index
// first or later), not a record's compare-and-set.
func slotConflict(ce *location.ConflictError, first int) bool {
	for _, i := range ce.FailedOps {
		if i >= first {
			return true
		}
	}
	return false
}

// pick reserves n indexes neither held nor being taken.
func (s *Slots) pick(n int) ([]uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint32, 0, n)
	for i := uint32(0); i < s.capacity && len(out) < n; i++ {
		if _, ok := s.held[i]; !ok && !s.taking[i] && !s.freeing[i] {
			out = append(out, i)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("%w: node %s holds %d of its %d capacity slots, %d more are needed", roamerr.ErrCapacityExceeded,
			s.node.NodeRid, len(s.held)+len(s.taking), s.capacity, n)
	}
	for _, i := range out {
		s.taking[i] = true
	}
	return out, nil
}

// settle ends the taking of slots: held by holders if took.
func (s *Slots) settle(slots []uint32, holders []location.AuthorityKey, took bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for j, i := range slots {
		delete(s.taking, i)
		if took {
			s.holdLocked(i, holders[j])
		}
	}
}

// holdLocked records slot i held by h.
func (s *Slots) holdLocked(i uint32, h location.AuthorityKey) {
	s.dropLocked(i)
	s.held[i] = h
	s.byHolder[h] = i
}

// dropLocked forgets slot i.
func (s *Slots) dropLocked(i uint32) {
	if h, ok := s.held[i]; ok {
		delete(s.held, i)
		if s.byHolder[h] == i {
			delete(s.byHolder, h)
		}
	}
}

// readAgain reports whether a read of the slots is due for a node that
// looks full (at most once per fullReadEvery), and counts it done.
func (s *Slots) readAgain() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if machine.Since(s.clock, s.lastRead) < fullReadEvery {
		return false
	}
	s.lastRead = s.clock.Now()
	return true
}

// refresh reads the node's slots from the store.
func (s *Slots) refresh(ctx context.Context) error {
	list, err := s.store.ListSlots(ctx, s.node)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = make(map[uint32]location.AuthorityKey, len(list))
	s.byHolder = make(map[location.AuthorityKey]uint32, len(list))
	for _, sl := range list {
		s.holdLocked(sl.Index, sl.Holder)
	}
	s.read = true
	s.lastRead = s.clock.Now()
	return nil
}

// freed forgets slots this node's transaction freed (or that a move's
// target freed at its commit).
func (s *Slots) freed(slots ...uint32) {
	if !s.Bounded() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range slots {
		s.dropLocked(i)
	}
}

// ReleaseHolder forgets the slot holder held here: the transaction that
// took the object off this node (a move's commit by its target) freed it.
func (s *Slots) ReleaseHolder(holder location.AuthorityKey) {
	if !s.Bounded() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.byHolder[holder]; ok {
		s.dropLocked(i)
	}
}

// SetOp turns slot of this node to holder, active or pending, in a
// transaction of this node (a reservation's commit).
func (s *Slots) SetOp(slot uint32, holder location.AuthorityKey, pending bool) location.Op {
	return location.SetSlotOp(s.node, s.lease, slot, holder, pending)
}

// FreeOp frees slot of this node.
func (s *Slots) FreeOp(slot uint32) location.Op { return location.FreeSlotOp(s.node, slot) }

// Free frees, in a transaction of their own, slots of this node that no
// record names (taken ahead of a move that did not commit here). It tries
// until the store answers or the node's lease ends (which frees them too):
// a slot kept would hold capacity for nothing.
func (s *Slots) Free(ctx context.Context, slots ...uint32) error {
	if !s.Bounded() || len(slots) == 0 {
		return nil
	}
	s.mu.Lock()
	holders := make(map[uint32]location.AuthorityKey, len(slots))
	for _, i := range slots {
		holders[i] = s.held[i]
		s.freeing[i] = true
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for i := range holders {
			delete(s.freeing, i)
		}
		s.mu.Unlock()
	}()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		// Free only what the store shows held by the object this node
		// took it for: a take whose answer was lost may not have applied
		// (and another node may hold the slot now), and an earlier try of
		// this free may have applied. While the free runs this node takes
		// none of these slots, and no record names them, so nobody else
		// frees and takes one in between.
		list, err := s.store.ListSlots(ctx, s.node)
		if err == nil {
			still := slots[:0:0]
			for _, sl := range list {
				if h, ok := holders[sl.Index]; ok && h == sl.Holder {
					still = append(still, sl.Index)
				}
			}
			ops := make([]location.Op, len(still))
			for i, sl := range still {
				ops[i] = s.FreeOp(sl)
			}
			if len(ops) > 0 {
				_, err = s.store.Apply(ctx, ops)
			}
			if err == nil || errors.Is(err, location.ErrLeaseEnded) {
				s.mu.Lock()
				for i, h := range holders {
					if s.held[i] == h {
						s.dropLocked(i)
					}
				}
				s.mu.Unlock()
				return err
			}
		}
		select {
		case <-ctx.Done():
			return err
		case <-machine.After(machine.Real, wait): // pacing
		}
	}
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
		held := make(map[uint32]bool, len(list))
		for _, sl := range list {
			held[sl.Index] = true
		}
		if len(held) >= int(capacity) {
			return nil, fmt.Errorf("%w: node %s holds all %d of its capacity slots", roamerr.ErrCapacityExceeded, node.NodeRid, capacity)
		}
		// A random free slot, not the lowest: creators racing for the
		// same node then rarely pick the same one (the node itself picks
		// from the lowest).
		nth := rand.IntN(int(capacity) - len(held))
		slot := uint32(0)
		for ; ; slot++ {
			if !held[slot] {
				if nth == 0 {
					break
				}
				nth--
			}
		}
		ops := build(slot)
		first := len(ops)
		vers, err := store.Apply(ctx, append(ops, location.TakeSlotOp(node, lease, slot, holder, pending)))
		var ce *location.ConflictError
		switch {
		case err == nil:
			return vers[:first], nil
		case errors.As(err, &ce) && slotConflict(ce, first) && attempt < 2*maxSlotAttempts:
		case errors.As(err, &ce) && slotConflict(ce, first):
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
	s.holdLocked(slot, holder)
}

// FreedRecordSlot forgets the slot rec named if it is this node's: a
// transaction that took rec's object off this node freed it.
func (d *Driver) FreedRecordSlot(rec *location.Record) { d.freedRecordSlot(rec) }
