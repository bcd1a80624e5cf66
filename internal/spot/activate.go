package spot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/spotservice"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
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
	return m.d.ActivationKind(k)
}

// onActivation is the target side of a SpotActivation, route kind 2
// (docs/PROTOCOL.md §7.5 steps 8–12, §7.6): the Activation machine
// decides, this runs its effects. Failures are answered to the caller's reply route.
func (m *Manager) onActivation(a *messages.SpotActivation) {
	ctx, cancel := m.wireDeadlineCtx(a.GetDeadlineUnixNanos())
	defer cancel()
	s := activation.Start{Envelope: a, IDErr: ValidateID(a.GetSpotId()), Kind: m.kindOf(a.GetStableType()), Now: m.clock.Now()}
	if a.GetFirst() != nil {
		s.First, s.FirstErr = relocation.FromWire(a.GetFirst())
	}
	mc, effects := activation.NewActivation(m.acfg, s)
	r := m.newRunner(ctx, mc.Step)
	r.env, r.first = a, s.First
	_ = r.run(effects) // a failure was answered, measured and logged
}

// Recover is the start-up authority scan (PROTOCOL.md §7.7): every
// Instance Spot activation whose owner ended while its recovery pointer
// was set is resumed here (if this node hosts its type), and every User
// Spot reservation of an ended owner is released with its fence. New runs
// it once in the background; it is safe to run again. Of several failed
// recoveries it returns one error in one class: the first failure's,
// preferring one that is ErrOwnerEnding (a scan a lease TTL later may
// finish it), with the others' text.
func (m *Manager) Recover(ctx context.Context) error {
	var err error
	spotservice.RunScan(scanEnv{m: m, ctx: ctx}, func(listErr error, failed []error) {
		if listErr != nil {
			err = storeError("scan", listErr)
			return
		}
		err = oneFailure(failed)
	})
	return err
}

// scanEnv is spotservice.RunScan's host (the walk the simulation runs
// too): every answer comes before the call returns.
type scanEnv struct {
	m   *Manager
	ctx context.Context
}

func (e scanEnv) List(kind location.Kind, req location.PageRequest, done func(location.Page, error)) {
	done(e.m.store.List(e.ctx, kind, req))
}

func (e scanEnv) Recover(v location.Versioned, done func(error)) { done(e.m.recoverOne(e.ctx, v)) }

// oneFailure is Recover's error for the failures errs: the first one (or
// the first ErrOwnerEnding one) with its class, and the others' text only,
// since they may be of other classes.
func oneFailure(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	i := max(0, slices.IndexFunc(errs, func(err error) bool { return errors.Is(err, roamerr.ErrOwnerEnding) }))
	if len(errs) == 1 {
		return errs[0]
	}
	others := make([]string, 0, len(errs)-1)
	for j, err := range errs {
		if j != i {
			others = append(others, err.Error())
		}
	}
	return fmt.Errorf("%w (and %d more failed: %s)", errs[i], len(others), strings.Join(others, "; "))
}

// recoverOne runs the recovery machine for one scanned record.
func (m *Manager) recoverOne(ctx context.Context, v location.Versioned) error {
	dl, _ := ctx.Deadline()
	mc, effects := activation.NewRecovery(m.acfg, activation.Recover{Scanned: v, Kind: m.kindOf(v.Record.GetStableType()), Deadline: dl, Now: m.clock.Now()})
	return m.newRunner(ctx, mc.Step).run(effects)
}

// clearRecovery removes an activation's recovery pointer once its first
// handler has completed, then deletes its root (the Clear machine); it
// returns how the machine ended.
func (m *Manager) clearRecovery(key location.AuthorityKey, op, rootKey string, committed location.Versioned) activation.Phase {
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.acfg.ClearFor)
	defer cancel()
	mc, effects := activation.NewClear(m.acfg, key, op, rootKey, committed, m.clock.Now())
	_ = m.newRunner(ctx, mc.Step).run(effects)
	return mc.Phase()
}

// withoutNotice drops a dispatch notice from a first message replayed from
// its recovery root: the future it names belonged to the original call,
// long answered or gone (and a restarted caller may reuse its name).
func withoutNotice(first any) any {
	env, ok := first.(*actor.MessageEnvelope)
	if !ok || env.Header == nil || env.Header.Get(relocation.HeaderDispatchNotice) == "" {
		return first
	}
	out := &actor.MessageEnvelope{Message: env.Message, Sender: env.Sender}
	for k, v := range env.Header.ToMap() {
		if k != relocation.HeaderDispatchNotice {
			out.SetHeader(k, v)
		}
	}
	return out
}

// closeAndRelease runs a close after its Closing write (PROTOCOL.md §7.9;
// the Release machine): the local incarnation handles what it
// accepted and stops, then the authority goes with the same fence. A Spot
// that turned out to be moving is put back to Ready and the close ends
// Unavailable.
func (m *Manager) closeAndRelease(key location.AuthorityKey, gen uint64, closingAt location.StoreVersion, wasReady *location.Record) error {
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.acfg.ReleaseFor)
	defer cancel()
	mc, effects := activation.NewRelease(m.acfg, key, gen, closingAt, wasReady, m.clock.Now())
	return m.newRunner(ctx, mc.Step).run(effects)
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
func (m *Manager) reserve(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record, other location.Kind,
	mine func(*location.Record) bool, replaced *location.Record, ownerCapacity uint32) (location.StoreVersion, error) {
	dl, _ := ctx.Deadline()
	return m.runWrite(ctx, activation.NewReserve(m.acfg, key, expected, rec, other, mine, dl).Replacing(replaced, ownerCapacity))
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
func (m *Manager) abortReservation(key location.AuthorityKey, version location.StoreVersion, rec *location.Record) {
	rootKey := rec.GetCreationIntent().GetContentRef()
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.cfg.DefaultTimeout)
	defer cancel()
	if err := m.deleteRecord(ctx, key, version, rec); err != nil && !errors.Is(err, location.ErrConflict) {
		m.log.Warn().Str("event", "reservation_abort_failed").Str("spot_id", key.ID).Err(err).Msg("the reservation stays until its owner's lease ends")
		return
	}
	m.deleteRoot(rootKey)
}

func (m *Manager) deleteRoot(rootKey string) {
	if rootKey == "" {
		return
	}
	ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.cfg.DefaultTimeout)
	defer cancel()
	if err := m.roots.DeleteRoot(ctx, rootKey); err != nil {
		m.log.Warn().Str("event", "root_delete_failed").Str("root", rootKey).Err(err).Msg("a root was left in the Relocation Store")
	}
}

// passOn hands an activation this node is too full for to another serving
// node of the same Mesh that hosts the type and has not refused it yet
// (spotservice.RunPassOn, which the simulation runs too). Nothing was
// reserved or queued here, so the caller still sees one activation; it
// ends CapacityExceeded only once every candidate is full (PROTOCOL.md
// §7.5 step 9).
func (m *Manager) passOn(ctx context.Context, a *messages.SpotActivation) (passed bool) {
	spotservice.RunPassOn(passOnEnv{m: m, ctx: ctx}, a, m.desc.GetNodeRid(), func(p bool) { passed = p })
	return passed
}

// passOnEnv is spotservice.RunPassOn's host: every answer comes before
// the call returns.
type passOnEnv struct {
	m   *Manager
	ctx context.Context
}

func (e passOnEnv) ListNodes(mesh string, done func([]location.VersionedNode, error)) {
	done(e.m.store.ListNodes(e.ctx, mesh))
}

func (e passOnEnv) Candidates(nodes []location.VersionedNode, a *messages.SpotActivation) []location.VersionedNode {
	return candidates(nodes, a.GetStableType(), true, a.GetSpotId())
}

func (e passOnEnv) Send(n location.VersionedNode, next *messages.SpotActivation) {
	e.m.sys.Root.RequestWithCustomSender(servicePID(n.Node.GetAddress()), next, e.m.self)
}
