package handoff

import (
	"fmt"

	"github.com/roamactors/roam/messages"
)

// Fence is the owner the coordinator expects (docs/PROTOCOL.md §2.3).
type Fence struct {
	NodeRid         string
	NodeGeneration  uint64
	OwnerGeneration uint64
}

// Identity ties every message of one move together; attribution is by
// Identity and connection only (PROTOCOL.md §2.3, §11).
type Identity struct {
	RelocationID            uint64
	TargetAttemptGeneration uint64
	Fence                   Fence
}

// Valid reports whether both numbers are non-zero (PROTOCOL.md §2.3).
func (id Identity) Valid() bool { return id.RelocationID != 0 && id.TargetAttemptGeneration != 0 }

func (id Identity) String() string {
	return fmt.Sprintf("relocation %d/%d", id.RelocationID, id.TargetAttemptGeneration)
}

// ToProto converts to the wire form.
func (id Identity) ToProto() *messages.RelocationIdentity {
	return &messages.RelocationIdentity{
		RelocationId:            id.RelocationID,
		TargetAttemptGeneration: id.TargetAttemptGeneration,
		CoordinatorFence: &messages.CoordinatorFence{
			NodeRid:         id.Fence.NodeRid,
			NodeGeneration:  id.Fence.NodeGeneration,
			OwnerGeneration: id.Fence.OwnerGeneration,
		},
	}
}

// IdentityFromProto converts from the wire form.
func IdentityFromProto(p *messages.RelocationIdentity) Identity {
	return Identity{
		RelocationID:            p.GetRelocationId(),
		TargetAttemptGeneration: p.GetTargetAttemptGeneration(),
		Fence: Fence{
			NodeRid:         p.GetCoordinatorFence().GetNodeRid(),
			NodeGeneration:  p.GetCoordinatorFence().GetNodeGeneration(),
			OwnerGeneration: p.GetCoordinatorFence().GetOwnerGeneration(),
		},
	}
}
