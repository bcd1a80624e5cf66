// Package capslots is the pure policy of a node's capacity slots in the
// Location Store (docs/PROTOCOL.md §7.12): which indexes a take picks, when
// a take is tried again, when a node that looks full reads its slots
// again, and which slots a free may free. The store decides who holds a
// slot; a View only picks indexes likely to be free. Time and randomness
// are inputs; nothing here reads or writes the store, and a View is not
// safe for concurrent use (its driver locks it).
package capslots

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// MaxAttempts bounds how often a take retries after finding a slot it
// thought free already held (another node's reservation for this one, or
// a stale view): each retry first reads the node's slots again. A take of
// another node's slot (TakeOn) tries twice as often: it reads the slots
// every time and races that node's own takes.
const MaxAttempts = 8

// FullReadEvery bounds how often a node that looks full reads its slots
// again: a view can over-count (a slot freed by another node's
// transaction, a read that raced a free), and a full node must notice.
const FullReadEvery = 100 * time.Millisecond

// View is a node lifecycle's view of its own capacity slots: which it
// knows held, and which a transaction of its own is taking or freeing.
type View struct {
	node     string
	capacity uint32
	// held are the slots the store holds, as last read or written here;
	// byHolder indexes them by holder.
	held     map[uint32]location.AuthorityKey
	byHolder map[location.AuthorityKey]uint32
	// taking are the indexes a transaction of this node is taking now.
	taking map[uint32]bool
	// freeing counts the frees freeing each index now: not picked,
	// whatever a read says, until every one of them ended (an earlier try
	// of one may have applied, and its retry must not free a slot taken
	// since; two failed moves may free the same index).
	freeing map[uint32]int
	// read: held has been read from the store since the node started,
	// and since the last take with an unknown outcome and the last slot
	// freed by another node's transaction (Unread).
	read     bool
	lastRead time.Time
}

// NewView is the view of node (its node RID, for errors) of capacity
// capacity, before any read.
func NewView(node string, capacity uint32) *View {
	return &View{
		node: node, capacity: capacity,
		held: map[uint32]location.AuthorityKey{}, byHolder: map[location.AuthorityKey]uint32{},
		taking: map[uint32]bool{}, freeing: map[uint32]int{},
	}
}

// Bounded reports whether the node counts its objects in slots.
func (v *View) Bounded() bool { return v.capacity > 0 }

// Read reports whether the view holds a read of the store's slots that
// no take with an unknown outcome, and no slot freed elsewhere, has
// overtaken.
func (v *View) Read() bool { return v.read }

// Pick reserves the n lowest indexes neither held nor being taken or
// freed; ErrCapacityExceeded when fewer are free.
func (v *View) Pick(n int) ([]uint32, error) {
	out := make([]uint32, 0, n)
	for i := uint32(0); i < v.capacity && len(out) < n; i++ {
		if _, ok := v.held[i]; !ok && !v.taking[i] && v.freeing[i] == 0 {
			out = append(out, i)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("%w: node %s holds %d of its %d capacity slots, %d more are needed", roamerr.ErrCapacityExceeded,
			v.node, len(v.held)+len(v.taking), v.capacity, n)
	}
	for _, i := range out {
		v.taking[i] = true
	}
	return out, nil
}

// ReadAgain reports whether a read of the slots is due for a node that
// looks full at now (at most once per FullReadEvery since the last read),
// and counts it done.
func (v *View) ReadAgain(now time.Time) bool {
	if now.Sub(v.lastRead) < FullReadEvery {
		return false
	}
	v.lastRead = now
	return true
}

// Refreshed replaces what the view holds by list, read from the store at
// now.
func (v *View) Refreshed(list []location.Slot, now time.Time) {
	v.held = make(map[uint32]location.AuthorityKey, len(list))
	v.byHolder = make(map[location.AuthorityKey]uint32, len(list))
	for _, sl := range list {
		v.Hold(sl.Index, sl.Holder)
	}
	v.read, v.lastRead = true, now
}

// Outcome is what becomes of a take after the store's answer.
type Outcome int

const (
	// Took: the transaction applied; the slots are held.
	Took Outcome = iota
	// Retry: a slot thought free was held; read the slots again and
	// take others.
	Retry
	// Exhausted: slots thought free were found held too often.
	Exhausted
	// Unknown: the transaction may have applied; the slots may be held.
	Unknown
	// Failed: it did not apply, for another reason (the caller's ops'
	// own compare-and-set, a store fault).
	Failed
)

// Answer judges the store's answer err to a take's attempt (from 1)
// whose slot ops start at index first of its transaction, of at most max
// attempts.
func Answer(err error, first, attempt, max int) Outcome {
	var ce *location.ConflictError
	switch {
	case err == nil:
		return Took
	case errors.As(err, &ce) && slotConflict(ce, first) && attempt < max:
		return Retry
	case errors.As(err, &ce) && slotConflict(ce, first):
		return Exhausted
	case errors.Is(err, location.ErrIndeterminate):
		return Unknown
	}
	return Failed
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

// Took ends a take of slots, for holders in order, judged o: slots taken
// (or that may be: Unknown) are counted held, and an unknown outcome
// makes the view read again before its next pick.
func (v *View) Took(slots []uint32, holders []location.AuthorityKey, o Outcome) {
	took := o == Took || o == Unknown
	for j, i := range slots {
		delete(v.taking, i)
		if took {
			v.Hold(i, holders[j])
		}
	}
	if o == Unknown {
		v.read = false
	}
}

// Taking reports whether a take of this node is taking slot i now.
func (v *View) Taking(i uint32) bool { return v.taking[i] }

// Hold records slot i held by h.
func (v *View) Hold(i uint32, h location.AuthorityKey) {
	v.Drop(i)
	v.held[i] = h
	v.byHolder[h] = i
}

// Drop forgets slot i.
func (v *View) Drop(i uint32) {
	if h, ok := v.held[i]; ok {
		delete(v.held, i)
		if v.byHolder[h] == i {
			delete(v.byHolder, h)
		}
	}
}

// Free is one free, in progress, of slots a move's target took for its
// participants and no record names (the move did not commit here, or a
// take of it whose answer was lost may have applied). It is judged on the
// store's listing at each try, never on the view: the view may name
// another take's holder by then, or none (a refresh).
type Free struct {
	slots   map[uint32]bool
	holders map[location.AuthorityKey]bool
	// settleUntil: a take of these slots had an unknown outcome, and its
	// transaction may still apply until then (it is in the store's hands
	// after its caller gave up): until then a try that finds nothing to
	// free, or frees what it found, looks again.
	settleUntil time.Time
}

// BeginFree starts freeing slots taken for holders (the move's
// participants): none of them is picked until EndFree. settleUntil is
// zero unless a take of them had an unknown outcome (see Free).
func (v *View) BeginFree(slots []uint32, holders []location.AuthorityKey, settleUntil time.Time) *Free {
	f := &Free{slots: make(map[uint32]bool, len(slots)), holders: make(map[location.AuthorityKey]bool, len(holders)), settleUntil: settleUntil}
	for _, i := range slots {
		if !f.slots[i] {
			f.slots[i] = true
			v.freeing[i]++
		}
	}
	for _, h := range holders {
		f.holders[h] = true
	}
	return f
}

// Candidates are the slots of the node's listing (list, read now) that a
// try of f may free: a slot of f's that the store shows pending for one of
// f's holders, and that no move running here claims (claimed: a later
// move of the same object took it since, its take having read it free).
// An active slot is never a stray: arrival slots are taken pending, and
// only a commit, which names the slot in the record, makes one active. A
// take whose answer was lost may not have applied (and another holder may
// have the slot now), and an earlier try of this free may have applied.
func (f *Free) Candidates(list []location.Slot, claimed func(slot uint32) bool) []location.Slot {
	var out []location.Slot
	for _, sl := range list {
		if f.slots[sl.Index] && sl.Pending && f.holders[sl.Holder] && !claimed(sl.Index) {
			out = append(out, sl)
		}
	}
	return out
}

// Ops are the ops of one try of f over its candidates on node (its node
// RID), given each candidate holder's record as read after the listing
// (record: false when there is none). A slot its holder's record names on
// node is the object's own: another node reserved it here for the same
// object since (a User Spot deleted and created again), and it stays. Each
// slot freed comes with a check that its holder's record is still as read,
// so a reservation made between the read and the free fails the try
// instead, and the next try reads again. A nil record is a world where no
// other node reserves here (the hand-off simulation has no Spot manager):
// no record is read and no check is made.
func (f *Free) Ops(cands []location.Slot, node string, record func(location.AuthorityKey) (location.Versioned, bool),
	op func(slot uint32) location.Op) []location.Op {
	var ops []location.Op
	if record == nil {
		for _, sl := range cands {
			ops = append(ops, op(sl.Index))
		}
		return ops
	}
	checked := map[location.AuthorityKey]bool{}
	for _, sl := range cands {
		v, ok := record(sl.Holder)
		if ok && v.Record.GetOwner().GetNodeRid() == node {
			if i, named := handoff.RecordSlot(v.Record); named && i == sl.Index {
				continue
			}
		}
		if !checked[sl.Holder] {
			checked[sl.Holder] = true
			var at location.StoreVersion // absent
			if ok {
				at = v.Version
			}
			ops = append(ops, location.CheckOp(sl.Holder, at))
		}
		ops = append(ops, op(sl.Index))
	}
	return ops
}

// Next judges a try of f that ended at now with err (nil: it applied, or
// found nothing to free): done, or try again after pause (prev: the last
// pause, 0 for none yet). A free ends once a try succeeds past its
// settling time, or once the node's lease ended (which frees them too);
// it never gives up otherwise, since a slot kept would hold capacity for
// nothing until the lease ends.
func (f *Free) Next(err error, now time.Time, prev time.Duration) (done bool, pause time.Duration) {
	switch {
	case errors.Is(err, location.ErrLeaseEnded):
		return true, 0
	case err == nil && !now.Before(f.settleUntil):
		return true, 0
	case err == nil:
		// Settling: look again at the pace of a retry, but never past
		// the settling time by more than a pause.
		return false, min(FreePause(prev), max(f.settleUntil.Sub(now), time.Millisecond))
	}
	return false, FreePause(prev)
}

// Freed forgets, once f ended, the slots of f that the view still saw
// held by one of f's holders.
func (v *View) Freed(f *Free) {
	for i := range f.slots {
		if h, ok := v.held[i]; ok && f.holders[h] {
			v.Drop(i)
		}
	}
}

// EndFree ends f: its slots may be picked again.
func (v *View) EndFree(f *Free) {
	for i := range f.slots {
		if v.freeing[i]--; v.freeing[i] <= 0 {
			delete(v.freeing, i)
		}
	}
}

// Unread makes the view read the store's slots again before its next
// pick: a slot of this node was freed by another node's transaction (a
// move's commit on its target frees the source's slot), and the view
// cannot tell which index (the object may hold another slot here by now).
func (v *View) Unread() { v.read = false }

// SettleFor is how long after a take whose answer was lost a free of its
// slots keeps looking for it to apply. A write the store has in hand when
// its caller gives up may still apply: Consul holds a request it cannot
// forward at once for seconds (its RPC hold, 7 s by default) and queues a
// Raft apply for up to 30 s. A minute is past both; a free that looks
// costs one listing a second.
const SettleFor = time.Minute

// FreePause is the pause before the next try of a free whose last try
// paused prev (0: none yet): 10 ms first, doubling up to a second. A slot
// kept would hold capacity for nothing, so a free tries until it ends.
func FreePause(prev time.Duration) time.Duration {
	if prev <= 0 {
		return 10 * time.Millisecond
	}
	return min(2*prev, time.Second)
}

// PickOn picks a slot of another node of capacity capacity whose slots
// read as list, for a reservation this node makes there: a random free
// one (intN(n) draws from [0, n), as math/rand's IntN), not the lowest,
// so that creators racing for the same node rarely pick the same one
// (the node itself picks from the lowest). ErrCapacityExceeded when none
// is free.
func PickOn(node string, capacity uint32, list []location.Slot, intN func(n int) int) (uint32, error) {
	held := make(map[uint32]bool, len(list))
	for _, sl := range list {
		held[sl.Index] = true
	}
	if len(held) >= int(capacity) {
		return 0, fmt.Errorf("%w: node %s holds all %d of its capacity slots", roamerr.ErrCapacityExceeded, node, capacity)
	}
	nth := intN(int(capacity) - len(held))
	slot := uint32(0)
	for ; ; slot++ {
		if !held[slot] {
			if nth == 0 {
				return slot, nil
			}
			nth--
		}
	}
}
