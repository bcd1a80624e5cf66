package spotsim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/simkit"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

type opKind int

const (
	opRead       opKind = iota // a consistent read of one key
	opReadNode                 // a node descriptor (OwnerNode, nodeAddress)
	opListNodes                // the live node descriptors (selectMesh, passOn, the route sweep)
	opList                     // the records of one kind, in one page (the start-up scan)
	opApply                    // a transaction; a node's writes carry its lease check
	opWatch                    // wait until a key is no longer at a version
	opRenew                    // renew a lease
	opClaim                    // create a lease and its node descriptor
	opPutRoot                  // Relocation Store: put a root
	opGetRoot                  // Relocation Store: get a root
	opDeleteRoot               // Relocation Store: delete a root
	opRevoke                   // revoke another lifecycle's lease at a descriptor version
	// Checkpoint calls (checkpoint.go): they do not go through call; a
	// script's faults name them. opCapture is a capture's wait in the
	// node's checkpoint writer before its lease check, opCheckpoint its
	// write's way to the store, opCheckpointClaim an activation's claim.
	opCapture
	opCheckpoint
	opCheckpointClaim
)

var opNames = [...]string{"read", "read-node", "list-nodes", "list", "apply", "watch", "renew", "claim", "put-root", "get-root", "delete-root", "revoke", "capture", "checkpoint", "checkpoint-claim"}

func (k opKind) write() bool {
	return k == opApply || k == opPutRoot || k == opDeleteRoot || k == opRevoke
}

// storeOp is one call to the store.
type storeOp struct {
	kind    opKind
	key     location.AuthorityKey
	owner   *messages.Owner // opReadNode, opRevoke
	beat    uint64          // opRevoke: the descriptor version seen
	ops     []location.Op   // opApply (without the lease check, which the store adds)
	after   location.StoreVersion
	rootKey string
	root    *root // opPutRoot
	// holder: the first message the deleting machine holds itself
	// (opDeleteRoot), if any.
	holder *Msg
	why    string
	quiet  bool // not traced: the heartbeat watch's listing, many per second
}

// storeRes is a store call's answer.
type storeRes struct {
	err      error
	v        location.Versioned
	versions []location.StoreVersion
	alive    bool
	beat     uint64   // opReadNode: the descriptor's version (its heartbeat)
	beats    []uint64 // opListNodes: each node's heartbeat
	revoked  bool     // opReadNode: not found because its lease was revoked
	node     *Life    // opReadNode: the lifecycle the descriptor found is
	addr     int
	nodes    []*Life
	list     []location.Versioned
	root     *root
}

// root is a Relocation Store root: an activation envelope, reduced to
// what the machines read back (its reference, operation and first
// message).
type root struct {
	ref   location.RootRef
	op    string
	first *Msg
}

type entry struct {
	version location.StoreVersion
	rec     *location.Record
}

type storeLease struct {
	life      *Life
	expiresAt time.Duration
	gone      bool
	beat      uint64 // the descriptor's version: every renewal changes it
	revoked   bool   // ended by another lifecycle's RevokeLease
}

type watcher struct {
	key   location.AuthorityKey
	after location.StoreVersion
	fire  func(location.Versioned)
	done  bool
}

// Store is the Location Store and the Relocation Store: authority records
// under the Instance and User Spot keys with a store-wide version,
// transactions (create-if-absent, update and delete on a version, check),
// per-lifecycle owner leases that end LeaseTTL after the last renewal the
// store applied (taking the node descriptor with them), the lease check
// every node write carries, a watch, and roots.
type Store struct {
	w        *World
	version  location.StoreVersion
	recs     map[location.AuthorityKey]entry
	leases   map[string]*storeLease
	roots    map[string]*root
	down     bool
	watchers []*watcher
	// pointerGone records, per activation operation, when a write first
	// removed that operation's recovery pointer from its record.
	pointerGone map[string]time.Duration
}

func newStore(w *World) *Store {
	return &Store{w: w, recs: map[location.AuthorityKey]entry{}, leases: map[string]*storeLease{}, roots: map[string]*root{},
		pointerGone: map[string]time.Duration{}}
}

// Read returns a key's current record (the truth, for checks).
func (s *Store) Read(key location.AuthorityKey) location.Versioned {
	e, ok := s.recs[key]
	if !ok {
		return location.Versioned{Key: key}
	}
	return location.Versioned{Key: key, Version: e.version, Record: e.rec}
}

// leaseLive reports whether a lifecycle's lease is in force in the store
// (expired leases end lazily, at the first look after their expiry).
func (s *Store) leaseLive(l *Life) bool {
	sl := s.leases[l.lease]
	if sl == nil {
		return false
	}
	if !sl.gone && s.w.Now() >= sl.expiresAt {
		sl.gone = true
		s.w.stats.LeasesExpired++
		s.w.tracef("store: lease of %s ended (expired)", l)
	}
	return !sl.gone
}

// call runs one store operation of lifecycle l: it reaches the store
// after a latency, applies there (or not, as the answer mode and outages
// decide) and is answered after another; done gets the answer, or
// context.DeadlineExceeded at deadline (0: none) if that is earlier. A
// write of a node whose lease is not provably in force is refused locally
// (location.Leased). done is not called once l's process is gone.
func (s *Store) call(l *Life, op storeOp, deadline time.Duration, done func(storeRes)) {
	w := s.w
	// One object per call carries the operation and its answer through
	// its events: the schedules make millions of store calls, and closures
	// capturing op and each answer by value were a fifth of the
	// simulation's allocated bytes.
	c := &inflight{s: s, l: l, op: op, done: done}
	if op.kind == opApply {
		switch {
		case l.ended:
			c.answerAfter(0, storeRes{err: fmt.Errorf("%w: node %s", location.ErrLeaseEnded, l.rid)})
			return
		case l.fenced():
			c.answerAfter(0, storeRes{err: fmt.Errorf("%w: node %s is fenced", location.ErrUnavailable, l.rid)})
			return
		}
	}
	if deadline > 0 && deadline <= w.Now() {
		c.answerAfter(0, storeRes{err: context.DeadlineExceeded})
		return
	}
	mode, late := w.storeMode(l, &c.op)
	l1, l2 := w.randDur(300*time.Microsecond, 3*time.Millisecond), w.randDur(300*time.Microsecond, 3*time.Millisecond)
	if late > 0 {
		l1 = late
	}
	if mode == simkit.ModeSlow {
		w.stats.SlowWrites++
		l1 += w.randDur(0, w.faults.SlowFor)
		l2 += w.randDur(0, w.faults.SlowFor)
	}
	c.mode, c.l2 = mode, l2
	if w.Tracing() && (mode != simkit.ModeOK || late > 0) {
		w.tracef("%s store %s %s sent (mode %s, applies at +%s)", l, opNames[c.op.kind], c.op.why, mode, ms(l1))
	}
	if deadline > 0 && (c.op.kind == opWatch || w.Now()+l1+l2 > deadline) {
		// The answer may come after the caller's context ended.
		w.at(deadline, c.deadlineExceeded)
	}
	w.after(l1, c.arrive)
}

// inflight is one store call on its way.
type inflight struct {
	s        *Store
	l        *Life
	op       storeOp
	done     func(storeRes)
	mode     simkit.StoreMode
	l2       time.Duration // the answer's way back
	res      storeRes      // the answer on its way back
	answered bool
}

// answerAfter delivers res after d.
func (c *inflight) answerAfter(d time.Duration, res storeRes) {
	c.res = res
	c.s.w.after(d, c.answer)
}

func (c *inflight) answer() { c.deliver(c.res) }

func (c *inflight) deadlineExceeded() { c.deliver(storeRes{err: context.DeadlineExceeded}) }

func (c *inflight) deliver(res storeRes) {
	if c.answered {
		return
	}
	c.answered = true
	if c.l.gone {
		return
	}
	if w := c.s.w; w.Tracing() && !c.op.quiet {
		w.tracef("%s store %s %s → %s", c.l, opNames[c.op.kind], c.op.why, resString(c.op, res))
	}
	c.done(res)
}

// arrive is the call reaching the store.
func (c *inflight) arrive() {
	s, w, l, op := c.s, c.s.w, c.l, &c.op
	if s.down || l.node.storeCut {
		err := location.ErrUnavailable
		if op.kind.write() && w.Rand.IntN(2) == 0 {
			err = location.ErrIndeterminate
		}
		c.answerAfter(c.l2, storeRes{err: err})
		return
	}
	switch c.mode {
	case simkit.ModeUnavailable:
		c.answerAfter(c.l2, storeRes{err: location.ErrUnavailable})
		return
	case simkit.ModeIndetNotApplied:
		err := location.ErrIndeterminate
		if !op.kind.write() {
			err = location.ErrUnavailable
		}
		c.answerAfter(c.l2, storeRes{err: err})
		return
	}
	if op.kind == opWatch {
		s.watch(*op, func(v location.Versioned) { c.answerAfter(c.l2, storeRes{v: v}) })
		return
	}
	res := s.apply(l, *op)
	if c.mode == simkit.ModeIndetApplied {
		w.stats.IndeterminateWrites++
		res = storeRes{err: location.ErrIndeterminate}
	}
	c.answerAfter(c.l2, res)
}

func resString(op storeOp, res storeRes) string {
	if res.err != nil {
		return errString(res.err)
	}
	switch op.kind {
	case opRead, opWatch:
		return recString(res.v)
	case opReadNode:
		return fmt.Sprintf("alive=%v", res.alive)
	case opListNodes:
		s := "["
		for i, l := range res.nodes {
			if i > 0 {
				s += " "
			}
			s += l.String()
		}
		return s + "]"
	case opList:
		return fmt.Sprintf("%d records", len(res.list))
	case opApply:
		return fmt.Sprintf("ok %v", res.versions)
	case opGetRoot:
		return "root of " + res.root.op
	}
	return "ok"
}

// errString names an error by its class.
func errString(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, location.ErrConflict):
		return "conflict"
	case errors.Is(err, location.ErrLeaseEnded):
		return "lease-ended"
	case errors.Is(err, location.ErrIndeterminate):
		return "indeterminate"
	case errors.Is(err, location.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, location.ErrNotFound):
		return "not-found"
	}
	return err.Error()
}

func (s *Store) apply(l *Life, op storeOp) storeRes {
	w := s.w
	switch op.kind {
	case opRead:
		e, ok := s.recs[op.key]
		if !ok {
			return storeRes{err: location.ErrNotFound}
		}
		return storeRes{v: location.Versioned{Key: op.key, Version: e.version, Record: e.rec}}
	case opReadNode:
		o := w.lifeByRid(op.owner.GetNodeRid())
		if o == nil || !s.leaseLive(o) {
			revoked := o != nil && s.leases[o.lease] != nil && s.leases[o.lease].revoked
			return storeRes{err: location.ErrNotFound, revoked: revoked}
		}
		return storeRes{alive: o.lease == op.owner.GetLeaseId() && o.gen == op.owner.GetNodeGeneration(), addr: o.addr, beat: s.leases[o.lease].beat, node: o}
	case opRevoke:
		o := w.lifeByRid(op.owner.GetNodeRid())
		switch {
		case o == nil || !s.leaseLive(o):
			return storeRes{err: location.ErrNotFound}
		case s.leases[o.lease].beat != op.beat:
			return storeRes{err: &location.ConflictError{Op: "revoke lease"}}
		}
		sl := s.leases[o.lease]
		sl.gone, sl.revoked, sl.expiresAt = true, true, w.Now()
		w.stats.LeasesRevoked++
		w.tracef("store: lease of %s revoked at its heartbeat %d", o, op.beat)
		return storeRes{}
	case opListNodes:
		out := make([]*Life, 0, len(w.lives))
		beats := make([]uint64, 0, len(w.lives))
		for _, o := range w.lives {
			if s.leaseLive(o) {
				out = append(out, o)
				beats = append(beats, s.leases[o.lease].beat)
			}
		}
		return storeRes{nodes: out, beats: beats}
	case opList:
		var out []location.Versioned
		for _, sp := range w.spots {
			if v := s.Read(location.Key(op.key.Kind, sp.id)); v.Present() {
				out = append(out, v)
			}
		}
		return storeRes{list: out}
	case opRenew:
		if !s.leaseLive(l) {
			return storeRes{err: location.ErrNotFound}
		}
		s.leases[l.lease].expiresAt = w.Now() + w.cfg.StoreExpiry
		s.leases[l.lease].beat++
		return storeRes{}
	case opClaim:
		s.leases[l.lease] = &storeLease{life: l, expiresAt: w.Now() + w.cfg.StoreExpiry, beat: 1}
		return storeRes{}
	case opPutRoot:
		s.roots[op.rootKey] = op.root
		return storeRes{}
	case opGetRoot:
		r := s.roots[op.rootKey]
		if r == nil {
			return storeRes{err: location.ErrNotFound}
		}
		return storeRes{root: r}
	case opDeleteRoot:
		if r := s.roots[op.rootKey]; r != nil {
			delete(s.roots, op.rootKey)
			w.rootDeleted(r, l, op.holder)
		}
		return storeRes{}
	case opApply:
		return s.transact(l, op)
	}
	panic("sim: store op " + opNames[op.kind])
}

// transact runs one Apply: every precondition first (the writer's lease
// check included, location.Leased), then every change, under one new
// version.
func (s *Store) transact(l *Life, op storeOp) storeRes {
	w := s.w
	if !s.leaseLive(l) {
		w.tracef("store: %s's write refused: its lease ended", l)
		return storeRes{err: fmt.Errorf("%w: node %s", location.ErrLeaseEnded, l.rid)}
	}
	var failed []int
	for i, o := range op.ops {
		cur := s.recs[o.Key].version
		ok := true
		switch o.Kind {
		case location.OpCreate:
			ok = cur == 0
		case location.OpUpdate, location.OpDelete, location.OpCheck:
			ok = cur == o.Version
		case location.OpDeleteRoot:
		case location.OpCheckNoCheckpoint:
			// The world's checkpoints are the store's (checkpoint.go).
			sp := w.spotByID(o.Key.ID)
			ok = sp == nil || w.cps[sp.idx] == nil
		}
		if !ok {
			failed = append(failed, i)
		}
	}
	if failed != nil {
		return storeRes{err: &location.ConflictError{Op: "apply", FailedOps: failed}}
	}
	s.version++
	versions := make([]location.StoreVersion, len(op.ops))
	for i, o := range op.ops {
		before := s.recs[o.Key]
		switch o.Kind {
		case location.OpCreate, location.OpUpdate:
			s.recs[o.Key] = entry{version: s.version, rec: o.Record}
			versions[i] = s.version
		case location.OpDelete:
			delete(s.recs, o.Key)
		case location.OpCheck:
			versions[i] = before.version
			continue
		case location.OpCheckNoCheckpoint:
			continue
		case location.OpDeleteRoot:
			if rt := s.roots[o.RootKey]; rt != nil {
				delete(s.roots, o.RootKey)
				w.rootDeleted(rt, l, op.holder)
			}
			continue
		}
		s.changed(o.Key, before, l, op.why)
	}
	return storeRes{versions: versions}
}

// changed notes a change of key: the trace, the recovery pointer's
// removal, the Spot's history, and the watches.
func (s *Store) changed(key location.AuthorityKey, before entry, by *Life, why string) {
	w := s.w
	after := s.Read(key)
	if w.Tracing() {
		w.tracef("store: %s %s → %s (%s by %s)", key.ID, recString(location.Versioned{Key: key, Version: before.version, Record: before.rec}), recString(after), why, by)
	}
	if op := before.rec.GetActivationRecovery().GetOperationId(); op != "" && after.Record.GetActivationRecovery().GetOperationId() != op {
		if _, seen := s.pointerGone[op]; !seen {
			s.pointerGone[op] = w.Now()
		}
	}
	if sp := w.spotByID(key.ID); sp != nil && key.Kind == location.KindInstanceSpot {
		w.recordChanged(sp, before.rec, after)
	}
	keep := s.watchers[:0]
	var fire []*watcher
	for _, wt := range s.watchers {
		switch {
		case wt.done:
		case wt.key == key && after.Version != wt.after:
			fire = append(fire, wt)
		default:
			keep = append(keep, wt)
		}
	}
	s.watchers = keep
	for _, wt := range fire {
		wt.done = true
		wt.fire(after)
	}
}

func (s *Store) watch(op storeOp, fire func(location.Versioned)) *watcher {
	if v := s.Read(op.key); v.Version != op.after {
		fire(v)
		return nil
	}
	wt := &watcher{key: op.key, after: op.after, fire: fire}
	s.watchers = append(s.watchers, wt)
	return wt
}

// storeMode picks how the store answers a call: a scenario's hook first,
// then the schedule's fault mix; after the horizon always ok.
func (w *World) storeMode(l *Life, op *storeOp) (simkit.StoreMode, time.Duration) {
	if w.hooks.StoreMode != nil {
		if m, late, ok := w.hooks.StoreMode(w, l, op); ok {
			return m, late
		}
	}
	if w.over || op.kind == opClaim {
		return simkit.ModeOK, 0
	}
	return w.faults.Draw(w.Rand, op.kind.write()), 0
}

// recString is a short form of a record for the trace.
func recString(v location.Versioned) string {
	if !v.Present() {
		return "{missing}"
	}
	r := v.Record
	st := "?"
	switch r.GetState() {
	case messages.LifecycleState_LIFECYCLE_STATE_CREATING:
		st = "Creating"
	case messages.LifecycleState_LIFECYCLE_STATE_READY:
		st = "Ready"
	case messages.LifecycleState_LIFECYCLE_STATE_CLOSING:
		st = "Closing"
	}
	s := fmt.Sprintf("{v%d %s %s %s.%d", v.Version, st, r.GetOwner().GetNodeRid(), genString(r.GetObjectGeneration()), r.GetAuthorityOwnerGeneration())
	if rr := r.GetActivationRecovery(); rr != nil {
		s += " ptr:" + rr.GetOperationId()
	}
	return s + "}"
}
