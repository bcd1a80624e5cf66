package handoff

import (
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
)

// Event is an input to a machine.
type Event interface{ isEvent() }

// Source events.
type (
	// Start: Relocate was called. SessionBound: a participant of the unit
	// is an Actor bound to a client Session, whose Session owner seals the
	// binding before the source seals (docs/SESSIONS.md §2).
	// Participants is how many objects the unit seals (a SpotWide User
	// Spot and its members, PROTOCOL.md §5.15); 0 counts as one.
	Start struct {
		SessionBound bool
		Participants int
	}
	// SessionsSealed: every Session owner asked answered its seal request
	// (SealSessions). Err, when set, is the first refusal or the lack of an
	// answer in time: the move ends before the source seals.
	SessionsSealed struct{ Err error }
	// SessionOwnersLooked answers LookUpSessionOwners: Silent is set when
	// a seal request is still unanswered by a Session owner that may be
	// alive.
	SessionOwnersLooked struct{ Silent bool }
	// CapabilityAnswered: the target's answer to QueryCapability.
	// ReceiveChunkLimit 0 means the target announced none.
	CapabilityAnswered struct {
		Supported         bool
		Reason            string
		ReceiveChunkLimit uint32
		// Code is a refusal's roamerr wire code ("" for unavailable).
		Code string
		// SourceCheck: the target checks the source before the seal
		// (CheckSource); a target that does not say so (an older
		// version) checks it only after the Restore request.
		SourceCheck bool
	}
	// Admitted: the in-flight budget has room; seal may proceed.
	Admitted struct{}
	// SourceChecked answers CheckSource: Err is nil when the store backs
	// this source at the move's fence; otherwise why the target will not
	// take the object (roamerr-typed: Stale when the source is not the
	// owner, Unavailable or DeadlineExceeded when it could not tell).
	SourceChecked struct{ Err error }
	// Captured: the mailbox sealed after the current turn and the driver
	// encoded state, saved work and timers into Stream.
	Captured struct{ Stream envelope.Stream }
	// CaptureFailed: the seal happened but the capture could not be encoded
	// (e.g. a queued message is not a protobuf message).
	CaptureFailed struct{ Err error }
	// RelayReadyReceived: the target's relay-ready reply.
	RelayReadyReceived struct{}
	// FailedReceived: the target's explicit failure reply.
	FailedReceived struct {
		Reason messages.FailureReason
		Detail string
	}
	// CutoverSent: the cutover went out after a batch with this sum.
	CutoverSent struct{ Sum RelaySum }
	// ConnectionLost: remote.EndpointTerminatedEvent for the peer.
	ConnectionLost struct{}
	// BoundaryAcked: the target's BoundaryAck: it holds the whole boundary
	// batch.
	BoundaryAcked struct{}
	// ReconcileRead: what Reconcile or ConfirmCommit read from the store,
	// or the error that kept it from reading (a watch that reached its
	// Until reports its deadline as Err). Target and ObjectGeneration name
	// the move's target node and object generation; SourceEnded reports
	// that this node's owner lease has ended. The machine judges it
	// (TimerFenceOut decides whether a fence-out may be written).
	ReconcileRead struct {
		Record           RecordView
		Target           string
		ObjectGeneration uint64
		Err              error
		SourceEnded      bool
	}
	// FenceOutAnswered: the answer to FenceOut's compare-and-set; nil Err
	// means it applied.
	FenceOutAnswered struct{ Err error }
	// ReconcileAnswered: a judged outcome of the move (what a
	// ReconcileRead or FenceOutAnswered comes to).
	ReconcileAnswered struct {
		TargetOwns bool
		// FencedOut: the store still names this source at its fence and
		// carries this move's RelocationId — the source's fence-out write,
		// made only after the target's restore deadline — so no CAS of the
		// target can ever apply: the move failed as surely as with an
		// explicit failure (docs/FAULTS.md, "A move whose target went silent").
		FencedOut bool
		// SourceEnded: this node's owner lease ended; the store takes no
		// write of it any more, so nothing here can decide the move.
		SourceEnded bool
	}
)

// Target events.
type (
	// PrepareReceived: a Restore request (RelocationPrepare) for this
	// identity, first or repeated.
	PrepareReceived struct {
		// SessionBound: a participant is bound to a client Session; the
		// target tells its Session owner the new route once it opened.
		SessionBound     bool
		Manifest         envelope.Manifest
		RestoreDeadline  time.Time
		MaxPayloadLength uint64
	}
	// ChunkReceived: a chunk (RelocationState) for this identity.
	ChunkReceived struct{ Chunk envelope.Chunk }
	// Restored: RestorePayload finished; the object waits in staging.
	Restored struct{}
	// RestoreFailed: RestorePayload failed (decode, adapter, type).
	RestoreFailed struct{ Err error }
	// SourceVerified answers VerifySource: Err is nil when the store backs
	// the prepare, else why not. Unsettled: the tries ran out at the
	// restore deadline with answers that said nothing of the source (the
	// store or the source's node unavailable, VerifyAgain), so Err is no
	// evidence that the source is stale.
	SourceVerified struct {
		Err       error
		Unsettled bool
	}
	// RelayRecordReceived: one relayed record. Record is its canonical bytes
	// (for the RelaySum), Item what OpenDispatch will post, Index its
	// position in the boundary batch (the same in every resend).
	RelayRecordReceived struct {
		Epoch  uint32
		Index  int
		Record []byte
		Item   any
	}
	// CutoverReceivedEvent: the cutover control.
	CutoverReceivedEvent struct {
		Epoch uint32
		Sum   RelaySum
	}
	// AbortReceived: RelocationAbort (PROTOCOL.md §6.2).
	AbortReceived struct{ Reason messages.FailureReason }
	// NodeStopping: the target's node is stopping gracefully. A move still
	// restoring is refused with an explicit failure (the source serves
	// again); one past relay-ready goes on to its commit, which the node
	// waits for before it ends its lease.
	NodeStopping struct{}
	// Superseded: a newer Restore request for the same object arrived at
	// this target (another RelocationId). Newest prepare wins: one still
	// restoring is removed with an explicit failure, so its source serves
	// again; one past relay-ready is kept, and the driver refuses the newer
	// (docs/PROTOCOL.md §5.7).
	Superseded struct{}
	// StoreCommitted: the CAS (or a re-read after an indeterminate answer)
	// shows this target as owner with this RelocationId.
	StoreCommitted struct{}
	// StoreRetryable: the store did not decide; try again. Unknown is set
	// when a CAS was sent and its outcome is indeterminate (it may have
	// applied): the target then never removes itself without a read that
	// settles it (PROTOCOL.md §6.3). Conflict is set when the CAS lost to
	// a newer version of a record that still backs the move: the next
	// attempt reads the record again, so it goes at once, the first time.
	StoreRetryable struct {
		Err      error
		Unknown  bool
		Conflict bool
	}
	// StoreNotCommitted: settling found the record still at the source's
	// fence and fenced the move out there: no CAS of this move applied,
	// and none can apply any more.
	StoreNotCommitted struct{}
	// StoreStale: another valid owner or generation is current.
	StoreStale struct{ Err error }
	// DispatchOpened: OpenDispatch finished.
	DispatchOpened struct{}
)

// TimerFired: a timer started with StartTimer fired.
type TimerFired struct{ Timer Timer }

func (Start) isEvent()                {}
func (CapabilityAnswered) isEvent()   {}
func (Admitted) isEvent()             {}
func (SourceChecked) isEvent()        {}
func (SessionsSealed) isEvent()       {}
func (SessionOwnersLooked) isEvent()  {}
func (Captured) isEvent()             {}
func (CaptureFailed) isEvent()        {}
func (RelayReadyReceived) isEvent()   {}
func (FailedReceived) isEvent()       {}
func (CutoverSent) isEvent()          {}
func (ConnectionLost) isEvent()       {}
func (BoundaryAcked) isEvent()        {}
func (ReconcileAnswered) isEvent()    {}
func (ReconcileRead) isEvent()        {}
func (FenceOutAnswered) isEvent()     {}
func (PrepareReceived) isEvent()      {}
func (ChunkReceived) isEvent()        {}
func (Restored) isEvent()             {}
func (RestoreFailed) isEvent()        {}
func (SourceVerified) isEvent()       {}
func (RelayRecordReceived) isEvent()  {}
func (CutoverReceivedEvent) isEvent() {}
func (AbortReceived) isEvent()        {}
func (NodeStopping) isEvent()         {}
func (Superseded) isEvent()           {}
func (StoreCommitted) isEvent()       {}
func (StoreRetryable) isEvent()       {}
func (StoreStale) isEvent()           {}
func (StoreNotCommitted) isEvent()    {}
func (DispatchOpened) isEvent()       {}
func (TimerFired) isEvent()           {}
