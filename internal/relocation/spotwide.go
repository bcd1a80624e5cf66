package relocation

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// SpotWide relocation (PROTOCOL.md §5.15): a User Spot of a SpotWide kind
// moves with every member it has at that moment, as one unit of the
// ordinary hand-off. The Spot is participant 1, its members follow in ID
// order; one seal of them all, one payload, one relay batch and cutover,
// and the target's one commit writes every record.

// MaxSpotWideMembers bounds a SpotWide unit: the Spot's record and its
// members' are written in one store transaction, and Consul takes at most
// 128 operations in one (its lease checks included). A Spot with more
// members is refused with CapacityExceeded before anything seals; give
// such a kind PerActor relocation (not SpotWide).
const MaxSpotWideMembers = 120

// RelocationReady is implemented by a SpotWide User Spot's actor that
// signals the end of its move itself (ApplicationSignaled): on the target,
// after the commit and before any participant's queue opens, roam calls
// OnRelocationReady on the Spot's goroutine with the members that moved
// with it.
type RelocationReady interface {
	OnRelocationReady(members []location.AuthorityKey)
}

// spotWideOf is the SpotWide User Spot on this node that obj is a member
// of, if any: such a member moves only with its Spot.
func (d *Driver) spotWideOf(obj *object) *object {
	if obj.member == nil {
		return nil
	}
	spot := d.objects[location.Key(location.KindUserSpot, obj.member.GetSpotId())]
	if spot == nil || !spot.kind.SpotWide || spot.generation != obj.member.GetSpotGeneration() {
		return nil
	}
	return spot
}

// spotWideMembers are the members of the SpotWide User Spot spot that move
// with it: every one its record counts (want) must serve on this node,
// none of them moving, and no join on its way.
func (d *Driver) spotWideMembers(spot *object, want int) ([]*object, error) {
	if spot.joining > 0 {
		return nil, fmt.Errorf("%w: an Actor is joining User Spot %q", roamerr.ErrUnavailable, spot.key.ID)
	}
	var members []*object
	for _, o := range d.objects {
		m := o.member
		if m == nil || m.GetSpotId() != spot.key.ID || m.GetSpotGeneration() != spot.generation {
			continue
		}
		switch {
		case o.opening != nil:
			// It arrived with the Spot, whose RelocationReady has not
			// returned yet: start again once its queue is open.
			return nil, &settlingError{done: o.opening}
		case o.state != serving || o.out != nil || o.activating.Load() || o.changing > 0:
			return nil, fmt.Errorf("%w: member %s of User Spot %q is moving", roamerr.ErrUnavailable, o.key, spot.key.ID)
		case isDisabled(o.kind.Policy):
			return nil, fmt.Errorf("%w: member %s of User Spot %q has DisableRelocation", roamerr.ErrInvalidOperation, o.key, spot.key.ID)
		}
		members = append(members, o)
	}
	switch {
	case want >= 0 && len(members) != want:
		return nil, fmt.Errorf("%w: User Spot %q counts %d members, %d of them serve on this node; a SpotWide Spot moves with all of them", roamerr.ErrUnavailable, spot.key.ID, want, len(members))
	case len(members) > MaxSpotWideMembers:
		return nil, fmt.Errorf("%w: User Spot %q has %d members, a SpotWide move takes at most %d", roamerr.ErrCapacityExceeded, spot.key.ID, len(members), MaxSpotWideMembers)
	}
	sort.Slice(members, func(i, j int) bool { return members[i].key.ID < members[j].key.ID })
	return members, nil
}

// admitMembers checks the members a SpotWide Restore request names, before
// anything of the move is installed: only a SpotWide User Spot brings
// members, each a distinct Actor of a kind this node hosts at the same
// application version, none of them already here.
func (d *Driver) admitMembers(key location.AuthorityKey, k *Kind, p *messages.RelocationPrepare) ([]*targetMember, messages.FailureReason, error) {
	ps := p.GetMembers()
	if len(ps) == 0 {
		return nil, 0, nil
	}
	stale := messages.FailureReason_FAILURE_REASON_STALE
	unsupported := messages.FailureReason_FAILURE_REASON_UNSUPPORTED
	switch {
	case key.Kind != location.KindUserSpot || !k.SpotWide:
		return nil, unsupported, fmt.Errorf("%w: only a SpotWide User Spot moves with members", roamerr.ErrInvalidOperation)
	case len(ps) > MaxSpotWideMembers:
		return nil, unsupported, fmt.Errorf("%w: %d members, at most %d", roamerr.ErrCapacityExceeded, len(ps), MaxSpotWideMembers)
	}
	seen := make(map[location.AuthorityKey]bool, len(ps))
	members := make([]*targetMember, 0, len(ps))
	for _, mp := range ps {
		o := mp.GetObject()
		mk := location.Key(o.GetKind(), o.GetId())
		mkind, ok := d.kind(o.GetStableType())
		switch {
		case mk.Kind != location.KindActor || mk.Validate() != nil || seen[mk]:
			return nil, unsupported, fmt.Errorf("%w: a member is not a distinct Actor", roamerr.ErrInvalidOperation)
		case !ok:
			return nil, unsupported, fmt.Errorf("%w: member stable type %q not registered here", roamerr.ErrNotFound, o.GetStableType())
		case mkind.ApplicationVersion != mp.GetApplicationVersion():
			return nil, unsupported, fmt.Errorf("%w: member %s at application version %q, hosting %q", roamerr.ErrTypeMismatch, mk, mp.GetApplicationVersion(), mkind.ApplicationVersion)
		case d.objects[mk] != nil || d.arriving(mk) != nil:
			return nil, stale, fmt.Errorf("%w: member %s is already here", roamerr.ErrConflict, mk)
		}
		seen[mk] = true
		members = append(members, &targetMember{key: mk, kind: mkind, p: mp})
	}
	return members, 0, nil
}

// readAll reads the records of keys at once (a store client that
// batches, like consulstore's, sends them together); a missing record
// reads as absent.
func (d *Driver) readAll(ctx context.Context, keys []location.AuthorityKey) ([]location.Versioned, error) {
	out := make([]location.Versioned, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := d.store.Read(ctx, key)
			if errors.Is(err, location.ErrNotFound) {
				v, err = location.Versioned{}, nil
			}
			out[i], errs[i] = v, err
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// verifyMembers reads each member's record for VerifySource
// (handoff.Commit.VerifyMembers judges them). spot is the Spot's own
// record.
func (d *Driver) verifyMembers(ctx context.Context, t *targetRun, spot *location.Record) error {
	if len(t.members) == 0 {
		return nil
	}
	c := d.commitPlan(t, false)
	vs, err := d.readAll(ctx, c.MemberKeys())
	if err != nil {
		return err
	}
	return c.VerifyMembers(spot, vs, d.slots.Bounded())
}

// openMembers gives each member its backlog (backlogs, in participant
// order), and opens the members' queues only once the Spot's
// RelocationReady callback, if it has one, ran on its goroutine — which it
// does before any message of the Spot's own backlog (PROTOCOL.md §5.15,
// ApplicationSignaled).
func (d *Driver) openMembers(t *targetRun, backlogs [][]any) {
	keys := make([]location.AuthorityKey, len(t.members))
	opening := make(chan struct{})
	for i, m := range t.members {
		keys[i] = m.key
		// Registered at once (calls find it), serving once its queue
		// opens; a move of the Spot meanwhile waits for that
		// (spotWideMembers).
		d.objects[m.key] = m.obj
		m.obj.opening = opening
	}
	open := func() {
		for i, m := range t.members {
			if err := m.obj.mb.OpenWith(backlogs[i]); err != nil {
				d.log.Error().Str("event", "open_failed").Str("object_id", m.key.ID).Err(err).Msg("opening dispatch failed")
			}
			m.obj.opening = nil
			d.nowServing(m.obj)
			if m.obj.cp != nil {
				_ = m.obj.mb.Do(m.obj.markDirty)
			}
		}
		close(opening)
	}
	spot := t.obj
	err := spot.mb.Do(func() {
		defer d.sys.Root.Send(d.self, &localCall{fn: open})
		if rr, ok := spot.inst.(RelocationReady); ok {
			rr.OnRelocationReady(keys)
		}
	})
	if err != nil {
		open()
	}
}
