package spotcall

import (
	"time"

	"github.com/roamactors/roam/messages"
)

// RoutePolicy is the positive route cache's policy (PROTOCOL.md §7.8):
// which resolves are kept, for how long, and which a sweep drops. The
// Spot driver's cache (internal/spot/cache.go) keeps its routes lock-free
// and the simulation's in its lifecycles; both keep and drop by this.
// A route is also dropped when a call on it ends as Ended or Refused
// say, and (the driver's) while a move or drain drains it.
type RoutePolicy struct {
	// MaxAge is how long a route is used (0: no cache).
	MaxAge time.Duration
}

// Keeps reports whether a resolve is cached: only a Ready authority whose
// owner is alive. Missing, Creating, Closing, an ended owner and store
// failures are never cached, so the next call reads the store again.
func (p RoutePolicy) Keeps(r Resolved) bool {
	return p.MaxAge > 0 && !r.Ended && r.V.Present() && r.V.Record.GetState() == messages.LifecycleState_LIFECYCLE_STATE_READY
}

// TickEvery is a Spot node's one period for its callers: on each tick
// the calls waiting for a reply check their owner's liveness (OwnerGone)
// and the route cache is swept against the live node descriptors
// (OwnerListed), the sweep's listing bounded by one period.
const TickEvery = time.Second

// RoutePut is what a resolve does to the route cache of its Spot ID.
type RoutePut int

const (
	// PutNone: the resolve is not kept (Keeps).
	PutNone RoutePut = iota
	// PutNew: no route is cached; the resolve is.
	PutNew
	// PutSame: the cached route names the resolve's incarnation: it
	// stays, with its age, and the call uses it.
	PutSame
	// PutWait: the cached route is being drained: the call waits for the
	// drain, then reads again.
	PutWait
	// PutDrain: the cached route names another incarnation, and another
	// call may have sent on it since this one read the store: it is
	// drained like a followed route, then the call reads again. Replaced
	// at once, the next call would overtake what the other call sent.
	PutDrain
)

// Put decides what resolve r does to the route cached for its Spot ID
// (cached: one is, aged or not; draining: it is being drained; same: it
// names r's incarnation, the same PID).
func (p RoutePolicy) Put(r Resolved, cached, draining, same bool) RoutePut {
	switch {
	case !p.Keeps(r):
		return PutNone
	case !cached:
		return PutNew
	case draining:
		return PutWait
	case !same:
		return PutDrain
	}
	return PutSame
}

// Aged reports whether a route cached age ago is past its use: the next
// call reads the store.
func (p RoutePolicy) Aged(age time.Duration) bool { return age >= p.MaxAge }

// OwnerListed reports whether a cached route's owner is among the live
// node descriptors (node RID → lease): a route whose owner's node left,
// or came back as another lifecycle, is dropped by the sweep.
func OwnerListed(o *messages.Owner, live map[string]string) bool {
	lease, ok := live[o.GetNodeRid()]
	return ok && lease == o.GetLeaseId()
}

// RouteLost decides whether a cached route must be dropped and the store
// read again before a call is sent on it: a route whose owner's lifecycle
// is over, with the connection to its node ended, can carry nothing, and
// a call sent on it could only end at its deadline with its outcome
// unknown. Only a route whose connection ended (connectionEnded) is
// checked, so a route in use costs no store read; then owner reads the
// owner's liveness (its answer classed by OwnerError) and OwnerGone
// decides. done is called once, from owner's answer or at once.
func RouteLost(connectionEnded bool, owner func(answer func(alive bool, err error)), done func(lost bool)) {
	if !connectionEnded {
		done(false)
		return
	}
	owner(func(alive bool, err error) { done(OwnerGone(alive, err)) })
}
