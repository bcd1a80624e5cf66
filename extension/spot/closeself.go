package spot

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/extensions"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

var managerExtension = extensions.NextExtensionID()

// ExtensionID registers the Manager as its actor system's extension, so a
// Spot's handler can find it (CloseSelf).
func (m *Manager) ExtensionID() extensions.ExtensionID { return managerExtension }

// CloseSelf asks for the local Close of the Instance Spot whose handler or
// timer is running in c (spec 002 §7: an Instance Spot closes from its own
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
		if rec.GetObjectGeneration() != gen || !sameOwner(rec.GetOwner(), m.owner()) || rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
			return fmt.Errorf("%w: %s is not Ready here at generation %d", roamerr.ErrStale, key, gen)
		}
		ready = rec
		closing := proto.Clone(rec).(*location.Record)
		closing.State = messages.LifecycleState_LIFECYCLE_STATE_CLOSING
		cv, err = m.commit(ctx, key, v.Version, closing)
		if err == nil {
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
