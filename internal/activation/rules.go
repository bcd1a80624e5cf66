package activation

import (
	"context"
	"errors"
	"time"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Config holds what the machines judge with: this node as an owner and
// the retry periods of the Spot store loops (docs/PROTOCOL.md §7). DefaultConfig gives the
// values roam uses.
type Config struct {
	// Self is this node as an owner (Mesh, node RID, node generation,
	// lease). A record naming it is this node's own.
	Self *messages.Owner
	// SettleBackoff is the pause between the consistent re-reads that
	// settle a write whose answer was indeterminate. Default 20 ms.
	SettleBackoff time.Duration
	// ClearBackoff is the pause after a failed read or write while the
	// recovery pointer is removed. Default 50 ms.
	ClearBackoff time.Duration
	// ClearFor bounds the removal of a recovery pointer; past it the
	// pointer stays (activation_recovery_clear_failed). Default 10 min.
	ClearFor time.Duration
	// ReleaseBackoff is the pause after a failed read or delete while a
	// closed Spot's authority is released. Default 20 ms.
	ReleaseBackoff time.Duration
	// ReleaseFor bounds a close from its local close to the release of
	// its authority (its caller's deadline may be spent). Default 30 s.
	ReleaseFor time.Duration
	// RootsInApply: the Relocation Store is the Location Store, so a
	// recovery pointer's removal deletes its root in the same transaction
	// (location.OpDeleteRoot) instead of a call after it.
	RootsInApply bool
}

// DefaultConfig returns the defaults for the node self.
func DefaultConfig(self *messages.Owner) Config {
	return Config{
		Self:           self,
		SettleBackoff:  20 * time.Millisecond,
		ClearBackoff:   50 * time.Millisecond,
		ClearFor:       10 * time.Minute,
		ReleaseBackoff: 20 * time.Millisecond,
		ReleaseFor:     30 * time.Second,
	}
}

// Kind is what this node knows of a stable type.
type Kind struct {
	// Registered: this node hosts the type.
	Registered bool
	// PreservesState: the kind's policy is PreserveStateWith, so its state
	// ends with an owner that ends (PROTOCOL.md §7.10).
	PreservesState bool
	// ReactivateEmpty: the kind accepts to start empty after its owner
	// ended instead of waiting for ReleaseEnded.
	ReactivateEmpty bool
	// Checkpointed: the kind's owners checkpoint its state; every
	// activation (cold, after an ended owner, resumed) starts from the
	// last checkpoint, and an ended owner's object is recovered from it.
	Checkpointed bool
	// CheckpointsInStore: the kind's checkpoints are kept by the Location
	// Store itself, so a reservation can check in its own transaction
	// that none is stored (location.OpCheckNoCheckpoint).
	CheckpointsInStore bool
	// RecoverByOperator: an ended owner's object waits for an operator
	// (ReleaseEnded) even when it could be recovered.
	RecoverByOperator bool
}

// AbandonGrace is how long past its operation's deadline a Creating
// reservation is left alone before any node may take it over or release
// it: a margin for clock skew between nodes.
const AbandonGrace = 5 * time.Second

// Abandoned reports whether an Instance Spot reservation is still
// Creating AbandonGrace after its activation's deadline, at now.
func Abandoned(rec *location.Record, now time.Time) bool {
	dl := rec.GetActivationRecovery().GetDeadlineUnixNanos()
	return rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING && dl != 0 &&
		now.After(time.Unix(0, dl).Add(AbandonGrace))
}

// AbandonedCreation reports whether a User Spot reservation outlived its
// creating operation's deadline by AbandonGrace, at now.
func AbandonedCreation(rec *location.Record, now time.Time) bool {
	dl := rec.GetCreationIntent().GetDeadlineUnixNanos()
	return rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING && dl != 0 &&
		now.After(time.Unix(0, dl).Add(AbandonGrace))
}

// NewGeneration issues the ObjectGeneration of a new incarnation: above
// prev, and otherwise the time now, so that an ID created again after its
// record was deleted (and prev forgotten) still gets a new generation
// (PROTOCOL.md §2.3: non-zero, 63-bit).
func NewGeneration(prev uint64, now time.Time) uint64 {
	g := uint64(now.UnixNano()) & (1<<63 - 1)
	return max(g, prev+1)
}

// SameOwner reports whether a and b are one owner lifecycle (node RID,
// node generation and lease).
func SameOwner(a, b *messages.Owner) bool {
	return a.GetNodeRid() == b.GetNodeRid() && a.GetNodeGeneration() == b.GetNodeGeneration() && a.GetLeaseId() == b.GetLeaseId()
}

// StoreError classifies a Location Store failure, in exactly one class:
// an operation whose context ended is DeadlineExceeded (the store error's
// text is kept, not its class); any other store error keeps its own class
// (roamerr's package documentation: an indeterminate or unreachable store
// is Unavailable, a missing key NotFound, a refused token
// PermissionDenied, a malformed request InvalidOperation, one over a limit
// CapacityExceeded, a conflict Conflict); an error of no class is
// Unavailable.
func StoreError(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return roamerr.Wrap(roamerr.ErrDeadlineExceeded, what, err)
	}
	return roamerr.Keep(roamerr.ErrUnavailable, what, err)
}

// passed reports whether deadline (zero: none) is reached at now.
func passed(deadline, now time.Time) bool {
	return !deadline.IsZero() && !now.Before(deadline)
}

// Ended is what becomes of an object whose owner ended, by its kind's
// recovery policy (docs/FAULTS.md, "Checkpoints and recovery").
type Ended int

const (
	// EndedNotHosted: this node does not host the kind; another judges.
	EndedNotHosted Ended = iota
	// EndedFromCheckpoint: a live node recovers it from its last
	// checkpoint (none yet: from its producer).
	EndedFromCheckpoint
	// EndedEmpty: a live node brings it back from its producer: the kind
	// carries no state, or accepts to lose it (ReactivateEmpty).
	EndedEmpty
	// EndedOperator: it waits for an operator's ReleaseEnded, and is
	// reported as waiting (RecoverByOperator, or a kind whose state has
	// no checkpoint to come back from).
	EndedOperator
)

func (e Ended) String() string {
	switch e {
	case EndedFromCheckpoint:
		return "from-checkpoint"
	case EndedEmpty:
		return "empty"
	case EndedOperator:
		return "operator"
	}
	return "not-hosted"
}

// EndedPolicy is the one rule for an ended owner's object of kind k.
func (k Kind) EndedPolicy() Ended {
	switch {
	case !k.Registered:
		return EndedNotHosted
	case k.RecoverByOperator:
		return EndedOperator
	case k.Checkpointed:
		return EndedFromCheckpoint
	case !k.PreservesState || k.ReactivateEmpty:
		return EndedEmpty
	}
	return EndedOperator
}
