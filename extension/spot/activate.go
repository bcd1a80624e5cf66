package spot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// errRetry: the store changed under this attempt; read the authority again.
var errRetry = errors.New("spot: authority changed, read again")

var deterministic = proto.MarshalOptions{Deterministic: true}

// onActivation is the target side of command 39 route kind 2 (spec 002
// §4.1 steps 10–12, §4.2): deliver the first message to the current owner,
// or obtain creation authority and activate the Spot here with that
// message handled first. Failures are answered to the caller's reply route.
func (m *Manager) onActivation(a *messages.SpotActivation) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, a.GetDeadlineUnixNanos()))
	defer cancel()
	err := m.activateHere(ctx, a)
	if err == nil {
		return
	}
	if errors.Is(err, roamerr.ErrCapacityExceeded) && m.passOn(ctx, a) {
		return
	}
	m.met.operation("activate", outcomeOf(err))
	if s := a.GetFirst().GetSender(); s != nil {
		relocation.RespondFailure(m.sys, actor.NewPID(s.GetAddress(), s.GetId()), a.GetSpotId(), err)
	}
	m.log.Warn().Str("event", "activation_failed").Str("spot_id", a.GetSpotId()).Str("operation_id", a.GetOperationId()).
		Err(err).Msg("the first message of a cold activation was not delivered")
}

func (m *Manager) activateHere(ctx context.Context, a *messages.SpotActivation) error {
	if a.GetRouteKind() != 2 || a.GetOperationId() == "" || a.GetFirst() == nil {
		return fmt.Errorf("%w: malformed activation envelope", roamerr.ErrInvalidOperation)
	}
	if err := ValidateID(a.GetSpotId()); err != nil {
		return err
	}
	if a.GetTargetNodeRid() != m.desc.GetNodeRid() || a.GetTargetNodeGeneration() != m.desc.GetNodeGeneration() {
		// Meant for another lifecycle (a process restarted on the same
		// address): the envelope's target fence does not match (§4.1).
		return fmt.Errorf("%w: command 39 for node %s reached %s", roamerr.ErrUnavailable, a.GetTargetNodeRid(), m.desc.GetNodeRid())
	}
	first, err := relocation.FromWire(a.GetFirst())
	if err != nil {
		return err
	}
	unlock := m.lockKey(a.GetSpotId())
	defer unlock()
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%w: activation of Spot %q: %w", roamerr.ErrDeadlineExceeded, a.GetSpotId(), err)
		}
		err := m.activateOnce(ctx, a, first)
		if !errors.Is(err, errRetry) {
			return err
		}
	}
}

func (m *Manager) activateOnce(ctx context.Context, a *messages.SpotActivation, first any) error {
	auth, err := m.readAuthority(ctx, a.GetSpotId())
	if err != nil {
		return err
	}
	rec := auth.v.Record
	if auth.v.Present() && auth.v.Key.Kind != location.KindInstanceSpot {
		return fmt.Errorf("%w: Spot %q is a User Spot", roamerr.ErrTypeMismatch, a.GetSpotId())
	}
	if auth.v.Present() && !auth.ended && m.stranded(auth.v) {
		// Our own record with no incarnation behind it and no activation
		// of ours in progress (we hold the key): an earlier attempt here
		// lost its answer from the store. It resumes like an ended owner's.
		auth.ended = true
	}
	switch {
	case auth.missing():
		return m.coldActivate(ctx, a, first, auth.v)
	case auth.ready() && !auth.ended:
		if rec.GetStableType() != a.GetStableType() {
			return fmt.Errorf("%w: Spot %q has stable type %q, the activation names %q", roamerr.ErrTypeMismatch, a.GetSpotId(), rec.GetStableType(), a.GetStableType())
		}
		// Ready already: the first message goes, once, to the current
		// owner's queue (spec 002 §4.2); a local incarnation that is not
		// the store's current one never gets it.
		m.sys.Root.Send(auth.pid(), first)
		m.met.operation("activate", "forwarded")
		return nil
	case auth.ended || abandonedActivation(rec):
		if rec.GetStableType() != a.GetStableType() {
			return fmt.Errorf("%w: Spot %q has stable type %q, the activation names %q", roamerr.ErrTypeMismatch, a.GetSpotId(), rec.GetStableType(), a.GetStableType())
		}
		if rec.GetActivationRecovery() != nil {
			return m.resume(ctx, auth.v, a, first)
		}
		if k, ok := m.d.Kind(rec.GetStableType()); ok && relocation.PreservesState(k.Policy) {
			if !k.ReactivateEmpty {
				// Spec 003: the state ended with its owner; only an operator
				// (or a kind that opted in) may accept the loss.
				m.log.Warn().Str("event", "reactivation_refused").Str("spot_id", a.GetSpotId()).Str("owner_node_rid", rec.GetOwner().GetNodeRid()).
					Msg("the owner of an Instance Spot ended with its in-memory state; it stays unavailable until ReleaseEnded accepts the loss")
				return fmt.Errorf("%w: Spot %q: its owner node %s ended and its in-memory state with it; Spots().ReleaseEnded accepts the loss and lets it start empty",
					roamerr.ErrUnavailable, a.GetSpotId(), rec.GetOwner().GetNodeRid())
			}
			m.log.Warn().Str("event", "spot_reactivated").Str("spot_id", a.GetSpotId()).Uint64("object_generation", rec.GetObjectGeneration()).
				Msg("the owner of an Instance Spot ended; a new incarnation starts without the old one's in-memory state")
		}
		return m.coldActivate(ctx, a, first, auth.v) // reactivation (spec 003)
	default:
		// Creating or Closing under a live owner: wait for its outcome.
		if err := m.watch(ctx, auth.v.Key, auth.v.Version); err != nil {
			return err
		}
		return errRetry
	}
}

// pendingFirst is a message the activation dispatches ahead of everything.
type pendingFirst struct {
	op  string
	msg any
}

// coldActivate stores the activation envelope as the recovery root, then
// reserves the Spot (Missing, or an ended owner's record at prev.Version,
// → Creating) with the recovery receipt in one transaction that also checks
// the ID is not a User Spot (spec 002 §4.1 step 10, spec 003).
func (m *Manager) coldActivate(ctx context.Context, a *messages.SpotActivation, first any, prev location.Versioned) error {
	if _, ok := m.d.Kind(a.GetStableType()); !ok {
		return fmt.Errorf("%w: Instance Spot type %q is not registered on node %s", roamerr.ErrNotFound, a.GetStableType(), m.desc.GetNodeRid())
	}
	release, err := m.admitCapacity(ctx)
	if err != nil {
		return err
	}
	defer release() // once open, the incarnation counts as serving
	data, err := deterministic.Marshal(a)
	if err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	rootKey := "activation-" + a.GetOperationId()
	ref, err := m.roots.PutRoot(ctx, rootKey, data)
	if err != nil {
		return storeError("store the recovery root", err)
	}
	key := location.Key(location.KindInstanceSpot, a.GetSpotId())
	rec := &location.Record{
		ObjectGeneration:         newGeneration(prev.Record.GetObjectGeneration()),
		AuthorityOwnerGeneration: 1,
		State:                    messages.LifecycleState_LIFECYCLE_STATE_CREATING,
		Owner:                    m.owner(),
		StableType:               a.GetStableType(),
		SpotKind:                 messages.SpotKind_SPOT_KIND_INSTANCE,
		ActivationRecovery: &messages.ActivationRecovery{
			RecoveryKey: rootKey, RootSha256: ref.SHA256[:], RootSize: ref.Size, OperationId: a.GetOperationId(),
			DeadlineUnixNanos: a.GetDeadlineUnixNanos(),
		},
	}
	rec.ActivationRecovery.ReservationFence = rec.ObjectGeneration
	version, err := m.reserve(ctx, key, prev.Version, rec, location.KindUserSpot, func(r *location.Record) bool {
		return r.GetActivationRecovery().GetOperationId() == a.GetOperationId()
	})
	if err != nil {
		m.deleteRoot(rootKey)
		return err
	}
	return m.openActivated(ctx, key, version, rec, []pendingFirst{{a.GetOperationId(), first}}, rootKey)
}

// reserve writes rec at key (created if expected is 0) with a check that
// the other Spot kind's key is absent, in one transaction. A lost race is
// errRetry; an indeterminate outcome is settled by a consistent re-read
// that looks for this attempt's own mark (DESIGN §3).
func (m *Manager) reserve(ctx context.Context, key location.AuthorityKey, expected location.StoreVersion, rec *location.Record, other location.Kind, mine func(*location.Record) bool) (location.StoreVersion, error) {
	op := location.CreateOp(key, rec)
	if expected != 0 {
		op = location.UpdateOp(key, expected, rec)
	}
	vers, err := m.store.Apply(ctx, []location.Op{op, location.CheckOp(location.Key(other, key.ID), 0)})
	switch {
	case err == nil:
		return vers[0], nil
	case errors.Is(err, location.ErrConflict):
		return 0, errRetry
	case errors.Is(err, location.ErrIndeterminate):
		return m.settle(ctx, key, mine)
	}
	return 0, storeError("reserve "+key.String(), err)
}

// settle decides an indeterminate write by consistent re-reads until one
// answers: the version if the record is this attempt's (mine), errRetry
// if it is not, or an error once ctx ends with the outcome still unknown.
func (m *Manager) settle(ctx context.Context, key location.AuthorityKey, mine func(*location.Record) bool) (location.StoreVersion, error) {
	for {
		v, err := m.store.Read(ctx, key)
		switch {
		case err == nil && mine(v.Record):
			return v.Version, nil
		case err == nil, errors.Is(err, location.ErrNotFound):
			return 0, errRetry
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: the outcome of a write to %s is unknown: %w", roamerr.ErrDeadlineExceeded, key, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stranded reports whether v is this node's own record (owner and lease)
// with no incarnation of its generation here. The caller holds the key, so
// no activation of ours is in progress for it.
func (m *Manager) stranded(v location.Versioned) bool {
	return v.Key.Kind == location.KindInstanceSpot && sameOwner(v.Record.GetOwner(), m.owner()) &&
		!m.d.Hosts(v.Key, v.Record.GetObjectGeneration())
}

// abandonedActivation reports whether an Instance Spot reservation is
// still Creating abandonGrace after its activation's deadline.
func abandonedActivation(rec *location.Record) bool {
	dl := rec.GetActivationRecovery().GetDeadlineUnixNanos()
	return rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING && dl != 0 &&
		time.Now().After(time.Unix(0, dl).Add(abandonGrace))
}

// openActivated runs the factory with the Spot staged, commits Ready
// keeping the recovery pointer, and opens dispatch with the first
// messages at the head of the queue; the pointer goes once the first
// handler has completed (spec 002 §4.1 steps 11–12). On any failure
// before the commit the reservation is released with the same fence.
func (m *Manager) openActivated(ctx context.Context, key location.AuthorityKey, version location.StoreVersion, rec *location.Record, firsts []pendingFirst, rootKey string) error {
	started := time.Now()
	staged, err := m.d.Stage(ctx, key, rec.GetStableType(), rec.GetObjectGeneration(), rec.GetAuthorityOwnerGeneration())
	if err != nil {
		m.abortReservation(key, version, rootKey)
		return err
	}
	ready := proto.Clone(rec).(*location.Record)
	ready.State = messages.LifecycleState_LIFECYCLE_STATE_READY
	if _, err := m.commit(ctx, key, version, ready); err != nil {
		staged.Discard()
		if !errors.Is(err, errRetry) {
			m.abortReservation(key, version, rootKey)
		}
		return err
	}
	msgs := make([]any, len(firsts))
	for i, f := range firsts {
		msgs[i] = f.msg
	}
	firstOp := firsts[0].op
	err = staged.Open(ctx, msgs, firstOp, func() { go m.clearRecovery(key, firstOp, rootKey) })
	if err != nil {
		// Ready with the pointer kept: the start-up scan of a live node
		// restores it (§4.1.1) once this lifecycle ends.
		return err
	}
	m.met.operation("activate", "ok")
	m.met.activated(started)
	m.log.Info().Str("event", "spot_activated").Str("spot_id", key.ID).Uint64("object_generation", rec.GetObjectGeneration()).
		Str("operation_id", firstOp).Str("stable_type", rec.GetStableType()).Msg("Instance Spot activated by its first message")
	return nil
}

// commit writes rec over the reservation at version; indeterminate
// outcomes are settled by re-reading.
func (m *Manager) commit(ctx context.Context, key location.AuthorityKey, version location.StoreVersion, rec *location.Record) (location.StoreVersion, error) {
	v, err := m.store.CompareAndSet(ctx, key, version, rec)
	switch {
	case err == nil:
		return v, nil
	case errors.Is(err, location.ErrConflict):
		return 0, errRetry
	case errors.Is(err, location.ErrIndeterminate):
		return m.settle(ctx, key, func(got *location.Record) bool { return proto.Equal(got, rec) })
	}
	return 0, storeError("commit "+key.String(), err)
}

// abortReservation releases a reservation this node made, with the same
// fence (its version), and deletes its root.
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

// resume continues an activation whose owner ended after its reservation
// or its Ready commit (spec 002 §4.1.1): it takes the record over with the
// same ObjectGeneration and the next owner generation, restores the first
// record from the recovery root, and dispatches it before anything else —
// then current's first message, if that is another operation.
func (m *Manager) resume(ctx context.Context, v location.Versioned, current *messages.SpotActivation, currentFirst any) error {
	rec := v.Record
	rr := rec.GetActivationRecovery()
	data, ref, err := m.roots.GetRoot(ctx, rr.GetRecoveryKey())
	if errors.Is(err, location.ErrNotFound) {
		return m.dropPointer(ctx, v)
	}
	if err != nil {
		return storeError("read the recovery root", err)
	}
	if !bytes.Equal(ref.SHA256[:], rr.GetRootSha256()) || ref.Size != rr.GetRootSize() {
		return fmt.Errorf("%w: recovery root of Spot %q does not match its receipt", roamerr.ErrConflict, v.Key.ID)
	}
	orig := &messages.SpotActivation{}
	if err := proto.Unmarshal(data, orig); err != nil {
		return fmt.Errorf("%w: recovery root of Spot %q: %w", roamerr.ErrConflict, v.Key.ID, err)
	}
	if _, ok := m.d.Kind(rec.GetStableType()); !ok {
		return fmt.Errorf("%w: Instance Spot type %q is not registered on node %s", roamerr.ErrUnavailable, rec.GetStableType(), m.desc.GetNodeRid())
	}
	origFirst, err := relocation.FromWire(orig.GetFirst())
	if err != nil {
		return err
	}
	took := proto.Clone(rec).(*location.Record)
	took.Owner = m.owner()
	took.AuthorityOwnerGeneration++
	took.State = messages.LifecycleState_LIFECYCLE_STATE_CREATING
	version, err := m.commit(ctx, v.Key, v.Version, took)
	if err != nil {
		return err
	}
	firsts := []pendingFirst{{orig.GetOperationId(), origFirst}}
	if current != nil && current.GetOperationId() != orig.GetOperationId() {
		firsts = append(firsts, pendingFirst{current.GetOperationId(), currentFirst})
	}
	// Warn: the ended owner may have run the first message's handler
	// before its lifecycle ended and before the pointer's removal landed;
	// the replay is then a second run (docs/FAULTS.md, repeated first
	// message). Nothing else in the store can tell the two apart.
	m.log.Warn().Str("event", "activation_resumed").Str("spot_id", v.Key.ID).Str("operation_id", orig.GetOperationId()).
		Msg("an activation whose owner ended is resumed here from its recovery root; its first message runs here, a second time if the ended owner had already handled it")
	return m.openActivated(ctx, v.Key, version, took, firsts, rr.GetRecoveryKey())
}

// dropPointer clears a recovery pointer whose root is gone (the first
// handler completed and the root was deleted, but the pointer's removal
// was not seen): the record is an ended owner's Ready record again.
func (m *Manager) dropPointer(ctx context.Context, v location.Versioned) error {
	rec := proto.Clone(v.Record).(*location.Record)
	rec.ActivationRecovery = nil
	if _, err := m.commit(ctx, v.Key, v.Version, rec); err != nil && !errors.Is(err, errRetry) {
		return err
	}
	return errRetry
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

func (m *Manager) recoverOne(ctx context.Context, v location.Versioned) error {
	rec := v.Record
	creatingUser := v.Key.Kind == location.KindUserSpot && rec.GetState() == messages.LifecycleState_LIFECYCLE_STATE_CREATING
	if rec.GetActivationRecovery() == nil && !creatingUser {
		return nil
	}
	if (creatingUser && abandoned(rec)) || abandonedActivation(rec) {
		// released or resumed below like an ended owner's reservation
	} else if _, alive, err := m.ownerAddress(ctx, rec.GetOwner()); err != nil || alive {
		return err
	}
	if creatingUser {
		_, err := m.store.Apply(ctx, []location.Op{location.DeleteOp(v.Key, v.Version)})
		if err == nil {
			m.deleteRoot(rec.GetCreationIntent().GetContentRef())
			m.log.Info().Str("event", "reservation_released").Str("spot_id", v.Key.ID).Msg("an ended owner's User Spot reservation was released")
		}
		if err != nil && !errors.Is(err, location.ErrConflict) {
			return storeError("release "+v.Key.String(), err)
		}
		return nil
	}
	if _, ok := m.d.Kind(rec.GetStableType()); !ok {
		return nil
	}
	unlock := m.lockKey(v.Key.ID)
	defer unlock()
	cur, err := m.store.Read(ctx, v.Key)
	if err != nil || cur.Version != v.Version {
		return nil // changed meanwhile: whoever changed it carries on
	}
	if err := m.resume(ctx, cur, nil, nil); err != nil && !errors.Is(err, errRetry) {
		return err
	}
	return nil
}

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
