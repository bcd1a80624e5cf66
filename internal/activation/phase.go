// Package activation holds the pure machines of one Spot ID's authority
// on this node (docs/PROTOCOL.md §7.5–§7.7, §7.9, §7.10): events in, a
// phase and effects out. They have no goroutines, no clock and no network;
// time is an input (the Now of an answer, a fired timer). The Spot
// manager's driver runs the effects against the Location Store, the
// Relocation Store and the relocation driver and feeds the answers back,
// the way the hand-off machines of internal/relocation/handoff are run.
//
//   - Activation: a SpotActivation (cold activation) on its target, from the
//     authority read to the first message dispatched, forwarded, passed on
//     or refused; and, started with NewRecovery, the start-up scan's
//     handling of one record (an interrupted activation resumed, an ended
//     owner's User Spot reservation released).
//   - Write: one store write whose outcome is decided — an indeterminate
//     answer is settled by consistent re-reads looking for the write's own
//     mark, bounded by the deadline. The other machines embed it; the
//     driver also runs it alone for the User Spot paths.
//   - Clear: the removal of a recovery pointer once the first handler
//     returned (PROTOCOL.md §7.5 step 12), with back-off, given up after a
//     bound.
//   - Release: a close after its Closing write (PROTOCOL.md §7.9):
//     the local close, then the authority's release with the same fence,
//     or the revert of a Spot found moving.
package activation

import "fmt"

// Phase is where a machine is.
type Phase int

// Activation phases.
const (
	// Locking: waiting for this node's other work on the Spot ID.
	Locking Phase = iota + 1
	// Resolving: the authority is being read.
	Resolving
	// Watching: Creating or Closing under a live owner; waiting for the
	// record to change, then reading again.
	Watching
	// Admitting: asking for a creation slot on this node.
	Admitting
	// StoringRoot: the activation envelope is being stored as the
	// recovery root.
	StoringRoot
	// Reserving: Missing (or an ended owner's record) → Creating, with the
	// recovery receipt, in one transaction.
	Reserving
	// ReadingRoot: an interrupted activation's recovery root is read.
	ReadingRoot
	// TakingOver: the interrupted activation's record is written with
	// this node as owner and the next owner generation.
	TakingOver
	// DroppingPointer: the root is gone; the recovery pointer is removed
	// and the authority read again.
	DroppingPointer
	// Staging: the incarnation is spawned with dispatch held.
	Staging
	// Committing: Ready is committed over the reservation.
	Committing
	// SettlingCommit: the Ready commit's outcome stayed unknown until the
	// deadline; re-read (past it) until it is known to have landed, or a
	// compare-and-set of the reservation fences it out.
	SettlingCommit
	// Opening: dispatch opens with the first messages at the head.
	Opening
	// Aborting: the reservation is released with its fence before the
	// activation fails.
	Aborting
	// PassingOn: this node is full; another candidate is asked.
	PassingOn
	// CheckingOwner: (recovery) is the record's owner alive?
	CheckingOwner
	// Rereading: (recovery) the record is read again under the key lock.
	Rereading
	// ReleasingReservation: (recovery) an ended owner's User Spot
	// reservation is deleted with its fence.
	ReleasingReservation
	// ClaimingCheckpoint: the object's last checkpoint is read and taken
	// over for this incarnation (a kind that checkpoints), before it is
	// staged with that state.
	ClaimingCheckpoint

	// Activated: the Spot serves here with the first messages at the head.
	Activated
	// Forwarded: the first message went to the current Ready owner.
	Forwarded
	// HandedOn: another candidate took the envelope.
	HandedOn
	// Failed: the activation (or recovery) failed; Err says why.
	Failed
	// Untouched: (recovery) nothing for this node to do.
	Untouched
	// ReservationReleased: (recovery) the ended owner's User Spot
	// reservation is gone.
	ReservationReleased
)

// Clear phases.
const (
	// ClearReading: the record is read.
	ClearReading Phase = iota + 100
	// ClearWriting: the record is written without its pointer.
	ClearWriting
	// ClearWaiting: a read or write failed; waiting to try again.
	ClearWaiting
	// PointerCleared: the pointer is gone (or the record moved on to
	// another activation); the root was deleted.
	PointerCleared
	// PointerLeftToRelease: the Spot is closing; its release removes
	// record and root together.
	PointerLeftToRelease
	// ClearGaveUp: the bound passed (or this lifecycle's lease ended); the
	// pointer stays.
	ClearGaveUp
)

// Release phases.
const (
	// ClosingLocal: the local incarnation handles what it accepted and
	// stops.
	ClosingLocal Phase = iota + 200
	// Reverting: the Spot turned out to be moving; its record goes back
	// to Ready.
	Reverting
	// ReleaseReading: the Closing record is read.
	ReleaseReading
	// ReleaseDeleting: the Closing record is deleted with its version.
	ReleaseDeleting
	// ReleaseWaiting: a read or delete failed; waiting to try again.
	ReleaseWaiting
	// AuthorityReleased: the record is gone.
	AuthorityReleased
	// CloseReverted: the close ended Unavailable (the Spot is moving).
	CloseReverted
	// ReleaseFailed: the record changed under the close, or the bound
	// passed.
	ReleaseFailed
)

var phaseNames = map[Phase]string{
	Locking:              "Locking",
	Resolving:            "Resolving",
	Watching:             "Watching",
	Admitting:            "Admitting",
	StoringRoot:          "StoringRoot",
	Reserving:            "Reserving",
	ReadingRoot:          "ReadingRoot",
	TakingOver:           "TakingOver",
	DroppingPointer:      "DroppingPointer",
	Staging:              "Staging",
	Committing:           "Committing",
	SettlingCommit:       "SettlingCommit",
	Opening:              "Opening",
	Aborting:             "Aborting",
	PassingOn:            "PassingOn",
	CheckingOwner:        "CheckingOwner",
	Rereading:            "Rereading",
	ReleasingReservation: "ReleasingReservation",
	ClaimingCheckpoint:   "ClaimingCheckpoint",
	Activated:            "Activated",
	Forwarded:            "Forwarded",
	HandedOn:             "HandedOn",
	Failed:               "Failed",
	Untouched:            "Untouched",
	ReservationReleased:  "ReservationReleased",
	ClearReading:         "ClearReading",
	ClearWriting:         "ClearWriting",
	ClearWaiting:         "ClearWaiting",
	PointerCleared:       "PointerCleared",
	PointerLeftToRelease: "PointerLeftToRelease",
	ClearGaveUp:          "ClearGaveUp",
	ClosingLocal:         "ClosingLocal",
	Reverting:            "Reverting",
	ReleaseReading:       "ReleaseReading",
	ReleaseDeleting:      "ReleaseDeleting",
	ReleaseWaiting:       "ReleaseWaiting",
	AuthorityReleased:    "AuthorityReleased",
	CloseReverted:        "CloseReverted",
	ReleaseFailed:        "ReleaseFailed",
}

func (p Phase) String() string {
	if n, ok := phaseNames[p]; ok {
		return n
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// Terminal reports whether p ends its machine.
func (p Phase) Terminal() bool {
	switch p {
	case Activated, Forwarded, HandedOn, Failed, Untouched, ReservationReleased,
		PointerCleared, PointerLeftToRelease, ClearGaveUp,
		AuthorityReleased, CloseReverted, ReleaseFailed:
		return true
	}
	return false
}
