package spotcall

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// OwnersActivation is the SpotActivation a ToOwner plan sends the live owner of
// the Creating or Closing record rec (Complete fills in the rest).
func OwnersActivation(rec *location.Record) *messages.SpotActivation {
	o := rec.GetOwner()
	return &messages.SpotActivation{
		TargetMesh: o.GetMesh(), TargetNodeRid: o.GetNodeRid(),
		TargetNodeGeneration: o.GetNodeGeneration(), StableType: rec.GetStableType(),
	}
}

// Complete names in act (route kind 2) the call's operation, Spot ID and
// deadline and the calling node's lifecycle, whose node answers for the
// first message (act.First, set by the host when it sends).
func Complete(act *messages.SpotActivation, op, spotID string, deadline time.Time, sourceRid string, sourceGen uint64) {
	act.OperationId = op
	act.RouteKind = 2
	act.SpotId = spotID
	act.DeadlineUnixNanos = deadline.UnixNano()
	act.SourceNodeRid = sourceRid
	act.SourceNodeGeneration = sourceGen
	act.HasMetadata = true
}

// End is how a call's wait for its answer ended without an answer.
type End int

const (
	// DeadLetter: the target had no such process; the route is stale.
	DeadLetter End = iota + 1
	// TimedOut: the call's deadline passed with no answer.
	TimedOut
	// Cancelled: the caller cancelled before the answer.
	Cancelled
	// ConnectionLost: the connection to the asked node was lost;
	// Proto.Actor drops what was in flight on it (PROTOCOL.md §4.1).
	ConnectionLost
	// OwnerLeft: the owner's lifecycle ended in the store while the
	// answer was awaited (the transport drops what was in flight to a
	// node that left).
	OwnerLeft
)

// Ended is what a call that was sent (and is never resent elsewhere:
// PROTOCOL.md §7.4) returns when its wait ended by e: its typed error,
// and whether its cached route is dropped. notice: it waited for a
// send's dispatch notice, not a reply; address names the asked node;
// cause is the context's error of a Cancelled wait.
func Ended(spotID string, e End, notice bool, address string, cause error) (err error, drop bool) {
	switch e {
	case DeadLetter:
		return fmt.Errorf("%w: the route to Spot %q is stale", roamerr.ErrStale, spotID), true
	case TimedOut:
		if notice {
			return fmt.Errorf("%w: the send to Spot %q was not confirmed dispatched by its deadline; it may or may not run", roamerr.ErrDeadlineExceeded, spotID), false
		}
		return fmt.Errorf("%w: no reply from Spot %q", roamerr.ErrDeadlineExceeded, spotID), false
	case Cancelled:
		return fmt.Errorf("%w: the call to Spot %q ended before its answer (%w); it may or may not have run", roamerr.ErrDeadlineExceeded, spotID, cause), false
	case ConnectionLost:
		return fmt.Errorf("%w: the connection to %s was lost; the call to Spot %q may or may not have run", roamerr.ErrUnavailable, address, spotID), true
	case OwnerLeft:
		return fmt.Errorf("%w: the owner of Spot %q left; the call may or may not have run", roamerr.ErrUnavailable, spotID), true
	}
	return fmt.Errorf("%w: the call to Spot %q ended unknown way %d", roamerr.ErrUnavailable, spotID, int(e)), false
}

// Refused is whether a typed failure the system answered (a delivery
// error) drops the call's cached route: a stale route, an owner that
// cannot serve it, a kind or type that is not the stored one. Other
// failures (NotFound from a live owner, DeadlineExceeded of a queued
// request, CapacityExceeded) say nothing against the route.
func Refused(err error) (drop bool) {
	return errors.Is(err, roamerr.ErrStale) || errors.Is(err, roamerr.ErrUnavailable) || errors.Is(err, roamerr.ErrTypeMismatch)
}
