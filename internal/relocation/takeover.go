package relocation

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/takeover"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// TakeOver brings back on this node an Actor or User Spot whose owner
// ended, from v, its record as read (docs/FAULTS.md, "Checkpoints and
// recovery"): the caller has judged the owner ended and this node the one
// to recover it. The same incarnation comes back under the next owner
// generation — its ObjectGeneration stays, so a User Spot's members stay
// members and their Spot's member count stays exact — from its last
// checkpoint when fromCheckpoint, else from its producer.
//
// The incarnation is staged first, so that whoever reads the new record
// finds its queue; then the record is written by compare-and-set on v's
// version (with a capacity slot of this node, and this node's Entry Spot
// for an Actor that was a member of the ended owner's): a node that loses
// the race to another recoverer, a call or an operator gets Conflict and
// leaves it. Once the record is this node's — or its write's outcome is
// unknown (ErrTakeOverUnderWay) — TakeOver returns and the rest runs on a
// goroutine of its own
// (finishTakeOver), for as long as this lifecycle lasts: a recovery pass
// never waits on one object's store trouble, and a record naming this
// live node always gets its incarnation.
func (d *Driver) TakeOver(ctx context.Context, v location.Versioned, fromCheckpoint bool) error {
	if err := d.serving(); err != nil {
		return err
	}
	key, rec := v.Key, v.Record
	tk := takeover.Kind{}
	if k, ok := d.kind(rec.GetStableType()); ok {
		tk = takeover.Kind{Registered: true, PreservesState: PreservesState(k.Policy)}
	}
	next, err := takeover.Claim(key, rec, tk, d.owner(), d.desc.GetEntrySpotId(), meshnode.IsEntrySpotID)
	if err != nil {
		return err
	}
	if !d.takeovers.start(key) {
		return ErrTakeOverUnderWay
	}
	staged, err := d.Stage(context.Background(), key, next.GetStableType(), next.GetObjectGeneration(), next.GetAuthorityOwnerGeneration())
	if err != nil {
		d.takeovers.end(key)
		return err
	}
	err = d.writeTakeOver(ctx, v, next)
	if err != nil && !errors.Is(err, errTakeOverUnsettled) {
		staged.Discard()
		d.takeovers.end(key)
		return err
	}
	unsettled := err != nil
	go func() {
		defer d.takeovers.end(key)
		if unsettled { // the write's outcome is unknown: settle it first
			if err := d.settleTakeOver(v, next); err != nil {
				staged.Discard()
				d.log.Info().Str("event", "takeover_lost").Str("object_id", key.ID).Err(err).
					Msg("the takeover's record write did not land; the object is left to its owner")
				return
			}
			d.log.Info().Str("event", "takeover_settled").Str("object_id", key.ID).
				Msg("the takeover's record write landed after all; the object serves once its checkpoint is restored")
		}
		d.finishTakeOver(staged, next, fromCheckpoint)
	}()
	if unsettled {
		return ErrTakeOverUnderWay
	}
	return nil
}

// restoreUntil restores a taken-over object's checkpoint, trying again
// while the kind's state adapter fails, for as long as this lifecycle
// lasts (false once it ended). A stateful object never serves from its
// producer in place of its checkpoint: that would be the object re-created
// empty, its next capture replacing the state for good — what no
// PreserveStateWith kind allows (docs/FAULTS.md, "Checkpoints and
// recovery"). Meanwhile it does not serve (calls to it wait, and end at
// their deadlines), a drain reports it unmovable, and the failure is
// logged at every try (checkpoint_restore_failed, error), as a cold
// activation of an Instance Spot refuses its call when its checkpoint
// cannot be restored. A restore slower than the restore timeout is logged
// and waited for, not queued again behind itself. The adapter's
// RestoreState runs again on the same instance, which it replaces the
// state of.
func (d *Driver) restoreUntil(staged *Staged, state []byte, stableType string) bool {
	key := staged.obj.key
	for try := 1; ; try++ {
		done, err := staged.restoreAsync(state)
		if err != nil {
			d.markRestoreFailed(staged.obj, nil)
			return false // the incarnation's queue is gone: the lifecycle ended
		}
		for waited := d.cfg.RestoreTimeout; err == nil; waited += d.cfg.RestoreTimeout {
			select {
			case err = <-done:
				if err == nil {
					if try > 1 {
						d.markRestoreFailed(staged.obj, nil)
						d.log.Info().Str("event", "checkpoint_restored").Str("object_id", key.ID).Int("tries", try).
							Msg("the recovered object's checkpoint was restored after all; it serves")
					}
					return true
				}
			case <-machine.After(d.clock, d.cfg.RestoreTimeout):
				d.log.Error().Str("event", "checkpoint_restore_slow").Str("object_id", key.ID).Str("stable_type", stableType).
					Dur("waited", waited).Msg("the kind's state adapter has not restored the recovered object's checkpoint yet; still waiting")
				if d.Usable() != nil || isClosed(d.node.Stopped()) {
					d.markRestoreFailed(staged.obj, nil)
					return false
				}
			}
		}
		d.markRestoreFailed(staged.obj, err)
		wait := takeover.RestorePause(try)
		d.log.Error().Str("event", "checkpoint_restore_failed").Str("object_id", key.ID).Str("stable_type", stableType).
			Int("try", try).Dur("next_try_in", wait).Err(err).
			Msg("the recovered object's checkpoint could not be restored; it does not serve without its state, and is tried again")
		if d.Usable() != nil || !d.pauseUnlessStopped(wait) {
			d.markRestoreFailed(staged.obj, nil)
			return false
		}
	}
}

// unrestored is a taken-over object whose checkpoint could not be
// restored yet (Driver.unrestored), for Inventory.
type unrestored struct {
	stableType string
	err        error
}

// markRestoreFailed records on the driver's goroutine why obj's restore
// failed (nil: it no longer does, or it was given up), for Inventory.
func (d *Driver) markRestoreFailed(obj *object, err error) {
	_, _ = call(context.Background(), d, func() (struct{}, error) {
		if err == nil {
			delete(d.unrestored, obj.key)
		} else {
			d.unrestored[obj.key] = unrestored{stableType: obj.kind.StableType, err: err}
		}
		return struct{}{}, nil
	})
}

// ErrTakeOverUnderWay: TakeOver of this object is already running on this
// node, or its record write's outcome is not known yet and is being
// settled. Not a failure: the object is neither recovered yet nor left, and
// a later pass looks at it again.
var ErrTakeOverUnderWay = errors.New("relocation: the takeover of the object is under way")

// finishTakeOver brings staged, whose record next this node now holds, to
// serving: claims the checkpoint under the new owner generation (no
// capture of the ended owner can replace it afterwards), restores it, and
// opens the queue; a bound Actor's Session owner is told the new route.
// It gives up only when this lifecycle ends (the record then names an
// ended owner again, and a live node takes it over) or a newer owner
// holds the checkpoint (the object is no longer this node's).
func (d *Driver) finishTakeOver(staged *Staged, next *location.Record, fromCheckpoint bool) {
	key := staged.obj.key
	generation, owner := next.GetObjectGeneration(), next.GetAuthorityOwnerGeneration()
	var state []byte
	restore := false
	if fromCheckpoint {
		var err error
		if state, restore, err = d.claimUntil(key, next.GetStableType(), generation, owner); err != nil {
			staged.Discard()
			d.log.Warn().Str("event", "takeover_abandoned").Str("object_id", key.ID).Err(err).
				Msg("the recovered object's checkpoint was not claimed; it is left to a live owner")
			return
		}
	}
	if restore && !d.restoreUntil(staged, state, next.GetStableType()) {
		staged.Discard()
		d.log.Warn().Str("event", "takeover_abandoned").Str("object_id", key.ID).
			Msg("this lifecycle ended before the recovered object's checkpoint was restored; it is left to a live owner")
		return
	}
	var membership *messages.Membership
	if m := next.GetMembership(); m != nil && !meshnode.IsEntrySpotID(m.GetSpotId()) {
		membership = m
	}
	var session *messages.SessionBinding
	if next.GetSessionId() != "" {
		session = &messages.SessionBinding{SessionId: next.GetSessionId(), OwnerAddress: next.GetSessionOwnerAddress()}
	}
	if _, err := call(context.Background(), d, func() (struct{}, error) {
		if membership != nil || session != nil {
			staged.obj.x().member, staged.obj.x().session = membership, session
		}
		return struct{}{}, nil
	}); err != nil {
		staged.Discard()
		return
	}
	if err := staged.Open(context.Background(), nil, "", nil); err != nil {
		// Only an ended lifecycle refuses: its records go to a live node.
		staged.Discard()
		return
	}
	if session != nil {
		// Routed as a recovery: no move identity. The Session owner checks
		// the route against the store before it uses it.
		d.send(SessionOwnerPID(session.GetOwnerAddress()), &messages.SessionRouteUpdate{
			SessionId: session.GetSessionId(), ActorId: key.ID, TargetRoute: d.routeOf(staged.obj),
		})
	}
}

// claimUntil claims key's checkpoint for the incarnation that took it
// over, trying again while the checkpoint store fails, until this
// lifecycle ends: the object is this node's, and its queue waits for its
// state. Stale when a newer owner holds the checkpoint (this takeover was
// overtaken).
func (d *Driver) claimUntil(key location.AuthorityKey, stableType string, generation, owner uint64) ([]byte, bool, error) {
	for try := 1; ; try++ {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.RestoreTimeout)
		state, restore, err := d.ClaimCheckpoint(ctx, key, stableType, generation, owner)
		cancel()
		if err == nil || errors.Is(err, roamerr.ErrStale) {
			return state, restore, err
		}
		if try == 1 || try%20 == 0 {
			d.log.Warn().Str("event", "checkpoint_claim_failed").Str("object_id", key.ID).Int("attempt", try).Err(err).
				Msg("the recovered object's checkpoint could not be read; it waits, with its queue, and the claim is tried again")
		}
		if err := d.Usable(); err != nil {
			return nil, false, err
		}
		if !d.pauseUnlessStopped(handoff.StorePause(try)) {
			return nil, false, fmt.Errorf("%w: the node stopped while %s waited for its checkpoint", roamerr.ErrUnavailable, key)
		}
	}
}

// takeovers are the keys this node is taking over (TakeOver), one
// takeover per key at a time.
type takeovers struct {
	mu   sync.Mutex
	keys map[location.AuthorityKey]struct{}
}

func (t *takeovers) start(key location.AuthorityKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.keys[key]; ok {
		return false
	}
	if t.keys == nil {
		t.keys = map[location.AuthorityKey]struct{}{}
	}
	t.keys[key] = struct{}{}
	return true
}

// has: key's takeover is under way here (its record may name this node
// already, its incarnation not open yet).
func (t *takeovers) has(key location.AuthorityKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.keys[key]
	return ok
}

func (t *takeovers) end(key location.AuthorityKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.keys, key)
}

// errTakeOverUnsettled: the takeover's record write had no answer, and the
// reads that followed could not tell whether it landed.
var errTakeOverUnsettled = errors.New("the takeover's record write is unsettled")

// writeTakeOver writes next over v (with a capacity slot of this node)
// and leaves in next what the store holds. An indeterminate answer is
// settled by consistent reads (takeOverLanded); one it cannot settle
// within ctx is errTakeOverUnsettled, for settleTakeOver.
func (d *Driver) writeTakeOver(ctx context.Context, v location.Versioned, next *location.Record) error {
	w := takeover.Write{Key: v.Key}
	for {
		_, _, err := d.slots.Take(ctx, []location.AuthorityKey{v.Key}, false, func(slots []uint32) []location.Op {
			WithSlot(next, slots, 0)
			return []location.Op{location.UpdateOp(v.Key, v.Version, next)}
		})
		step, ferr := w.Wrote(err)
		if step == takeover.ReadBack {
			landed, again, rerr := d.takeOverLanded(ctx, v, next, err)
			step, ferr = w.Read(landed, again, rerr, err)
		}
		switch step {
		case takeover.Done:
			return nil
		case takeover.Unsettled:
			return errTakeOverUnsettled
		case takeover.Fail:
			return ferr
		}
	}
}

// takeOverLanded reads key after the write of next over v failed with
// werr: landed when the record is next (this lifecycle, its owner and
// object generations; next then holds what the store has), again when it
// is still v after an indeterminate answer (the write is sent again: a
// lost one landing later then conflicts). Neither, without rerr: another
// write won.
func (d *Driver) takeOverLanded(ctx context.Context, v location.Versioned, next *location.Record, werr error) (landed, again bool, rerr error) {
	cur, rerr := d.settleRead(ctx, v.Key)
	landed, again, rerr = takeover.Landed(cur, rerr, v, next, werr)
	if landed {
		proto.Reset(next)
		proto.Merge(next, cur.Record)
	}
	return landed, again, rerr
}

// settleTakeOver goes on with a takeover whose write is unsettled, for as
// long as this lifecycle lasts: the record may yet name this node, and
// must then get its incarnation. Nil once the record is next.
func (d *Driver) settleTakeOver(v location.Versioned, next *location.Record) error {
	for try := 1; ; try++ {
		if err := d.Usable(); err != nil {
			return err
		}
		if !d.pauseUnlessStopped(handoff.StorePause(try)) {
			return fmt.Errorf("%w: the node stopped", roamerr.ErrUnavailable)
		}
		// Read first: the write may have landed, and a write sent again
		// over it would find the slots taken by it.
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.RestoreTimeout)
		landed, again, rerr := d.takeOverLanded(ctx, v, next, location.ErrIndeterminate)
		switch step, err := takeover.Settle(landed, again, rerr, v.Key); step {
		case takeover.Done:
			cancel()
			return nil
		case takeover.ReadBack:
			cancel()
			continue // the store is away: whatever landed is still unknown
		case takeover.Fail:
			cancel()
			return err
		}
		err := d.writeTakeOver(ctx, v, next)
		cancel()
		if err == nil {
			return nil
		}
		// Any failure here leaves the outcome of the earlier write
		// unknown while the record is still at v's version: look again.
	}
}

// settleRead reads key consistently, trying again while the store fails,
// within ctx.
func (d *Driver) settleRead(ctx context.Context, key location.AuthorityKey) (location.Versioned, error) {
	for try := 1; ; try++ {
		rctx, cancel := machine.WithTimeout(ctx, d.clock, d.cfg.RestoreTimeout)
		v, err := d.store.Read(rctx, key)
		cancel()
		if err == nil || errors.Is(err, location.ErrNotFound) || ctx.Err() != nil {
			return v, err
		}
		if !d.pauseUnlessStopped(handoff.StorePause(try)) {
			return v, err
		}
	}
}
