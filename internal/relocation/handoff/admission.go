package handoff

import (
	"fmt"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// PrepareFacts is what a node knows when a Restore request of a new
// identity arrives (PROTOCOL.md §5.7). Ticket and Admit have effects (a
// ticket is consumed, a Join is counted): AdmitPrepare asks them only once
// every earlier check passed, in its order.
type PrepareFacts struct {
	// LeaseValid: the node's owner lease is provably in force.
	LeaseValid bool
	// Leaving: the node is draining or stopping.
	Leaving bool
	// IdentityValid: the identity has a RelocationId and an attempt.
	IdentityValid bool
	// FromSource: the request came from the node it names as its source.
	FromSource bool
	// Ticket takes the request's move ticket: false when there is none
	// for its source.
	Ticket func() bool
	// Movable: the object's key is valid and of a kind that moves;
	// Registered: its stable type is registered here.
	Movable, Registered bool
	// Admit checks the Join and the SpotWide members the request names
	// (nil: it names none); a refusal's reason and why.
	Admit func() (messages.FailureReason, error)
	// Earlier is the phase of an earlier, unfinished arrival of the same
	// object into this node (0: none).
	Earlier Phase
}

// PrepareVerdict is AdmitPrepare's answer: refuse the request with Reason
// and Detail (NoTicket: the sender was not entitled to send it), or
// accept it, removing the earlier arrival first when Supersede.
type PrepareVerdict struct {
	Refuse    bool
	Reason    messages.FailureReason
	Detail    string
	NoTicket  bool
	Supersede bool
}

func refusePrepare(reason messages.FailureReason, detail string) PrepareVerdict {
	return PrepareVerdict{Refuse: true, Reason: reason, Detail: detail}
}

// AdmitPrepare decides whether a node takes a Restore request. A fenced
// node's move could never commit; a leaving one would have to send it
// away again (the source's capability answer may predate the drain,
// PROTOCOL.md §5.2). Newest prepare wins (PROTOCOL.md §5.7): two prepares
// never share the object's temporary queue, so an earlier arrival still
// restoring is superseded (its source serves again), while one past
// relay-ready is irreversible and the newer is refused.
func AdmitPrepare(f PrepareFacts) PrepareVerdict {
	switch {
	case !f.LeaseValid:
		return refusePrepare(messages.FailureReason_FAILURE_REASON_STALE, "the target node's owner lease is not in force")
	case f.Leaving:
		return refusePrepare(messages.FailureReason_FAILURE_REASON_NODE_DRAINING, "the target node is draining or stopping")
	case !f.IdentityValid:
		return refusePrepare(messages.FailureReason_FAILURE_REASON_CONFLICT, "relocation identity has a zero id or attempt")
	case !f.FromSource:
		return refusePrepare(messages.FailureReason_FAILURE_REASON_CONFLICT, "Restore request not sent by its source node")
	case f.Ticket != nil && !f.Ticket():
		v := refusePrepare(messages.FailureReason_FAILURE_REASON_STALE, "Restore request not admitted: no valid move ticket")
		v.NoTicket = true
		return v
	case !f.Movable:
		return refusePrepare(messages.FailureReason_FAILURE_REASON_UNSUPPORTED, "object is not an Actor, Instance Spot or User Spot")
	case !f.Registered:
		return refusePrepare(messages.FailureReason_FAILURE_REASON_UNSUPPORTED, "stable type not registered here")
	}
	if f.Admit != nil {
		if reason, err := f.Admit(); err != nil {
			return refusePrepare(reason, err.Error())
		}
	}
	switch f.Earlier {
	case 0:
		return PrepareVerdict{}
	case TargetRestoring:
		return PrepareVerdict{Supersede: true}
	}
	return refusePrepare(messages.FailureReason_FAILURE_REASON_STALE, "an earlier move of this object into this node is past relay-ready")
}

// StartFacts is what a node knows when asked to move an object away
// (Relocate), before anything is sent.
type StartFacts struct {
	// Lease is why the node may not serve (nil: it may): its lifecycle
	// ended, or its owner lease is not in force; a typed error, returned
	// as it is.
	Lease error
	// Owned: an incarnation of the object is this node's. Serving: it
	// serves (not arriving, leaving or ended). Moving: a move of it
	// started and has not ended.
	Owned, Serving, Moving bool
	// TargetIsSelf: the target is this node.
	TargetIsSelf bool
	// Changing: a membership change of the object is in flight.
	Changing bool
	// SpotWideSpot names the SpotWide User Spot, on this node, the object
	// is a member of ("": none); such a member moves only with its Spot.
	SpotWideSpot string
}

// RefuseStart is why a move of key to target must not start (nil: it
// may), checked in this order: the node's lifecycle and lease, then the
// object.
func RefuseStart(f StartFacts, key location.AuthorityKey, target string) error {
	switch {
	case f.Lease != nil:
		return f.Lease
	case !f.Owned:
		return fmt.Errorf("%w: %s is not owned by this node", roamerr.ErrNotFound, key)
	case !f.Serving || f.Moving:
		// Moving: a move that has not sealed yet (capability check,
		// budget) still leaves the object serving; a second one must not
		// start.
		return fmt.Errorf("%w: %s is already moving", roamerr.ErrUnavailable, key)
	case f.TargetIsSelf:
		return fmt.Errorf("%w: %s is already on node %s", roamerr.ErrInvalidOperation, key, target)
	case f.Changing:
		return fmt.Errorf("%w: %s is changing its membership", roamerr.ErrUnavailable, key)
	case f.SpotWideSpot != "":
		// Also for a Join into another Spot: past relay-ready a Join the
		// target no longer admits commits without it, which would leave
		// a SpotWide member away from its Spot. It leaves first.
		return fmt.Errorf("%w: %s is a member of the SpotWide User Spot %q on this node and moves with it (LeaveSpot first to move it alone or join another Spot)", roamerr.ErrInvalidOperation, key, f.SpotWideSpot)
	}
	return nil
}

// Attribution is whose a control message of a move is.
type Attribution int

const (
	// OtherRun: it names another move; the run ignores it.
	OtherRun Attribution = iota
	// ThisRun: the run steps it.
	ThisRun
	// WrongPeer: it names the run but came from another node than the
	// move's other side (or from no node); it is refused.
	WrongPeer
)

// Attribute attributes a control message naming identity got, sent from
// address from ("" when it has no sender), to the run of identity id
// whose other side is at peer: by identity and connection only
// (PROTOCOL.md §5.7), never by what else the message claims.
func Attribute(id Identity, peer string, got Identity, from string) Attribution {
	switch {
	case got != id:
		return OtherRun
	case from == "" || from != peer:
		return WrongPeer
	}
	return ThisRun
}
