package spot

import (
	"context"
	"errors"
	"fmt"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/roamerr"
)

// ReleaseEnded is the operator's acceptance that an Instance Spot whose
// owner ended (its node crashed or was cut off) has lost its in-memory
// state: it deletes the ended owner's record, with a compare-and-set on
// the version it read, so the next Instance-intent call activates the Spot
// empty. It returns true when it released the record, false when there was
// none. It refuses (InvalidOperation) a Spot whose owner is alive, a User
// Spot, and an activation still in progress (that one resumes by itself
// with its stored first message). Spec 003 releases an ended owner's record
// automatically only where no state is lost; this is the explicit case.
func (m *Manager) ReleaseEnded(ctx context.Context, spotID string) (bool, error) {
	if err := m.d.Usable(); err != nil {
		return false, err
	}
	if err := ValidateID(spotID); err != nil {
		return false, err
	}
	ctx, cancel := m.deadlineCtx(ctx, 0)
	defer cancel()
	a, err := m.readAuthority(ctx, spotID)
	switch {
	case err != nil:
		return false, err
	case !a.v.Present():
		return false, nil
	case a.v.Key.Kind != location.KindInstanceSpot:
		return false, fmt.Errorf("%w: Spot %q is a User Spot", roamerr.ErrInvalidOperation, spotID)
	case !a.ended:
		return false, fmt.Errorf("%w: Spot %q has a live owner (node %s)", roamerr.ErrInvalidOperation, spotID, a.v.Record.GetOwner().GetNodeRid())
	case a.v.Record.GetActivationRecovery() != nil:
		return false, fmt.Errorf("%w: Spot %q has an activation in progress; it resumes by itself", roamerr.ErrInvalidOperation, spotID)
	}
	_, err = m.store.Apply(ctx, []location.Op{location.DeleteOp(a.v.Key, a.v.Version)})
	switch {
	case err == nil:
	case errors.Is(err, location.ErrConflict):
		return false, fmt.Errorf("%w: Spot %q changed while it was being released", roamerr.ErrConflict, spotID)
	default:
		return false, storeError("release "+a.v.Key.String(), err)
	}
	m.cache.drop(spotID)
	m.log.Warn().Str("event", "ended_owner_released").Str("spot_id", spotID).Str("owner_node_rid", a.v.Record.GetOwner().GetNodeRid()).
		Uint64("object_generation", a.v.Record.GetObjectGeneration()).Msg("an operator accepted the loss of an ended owner's Instance Spot state")
	return true, nil
}
