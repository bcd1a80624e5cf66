package activation

import (
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Event is an input to a machine: the answer to an effect, or a timer.
// Answers that time matters for carry Now, the driver's clock when the
// answer came; the machines read no clock of their own.
type Event interface{ isEvent() }

// Start is a SpotActivation (route kind 2) as it reached this node, with what
// the driver found out about it before the machine runs.
type Start struct {
	// Envelope is the activation envelope.
	Envelope *messages.SpotActivation
	// First is the first message, decoded from Envelope.First.
	First any
	// IDErr is the Spot ID's validation error, if it is not a valid ID.
	IDErr error
	// FirstErr is why Envelope.First could not be decoded, if it could not.
	FirstErr error
	// Kind is what this node knows of Envelope.StableType.
	Kind Kind
	// Now is when the envelope is handled.
	Now time.Time
}

// Recover is one record of the start-up authority scan (docs/PROTOCOL.md §7.7).
type Recover struct {
	// Scanned is the record as the scan listed it.
	Scanned location.Versioned
	// Kind is what this node knows of the record's stable type.
	Kind Kind
	// Deadline bounds the scan (zero: none).
	Deadline time.Time
	// Now is when the record is looked at.
	Now time.Time
}

// Authority is what a read of a Spot ID's authority found: the record
// under the Instance or the User key (Present false: Missing, under the
// Instance key), and its owner's liveness.
type Authority struct {
	Versioned location.Versioned
	// Address is the owner's remote address, when its lifecycle is alive.
	Address string
	// OwnerEnded: the owner's lease or lifecycle ended (PROTOCOL.md §3.4).
	OwnerEnded bool
	// Hosted: this node has an incarnation of the record's key and
	// generation (serving, moving out, or arriving). The machine reads it
	// only for a record that names this node, so a driver may leave it
	// false for any other.
	Hosted bool
}

// Activation and recovery answers.
type (
	// KeyLocked: this node's work on the Spot ID is now this machine's
	// alone (LockKey).
	KeyLocked struct{ Now time.Time }
	// AuthorityRead answers ReadAuthority. Err is already classified
	// (a roamerr class).
	AuthorityRead struct {
		Authority Authority
		Err       error
		Now       time.Time
	}
	// Watched answers Watch: the key moved past the version, or the
	// shared watch timed out (nil), or Err (already classified).
	Watched struct {
		Err error
		Now time.Time
	}
	// CapacityAdmitted answers AdmitCapacity; with nil Err this node holds
	// one creation slot until ReleaseCapacity.
	CapacityAdmitted struct{ Err error }
	// RootPut answers PutRoot.
	RootPut struct {
		Ref location.RootRef
		Err error
	}
	// RootGot answers GetRoot: the stored reference and, decoded, the
	// stored activation's operation and first message. Err is the store's
	// error; DecodeErr that the root is no activation envelope; FirstErr
	// that its first message could not be decoded.
	RootGot struct {
		Ref       location.RootRef
		Operation string
		First     any
		Err       error
		DecodeErr error
		FirstErr  error
	}
	// WriteAnswered answers Reserve and CompareAndSet: the new version, or
	// the store's error (location.ErrConflict, ErrIndeterminate, …).
	// CheckpointStored: a Reserve with NoCheckpoint was refused by that
	// check alone (a *ConflictError naming it): nothing of it applied.
	WriteAnswered struct {
		Version          location.StoreVersion
		Err              error
		Now              time.Time
		CheckpointStored bool
	}
	// RecordRead answers ReadRecord (a consistent read).
	RecordRead struct {
		Record location.Versioned
		Err    error
		Now    time.Time
	}
	// Staged answers Stage.
	Staged struct{ Err error }
	// CheckpointClaimed answers ClaimCheckpoint: the state to restore
	// (Restore false: none stored; the incarnation starts from its
	// producer).
	CheckpointClaimed struct {
		State   []byte
		Restore bool
		Err     error
	}
	// Opened answers Open.
	Opened struct{ Err error }
	// AbortAnswered answers AbortReservation.
	AbortAnswered struct{ Err error }
	// Deleted answers Delete.
	Deleted struct {
		Err error
		Now time.Time
	}
	// OwnerRead answers ReadOwner. Err is already classified.
	OwnerRead struct {
		Alive bool
		Err   error
	}
	// PassedOn answers PassOn: OK if another candidate took the envelope.
	PassedOn struct{ OK bool }
	// LocalClosed answers CloseLocal.
	LocalClosed struct{ Err error }
)

// TimerFired: a timer started with StartTimer fired.
type TimerFired struct {
	Timer Timer
	Now   time.Time
}

func (KeyLocked) isEvent()         {}
func (AuthorityRead) isEvent()     {}
func (Watched) isEvent()           {}
func (CapacityAdmitted) isEvent()  {}
func (RootPut) isEvent()           {}
func (RootGot) isEvent()           {}
func (WriteAnswered) isEvent()     {}
func (RecordRead) isEvent()        {}
func (Staged) isEvent()            {}
func (Opened) isEvent()            {}
func (AbortAnswered) isEvent()     {}
func (Deleted) isEvent()           {}
func (OwnerRead) isEvent()         {}
func (PassedOn) isEvent()          {}
func (LocalClosed) isEvent()       {}
func (TimerFired) isEvent()        {}
func (CheckpointClaimed) isEvent() {}
