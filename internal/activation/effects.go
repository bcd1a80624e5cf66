package activation

import (
	"time"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Effect is something a machine asks its driver to do. Effects of one Step
// run in the order returned; an effect documented with an answer is
// answered by exactly that event, and a machine has at most one such
// effect outstanding.
type Effect interface{ isEffect() }

// Timer names the timers the machines use.
type Timer int

const (
	// TimerDeadline: the operation's deadline (the activation's, or the
	// bound of a recovery pointer's removal or of a close's release).
	TimerDeadline Timer = iota + 1
	// TimerSettle: the pause before the next re-read that settles an
	// indeterminate write.
	TimerSettle
	// TimerRetry: the pause before the next attempt after a failed read or
	// write (pointer removal, release).
	TimerRetry
)

func (t Timer) String() string {
	switch t {
	case TimerDeadline:
		return "deadline"
	case TimerSettle:
		return "settle"
	case TimerRetry:
		return "retry"
	}
	return "timer?"
}

// Store and Relocation Store effects.
type (
	// ReadAuthority: read the Spot ID's authority under both Spot keys and
	// its owner's liveness; answer AuthorityRead.
	ReadAuthority struct{ SpotID string }
	// Watch: wait until Key moves past After (a shared watch that may end
	// early); answer Watched.
	Watch struct {
		Key   location.AuthorityKey
		After location.StoreVersion
	}
	// PutRoot: store the activation envelope as the recovery root RootKey
	// in the Relocation Store; answer RootPut. The driver may answer with
	// the reference alone and leave the write to the Reserve that follows,
	// in its transaction (location.OpCreateRoot): the root then exists
	// exactly when the reservation does.
	PutRoot struct{ RootKey string }
	// GetRoot: read and decode the recovery root RootKey; answer RootGot.
	GetRoot struct{ RootKey string }
	// Reserve: one transaction that writes Record at Key (created if
	// Expected is 0, else by compare-and-set on Expected) and checks that
	// the same ID under Other is absent (docs/PROTOCOL.md §7.5 step 9); answer
	// WriteAnswered with the Record's new version.
	// Replaced is the record at Expected, if any: a capacity slot it
	// names is freed in the same transaction; OwnerCapacity is the
	// capacity of Record's owner node when that is another node (a
	// remote creation's reservation takes a pending slot there;
	// PROTOCOL.md §7.12).
	// NoCheckpoint: the transaction also checks that Key has no
	// checkpoint (location.OpCheckNoCheckpoint); a failure of that check
	// alone is answered WriteAnswered.CheckpointStored.
	Reserve struct {
		Key           location.AuthorityKey
		Expected      location.StoreVersion
		Record        *location.Record
		Other         location.Kind
		Replaced      *location.Record
		OwnerCapacity uint32
		NoCheckpoint  bool
	}
	// CompareAndSet: write Record over Key at Expected; answer
	// WriteAnswered.
	// Settle: past the operation's deadline (a settling call has a
	// timeout of its own).
	// Replaced: as for Reserve (a take-over's previous record).
	// DeleteRoot: also delete that recovery root in the same transaction
	// (location.OpDeleteRoot; a recovery pointer's removal).
	CompareAndSet struct {
		Key        location.AuthorityKey
		Expected   location.StoreVersion
		Record     *location.Record
		Settle     bool
		Replaced   *location.Record
		DeleteRoot string
	}
	// ReadRecord: a consistent read of Key; answer RecordRead. Settle: as
	// for CompareAndSet.
	ReadRecord struct {
		Key    location.AuthorityKey
		Settle bool
	}
	// AbortReservation: delete the reservation this node made at Version
	// (its fence), with a timeout of its own: the operation's deadline may
	// be spent. Answer AbortAnswered.
	// Record is the record at Version: the capacity slot it names is
	// freed in the same transaction (PROTOCOL.md §7.12).
	AbortReservation struct {
		Key     location.AuthorityKey
		Version location.StoreVersion
		Record  *location.Record
	}
	// Delete: delete Key at Version (Record, whose capacity slot goes
	// too); answer Deleted.
	Delete struct {
		Key     location.AuthorityKey
		Version location.StoreVersion
		Record  *location.Record
	}
	// DeleteRoot: delete a Relocation Store root, with a timeout of its
	// own; a failure is the driver's to log (root_delete_failed). No
	// answer.
	DeleteRoot struct{ RootKey string }
	// ReadOwner: is Owner's lifecycle alive? Answer OwnerRead.
	ReadOwner struct{ Owner *messages.Owner }
)

// Node effects.
type (
	// LockKey: wait for this node's other work on SpotID (closes,
	// recoveries, earlier activations) and hold the ID until UnlockKey;
	// answer KeyLocked.
	LockKey struct{ SpotID string }
	// UnlockKey: let this node's other work on the Spot ID go on.
	UnlockKey struct{}
	// AdmitCapacity: take one creation slot if this node has room; answer
	// CapacityAdmitted.
	AdmitCapacity struct{}
	// ReleaseCapacity: give the creation slot back (once open, the
	// incarnation counts as serving).
	ReleaseCapacity struct{}
	// ClaimCheckpoint: take the object's last checkpoint over for the
	// incarnation with Generation and OwnerGeneration, so no capture of
	// an earlier incarnation replaces it afterwards (docs/FAULTS.md,
	// "Checkpoints and recovery"); answer CheckpointClaimed.
	ClaimCheckpoint struct {
		Key             location.AuthorityKey
		StableType      string
		Generation      uint64
		OwnerGeneration uint64
	}
	// Stage: spawn the incarnation with dispatch held (the activation
	// barrier of PROTOCOL.md §7.5 steps 10–11), and give it State when
	// Restore (a claimed checkpoint's); answer Staged. NoCheckpoint: the
	// reservation proved that no checkpoint of Key is stored (nothing was
	// claimed), so the incarnation's first capture creates one without
	// reading.
	Stage struct {
		Key             location.AuthorityKey
		StableType      string
		Generation      uint64
		OwnerGeneration uint64
		State           []byte
		Restore         bool
		NoCheckpoint    bool
	}
	// DiscardStaged: remove the staged incarnation; what waited in its
	// queue is answered Unavailable.
	DiscardStaged struct{}
	// Open: make the staged incarnation serve, with Messages first in
	// that order; once the handler of the message of FirstOperation has
	// returned, remove the recovery pointer (run a Clear machine for Key,
	// FirstOperation and RootKey, from Committed). Answer Opened.
	// Committed is the Ready record as committed, at its version.
	Open struct {
		Key            location.AuthorityKey
		Messages       []any
		FirstOperation string
		RootKey        string
		Committed      location.Versioned
	}
	// Forward: send the activation's first message to the current owner's
	// incarnation (Address, Key, Record name its PID) (PROTOCOL.md §7.6).
	Forward struct {
		Address string
		Key     location.AuthorityKey
		Record  *location.Record
	}
	// PassOn: hand the envelope to another serving candidate of its Mesh
	// that has not refused it for capacity; answer PassedOn.
	PassOn struct{}
	// RespondFailure: answer the first message's sender (if it has one)
	// with Err's class.
	RespondFailure struct{ Err error }
	// CloseLocal: seal the local incarnation of Key at Generation, let it
	// handle what it accepted, and stop it; answer LocalClosed.
	CloseLocal struct {
		Key        location.AuthorityKey
		Generation uint64
	}
	// DropRoute: drop this node's cached route to SpotID.
	DropRoute struct{ SpotID string }
)

// Shared effects.
type (
	// StartTimer: fire TimerFired{Timer} After from now, or At if set.
	// Starting a running timer restarts it.
	StartTimer struct {
		Timer Timer
		After time.Duration
		At    time.Time
	}
	// StopTimer: cancel a timer; a fire already on its way is ignored.
	StopTimer struct{ Timer Timer }
	// Log: a structured log line named Event; empty fields are left out.
	Log struct {
		Level            loglevel.Level
		Event            string
		Msg              string
		SpotID           string
		OperationID      string
		StableType       string
		OwnerNodeRid     string
		ObjectGeneration uint64
		Err              error
	}
	// Measure: count the activation's outcome (roam.spot.operations);
	// Activated also records how long it took since Stage.
	Measure struct {
		Outcome   string
		Activated bool
	}
	// Finish: the machine is done; Err is its result (nil: success, or
	// nothing to do). The driver stops the machine's timers.
	Finish struct{ Err error }
)

func (ReadAuthority) isEffect()    {}
func (Watch) isEffect()            {}
func (PutRoot) isEffect()          {}
func (GetRoot) isEffect()          {}
func (Reserve) isEffect()          {}
func (CompareAndSet) isEffect()    {}
func (ReadRecord) isEffect()       {}
func (AbortReservation) isEffect() {}
func (Delete) isEffect()           {}
func (DeleteRoot) isEffect()       {}
func (ReadOwner) isEffect()        {}
func (LockKey) isEffect()          {}
func (UnlockKey) isEffect()        {}
func (AdmitCapacity) isEffect()    {}
func (ReleaseCapacity) isEffect()  {}
func (Stage) isEffect()            {}
func (DiscardStaged) isEffect()    {}
func (Open) isEffect()             {}
func (Forward) isEffect()          {}
func (PassOn) isEffect()           {}
func (RespondFailure) isEffect()   {}
func (CloseLocal) isEffect()       {}
func (DropRoute) isEffect()        {}
func (StartTimer) isEffect()       {}
func (StopTimer) isEffect()        {}
func (Log) isEffect()              {}
func (Measure) isEffect()          {}
func (Finish) isEffect()           {}
func (ClaimCheckpoint) isEffect()  {}
