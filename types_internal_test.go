package roam

import (
	"testing"

	"github.com/roamactors/roam/internal/placement"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/spot"
)

// The public constants are the internal values they are converted to and
// from.
func TestPublicConstantsMatchTheInternalOnes(t *testing.T) {
	for pub, in := range map[CreateState]spot.CreateState{Existing: spot.Existing, Created: spot.Created, Rejected: spot.Rejected} {
		if int(pub) != int(in) {
			t.Errorf("CreateState %s is %d, internally %d", pub, pub, in)
		}
	}
	for pub, in := range map[PlacementOutcome]placement.Outcome{PlacementBusy: placement.Busy, PlacementCommitted: placement.Committed,
		PlacementDeferred: placement.Deferred, PlacementStale: placement.Stale} {
		if string(pub) != string(in) {
			t.Errorf("PlacementOutcome %q is %q internally", pub, in)
		}
	}
	if MaxSpotWideMembers != relocation.MaxSpotWideMembers {
		t.Errorf("MaxSpotWideMembers %d, internally %d", MaxSpotWideMembers, relocation.MaxSpotWideMembers)
	}
}
