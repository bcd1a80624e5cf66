package spot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation"
	"github.com/roamactors/roam/extension/spot/activation"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// errRetry: the store changed under this attempt; read the authority again.
var errRetry = errors.New("spot: authority changed, read again")

var deterministic = proto.MarshalOptions{Deterministic: true}

// kindOf is what the activation machines need to know of a registered
// kind.
func (m *Manager) kindOf(stableType string) activation.Kind {
	k, ok := m.d.Kind(stableType)
	if !ok {
		return activation.Kind{}
	}
	return activation.Kind{Registered: true, PreservesState: relocation.PreservesState(k.Policy), ReactivateEmpty: k.ReactivateEmpty}
}

// onActivation is the target side of command 39 route kind 2 (spec 002
// §4.1 steps 10–12, §4.2): the Activation machine decides, this runs its
// effects. Failures are answered to the caller's reply route.
func (m *Manager) onActivation(a *messages.SpotActivation) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, a.GetDeadlineUnixNanos()))
	defer cancel()
	s := activation.Start{Envelope: a, IDErr: ValidateID(a.GetSpotId()), Kind: m.kindOf(a.GetStableType()), Now: time.Now()}
	if a.GetFirst() != nil {
		s.First, s.FirstErr = relocation.FromWire(a.GetFirst())
	}
	mc, effects := activation.NewActivation(m.acfg, s)
	r := m.newRunner(ctx, mc.Step)
	r.env, r.first = a, s.First
	_ = r.run(effects) // a failure was answered, measured and logged
}

// Recover is the start-up authority scan (spec 002 §4.1.1): every
// Instance Spot activation whose owner ended while its recovery pointer
// was set is resumed here (if this node hosts its type), and every User
// Spot reservation of an ended owner is released with its fence. New runs
// it once in the background; it is safe to run again.
func (m *Manager) Recover(ctx context.Context) error {
	var errs []error
	for _, kind := range []location.Kind{location.KindInstanceSpot, location.KindUserSpot} {
		after := ""
		for {
			page, err := m.store.List(ctx, kind, location.PageRequest{Size: location.MaxPageSize, After: after})
			if err != nil {
				return storeError("scan", err)
			}
			for _, v := range page.Items {
				if err := m.recoverOne(ctx, v); err != nil {
					errs = append(errs, err)
				}
			}
			if page.Next == "" {
				break
			}
			after = page.Next
		}
	}
	return errors.Join(errs...)
}

// recoverOne runs the recovery machine for one scanned record.
func (m *Manager) recoverOne(ctx context.Context, v location.Versioned) error {
	dl, _ := ctx.Deadline()
	mc, effects := activation.NewRecovery(m.acfg, activation.Recover{Scanned: v, Kind: m.kindOf(v.Record.GetStableType()), Deadline: dl, Now: time.Now()})
	return m.newRunner(ctx, mc.Step).run(effects)
}

// clearRecovery removes the recovery pointer by expected-version CAS once
// the first handler has completed, then deletes the root (spec 002 §4.1
// step 12). It re-reads on every attempt, so a record rewritten meanwhile
// (a move) is handled.
func (m *Manager) clearRecovery(key location.AuthorityKey, op, rootKey string) {
	ctx, cancel := context.WithTimeout(context.Background(), clearRecoveryFor)
	defer cancel()
	for ctx.Err() == nil {
		v, err := m.store.Read(ctx, key)
		if errors.Is(err, location.ErrNotFound) {
			break
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if v.Record.GetActivationRecovery().GetOperationId() != op {
			break
		}
		if v.Record.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY {
			return // closing: the release removes record and root together
		}
		rec := proto.Clone(v.Record).(*location.Record)
		rec.ActivationRecovery = nil
		if _, err := m.store.CompareAndSet(ctx, key, v.Version, rec); err == nil || errors.Is(err, location.ErrConflict) || errors.Is(err, location.ErrIndeterminate) {
			continue // re-read: done when the pointer is gone
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ctx.Err() != nil {
		m.log.Warn().Str("event", "activation_recovery_clear_failed").Str("spot_id", key.ID).Msg("the recovery pointer stays; the first message may be replayed if this owner ends")
		return
	}
	m.deleteRoot(rootKey)
}

// clearRecoveryFor bounds the retries of a recovery pointer's removal.
const clearRecoveryFor = 10 * time.Minute

// release ends a close: it deletes key's record while it is still Closing
// at generation gen under this owner, re-reading after every conflict or
// unclear answer, with its own deadline (the caller's may be spent by the
// accepted turns). It then deletes a recovery root the record still named.
func (m *Manager) release(key location.AuthorityKey, gen uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		v, err := m.store.Read(ctx, key)
		switch {
		case errors.Is(err, location.ErrNotFound):
			return nil
		case err == nil:
			rec := v.Record
			if rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_CLOSING || rec.GetObjectGeneration() != gen || !sameOwner(rec.GetOwner(), m.owner()) {
				return fmt.Errorf("%w: %s changed while closing", roamerr.ErrStale, key)
			}
			if _, err = m.store.Apply(ctx, []location.Op{location.DeleteOp(key, v.Version)}); err == nil {
				m.deleteRoot(rec.GetActivationRecovery().GetRecoveryKey())
				return nil
			}
		}
		select {
		case <-ctx.Done():
			m.log.Error().Str("event", "spot_release_failed").Str("spot_id", key.ID).Err(err).Msg("a closed Spot's authority stays Closing")
			return storeError("release "+key.String(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// closeAndRelease runs a close after its Closing write (spec 002 §7 steps
// 2–4): the local incarnation handles what it accepted and stops, then the
// authority goes with the same fence. A Spot that turned out to be moving
// is put back to Ready and the close ends Unavailable.
func (m *Manager) closeAndRelease(key location.AuthorityKey, gen uint64, closingAt location.StoreVersion, wasReady *location.Record) error {
	m.cache.drop(key.ID) // a reader now sees Closing, which is never cached
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := m.d.CloseLocal(ctx, key, gen)
	if errors.Is(err, roamerr.ErrUnavailable) {
		if _, rerr := m.commit(ctx, key, closingAt, wasReady); rerr != nil {
			m.log.Error().Str("event", "spot_close_revert_failed").Str("spot_id", key.ID).Err(rerr).Msg("a moving Spot stays Closing")
		}
		return err
	}
	if err != nil && !errors.Is(err, roamerr.ErrNotFound) {
		// The incarnation is ended and stops itself after its accepted
		// turns; nothing new reaches it.
		m.log.Warn().Str("event", "close_local_slow").Str("spot_id", key.ID).Err(err).Msg("the closed incarnation is still finishing accepted turns")
	}
	return m.release(key, gen)
}

// commit writes rec over key at version (a Write machine): nil with the
// new version, errRetry if the store changed under it (a conflict, or an
// indeterminate answer settled as not applied), or the failure.
func (m *Manager) commit(ctx context.Context, key location.AuthorityKey, version location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	dl, _ := ctx.Deadline()
	return m.runWrite(ctx, activation.NewCompareAndSet(m.acfg, key, version, rec, dl))
}

// reserve writes rec at key (created if expected is 0) with a check that
// the other Spot kind's key is absent, in one transaction (a Write
// machine); mine recognises this attempt's own mark when an indeterminate
// answer is settled. A lost race is errRetry.
func (m *Manager) reserve(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record, other location.Kind, mine func(*location.Record) bool) (location.StoreVersion, error) {
	dl, _ := ctx.Deadline()
	return m.runWrite(ctx, activation.NewReserve(m.acfg, key, expected, rec, other, mine, dl))
}

func (m *Manager) runWrite(ctx context.Context, w *activation.Write) (location.StoreVersion, error) {
	w.Alone()
	runErr := m.newRunner(ctx, w.Step).run(w.Start())
	switch outcome, v, err := w.Result(); outcome {
	case activation.Applied:
		return v, nil
	case activation.Lost:
		return 0, errRetry
	case activation.WriteFailed:
		return 0, err
	}
	return 0, runErr
}

// abortReservation releases a reservation this node made, with the same
// fence (its version), and deletes its root (a User Spot creation that
// will not complete).
func (m *Manager) abortReservation(key location.AuthorityKey, version location.StoreVersion, rootKey string) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DefaultTimeout)
	defer cancel()
	if _, err := m.store.Apply(ctx, []location.Op{location.DeleteOp(key, version)}); err != nil && !errors.Is(err, location.ErrConflict) {
		m.log.Warn().Str("event", "reservation_abort_failed").Str("spot_id", key.ID).Err(err).Msg("the reservation stays until its owner's lease ends")
		return
	}
	m.deleteRoot(rootKey)
}

func (m *Manager) deleteRoot(rootKey string) {
	if rootKey == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DefaultTimeout)
	defer cancel()
	if err := m.roots.DeleteRoot(ctx, rootKey); err != nil {
		m.log.Warn().Str("event", "root_delete_failed").Str("root", rootKey).Err(err).Msg("a root was left in the Relocation Store")
	}
}

// passOn hands an activation this node is too full for to another serving
// node of the same Mesh that hosts the type and has not refused it yet.
// Nothing was reserved or queued here, so the caller still sees one
// activation; it ends CapacityExceeded only once every candidate is full
// (spec 002 §4.1 step 7).
func (m *Manager) passOn(ctx context.Context, a *messages.SpotActivation) bool {
	full := append(a.GetFullNodeRids(), m.desc.GetNodeRid())
	nodes, err := m.store.ListNodes(ctx, a.GetTargetMesh())
	if err != nil {
		return false
	}
	for _, n := range candidates(nodes, a.GetStableType(), true, a.GetSpotId()) {
		if slices.Contains(full, n.Node.GetNodeRid()) {
			continue
		}
		next := proto.Clone(a).(*messages.SpotActivation)
		next.FullNodeRids = full
		next.TargetNodeRid, next.TargetNodeGeneration = n.Node.GetNodeRid(), n.Node.GetNodeGeneration()
		next.DescriptorVersion = uint64(n.Version)
		m.sys.Root.Send(servicePID(n.Node.GetAddress()), next)
		return true
	}
	return false
}
