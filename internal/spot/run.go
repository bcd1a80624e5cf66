package spot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/activation/activationrun"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// runner hosts one machine of package activation on a machine.Loop of
// its own: activationrun decides the order of its effects, their
// deadlines and its timers' turns, and runs as the loop's turns; runner
// supplies the primitives. A primitive that waits (for the Spot ID's lock,
// the store, a staged incarnation) does it off the loop and posts its
// answer back as a turn, so no turn blocks and the machine's timers stay
// the loop's. The caller of run only waits for the run's end.
type runner struct {
	m    *Manager
	ctx  context.Context
	ar   *activationrun.Runner
	loop *machine.Loop[activation.Timer]
	// ended closes when the machine has finished (Done).
	ended chan struct{}

	// What a SpotActivation brings, for the effects that use it.
	env   *messages.SpotActivation
	first any

	// Set by the answers' turns; given back by close if the run ends
	// holding them.
	staged          *relocation.Staged
	stagedAt        time.Time
	releaseCapacity func()
	unlock          func()
	// inlineRoot is a recovery root answered as stored but not written
	// yet: the Reserve that follows writes it in its own transaction.
	inlineRoot *inlineRoot
	// unstoredRoot is the key of an inline root whose transaction was
	// rolled back: nothing to delete.
	unstoredRoot string
}

var _ activationrun.Env = (*runner)(nil)

func (m *Manager) newRunner(ctx context.Context, step func(activation.Event) []activation.Effect) *runner {
	r := &runner{m: m, ctx: ctx, loop: machine.NewLoop[activation.Timer](m.clock), ended: make(chan struct{})}
	r.ar = activationrun.New(step, r)
	return r
}

// run runs effects and everything they lead to until the machine emits
// Finish, and returns its error.
func (r *runner) run(effects []activation.Effect) error {
	defer r.close()
	r.loop.Post(func() { r.ar.Start(effects) })
	<-r.ended
	return r.ar.Err()
}

// close ends the loop and, once its last turn has returned, gives back
// what a machine that ended early still held.
func (r *runner) close() {
	r.loop.Close()
	<-r.loop.Done()
	if r.releaseCapacity != nil {
		r.releaseCapacity()
		r.releaseCapacity = nil
	}
	if r.unlock != nil {
		r.unlock()
		r.unlock = nil
	}
}

// off runs wait off the loop — it may block on the store or a staged
// incarnation, bounded by its context — and then, as a turn, what it
// returns. Only one effect runs at a time (activationrun waits for each
// answer), so the fields the continuation sets are the loop's alone; and
// the loop closes only once the machine has ended, which it never does
// while it waits for an answer, so the continuation's turn is never
// refused.
func (r *runner) off(wait func() (then func())) {
	machine.Go(func() {
		then := wait()
		r.loop.Post(then)
	})
}

// store is call for a primitive that is store calls and nothing else
// that waits. On an immediate store (memstore) they run on the loop's own
// goroutine: a goroutine started for each, which grew its stack through
// the store's call every time, was a fifth of a cold activation's CPU.
// The answer is still a turn of its own, as every answer is.
func (r *runner) store(wait func() activation.Event) {
	r.storeOff(func() func() {
		ev := wait()
		return func() { r.ar.Answer(ev) }
	})
}

// storeOff is off for store calls, on the loop's goroutine as store says.
func (r *runner) storeOff(wait func() (then func())) {
	if !r.m.immediate {
		r.off(wait)
		return
	}
	r.loop.Post(wait())
}

// call is off for a primitive whose whole answer is an event.
func (r *runner) call(wait func() activation.Event) {
	r.off(func() func() {
		ev := wait()
		return func() { r.ar.Answer(ev) }
	})
}

// ctxFor is the context of a store call: the machine's, or — for a call
// that settles past the operation's deadline — one with a timeout of its
// own (the machine bounds the settling itself).
func (r *runner) ctxFor(d activationrun.Deadline) (context.Context, context.CancelFunc) {
	if d == activationrun.OwnTimeout {
		return machine.WithTimeout(context.Background(), r.m.clock, r.m.cfg.DefaultTimeout)
	}
	return r.ctx, func() {}
}

func (r *runner) Gone() bool                                    { return false }
func (r *runner) Stepped(activation.Event, []activation.Effect) {}
func (r *runner) Before(activation.Effect)                      {}
func (r *runner) Now() time.Time                                { return r.m.clock.Now() }

// Lock waits in the manager's key lock's queue, not on a goroutine: the
// grant posts the answer.
func (r *runner) Lock(spotID string) {
	r.m.lockKeyThen(spotID, func(unlock func()) {
		if !r.loop.Post(func() {
			r.unlock = unlock
			r.ar.Answer(activation.KeyLocked{Now: r.m.clock.Now()})
		}) {
			unlock() // cannot be: the machine waits for this answer
		}
	})
}

func (r *runner) Unlock() {
	if r.unlock != nil {
		r.unlock()
		r.unlock = nil
	}
}

func (r *runner) ReadAuthority(spotID string, d activationrun.Deadline) {
	m := r.m
	r.store(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		a, err := m.readAuthority(ctx, spotID)
		auth := activation.Authority{Versioned: a.v, Address: a.address, OwnerEnded: a.ended}
		if err == nil && a.v.Present() && !a.ended && sameOwner(a.v.Record.GetOwner(), m.owner()) {
			auth.Hosted = m.d.Hosts(a.v.Key, a.v.Record.GetObjectGeneration())
		}
		return activation.AuthorityRead{Authority: auth, Err: err, Now: m.clock.Now()}
	})
}

func (r *runner) Watch(key location.AuthorityKey, after location.StoreVersion, d activationrun.Deadline) {
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		err := r.m.watch(ctx, key, after)
		return activation.Watched{Err: err, Now: r.m.clock.Now()}
	})
}

func (r *runner) AdmitCapacity(d activationrun.Deadline) {
	r.off(func() func() {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		release, err := r.m.admitCapacity(ctx)
		return func() {
			if err == nil {
				r.releaseCapacity = release
			}
			r.ar.Answer(activation.CapacityAdmitted{Err: err})
		}
	})
}

func (r *runner) ReleaseCapacity() {
	if r.releaseCapacity != nil {
		r.releaseCapacity()
		r.releaseCapacity = nil
	}
}

func (r *runner) PutRoot(rootKey string, d activationrun.Deadline) {
	m := r.m
	data, err := deterministic.Marshal(r.env)
	if err != nil {
		r.ar.Answer(activation.RootPut{Err: fmt.Errorf("%w: %w", location.ErrInvalid, err)})
		return
	}
	if m.rootsInline && len(data) <= location.MaxInlineRootBytes {
		// The reservation's transaction stores it (Reserve): the
		// machine's next effect, and the only one that needs it.
		r.inlineRoot = &inlineRoot{key: rootKey, data: data}
		r.ar.Answer(activation.RootPut{Ref: location.NewRootRef(rootKey, data)})
		return
	}
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		ref, err := m.roots.PutRoot(ctx, rootKey, data)
		return activation.RootPut{Ref: ref, Err: err}
	})
}

func (r *runner) GetRoot(rootKey string, d activationrun.Deadline) {
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		data, ref, err := r.m.roots.GetRoot(ctx, rootKey)
		got := activation.RootGot{Ref: ref, Err: err}
		if err == nil {
			orig := &messages.SpotActivation{}
			if err := proto.Unmarshal(data, orig); err != nil {
				got.DecodeErr = err
			} else {
				got.Operation = orig.GetOperationId()
				got.First, got.FirstErr = relocation.FromWire(orig.GetFirst())
				got.First = withoutNotice(got.First)
			}
		}
		return got
	})
}

func (r *runner) Reserve(e activation.Reserve, d activationrun.Deadline) {
	root := r.inlineRoot
	r.inlineRoot = nil
	r.storeOff(func() func() {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		vers, unstored, cpStored, err := r.m.applyReservation(ctx, e, root)
		ans := activation.WriteAnswered{Err: err, Now: r.m.clock.Now(), CheckpointStored: cpStored}
		if err == nil {
			ans.Version = vers[0]
		}
		return func() {
			switch {
			case cpStored:
				// The machine reserves again at once: the root goes in
				// that transaction.
				r.inlineRoot = root
			case unstored:
				r.unstoredRoot = root.key
			}
			r.ar.Answer(ans)
		}
	})
}

func (r *runner) CompareAndSet(e activation.CompareAndSet, d activationrun.Deadline) {
	r.store(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		var v location.StoreVersion
		ops := []location.Op{location.UpdateOp(e.Key, e.Expected, e.Record)}
		if e.DeleteRoot != "" {
			ops = append(ops, location.DeleteRootOp(e.DeleteRoot))
		}
		vers, err := r.m.applyHolding(ctx, e.Key, e.Record, e.Replaced, 0, ops)
		if err == nil {
			v = vers[0]
		}
		return activation.WriteAnswered{Version: v, Err: err, Now: r.m.clock.Now()}
	})
}

func (r *runner) ReadRecord(key location.AuthorityKey, d activationrun.Deadline) {
	r.store(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		v, err := r.m.store.Read(ctx, key)
		return activation.RecordRead{Record: v, Err: err, Now: r.m.clock.Now()}
	})
}

func (r *runner) AbortReservation(e activation.AbortReservation, d activationrun.Deadline) {
	r.store(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		return activation.AbortAnswered{Err: r.m.deleteRecord(ctx, e.Key, e.Version, e.Record)}
	})
}

func (r *runner) Delete(e activation.Delete, d activationrun.Deadline) {
	r.store(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		err := r.m.deleteRecord(ctx, e.Key, e.Version, e.Record)
		return activation.Deleted{Err: err, Now: r.m.clock.Now()}
	})
}

// DeleteRoot runs under deleteRoot's own timeout, whatever d says.
func (r *runner) DeleteRoot(rootKey string, _ activationrun.Deadline) {
	if rootKey == r.unstoredRoot {
		r.unstoredRoot = ""
		r.ar.Answer(nil)
		return
	}
	r.call(func() activation.Event {
		r.m.deleteRoot(rootKey)
		return nil
	})
}

func (r *runner) ReadOwner(owner *messages.Owner, d activationrun.Deadline) {
	r.store(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		_, alive, err := r.m.ownerAddress(ctx, owner)
		return activation.OwnerRead{Alive: alive, Err: err}
	})
}

func (r *runner) ClaimCheckpoint(e activation.ClaimCheckpoint, d activationrun.Deadline) {
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		state, restore, err := r.m.d.ClaimCheckpoint(ctx, e.Key, e.StableType, e.Generation, e.OwnerGeneration)
		return activation.CheckpointClaimed{State: state, Restore: restore, Err: err}
	})
}

// Stage stages the incarnation and restores its checkpoint: the
// application's state adapter runs on the staged actor's own goroutine,
// under its supervision (relocation.Staged.Restore), never on the loop.
func (r *runner) Stage(e activation.Stage, d activationrun.Deadline) {
	m := r.m
	r.stagedAt = m.clock.Now()
	r.off(func() func() {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		staged, err := m.d.Stage(ctx, e.Key, e.StableType, e.Generation, e.OwnerGeneration)
		if err == nil && e.NoCheckpoint {
			staged.NoCheckpoint()
		}
		if err == nil && e.Restore {
			if err = staged.Restore(ctx, e.State); err != nil {
				m.log.Error().Str("event", "checkpoint_restore_failed").Str("spot_id", e.Key.ID).Err(err).
					Msg("the kind's state adapter refused the Spot's last checkpoint; the Spot does not start without it")
				err = fmt.Errorf("%w: restore the Spot's last checkpoint: %w", roamerr.ErrUnavailable, err)
			}
		}
		return func() {
			r.staged = staged
			r.ar.Answer(activation.Staged{Err: err})
		}
	})
}

func (r *runner) DiscardStaged() {
	if r.staged != nil {
		r.staged.Discard()
		r.staged = nil
	}
}

func (r *runner) Open(e activation.Open, d activationrun.Deadline) {
	m := r.m
	key, op, rootKey, committed := e.Key, e.FirstOperation, e.RootKey, e.Committed
	var afterFirst func(settled func(pointerGone bool))
	if op != "" { // a recovery from a checkpoint has no first message, and no pointer
		afterFirst = func(settled func(pointerGone bool)) {
			machine.Go(func() {
				// The incarnation dispatches again; a move may start unless
				// a close is releasing the record with its pointer.
				settled(m.clearRecovery(key, op, rootKey, committed) != activation.PointerLeftToRelease)
			})
		}
	}
	staged := r.staged
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		return activation.Opened{Err: staged.Open(ctx, e.Messages, op, afterFirst)}
	})
}

func (r *runner) PassOn(d activationrun.Deadline) {
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		return activation.PassedOn{OK: r.m.passOn(ctx, r.env)}
	})
}

func (r *runner) CloseLocal(e activation.CloseLocal, d activationrun.Deadline) {
	r.call(func() activation.Event {
		ctx, cancel := r.ctxFor(d)
		defer cancel()
		return activation.LocalClosed{Err: r.m.d.CloseLocal(ctx, e.Key, e.Generation)}
	})
}

func (r *runner) Forward(e activation.Forward) {
	r.m.sys.Root.Send(relocation.ObjectPID(e.Address, e.Key, e.Record), r.first)
}

func (r *runner) RespondFailure(err error) {
	if to := relocation.ReplyRoute(r.env.GetFirst()); to != nil {
		relocation.RespondFailure(r.m.sys, to, r.env.GetFirst(), r.env.GetSpotId(), err)
	}
}

func (r *runner) DropRoute(spotID string) { r.m.cache.drop(spotID) }

func (r *runner) Measure(e activation.Measure) {
	r.m.met.operation("activate", e.Outcome)
	if e.Activated {
		r.m.met.activated(machine.Since(r.m.clock, r.stagedAt))
	}
}

func (r *runner) Log(l activation.Log) { r.m.logEffect(l) }

func (r *runner) Arm(a activationrun.Arming, after time.Duration, at time.Time) {
	if !at.IsZero() {
		after = machine.Until(r.m.clock, at)
	}
	r.loop.Arm(a.Timer, max(after, 0), func() { r.ar.Fire(a) })
}

func (r *runner) Stop(t activation.Timer) { r.loop.Cancel(t) }

func (r *runner) Stalled() {
	r.m.log.Error().Str("event", "spot_machine_stalled").Msg("a Spot machine waits for nothing")
}

// Done is the machine's end, stepped in a turn: run's caller may go on.
func (r *runner) Done(error) { close(r.ended) }

// logEffect writes a machine's Log effect, leaving out empty fields.
func (m *Manager) logEffect(l activation.Log) {
	ev := machine.LogEvent(m.log, l.Level).Str("event", l.Event)
	for _, f := range [][2]string{{"spot_id", l.SpotID}, {"operation_id", l.OperationID}, {"stable_type", l.StableType}, {"owner_node_rid", l.OwnerNodeRid}} {
		if f[1] != "" {
			ev = ev.Str(f[0], f[1])
		}
	}
	if l.ObjectGeneration != 0 {
		ev = ev.Uint64("object_generation", l.ObjectGeneration)
	}
	if l.Err != nil {
		ev = ev.Err(l.Err)
	}
	ev.Msg(l.Msg)
}

// applyReservation writes a reservation in one transaction with its check that
// the ID is no User Spot, and with root, the recovery root the PutRoot
// before it left to this transaction (docs/PROTOCOL.md §7.5 step 9).
// unstored: root was given and rolled back with the transaction, so the
// machine's later delete of it has nothing to do.
func (m *Manager) applyReservation(ctx context.Context, e activation.Reserve, root *inlineRoot) (_ []location.StoreVersion, unstored, checkpointStored bool, _ error) {
	op := location.CreateOp(e.Key, e.Record)
	if e.Expected != 0 {
		op = location.UpdateOp(e.Key, e.Expected, e.Record)
	}
	ops := []location.Op{op, location.CheckOp(location.Key(e.Other, e.Key.ID), 0)}
	if e.NoCheckpoint {
		ops = append(ops, location.CheckNoCheckpointOp(e.Key))
	}
	// stored: the check that no checkpoint is stored failed, and nothing
	// else did (with the record's own op failing too, the reservation is
	// simply lost).
	slot := e.Record.GetCapacitySlot()
	stored := func(err error) bool {
		var c *location.ConflictError
		if !e.NoCheckpoint || !errors.As(err, &c) || len(c.FailedOps) != 1 || c.FailedOps[0] != 2 {
			return false
		}
		// The machine reserves this record again: as it was, without the
		// slot this attempt named in it.
		e.Record.CapacitySlot = slot
		return true
	}
	if root == nil {
		vers, err := m.applyHolding(ctx, e.Key, e.Record, e.Replaced, e.OwnerCapacity, ops)
		return vers, false, stored(err), err
	}
	vers, err := m.applyHolding(ctx, e.Key, e.Record, e.Replaced, e.OwnerCapacity, append(slices.Clip(ops), location.CreateRootOp(root.key, root.data)))
	var c *location.ConflictError
	if !errors.As(err, &c) || !slices.Contains(c.FailedOps, len(ops)) {
		// A conflict elsewhere rolled it back whole: the root was not
		// stored.
		return vers, c != nil, stored(err), err
	}
	// A root under the key already: an earlier attempt's, whose delete
	// failed. PutRoot takes identical bytes as stored; then the
	// reservation alone, as the conflict left it (nothing was applied).
	if _, err := m.roots.PutRoot(ctx, root.key, root.data); err != nil {
		return nil, false, false, err
	}
	e.Record.CapacitySlot = slot
	vers, err = m.applyHolding(ctx, e.Key, e.Record, e.Replaced, e.OwnerCapacity, ops)
	return vers, false, stored(err), err
}

// inlineRoot is a recovery root waiting for the reservation's
// transaction.
type inlineRoot struct {
	key  string
	data []byte
}

// applyHolding applies ops, which write rec at key over replaced (if any),
// with the capacity slot rec's owner holds for it (PROTOCOL.md §7.12): on
// this node, if rec names one, it is set to rec's state (pending while
// Creating); if not, this node's slot replaced names is kept, or one is
// taken, and rec names it. For a reservation on another node of capacity
// ownerCapacity, a pending slot of that node is taken. A slot replaced
// names and rec does not keep is freed. ops write rec by pointer, so
// naming the slot in rec names it in the write.
func (m *Manager) applyHolding(ctx context.Context, key location.AuthorityKey, rec, replaced *location.Record, ownerCapacity uint32,
	ops []location.Op) (_ []location.StoreVersion, err error) {
	slots := m.d.Slots()
	pending := rec.GetState() != messages.LifecycleState_LIFECYCLE_STATE_READY
	o := rec.GetOwner()
	self := m.desc.GetNodeRid()
	if old, ok := relocation.RecordSlot(replaced); ok {
		mine := replaced.GetOwner().GetNodeRid() == self
		switch {
		case mine && o.GetNodeRid() == self && rec.GetCapacitySlot() == 0:
			rec.CapacitySlot = old + 1 // this node's slot, kept
		case mine && rec.GetCapacitySlot() == old+1:
		default:
			ops = append(ops, relocation.FreeRecordSlotOps(replaced)...)
			defer func() {
				if err == nil {
					m.d.FreedRecordSlot(replaced)
				}
			}()
		}
	}
	switch {
	case sameOwner(o, m.owner()) && slots.Bounded():
		if slot, ok := relocation.RecordSlot(rec); ok {
			vers, err := m.store.Apply(ctx, append(ops, slots.SetOp(slot, key, pending)))
			if err == nil {
				slots.Mark(slot, key)
			}
			return vers, err
		}
		vers, _, err := slots.Take(ctx, []location.AuthorityKey{key}, pending, func(s []uint32) []location.Op {
			relocation.WithSlot(rec, s, 0)
			return ops
		})
		return vers, err
	case !sameOwner(o, m.owner()) && ownerCapacity > 0 && rec.GetCapacitySlot() == 0:
		return relocation.TakeSlotOn(ctx, m.store, location.NodeKey{Mesh: o.GetMesh(), NodeRid: o.GetNodeRid()}, location.LeaseID(o.GetLeaseId()),
			ownerCapacity, key, pending, func(slot uint32) []location.Op {
				rec.CapacitySlot = slot + 1
				return ops
			})
	}
	return m.store.Apply(ctx, ops)
}

// deleteRecord deletes key at version, whose record is rec, with the
// capacity slot rec names (PROTOCOL.md §7.12).
func (m *Manager) deleteRecord(ctx context.Context, key location.AuthorityKey, version location.StoreVersion, rec *location.Record) error {
	_, err := m.store.Apply(ctx, append([]location.Op{location.DeleteOp(key, version)}, relocation.FreeRecordSlotOps(rec)...))
	if err == nil {
		m.d.FreedRecordSlot(rec)
	}
	return err
}

// reclaimAbandoned releases, with their fences, the abandoned User Spot
// reservations that hold pending capacity slots of this node: a
// reservation whose command 47 never came (its creator ended, or gave up
// on an answer it lost) would otherwise hold a slot for the node's life.
// Any node may release an abandoned reservation (PROTOCOL.md §7.2); the
// node asks when no slot looks free (§7.12).
func (m *Manager) reclaimAbandoned(ctx context.Context) {
	slots, err := m.store.ListSlots(ctx, location.NodeKey{Mesh: m.desc.GetMesh(), NodeRid: m.desc.GetNodeRid()})
	if err != nil {
		return
	}
	for _, sl := range slots {
		if !sl.Pending || sl.Holder.Kind != location.KindUserSpot {
			continue
		}
		v, err := m.store.Read(ctx, sl.Holder)
		if err != nil {
			continue
		}
		rec := v.Record
		if slot, ok := relocation.RecordSlot(rec); !ok || slot != sl.Index || rec.GetOwner().GetNodeRid() != m.desc.GetNodeRid() ||
			!activation.AbandonedCreation(rec, m.clock.Now()) {
			continue
		}
		if err := m.deleteRecord(ctx, v.Key, v.Version, rec); err != nil {
			continue
		}
		m.deleteRoot(rec.GetCreationIntent().GetContentRef())
		m.log.Warn().Str("event", "abandoned_reservation_released").Str("spot_id", v.Key.ID).Uint32("slot", sl.Index).
			Msg("a User Spot reservation whose creation never came held a capacity slot of this node; released with its fence")
	}
}
