package handoff

import (
	"time"

	"github.com/roamactors/roam/internal/machine/loglevel"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/messages"
)

// Effect is something a machine asks its driver to do. Effects of one Step
// must be run in the order returned.
type Effect interface{ isEffect() }

// Timer names the timers the machines use.
type Timer int

const (
	// TimerCutoverWait: RelocationCutoverWaitTimeout after relay-ready (target).
	TimerCutoverWait Timer = iota + 1
	// TimerRestoreDeadline: the Restore operation's absolute deadline.
	TimerRestoreDeadline
	// TimerStoreRetry: the back-off before the next CAS attempt (target).
	TimerStoreRetry
	// TimerResendWindow: how long the source keeps payload and boundary
	// batch after the cutover submit (as long as the cutover wait,
	// PROTOCOL.md §5.13).
	TimerResendWindow
	// TimerFollow: MessageFollowDuration on the source (PROTOCOL.md §5.14).
	TimerFollow
	// TimerReconcile: the next reconciliation sweep (source).
	TimerReconcile
	// TimerFenceOut: the target's restore deadline plus one cutover wait
	// (source): from then on a move whose record is still at the source's
	// fence may be fenced out.
	TimerFenceOut
	// TimerBoundaryResend: after the cutover, the next resend of the
	// boundary batch while the target has not acknowledged it (source).
	TimerBoundaryResend
	// TimerBoundaryGiveUp: BoundaryAckPatience after the cutover (source):
	// an unacknowledged boundary batch is dropped loudly.
	TimerBoundaryGiveUp
	// TimerSealPatience: SealPatience after the seal of a move of more
	// than one participant (source): captures still outstanding then fail
	// the move.
	TimerSealPatience
	// TimerForget: how long a finished target run is kept (target): it
	// takes the source's late resends until then, and a removed
	// incarnation the source may know of answers Unavailable until then.
	TimerForget
	// TimerSessionSeal: SessionSealWait after SealSessions (source): the
	// Session owners still silent then are looked up.
	TimerSessionSeal
	// TimerStub: FollowDuration after EndFollow (source): the incarnation
	// that moved away has answered Unavailable long enough and stops.
	TimerStub
	// TimerSourceCheck: the restore deadline while the source waits for
	// the target's source check, before the seal (source).
	TimerSourceCheck
)

func (t Timer) String() string {
	switch t {
	case TimerCutoverWait:
		return "cutover-wait"
	case TimerRestoreDeadline:
		return "restore-deadline"
	case TimerStoreRetry:
		return "store-retry"
	case TimerResendWindow:
		return "resend-window"
	case TimerFollow:
		return "follow"
	case TimerReconcile:
		return "reconcile"
	case TimerFenceOut:
		return "fence-out"
	case TimerBoundaryResend:
		return "boundary-resend"
	case TimerBoundaryGiveUp:
		return "boundary-give-up"
	case TimerSealPatience:
		return "seal-patience"
	case TimerForget:
		return "forget"
	case TimerSessionSeal:
		return "session-seal"
	case TimerStub:
		return "stub"
	case TimerSourceCheck:
		return "source-check"
	}
	return "timer?"
}

// Source effects.
type (
	// QueryCapability: ask the target whether it hosts the kind
	// (PROTOCOL.md §5.2).
	QueryCapability struct{}
	// AwaitAdmission: wait for in-flight budget room before sealing
	// (PROTOCOL.md §5.3).
	AwaitAdmission struct{}
	// CheckSource: ask the target to check, against the Location Store,
	// that this source owns the object at the move's fence, and report
	// SourceChecked — before the seal, so that the target's read is not
	// part of the pause (PROTOCOL.md §5.2).
	CheckSource struct{}
	// SealSessions: ask the Session owner of every bound participant to
	// seal its binding (command 42) and report SessionsSealed
	// (docs/SESSIONS.md §2).
	SealSessions struct{}
	// LookUpSessionOwners: the seal wait ran out: drop the binding of
	// every participant whose Session owner is still silent and whose
	// node is no live member of the mesh (a node's Sessions end with its
	// lifecycle), and report SessionOwnersLooked.
	LookUpSessionOwners struct{}
	// AbortSessions: the source serves again after a failure before
	// relay-ready: tell the Session owners whose seal may be installed to
	// release it and submit what they held to the source route (command
	// 44). Always after the source's queue is restored (Unseal or
	// Reinstate), never while the move's outcome is unknown.
	AbortSessions struct{}
	// Seal: stop dispatch after the current turn and capture
	// (PROTOCOL.md §5.4, §5.5).
	Seal struct{}
	// SendPrepare: send the Restore request (RelocationPrepare,
	// PROTOCOL.md §5.6) with the manifest.
	SendPrepare struct {
		Manifest   envelope.Manifest
		ChunkLimit int
	}
	// SendChunks: send these chunks (RelocationState) in order, paced by the
	// per-peer in-flight budget.
	SendChunks struct{ Chunks []envelope.Chunk }
	// Unseal: put the saved work back in original order and reopen dispatch
	// (explicit failure before relay-ready).
	Unseal struct{}
	// SendAbort: RelocationAbort, one-way, after Unseal (PROTOCOL.md §6.2).
	SendAbort struct{ Reason messages.FailureReason }
	// RelayThenCutover: relay the ingress hold in order, hold later
	// messages (in order, requests too) until StartFollow or Reinstate,
	// and send the cutover with the batch's count and CRC; report
	// CutoverSent.
	RelayThenCutover struct{ Epoch uint32 }
	// StartFollow: the move is confirmed: forward the messages held since
	// the cutover, in order, then every later one, by Message Follow.
	// Nothing follows to a target before its commit is known, so a
	// fence-out never strands a message at a removed target; nor before
	// it acknowledged the boundary batch, so nothing followed overtakes a
	// relayed record it delivers late after its cutover fallback (unless
	// the acknowledgement cannot be waited for: the connection to the
	// target was lost, the batch was given up on, the follow period
	// ended, or this node's lease did).
	StartFollow struct{}
	// ResendBoundary: send the whole boundary batch again with Epoch, then
	// the cutover, on the new connection (PROTOCOL.md §5.9).
	ResendBoundary struct{ Epoch uint32 }
	// ReturnBudget: the move's chunk bytes in flight no longer count
	// against the in-flight budget (PROTOCOL.md §5.3): its target holds
	// the whole payload (relay-ready). A lost connection gives back the
	// budget of every move to the peer at once, before any of them resends
	// (sourcerun.ConnectionLost).
	ReturnBudget struct{}
	// ReleasePayload: drop the payload copy (state, saved work, what a
	// Reinstate would need), once. The boundary batch's wire copy is kept
	// for resends until ReleaseBoundary.
	ReleasePayload struct{}
	// ReleaseBoundary: drop the boundary batch's wire copy, once: the
	// target acknowledged it, or the batch went back into the source's
	// queue (Reinstate), or — Unacknowledged — the target stayed silent for
	// BoundaryAckPatience: the batch's messages may be lost, which the
	// driver reports loudly.
	ReleaseBoundary struct{ Unacknowledged bool }
	// EndFollow: stop Message Follow (later messages end Unavailable,
	// until StopIncarnation).
	EndFollow struct{}
	// Reconcile: the outcome of the move is unknown to the source; read the
	// store once and report ReconcileRead (PROTOCOL.md §6.4).
	Reconcile struct{}
	// AdoptTargetRoute: the store names the target: forward the held and
	// later messages to it by Message Follow (PROTOCOL.md §6.4).
	AdoptTargetRoute struct{}
	// FailHeld: end every held request with Err; held sends stay held
	// until the outcome is known (PROTOCOL.md §6.4: waiting requests fail).
	FailHeld struct{ Err error }
	// ConfirmCommit: after the cutover, watch the record until its store
	// version is past After (0: read at once) or Until passes, and report
	// ReconcileRead.
	ConfirmCommit struct {
		After uint64
		Until time.Time
	}
	// FenceOut: write the move's RelocationId into the record read at
	// Version, owner unchanged, by compare-and-set (docs/FAULTS.md, the
	// fence-out); report FenceOutAnswered.
	FenceOut struct{ Version uint64 }
	// CloseOut: the move is confirmed: tell the application its source
	// incarnation closed (OnClosing(RelocationOut)) and drop the instance.
	CloseOut struct{}
	// Reinstate: the move was fenced out after the cutover: serve again on
	// the source, with the saved work and the boundary batch first, then
	// whatever arrives next, and the timers re-armed.
	Reinstate struct{}
)

// Target effects.
type (
	// InstallStaging: register the temporary queue (spawn the object with a
	// staging mailbox) before any chunk is attributed (PROTOCOL.md §5.7).
	InstallStaging struct{}
	// VerifySource: check, against the Location Store, that the prepare's
	// source is the object's owner at the move's fence and a live node at
	// the address the prepare came from; report SourceVerified. Whoever can
	// reach a node's port can send it a prepare: the target never answers
	// relay-ready to one the store does not back.
	VerifySource struct{}
	// SendCredit: return received bytes to the source's in-flight budget.
	SendCredit struct{ ReceivedBytes uint64 }
	// RestorePayload: decode the verified stream and restore state, saved
	// work and timers without dispatch; report Restored or RestoreFailed.
	RestorePayload struct{ Stream []byte }
	// SendFailed: the explicit failure reply to the Restore request
	// (RelocationFailed, PROTOCOL.md §6.2).
	SendFailed struct {
		Reason messages.FailureReason
		Detail string
	}
	// SendRelayReady: the relay-ready reply.
	SendRelayReady struct{}
	// CommitOwner: the target-only CAS with the expected source fence and
	// RelocationId; on an indeterminate answer re-read first
	// (PROTOCOL.md §5.11).
	CommitOwner struct {
		Attempt int
		// SettleOnly: the restore deadline passed with a CAS outcome
		// unknown; no new owner CAS: read the record and, if it is still
		// at the source's fence, fence the move out (its RelocationId with
		// the owner unchanged, so the unknown CAS can never apply) and
		// report StoreNotCommitted; else StoreCommitted, StoreStale or
		// StoreRetryable.
		SettleOnly bool
	}
	// OpenDispatch: merge the backlog — saved work, then Relay, then the
	// temporary queue — and open dispatch (PROTOCOL.md §5.12); report
	// DispatchOpened.
	OpenDispatch struct{ Relay []any }
	// DeliverLate: a relay record that arrived after the cutover or its
	// fallback; post it like direct ingress (order not guaranteed,
	// PROTOCOL.md §5.10).
	DeliverLate struct{ Item any }
	// AckBoundary: tell the source this target holds the whole boundary
	// batch (one-way BoundaryAck), so it stops resending.
	AckBoundary struct{}
	// UpdateSessionRoutes: the target committed and opened dispatch: tell
	// the Session owner of every bound participant its new route (command
	// 43, one-way), so the held client messages come here.
	UpdateSessionRoutes struct{}
	// RemoveTarget: remove the prepared object, temporary queue and state;
	// its incarnations answer Unavailable until StopIncarnation.
	RemoveTarget struct{}
	// Forget: drop the finished run and its timers; nothing the source
	// still sends for the move is answered any more.
	Forget struct{}
)

// StopIncarnation stops the move's incarnations on this side: their
// actors end, and what still reaches them is a dead letter. On the
// source, one follow period after EndFollow (stubs do not pile up); on a
// removed target, at once when no source learned of it (no relay-ready
// went out), else once nothing follows to it any more (TimerForget).
type StopIncarnation struct{}

// Shared effects.
type (
	// StartTimer: fire TimerFired{Timer} After from now, or At if set.
	StartTimer struct {
		Timer Timer
		After time.Duration
		At    time.Time
	}
	// StopTimer: cancel a timer; a fire already queued is ignored by the
	// machine anyway.
	StopTimer struct{ Timer Timer }
	// Log: a structured log line with its event name (the names PROTOCOL.md
	// uses, such as cutover_timeout).
	Log struct {
		Level loglevel.Level
		Event string
		Msg   string
	}
	// Complete: the move is decided for this side; Err nil means success.
	Complete struct{ Err error }
)

func (QueryCapability) isEffect()     {}
func (AwaitAdmission) isEffect()      {}
func (CheckSource) isEffect()         {}
func (Seal) isEffect()                {}
func (SealSessions) isEffect()        {}
func (AbortSessions) isEffect()       {}
func (LookUpSessionOwners) isEffect() {}
func (UpdateSessionRoutes) isEffect() {}
func (SendPrepare) isEffect()         {}
func (SendChunks) isEffect()          {}
func (Unseal) isEffect()              {}
func (SendAbort) isEffect()           {}
func (RelayThenCutover) isEffect()    {}
func (ResendBoundary) isEffect()      {}
func (ReleasePayload) isEffect()      {}
func (ReturnBudget) isEffect()        {}
func (StartFollow) isEffect()         {}
func (ReleaseBoundary) isEffect()     {}
func (AckBoundary) isEffect()         {}
func (EndFollow) isEffect()           {}
func (Reconcile) isEffect()           {}
func (AdoptTargetRoute) isEffect()    {}
func (FailHeld) isEffect()            {}
func (ConfirmCommit) isEffect()       {}
func (FenceOut) isEffect()            {}
func (CloseOut) isEffect()            {}
func (Reinstate) isEffect()           {}
func (InstallStaging) isEffect()      {}
func (VerifySource) isEffect()        {}
func (SendCredit) isEffect()          {}
func (RestorePayload) isEffect()      {}
func (SendFailed) isEffect()          {}
func (SendRelayReady) isEffect()      {}
func (CommitOwner) isEffect()         {}
func (OpenDispatch) isEffect()        {}
func (DeliverLate) isEffect()         {}
func (RemoveTarget) isEffect()        {}
func (StopIncarnation) isEffect()     {}
func (Forget) isEffect()              {}
func (StartTimer) isEffect()          {}
func (StopTimer) isEffect()           {}
func (Log) isEffect()                 {}
func (Complete) isEffect()            {}
