package handoff

import (
	"fmt"

	"github.com/roamactors/roam/messages"
)

// RecordView is what the machines judge of an object's owner record read
// from the Location Store. Present is false when there is no record.
type RecordView struct {
	Present             bool
	Version             uint64
	OwnerNodeRid        string
	OwnerNodeGeneration uint64
	OwnerGeneration     uint64 // AuthorityOwnerGeneration
	ObjectGeneration    uint64
	RelocationID        uint64
	// State is the record's lifecycle state (a Close writes Closing).
	State messages.LifecycleState
}

// atFence reports whether the record still names the move's source at the
// fence the move started from, for the object's generation.
func (id Identity) atFence(v RecordView, objectGeneration uint64) bool {
	f := id.Fence
	return v.Present && v.OwnerNodeRid == f.NodeRid && v.OwnerNodeGeneration == f.NodeGeneration &&
		v.OwnerGeneration == f.OwnerGeneration && v.ObjectGeneration == objectGeneration
}

// JudgeCommit is the target's reading of a record before and after its
// CAS (docs/PROTOCOL.md §5.11): StoreCommitted when the record names this
// target (self, at newOwnerGeneration) with the move's RelocationId — an
// earlier attempt's indeterminate write applied; StoreStale when the
// source fenced the move out (the move's RelocationId at another owner) or
// another owner or generation is current; nil when the record is still at
// the source's fence and the CAS may go on.
func (id Identity) JudgeCommit(v RecordView, self string, newOwnerGeneration, objectGeneration uint64) Event {
	switch {
	case !v.Present:
		return StoreStale{Err: fmt.Errorf("the object of %s no longer exists", id)}
	case v.RelocationID == id.RelocationID && v.OwnerNodeRid == self && v.OwnerGeneration == newOwnerGeneration:
		return StoreCommitted{}
	case v.RelocationID == id.RelocationID:
		return StoreStale{Err: fmt.Errorf("the source fenced %s out", id)}
	case !id.atFence(v, objectGeneration):
		return StoreStale{Err: fmt.Errorf("the object is owned by %s at owner generation %d, %s expected %s at %d",
			v.OwnerNodeRid, v.OwnerGeneration, id, id.Fence.NodeRid, id.Fence.OwnerGeneration)}
	}
	return nil
}

// JudgeOwnerChange is the target's last look at a record JudgeCommit let
// its owner CAS go on with: StoreRetryable when the record is not Ready.
// A Close that wrote Closing after the seal finds the object moving and
// puts the record back to Ready; the move commits then. An owner is never
// committed over a Closing record: the Close would end an incarnation the
// record no longer names. The settling fence-out does not ask: it leaves
// the owner as it is.
func (id Identity) JudgeOwnerChange(v RecordView) Event {
	if v.State != messages.LifecycleState_LIFECYCLE_STATE_READY {
		return StoreRetryable{Err: fmt.Errorf("the object of %s is %s", id, v.State)}
	}
	return nil
}

// sourceJudgement is what a record read tells a source whose move's
// outcome is unknown.
type sourceJudgement int

const (
	atSourceFence    sourceJudgement = iota // undecided: the fence-out may apply
	targetOwns                              // the target committed
	fencedOut                               // an earlier fence-out landed
	changedElsewhere                        // not at the fence, not the target's commit
)

// judgeForSource reads a record for a source that does not know its
// move's outcome. targetRid names the move's target.
func (id Identity) judgeForSource(v RecordView, targetRid string, objectGeneration uint64) sourceJudgement {
	switch {
	case v.Present && v.OwnerNodeRid == targetRid && v.RelocationID == id.RelocationID:
		return targetOwns
	case !id.atFence(v, objectGeneration):
		return changedElsewhere
	case v.RelocationID == id.RelocationID:
		return fencedOut
	}
	return atSourceFence
}

// JudgeSource is the target's check of a Restore request against the
// record (VerifySource): nil when the record names the move's source at
// its fence for the object's generation and carries no fence-out of this
// move; otherwise why the source may not move the object.
func (id Identity) JudgeSource(v RecordView, objectGeneration uint64) error {
	switch {
	case !v.Present:
		return fmt.Errorf("the object of %s does not exist", id)
	case !id.atFence(v, objectGeneration):
		return fmt.Errorf("the object's owner is not %s's source at its fence", id)
	case v.RelocationID == id.RelocationID:
		return fmt.Errorf("%s was fenced out", id)
	}
	return nil
}
