package spot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/extensions"

	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

var managerExtension = extensions.NextExtensionID()

// ExtensionID registers the Manager as its actor system's extension, so a
// Spot's handler can find it (CloseSelf).
func (m *Manager) ExtensionID() extensions.ExtensionID { return managerExtension }

// CloseSelf asks for the local Close of the Instance Spot whose handler or
// timer is running in c (docs/PROTOCOL.md §7.9: an Instance Spot closes from its own
// lifecycle context). It returns at once; after the current turn the Spot
// goes Closing in the store, handles what it had accepted, hears
// OnClosing(Closed), stops, and its authority is released. A later call
// with Instance intent activates a new incarnation.
func CloseSelf(c actor.Context) error {
	ext := c.ActorSystem().Extensions.Get(managerExtension)
	m, ok := ext.(*Manager)
	if !ok {
		return fmt.Errorf("%w: no Spot manager on this actor system", roamerr.ErrNotConfigured)
	}
	self := c.Self()
	go func() {
		if err := m.closeInstance(self); err != nil {
			m.log.Warn().Str("event", "instance_close_failed").Str("pid", self.Id).Err(err).Msg("an Instance Spot's own Close did not finish")
		}
	}()
	return nil
}

func (m *Manager) closeInstance(pid *actor.PID) error {
	ctx, cancel := m.deadlineCtx(context.Background(), 0)
	defer cancel()
	key, gen, err := m.d.IncarnationOf(ctx, pid)
	if err != nil {
		return err
	}
	if key.Kind != location.KindInstanceSpot {
		return fmt.Errorf("%w: %s is not an Instance Spot; close User Spots with Manager.Close", roamerr.ErrInvalidOperation, key)
	}
	unlock := m.lockKey(key.ID)
	defer unlock()
	// The record may change under us for reasons that keep this
	// incarnation (its recovery pointer going): read again until the
	// Closing write lands on the incarnation we close.
	var (
		cv    location.StoreVersion
		ready *location.Record
	)
	for {
		v, err := m.store.Read(ctx, key)
		if err != nil {
			return storeError("read "+key.String(), err)
		}
		rec := v.Record
		closing := spotservice.Closing(rec, gen, m.owner())
		if closing == nil {
			return fmt.Errorf("%w: %s is not Ready here at generation %d", roamerr.ErrStale, key, gen)
		}
		ready = rec
		cv, err = m.commit(ctx, key, v.Version, closing)
		if err == nil {
			break
		}
		if errors.Is(err, roamerr.ErrDeadlineExceeded) {
			// The Closing write's outcome is unknown: it may have landed
			// while this incarnation serves on. Settle it, past the call's
			// deadline, before giving up.
			landed, serr := m.settleClosing(key, gen, v.Version, rec)
			if serr != nil {
				return serr
			}
			if landed == 0 {
				return err
			}
			cv = landed
			break
		}
		if !errors.Is(err, errRetry) {
			return err
		}
	}
	if err := m.closeAndRelease(key, gen, cv, ready); err != nil {
		return err
	}
	m.log.Info().Str("event", "instance_spot_closed").Str("spot_id", key.ID).Uint64("object_generation", gen).Msg("Instance Spot closed itself")
	return nil
}

// settleClosing decides a Closing write to key (expected at version, from
// the Ready record ready at generation gen) whose answer never came. It
// re-reads, on its own deadline: the write landed (the record is Closing
// at gen under this owner, past version) — its version; or the record is
// still Ready at version, and a compare-and-set of the same record bumps
// the version, so the write in flight can never land — 0. Anything else
// is Stale. Without this a landed write left the record Closing for good
// under a live owner while the incarnation served on.
func (m *Manager) settleClosing(key location.AuthorityKey, gen uint64, version location.StoreVersion, ready *location.Record) (location.StoreVersion, error) {
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, closeSettleFor)
	defer cancel()
	for {
		v, err := m.store.Read(ctx, key)
		if err == nil {
			switch spotservice.SettleClosing(v, version, gen, m.owner()) {
			case spotservice.SettleChanged:
				return 0, fmt.Errorf("%w: %s changed while its Closing write was unsettled", roamerr.ErrStale, key)
			case spotservice.SettleLanded:
				return v.Version, nil
			case spotservice.SettleFence:
				if _, err = m.store.CompareAndSet(ctx, key, version, ready); err == nil {
					return 0, nil // fenced: the Closing write cannot land any more
				}
			case spotservice.SettleMovedPast:
				return 0, nil
			}
		}
		select {
		case <-ctx.Done():
			m.log.Error().Str("event", "spot_close_unsettled").Str("spot_id", key.ID).Err(err).
				Msg("an Instance Spot's Closing write stays unsettled; the record may be Closing while the incarnation serves")
			return 0, storeError("settle the Closing write of "+key.String(), err)
		case <-machine.After(machine.Real, 50*time.Millisecond): // pacing
		}
	}
}

// closeSettleFor bounds how long an own close settles its Closing write.
const closeSettleFor = 30 * time.Second
