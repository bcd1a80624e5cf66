package spot

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// ReleaseEnded is the operator's acceptance that a Spot whose owner ended
// (its node crashed, was cut off or stopped) has lost its in-memory state.
// It deletes the ended owner's record, with a compare-and-set on the
// version it read, so the next Instance-intent call activates an Instance
// Spot empty, and GetOrCreate creates a User Spot anew. For a User Spot it
// also releases the records of its member Actors — all of them must have
// ended owners too; a member on a live node makes it Unavailable (the
// member must leave first). It returns true when it released the record,
// false when there was none. It refuses (InvalidOperation) a Spot whose
// owner is alive and an activation still in progress (that one resumes by
// itself with its stored first message). roam releases an ended owner's
// record automatically only where no state is lost and no members
// remain; this is the explicit case.
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
	case !a.ended:
		return false, fmt.Errorf("%w: Spot %q has a live owner (node %s)", roamerr.ErrInvalidOperation, spotID, a.v.Record.GetOwner().GetNodeRid())
	case a.v.Record.GetActivationRecovery() != nil:
		return false, fmt.Errorf("%w: Spot %q has an activation in progress; it resumes by itself", roamerr.ErrInvalidOperation, spotID)
	}
	if err := m.d.ReleasableEnded(ctx, a.v.Record.GetStableType(), a.v.Key); err != nil {
		return false, err
	}
	// The loss is accepted: the checkpoint must not come back either.
	if err := m.d.ForgetCheckpoint(ctx, a.v.Key, a.v.Record); err != nil {
		return false, err
	}
	members, at := 0, a.v
	if a.v.Key.Kind == location.KindUserSpot && a.v.Record.GetMemberCount() > 0 {
		if members, at, err = m.releaseEndedMembers(ctx, a.v); err != nil {
			return false, err
		}
	}
	// No capacity slot to free: the ended owner's went with its lease
	// (PROTOCOL.md §7.12).
	_, err = m.store.Apply(ctx, []location.Op{location.DeleteOp(at.Key, at.Version)})
	switch {
	case err == nil:
	case errors.Is(err, location.ErrConflict):
		return false, fmt.Errorf("%w: Spot %q changed while it was being released", roamerr.ErrConflict, spotID)
	default:
		return false, storeError("release "+a.v.Key.String(), err)
	}
	m.cache.drop(spotID)
	m.log.Warn().Str("event", "ended_owner_released").Str("spot_id", spotID).Str("spot_kind", location.KindName(a.v.Key.Kind)).
		Str("owner_node_rid", a.v.Record.GetOwner().GetNodeRid()).Uint64("object_generation", a.v.Record.GetObjectGeneration()).
		Int("members_released", members).Msg("an operator accepted the loss of an ended owner's Spot state")
	return true, nil
}

// releaseBatch bounds the deletes of one store transaction, well under
// location.MaxApplyOps (128, Consul's limit), leaving room for the checks
// that go with them.
const releaseBatch = 32

// releaseEndedMembers deletes, by compare-and-set, the records of the
// Actors that are members of the User Spot incarnation spot, whose owner
// ended, each batch together with the Spot's member count, so the count
// stays exact if a batch fails; it returns the Spot as last written.
// Every member must have an ended owner: a member on a live node is
// Unavailable and nothing is released. No Actor can join meanwhile: a
// membership is written only under a live Spot owner (SpawnMember).
func (m *Manager) releaseEndedMembers(ctx context.Context, spot location.Versioned) (int, location.Versioned, error) {
	spotID, generation := spot.Key.ID, spot.Record.GetObjectGeneration()
	var ended []location.Versioned
	alive := map[string]bool{} // owner node RID and generation → alive
	after := ""
	for {
		page, err := m.store.List(ctx, location.KindActor, location.PageRequest{Size: location.MaxPageSize, After: after})
		if err != nil {
			return 0, spot, storeError("list members", err)
		}
		for _, v := range page.Items {
			if ms := v.Record.GetMembership(); ms.GetSpotId() != spotID || ms.GetSpotGeneration() != generation {
				continue
			}
			o := v.Record.GetOwner()
			id := fmt.Sprintf("%s/%d/%s", o.GetNodeRid(), o.GetNodeGeneration(), o.GetLeaseId())
			live, seen := alive[id]
			if !seen {
				if _, live, err = m.ownerAddress(ctx, o); err != nil {
					return 0, spot, err
				}
				alive[id] = live
			}
			if live {
				return 0, spot, fmt.Errorf("%w: User Spot %q has member Actor %q on live node %s; it must leave the Spot first", roamerr.ErrUnavailable, spotID, v.Key.ID, o.GetNodeRid())
			}
			ended = append(ended, v)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	for _, v := range ended {
		if err := m.d.ForgetCheckpoint(ctx, v.Key, v.Record); err != nil {
			return 0, spot, err
		}
	}
	for i := 0; i < len(ended); i += releaseBatch {
		batch := ended[i:min(i+releaseBatch, len(ended))]
		var ops []location.Op
		for _, v := range batch {
			ops = append(ops, location.DeleteOp(v.Key, v.Version))
		}
		next := proto.Clone(spot.Record).(*location.Record)
		next.MemberCount -= min(next.MemberCount, uint32(len(batch)))
		ops = append(ops, location.UpdateOp(spot.Key, spot.Version, next))
		versions, err := m.store.Apply(ctx, ops)
		if err != nil {
			if errors.Is(err, location.ErrConflict) {
				return 0, spot, fmt.Errorf("%w: User Spot %q or a member changed while it was being released", roamerr.ErrConflict, spotID)
			}
			return 0, spot, storeError("release members", err)
		}
		spot = location.Versioned{Key: spot.Key, Record: next, Version: versions[len(versions)-1]}
	}
	return len(ended), spot, nil
}
