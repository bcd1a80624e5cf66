// Package spotservice holds the decisions and orderings of a node's Spot
// service around the activation machines: the per-Spot-ID queue of
// SpotActivations, the Spot ID lock's first-in-first-out hand-over, the
// shared store watches, the choice of a node to pass a full node's
// activation on to, the start-up scan's walk, and an Instance Spot's own
// close (CloseSelf, callback-style on a CloseEnv). It does no I/O and
// starts nothing: the Spot driver (internal/spot) hosts it under its
// mutex with goroutines and the Location Store, the deterministic
// simulation hosts it on its scheduler, so both run the same decisions.
//
// Nothing here is safe for concurrent use; the host serialises calls.
package spotservice

import (
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Queues holds SpotActivations per Spot ID in arrival order. One worker
// per ID takes them one at a time, so a caller's messages to a Spot being
// activated keep their order.
type Queues[K comparable, T any] struct {
	q map[K][]T // present: a worker runs for the ID
}

// Push queues item behind the earlier ones for id. It reports whether no
// worker runs for id: then the host starts one, which calls Next until it
// reports false.
func (qs *Queues[K, T]) Push(id K, item T) (start bool) {
	if qs.q == nil {
		qs.q = map[K][]T{}
	}
	q, running := qs.q[id]
	qs.q[id] = append(q, item)
	return !running
}

// Next takes the oldest item queued for id. With none left it reports
// false and the worker ends: the next Push starts another.
func (qs *Queues[K, T]) Next(id K) (T, bool) {
	q := qs.q[id]
	if len(q) == 0 {
		delete(qs.q, id)
		var zero T
		return zero, false
	}
	qs.q[id] = q[1:]
	return q[0], true
}

// Working reports whether a worker runs for id.
func (qs *Queues[K, T]) Working(id K) bool { _, ok := qs.q[id]; return ok }

// Queued is what waits for id's worker, oldest first.
func (qs *Queues[K, T]) Queued(id K) []T { return qs.q[id] }

// Locks serialise a node's own work on one Spot ID. The lock passes to
// its waiters in the order they asked: a caller queued behind a creation
// is not overtaken by one that came later.
type Locks[K comparable] struct {
	m map[K][]func() // present: held; the waiters, oldest first
}

// Acquire takes id's lock for the caller and reports true, or queues
// granted, which the host runs when Release hands the lock over.
func (ls *Locks[K]) Acquire(id K, granted func()) (now bool) {
	if ls.m == nil {
		ls.m = map[K][]func(){}
	}
	w, held := ls.m[id]
	if !held {
		ls.m[id] = nil
		return true
	}
	ls.m[id] = append(w, granted)
	return false
}

// Release gives id's lock up. If someone waits, the lock is theirs at
// once and next is their grant, for the host to run (outside its own
// mutex); otherwise next is nil and the lock is free.
func (ls *Locks[K]) Release(id K) (next func()) {
	w, held := ls.m[id]
	if !held {
		panic(fmt.Sprintf("spotservice: release of a lock not held: %v", id))
	}
	if len(w) == 0 {
		delete(ls.m, id)
		return nil
	}
	ls.m[id] = w[1:]
	return w[0]
}

// Held reports whether id's lock is held, and how many wait for it.
func (ls *Locks[K]) Held(id K) (bool, int) {
	w, held := ls.m[id]
	return held, len(w)
}

// SharedWatchTimeout bounds one shared store watch: its waiters read
// again after it, so a watch the store never answers holds nobody.
const SharedWatchTimeout = 10 * time.Second

// WatchKey is what one shared store watch waits on: the key moving past
// the version After.
type WatchKey struct {
	Key   location.AuthorityKey
	After location.StoreVersion
}

// Watches share one store watch among all of a node's waiters on the same
// key and version, so fifty callers waiting for one creation hold one
// Consul blocking query, not fifty connections.
type Watches struct {
	m map[WatchKey][]func(error)
}

// Join adds waiter to k's watch. It reports whether no store watch runs
// for k yet: then the host starts one (bounded by its own timeout, not
// the waiter's) and calls Finish with its outcome.
func (ws *Watches) Join(k WatchKey, waiter func(error)) (start bool) {
	if ws.m == nil {
		ws.m = map[WatchKey][]func(error){}
	}
	w, running := ws.m[k]
	ws.m[k] = append(w, waiter)
	return !running
}

// Finish ends k's store watch, which answered err or ran out its own
// timeout (timedOut): the next Join starts another. It returns the
// waiters, for the host to call with result (outside its own mutex): nil
// when the key moved or the watch timed out — the waiters read again —
// or the store's failure.
func (ws *Watches) Finish(k WatchKey, err error, timedOut bool) (waiters []func(error), result error) {
	waiters = ws.m[k]
	delete(ws.m, k)
	if err != nil && !timedOut {
		result = activation.StoreError("watch "+k.Key.String(), err)
	}
	return waiters, result
}

// Running reports whether a store watch runs for k.
func (ws *Watches) Running(k WatchKey) bool { _, ok := ws.m[k]; return ok }

// WaitExpired is a waiter's error when its own deadline comes first;
// cause, if not nil, says why.
func WaitExpired(key location.AuthorityKey, cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: waiting for %s", roamerr.ErrDeadlineExceeded, key)
	}
	return fmt.Errorf("%w: waiting for %s: %w", roamerr.ErrDeadlineExceeded, key, cause)
}

// Candidate is a serving node a full node may pass an activation on to
// (the placement's candidates, best first).
type Candidate struct {
	RID               string
	Generation        uint64
	DescriptorVersion uint64
}

// PassOn chooses where a node too full for activation a (self, by node
// RID) passes it on: the first candidate that has not refused it yet. It
// returns the envelope to send there and the candidate's index, or -1
// when every candidate has refused it: the activation ends
// CapacityExceeded. Nothing was reserved or queued on the full node, so
// the caller still sees one activation.
func PassOn(a *messages.SpotActivation, self string, candidates []Candidate) (*messages.SpotActivation, int) {
	full := append(slices.Clone(a.GetFullNodeRids()), self)
	for i, c := range candidates {
		if slices.Contains(full, c.RID) {
			continue
		}
		next := proto.Clone(a).(*messages.SpotActivation)
		next.FullNodeRids = full
		next.TargetNodeRid, next.TargetNodeGeneration = c.RID, c.Generation
		next.DescriptorVersion = c.DescriptorVersion
		return next, i
	}
	return nil, -1
}

// Closing is the record an Instance Spot's own close writes over rec (the
// record read): rec in state Closing, or nil when rec is not this
// incarnation's (generation gen, owner) Ready record — the close is Stale.
func Closing(rec *location.Record, gen uint64, owner *messages.Owner) *location.Record {
	if rec.GetObjectGeneration() != gen || !activation.SameOwner(rec.GetOwner(), owner) || rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
		return nil
	}
	closing := proto.Clone(rec).(*location.Record)
	closing.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
	return closing
}

// Settle is what a re-read tells an own close whose Closing write's
// answer never came.
type Settle int

const (
	// SettleRetry: nothing is known yet; read again (paced, within the
	// settling's own bound).
	SettleRetry Settle = iota
	// SettleChanged: the record is no longer this incarnation's; the
	// close is Stale.
	SettleChanged
	// SettleLanded: the Closing write landed; release from the version
	// read.
	SettleLanded
	// SettleFence: still Ready at the write's version; a compare-and-set
	// of the same Ready record there bumps the version so the write in
	// flight can never land (then the close did not happen). A failed
	// fence reads again.
	SettleFence
	// SettleMovedPast: Ready past the write's version without it; the
	// close did not happen.
	SettleMovedPast
)

// SettleClosing decides from v, the record read again, a Closing write
// expected at version by the incarnation gen of owner. Without settling, a
// landed write would leave the record Closing for good under a live
// owner while the incarnation served on.
func SettleClosing(v location.Versioned, version location.StoreVersion, gen uint64, owner *messages.Owner) Settle {
	rec := v.Record
	switch {
	case rec.GetObjectGeneration() != gen || !activation.SameOwner(rec.GetOwner(), owner):
		return SettleChanged
	case rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CLOSING && v.Version != version:
		return SettleLanded
	case rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY && v.Version == version:
		return SettleFence
	case rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY:
		return SettleMovedPast
	}
	return SettleRetry
}

// scanKinds are the kinds the start-up scan lists, in this order.
var scanKinds = [...]location.Kind{location.KindInstanceSpot, location.KindUserSpot}

// Scan is the start-up authority scan's walk (PROTOCOL.md §7.7): every
// page of Instance Spot records, then of User Spot records; of each page
// only the records that need recovery (activation.Recoverable), so the
// common case costs nothing but the listing. Its zero value starts a
// scan.
type Scan struct {
	kind  int
	after string
}

// Next is the page to list next; ok false when the scan is done.
func (s *Scan) Next() (kind location.Kind, page location.PageRequest, ok bool) {
	if s.kind >= len(scanKinds) {
		return 0, location.PageRequest{}, false
	}
	return scanKinds[s.kind], location.PageRequest{Size: location.MaxPageSize, After: s.after}, true
}

// Page takes the page Next asked for and returns its records to recover,
// in the listing's order.
func (s *Scan) Page(p location.Page) []location.Versioned {
	if p.Next == "" {
		s.kind, s.after = s.kind+1, ""
	} else {
		s.after = p.Next
	}
	var out []location.Versioned
	for _, v := range p.Items {
		if activation.Recoverable(v) {
			out = append(out, v)
		}
	}
	return out
}

// PassOnEnv is what passing an activation on needs from its host.
type PassOnEnv interface {
	// ListNodes lists the Mesh's node descriptors (the store's answer).
	ListNodes(mesh string, done func([]location.VersionedNode, error))
	// Candidates orders nodes as the placement does for the activation
	// (spotcall.Candidates: serving, hosting its type, rendezvous order).
	Candidates(nodes []location.VersionedNode, a *messages.SpotActivation) []location.VersionedNode
	// Send sends next to the Spot service of node.
	Send(node location.VersionedNode, next *messages.SpotActivation)
}

// RunPassOn hands an activation a node (self, by node RID) is too full
// for to the first candidate of its Mesh that has not refused it yet
// (PassOn), and reports whether it did; a failed listing passes nothing
// on. The driver and the simulation both run it.
func RunPassOn(env PassOnEnv, a *messages.SpotActivation, self string, done func(passed bool)) {
	env.ListNodes(a.GetTargetMesh(), func(nodes []location.VersionedNode, err error) {
		if err != nil {
			done(false)
			return
		}
		found := env.Candidates(nodes, a)
		cs := make([]Candidate, len(found))
		for i, n := range found {
			cs[i] = Candidate{RID: n.Node.GetNodeRid(), Generation: n.Node.GetNodeGeneration(), DescriptorVersion: uint64(n.Version)}
		}
		next, i := PassOn(a, self, cs)
		if i < 0 {
			done(false)
			return
		}
		env.Send(found[i], next)
		done(true)
	})
}
