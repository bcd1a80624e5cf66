package sim

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
)

// Record is the sim's Location Store record of one object: the fields the
// hand-off reads and writes (location.Record's owner, generations and
// RelocationId) and the store version.
type Record struct {
	Version      uint64
	OwnerNode    string
	OwnerNodeGen uint64
	OwnerGen     uint64 // AuthorityOwnerGeneration
	ObjectGen    uint64
	RelocID      uint64
	// Member: the SpotWide User Spot (its ID) a member's record names;
	// MemberCount: the members a Spot's record counts.
	Member      string
	MemberCount uint32
	// Slot is the owner's capacity slot for the object, plus one (0:
	// none): location.Record's capacity_slot.
	Slot uint32
}

func (r Record) String() string {
	s := fmt.Sprintf("{v%d owner %s/%d og%d reloc %d", r.Version, r.OwnerNode, r.OwnerNodeGen, r.OwnerGen, r.RelocID)
	if r.Member != "" {
		s += " member of " + r.Member
	}
	if r.MemberCount > 0 {
		s += fmt.Sprintf(" members %d", r.MemberCount)
	}
	if r.Slot > 0 {
		s += fmt.Sprintf(" slot %d", r.Slot-1)
	}
	return s + "}"
}

type opKind int

const (
	opRead opKind = iota
	opCAS
	opRenew
	opWatch
	// opReadAll reads objs' records at once; opApply writes every one of
	// writes, each at its expected version, or none (a transaction: a
	// SpotWide unit's commit).
	opReadAll
	opApply
	// opListSlots reads the capacity slots of the node node.
	opListSlots
)

var opNames = [...]string{"read", "cas", "renew", "watch", "read-all", "apply", "list-slots"}

// isWrite: the op writes under the writer's lease.
func (k opKind) isWrite() bool { return k == opCAS || k == opApply }

// write is one record an opApply changes, or one capacity slot op (slot
// set: location's OpTakeSlot, OpSetSlot or OpFreeSlot).
type write struct {
	obj      ObjID
	expected uint64
	next     Record
	slot     *location.Op
}

// slotHolder is one held capacity slot.
type slotHolder struct {
	obj     ObjID
	pending bool
}

type storeOp struct {
	kind     opKind
	obj      ObjID
	expected uint64  // CAS: expected version
	next     Record  // CAS: the record to write
	after    uint64  // watch: answer once the version is above
	why      string  // for the trace
	objs     []ObjID // read-all
	writes   []write // apply
	node     int     // list-slots
}

// storeErr is the class of a store answer, as the driver tells them apart.
type storeErr int

const (
	errNone storeErr = iota
	errConflict
	errUnavailable
	errIndeterminate
	errDeadline // the caller's context ended first (may have applied)
	errLeaseEnded
	errNoLease // renewal: the lease is gone
)

var errNames = [...]string{"ok", "conflict", "unavailable", "indeterminate", "deadline", "lease-ended", "no-such-lease"}

func (e storeErr) String() string { return errNames[e] }

type storeRes struct {
	err storeErr
	rec Record // read/watch: the record; CAS conflict: the current record
	// recs: read-all's records, in its order; an apply's conflict: the
	// current record of each write, in its order.
	recs []Record
	// failed: an apply's conflict, the indexes of the writes that failed;
	// slots: list-slots' answer.
	failed []int
	slots  []location.Slot
}

type storeLease struct {
	expiresAt time.Duration
	gone      bool
}

type watcher struct {
	obj   ObjID
	after uint64
	fire  func(Record)
	done  bool
}

// Store is the Location Store: one record per object, CAS on the version,
// per-node owner leases that the store ends TTL after the last renewal it
// applied, and writes that carry the writer's lease check.
type Store struct {
	w        *World
	recs     []Record
	version  uint64
	leases   []storeLease
	down     bool // an outage for every node
	watchers []*watcher
	// slots are each node lifecycle's capacity slots; they go with its
	// lease.
	slots []map[uint32]slotHolder
}

func newStore(w *World) *Store {
	s := &Store{w: w, leases: make([]storeLease, w.cfg.Nodes)}
	for i := range s.leases {
		s.leases[i].expiresAt = w.cfg.LeaseTTL
		s.slots = append(s.slots, map[uint32]slotHolder{})
	}
	return s
}

// Record returns an object's current record (the truth, for checks and
// for clients resolving a route).
func (s *Store) Record(o ObjID) Record { return s.recs[o] }

func (s *Store) leaseLive(n *Node) bool {
	l := &s.leases[n.idx]
	if !l.gone && s.w.Now() >= l.expiresAt {
		s.endLease(n)
		s.w.tracef("store: lease of %s ended (expired)", n.name)
	}
	return !l.gone
}

// endLease ends n's lease, and its capacity slots with it.
func (s *Store) endLease(n *Node) {
	s.leases[n.idx].gone = true
	clear(s.slots[n.idx])
}

// call runs one store operation of node n: the request reaches the store
// after a latency, applies there (or not, as the answer mode and outages
// decide) and the answer comes back after another; done gets the answer,
// or errDeadline at deadline if that is earlier. A write from a node whose
// lease is not provably in force is refused locally (location.Leased).
// done is not called if n crashed or ended its process meanwhile.
func (s *Store) call(n *Node, op storeOp, deadline time.Duration, done func(storeRes)) {
	w := s.w
	life := n.life
	answered := false
	deliver := func(res storeRes) {
		if answered {
			return
		}
		answered = true
		if !n.alive || n.life != life {
			return
		}
		if w.Tracing() {
			w.tracef("%s store %s %s answered %s %s", n.name, opNames[op.kind], op.why, res.err, res.rec)
		}
		done(res)
	}
	if op.kind.isWrite() {
		switch {
		case n.ended:
			w.after(0, "local-refuse", func() { deliver(storeRes{err: errLeaseEnded}) })
			return
		case n.fenced():
			w.after(0, "local-refuse", func() { deliver(storeRes{err: errUnavailable}) })
			return
		}
	}
	if deadline <= w.Now() {
		w.after(0, "ctx-expired", func() { deliver(storeRes{err: errDeadline}) })
		return
	}
	mode, late := w.storeMode(n, &op)
	l1, l2 := w.randDur(300*time.Microsecond, 3*time.Millisecond), w.randDur(300*time.Microsecond, 3*time.Millisecond)
	if late > 0 {
		l1 = late
	}
	if mode == simkit.ModeSlow {
		l1 += w.randDur(0, 400*time.Millisecond)
		l2 += w.randDur(0, 600*time.Millisecond)
	}
	if w.Tracing() {
		w.tracef("%s store %s %s sent (mode %s, applies at +%s)", n.name, opNames[op.kind], op.why, mode, l1)
	}
	w.at(deadline, "store-deadline", func() { deliver(storeRes{err: errDeadline}) })
	w.after(l1, "store-apply", func() {
		if s.down || n.storeCut {
			if mode != simkit.ModeHang {
				err := errUnavailable
				if op.kind.isWrite() && w.Rand.IntN(2) == 0 {
					err = errIndeterminate
				}
				w.after(l2, "store-answer", func() { deliver(storeRes{err: err}) })
			}
			return
		}
		switch mode {
		case simkit.ModeUnavailable:
			w.after(l2, "store-answer", func() { deliver(storeRes{err: errUnavailable}) })
			return
		case simkit.ModeIndetNotApplied:
			w.after(l2, "store-answer", func() { deliver(storeRes{err: errIndeterminate}) })
			return
		case simkit.ModeHang:
			return
		}
		if op.kind == opWatch {
			s.watch(op, func(r Record) { w.after(l2, "store-answer", func() { deliver(storeRes{rec: r}) }) })
			return
		}
		res := s.apply(n, op)
		if mode == simkit.ModeLate {
			return
		}
		if mode == simkit.ModeIndetApplied {
			if op.kind.isWrite() {
				w.stats.IndeterminateCAS++
			}
			res = storeRes{err: errIndeterminate}
		}
		w.after(l2, "store-answer", func() { deliver(res) })
	})
}

func (s *Store) apply(n *Node, op storeOp) storeRes {
	w := s.w
	switch op.kind {
	case opRead:
		return storeRes{rec: s.recs[op.obj]}
	case opRenew:
		if !s.leaseLive(n) {
			return storeRes{err: errNoLease}
		}
		s.leases[n.idx].expiresAt = w.Now() + w.cfg.LeaseTTL
		return storeRes{}
	case opReadAll:
		recs := make([]Record, len(op.objs))
		for i, o := range op.objs {
			recs[i] = s.recs[o]
		}
		return storeRes{recs: recs}
	case opCAS:
		if !s.leaseLive(n) {
			w.tracef("store: CAS of %s refused: its lease ended", n.name)
			return storeRes{err: errLeaseEnded}
		}
		cur := s.recs[op.obj]
		if cur.Version != op.expected {
			return storeRes{err: errConflict, rec: cur}
		}
		s.version++
		next := s.put(n, op.obj, op.next, op.why)
		s.changed(op.obj)
		return storeRes{rec: next}
	case opApply:
		if !s.leaseLive(n) {
			w.tracef("store: transaction of %s refused: its lease ended", n.name)
			return storeRes{err: errLeaseEnded}
		}
		var failed []int
		cur := make([]Record, len(op.writes))
		for i, x := range op.writes {
			switch {
			case x.slot == nil:
				cur[i] = s.recs[x.obj]
				if cur[i].Version != x.expected {
					failed = append(failed, i)
				}
			case x.slot.Kind == location.OpTakeSlot:
				if _, held := s.slots[w.node(x.slot.Node.NodeRid).idx][x.slot.Slot]; held {
					failed = append(failed, i)
				}
			}
		}
		if failed != nil {
			return storeRes{err: errConflict, recs: cur, failed: failed}
		}
		s.version++
		for _, x := range op.writes {
			if x.slot == nil {
				s.put(n, x.obj, x.next, op.why)
				continue
			}
			s.putSlot(n, *x.slot, op.why)
		}
		for _, x := range op.writes {
			if x.slot == nil {
				s.changed(x.obj)
			}
		}
		return storeRes{}
	case opListSlots:
		var list []location.Slot
		for i, h := range s.slots[op.node] {
			list = append(list, location.Slot{Index: i, Holder: w.keyOf(h.obj), Pending: h.pending})
		}
		location.SortSlots(list)
		return storeRes{slots: list}
	}
	panic("sim: store op")
}

// putSlot applies a capacity slot op of a transaction n wrote. A slot of
// another node is only ever freed (the object leaves it); a node's own
// are taken and set under its lease, which the transaction checked.
func (s *Store) putSlot(n *Node, op location.Op, why string) {
	w := s.w
	owner := w.node(op.Node.NodeRid)
	slots := s.slots[owner.idx]
	switch op.Kind {
	case location.OpTakeSlot, location.OpSetSlot:
		slots[op.Slot] = slotHolder{obj: w.objOfKey(op.Key), pending: op.Pending}
	case location.OpFreeSlot:
		delete(slots, op.Slot)
	}
	if w.Tracing() {
		w.tracef("store: %s slot %d of %s %s (%s by %s)", opSlotNames[op.Kind], op.Slot, owner.name, slotHolderString(op), why, n.name)
	}
}

var opSlotNames = map[location.OpKind]string{location.OpTakeSlot: "take", location.OpSetSlot: "set", location.OpFreeSlot: "free"}

func slotHolderString(op location.Op) string {
	switch {
	case op.Kind == location.OpFreeSlot:
		return ""
	case op.Pending:
		return "pending for " + op.Key.ID
	}
	return "for " + op.Key.ID
}

// put writes o's record at the store's current version (one transaction
// writes all its records at one version).
func (s *Store) put(n *Node, o ObjID, next Record, why string) Record {
	w := s.w
	cur := s.recs[o]
	next.Version = s.version
	s.recs[o] = next
	if w.Tracing() {
		w.tracef("store: o%d %s → %s (%s by %s)", o, cur, next, why, n.name)
	}
	if next.Member != cur.Member {
		w.joined(o, next.Member)
	}
	if next.RelocID != cur.RelocID && next.OwnerNode != cur.OwnerNode {
		if mv := w.moveByID(next.RelocID); mv != nil {
			mv.committedInStore = true
		}
	}
	return next
}

func (s *Store) watch(op storeOp, fire func(Record)) {
	if r := s.recs[op.obj]; r.Version > op.after {
		fire(r)
		return
	}
	s.watchers = append(s.watchers, &watcher{obj: op.obj, after: op.after, fire: fire})
}

func (s *Store) changed(o ObjID) {
	keep := s.watchers[:0]
	var fire []*watcher
	for _, wt := range s.watchers {
		if wt.obj == o && s.recs[o].Version > wt.after {
			fire = append(fire, wt)
			continue
		}
		keep = append(keep, wt)
	}
	s.watchers = keep
	for _, wt := range fire {
		wt.fire(s.recs[o])
	}
}

// storeMode picks how the store answers a call (and, from a scenario, the
// latency to the store if positive): a scenario's hook first, then the
// schedule's fault mix; after the horizon always ok.
func (w *World) storeMode(n *Node, op *storeOp) (simkit.StoreMode, time.Duration) {
	if w.hooks.StoreMode != nil {
		if m, late, ok := w.hooks.StoreMode(w, n, op); ok {
			return m, late
		}
	}
	if w.over {
		return simkit.ModeOK, 0
	}
	return w.faults.Draw(w.Rand, op.kind.isWrite()), 0
}
