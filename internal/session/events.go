package session

import (
	"time"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/internal/relocation/handoff"
)

// Event is an input to the Owner.
type Event interface{ isEvent() }

// Events from the Session's own node (the client side and the driver).
type (
	// OpenSession: a client connected.
	OpenSession struct{ Session ID }
	// CloseSession: the client disconnected, or the node closes it; Err is
	// what its held requests end with.
	CloseSession struct {
		Session ID
		Err     error
	}
	// Bind: Actor, whose incarnation runs at Route, is bound to the
	// Session.
	Bind struct {
		Session ID
		Actor   string
		Route   Route
	}
	// Unbind: the Actor is no longer bound (deleted).
	Unbind struct {
		Session ID
		Actor   string
	}
	// Client: a client message for the bound Actor, in the client's order.
	// RouteDown: the driver knows the binding's route unreachable now (its
	// node's connection ended, or the node's lifecycle ended): whatever is
	// sent there is lost without a word (Proto.Actor drops it).
	Client struct {
		Session   ID
		Actor     string
		Item      Item
		RouteDown bool
	}
	// Resolved: where the store says the bound Actor serves now (its
	// record's owner and generations), and whether that owner is alive:
	// the answer to a Resolve, or to a recovering node's word.
	Resolved struct {
		Session ID
		Actor   string
		Route   Route
		Alive   bool
	}
	// SealExpired: the seal timer of Move fired.
	SealExpired struct {
		Session ID
		Actor   string
		Move    handoff.Identity
	}
)

// Commands of a hand-off (docs/SESSIONS.md §2). From is the sending node's
// address as the transport vouches for it.
type (
	// SealRequest is command 42, from the source.
	SealRequest struct {
		From    string
		Session ID
		Actor   string
		Move    handoff.Identity
		Source  Route
	}
	// RouteUpdate is command 43, from the target, one-way.
	RouteUpdate struct {
		From    string
		Session ID
		Actor   string
		Move    handoff.Identity
		Target  Route
	}
	// Abort is command 44, from the source once it serves again, one-way.
	Abort struct {
		From    string
		Session ID
		Actor   string
		Move    handoff.Identity
	}
)

func (OpenSession) isEvent()  {}
func (CloseSession) isEvent() {}
func (Bind) isEvent()         {}
func (Unbind) isEvent()       {}
func (Client) isEvent()       {}
func (SealExpired) isEvent()  {}
func (Resolved) isEvent()     {}
func (SealRequest) isEvent()  {}
func (RouteUpdate) isEvent()  {}
func (Abort) isEvent()        {}

// Effect is something the Owner asks its driver to do, in order.
type Effect interface{ isEffect() }

type (
	// Deliver: send the client message to the incarnation at Route.
	Deliver struct {
		Session ID
		Actor   string
		Route   Route
		Item    Item
	}
	// Refuse: the client message goes nowhere; its sender gets Err (a
	// request its error, a push an error on the client's send).
	Refuse struct {
		Session ID
		Item    Item
		Err     error
	}
	// Resolve: look up, in the store, where the bound Actor serves now and
	// answer Resolved; After (zero: at once) is a pause before the look.
	Resolve struct {
		Session ID
		Actor   string
		After   time.Duration
	}
	// Recovered: the bound Actor serves again at a new route after its
	// owner ended (not by a move of this Session's seal): what the client
	// sent it before may have been lost with the ended owner. Tell the
	// client.
	Recovered struct {
		Session ID
		Actor   string
		Route   Route
	}
	// Reject: the local call (OpenSession, Bind) failed with Err.
	Reject struct{ Err error }
	// ReplySeal: answer command 42 at To: sealed (nil Err) or a refusal.
	ReplySeal struct {
		To      string
		Session ID
		Actor   string
		Move    handoff.Identity
		Err     error
	}
	// StartSealTimer: fire SealExpired for Move After from now.
	StartSealTimer struct {
		Session ID
		Actor   string
		Move    handoff.Identity
		After   time.Duration
	}
	// StopSealTimer: the seal of Move is released; its timer need not fire
	// (a fire already on its way is ignored anyway).
	StopSealTimer struct {
		Session ID
		Actor   string
		Move    handoff.Identity
	}
	// Closed: the Session is cleared; close the client's connection with
	// Err.
	Closed struct {
		Session ID
		Err     error
	}
	// Log: a structured log line with its event name.
	Log struct {
		Level   loglevel.Level
		Event   string
		Msg     string
		Session ID
		Actor   string
		Move    handoff.Identity
	}
)

func (Deliver) isEffect()        {}
func (Resolve) isEffect()        {}
func (Recovered) isEffect()      {}
func (Refuse) isEffect()         {}
func (Reject) isEffect()         {}
func (ReplySeal) isEffect()      {}
func (StartSealTimer) isEffect() {}
func (StopSealTimer) isEffect()  {}
func (Closed) isEffect()         {}
func (Log) isEffect()            {}
