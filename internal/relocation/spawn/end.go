package spawn

import (
	"errors"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Here is what this node's driver knows of an object's incarnation here
// when a Close or a delete asks to end it.
type Here struct {
	// Present: an incarnation of the object is registered here; the
	// fields below describe it.
	Present bool
	// Pending: none is registered, and yet the object is on its way to
	// serving here: arriving (alone, or as a SpotWide Spot's member whose
	// commit named this node before it opens), taken over (the record
	// names this node before it opens), or moving out past its cutover.
	Pending    bool
	Generation uint64
	// Serving: this node dispatches it; Ended: it no longer serves here
	// at all (it follows to its next owner, or has ended).
	Serving, Ended bool
	// Moving: a move out of it is under way; Activating: a cold
	// activation's recovery pointer is not known gone; Changing: a
	// membership change of it is under way.
	Moving, Activating, Changing bool
}

// AdmitClose decides a CloseLocal of generation of key: nil to mark the
// incarnation closed and end it after the turns it accepted. Unavailable
// while it is being recovered or moves (try again); NotFound when that
// incarnation does not serve here.
func AdmitClose(key location.AuthorityKey, generation uint64, h Here) error {
	switch {
	case !h.Present && h.Pending:
		// Its record may name this node already; closed now, the
		// recovery would open an incarnation with no record.
		return fmt.Errorf("%w: %s is being recovered here", roamerr.ErrUnavailable, key)
	case !h.Present || h.Generation != generation || h.Ended:
		return fmt.Errorf("%w: %s generation %d does not serve here", roamerr.ErrNotFound, key, generation)
	case !h.Serving || h.Moving:
		return fmt.Errorf("%w: %s is moving", roamerr.ErrUnavailable, key)
	}
	return nil
}

// AdmitDelete decides a DeleteActor of key, whose record names this
// node's lifecycle (node, stopping: it takes no new work) at generation:
// close reports whether an incarnation here is to close first (false:
// nothing serves the record here, only the record goes). Unavailable
// while anything else changes it; the caller may try again.
func AdmitDelete(key location.AuthorityKey, generation uint64, h Here, node string, stopping bool) (close bool, err error) {
	switch {
	case !h.Present && h.Pending:
		return false, fmt.Errorf("%w: %s is moving or being recovered", roamerr.ErrUnavailable, key)
	case stopping:
		return false, fmt.Errorf("%w: node %s is stopping", roamerr.ErrUnavailable, node)
	case !h.Present:
		return false, nil
	case h.Generation != generation:
		return false, fmt.Errorf("%w: %s changed while it was read; try again", roamerr.ErrUnavailable, key)
	case !h.Serving || h.Moving || h.Activating || h.Changing:
		return false, fmt.Errorf("%w: %s is moving, or its membership is changing", roamerr.ErrUnavailable, key)
	}
	return true, nil
}

// Delete judges the store's answers to the delete of a member's record
// whose incarnation on this node has closed (or never served here): the
// record goes with its place in its User Spot's count and its capacity
// slot, in one transaction, tried again past conflicts with other changes
// of the Spot's count and past store faults until it lands, the record
// is another incarnation's or owner's, or the node stops. A record left
// Ready with nothing serving it would be an object nobody can reach, move
// or drain.
type Delete struct {
	Key location.AuthorityKey
	// Owner is this node's lifecycle as the record names it.
	Owner *messages.Owner
	// At is the record as last read: the delete is at its version.
	At location.Versioned

	// indeterminate: a try may have landed (its answer was unknown).
	indeterminate bool
	// last is the last try's failure.
	last error
	done bool
	err  error
}

// DeleteStep is what a record delete does next.
type DeleteStep int

const (
	// Deleted: the try deleted the record (At).
	Deleted DeleteStep = iota
	// Reread: the try conflicted: read the Actor's record again (Reread).
	Reread
	// Retry: try again after Pause.
	Retry
	// Over: nothing of the incarnation is left to delete, or it is not
	// this node's: Result.
	Over
)

// Wrote judges the answer err to a try of the delete.
func (x *Delete) Wrote(err error) DeleteStep {
	switch {
	case err == nil:
		return Deleted
	case errors.Is(err, location.ErrConflict):
		// The Spot's count moved (another member joined or left), or the
		// record did.
		x.last = err
		return Reread
	}
	x.failed(err)
	return Retry
}

// Reread judges the Actor's record read again as cur (found: there is
// one; rerr: the read failed) after a try conflicted.
func (x *Delete) Reread(cur location.Versioned, found bool, rerr error) DeleteStep {
	if rerr != nil {
		x.failed(rerr)
		return Retry
	}
	switch handoff.DeleteReread(x.At, cur, found, x.Owner) {
	case handoff.DeleteGone:
		// Deleted by this delete only if one of its tries may have
		// landed; otherwise another writer removed it.
		x.done = x.indeterminate
		return Over
	case handoff.DeleteNotOurs:
		x.err = fmt.Errorf("%w: %s is not owned by this node", roamerr.ErrNotFound, x.Key)
		return Over
	}
	x.At = cur
	x.indeterminate = x.indeterminate || errors.Is(x.last, location.ErrIndeterminate)
	return Retry
}

func (x *Delete) failed(err error) {
	x.last = err
	x.indeterminate = x.indeterminate || errors.Is(err, location.ErrIndeterminate)
}

// Pause is the pause before try (from 0) again (handoff.DeletePause,
// drawn from intN); warn: a store fault failed it (worth a warning, with
// Err), not a lost race.
func (x *Delete) Pause(try int, intN func(n int) int) (pause time.Duration, warn bool) {
	return handoff.DeletePause(try, x.last, intN)
}

// Err is the last try's failure.
func (x *Delete) Err() error { return x.last }

// Result is the delete's outcome once Over: whether this incarnation's
// record was deleted, or why it is not this node's to delete.
func (x *Delete) Result() (deleted bool, err error) { return x.done, x.err }

// Stopped is the delete's outcome when node stopped before it landed:
// the record is then an ended owner's object, released as such.
func (x *Delete) Stopped(node string) error {
	return fmt.Errorf("%w: delete %s: node %s has stopped: %v", roamerr.ErrUnavailable, x.Key, node, x.last)
}
