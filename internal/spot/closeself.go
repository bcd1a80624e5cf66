package spot

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/extensions"

	"github.com/roamactors/roam/internal/activation"
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
	h := &closeHost{m: m, ctx: ctx, key: key, gen: gen}
	defer func() {
		if h.cancelSettle != nil {
			h.cancelSettle()
		}
	}()
	spotservice.CloseSelf(h, key, gen, m.owner())
	if h.err != nil {
		return h.err
	}
	m.log.Info().Str("event", "instance_spot_closed").Str("spot_id", key.ID).Uint64("object_generation", gen).Msg("Instance Spot closed itself")
	return nil
}

// closeHost runs an own close (spotservice.CloseSelf) on the Location
// Store and this node's clock. Every primitive answers before it returns,
// so the close has ended when CloseSelf returns.
type closeHost struct {
	m   *Manager
	ctx context.Context
	key location.AuthorityKey
	gen uint64
	err error
	// settleCtx bounds the settling of an unknown Closing write, from its
	// first re-read (spotservice.CloseSettleFor).
	settleCtx    context.Context
	cancelSettle context.CancelFunc
}

func (h *closeHost) Read(done func(location.Versioned, error)) { done(h.m.store.Read(h.ctx, h.key)) }

func (h *closeHost) WriteClosing(version location.StoreVersion, closing *location.Record, done func(activation.Outcome, location.StoreVersion, error)) {
	dl, _ := h.ctx.Deadline()
	w := activation.NewCompareAndSet(h.m.acfg, h.key, version, closing, dl).Alone()
	runErr := h.m.newRunner(h.ctx, w.Step).run(w.Start())
	outcome, v, err := w.Result()
	if outcome == activation.Pending {
		err = runErr
	}
	done(outcome, v, err)
}

func (h *closeHost) settling() context.Context {
	if h.settleCtx == nil {
		h.settleCtx, h.cancelSettle = machine.WithTimeout(context.Background(), h.m.clock, spotservice.CloseSettleFor)
	}
	return h.settleCtx
}

func (h *closeHost) SettleRead(done func(location.Versioned, error)) {
	done(h.m.store.Read(h.settling(), h.key))
}

func (h *closeHost) Fence(version location.StoreVersion, ready *location.Record, done func(error)) {
	_, err := h.m.store.CompareAndSet(h.settling(), h.key, version, ready)
	done(err)
}

// Pace runs again on this goroutine: the settling recurses once per
// re-read, at most CloseSettleFor / CloseSettlePace deep.
func (h *closeHost) Pace(again func()) bool {
	select {
	case <-h.settling().Done():
		return false
	case <-machine.After(machine.Real, spotservice.CloseSettlePace):
	}
	again()
	return true
}

func (h *closeHost) Unsettled(err error) {
	h.m.log.Error().Str("event", "spot_close_unsettled").Str("spot_id", h.key.ID).Err(err).
		Msg("an Instance Spot's Closing write stays unsettled; the record may be Closing while the incarnation serves")
}

func (h *closeHost) Release(closingAt location.StoreVersion, ready *location.Record, done func(error)) {
	done(h.m.closeAndRelease(h.key, h.gen, closingAt, ready))
}

func (h *closeHost) Done(err error) { h.err = err }
