package spot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/roamactors/roam/internal/activation"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// runner drives one machine of package activation on the calling
// goroutine: it runs each effect, feeds its answer back, and when nothing
// is left to run waits for the machine's next timer. It decides nothing;
// every choice is the machine's. Store and node calls run under ctx
// (except those documented with a timeout of their own).
type runner struct {
	m      *Manager
	ctx    context.Context
	step   func(activation.Event) []activation.Effect
	timers *timerSet

	// What a SpotActivation brings, for the effects that use it.
	env   *messages.SpotActivation
	first any

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

	done bool
	err  error
}

func (m *Manager) newRunner(ctx context.Context, step func(activation.Event) []activation.Effect) *runner {
	return &runner{m: m, ctx: ctx, step: step, timers: newTimerSet(m.clock)}
}

// run runs effects and everything they lead to until the machine emits
// Finish, and returns its error.
func (r *runner) run(effects []activation.Effect) error {
	defer r.close()
	var queue []activation.Event
	for {
		for _, e := range effects {
			if ev := r.exec(e); ev != nil {
				queue = append(queue, ev)
			}
		}
		if r.done {
			return r.err
		}
		if len(queue) == 0 {
			t, ok := r.timers.next()
			if !ok {
				// A machine defect: no answer and no timer to wait for.
				r.m.log.Error().Str("event", "spot_machine_stalled").Msg("a Spot machine waits for nothing")
				return fmt.Errorf("%w: spot: a machine waits for nothing", roamerr.ErrUnavailable)
			}
			queue = append(queue, activation.TimerFired{Timer: t, Now: r.m.clock.Now()})
		}
		ev := queue[0]
		queue = queue[1:]
		effects = r.step(ev)
	}
}

// storeCtx is the context of a store call: the machine's, or — for a call
// that settles past the operation's deadline — one with a timeout of its
// own (the machine bounds the settling itself).
func (r *runner) storeCtx(settle bool) (context.Context, context.CancelFunc) {
	if settle {
		return machine.WithTimeout(context.Background(), r.m.clock, r.m.cfg.DefaultTimeout)
	}
	return r.ctx, func() {}
}

// close gives back what a machine that ended early still held.
func (r *runner) close() {
	r.timers.stopAll()
	if r.releaseCapacity != nil {
		r.releaseCapacity()
		r.releaseCapacity = nil
	}
	if r.unlock != nil {
		r.unlock()
		r.unlock = nil
	}
}

// exec runs one effect and returns its answer, if it has one.
func (r *runner) exec(e activation.Effect) activation.Event {
	m := r.m
	switch e := e.(type) {
	case activation.LockKey:
		r.unlock = m.lockKey(e.SpotID)
		return activation.KeyLocked{Now: m.clock.Now()}
	case activation.UnlockKey:
		if r.unlock != nil {
			r.unlock()
			r.unlock = nil
		}
	case activation.ReadAuthority:
		a, err := m.readAuthority(r.ctx, e.SpotID)
		auth := activation.Authority{Versioned: a.v, Address: a.address, OwnerEnded: a.ended}
		if err == nil && a.v.Present() && !a.ended && sameOwner(a.v.Record.GetOwner(), m.owner()) {
			auth.Hosted = m.d.Hosts(a.v.Key, a.v.Record.GetObjectGeneration())
		}
		return activation.AuthorityRead{Authority: auth, Err: err, Now: m.clock.Now()}
	case activation.Watch:
		err := m.watch(r.ctx, e.Key, e.After)
		return activation.Watched{Err: err, Now: m.clock.Now()}
	case activation.AdmitCapacity:
		release, err := m.admitCapacity(r.ctx)
		if err == nil {
			r.releaseCapacity = release
		}
		return activation.CapacityAdmitted{Err: err}
	case activation.ReleaseCapacity:
		if r.releaseCapacity != nil {
			r.releaseCapacity()
			r.releaseCapacity = nil
		}
	case activation.PutRoot:
		data, err := deterministic.Marshal(r.env)
		if err != nil {
			return activation.RootPut{Err: fmt.Errorf("%w: %w", location.ErrInvalid, err)}
		}
		if m.rootsInline && len(data) <= location.MaxInlineRootBytes {
			// The reservation's transaction stores it (Reserve): the
			// machine's next effect, and the only one that needs it.
			r.inlineRoot = &inlineRoot{key: e.RootKey, data: data}
			return activation.RootPut{Ref: location.NewRootRef(e.RootKey, data)}
		}
		ref, err := m.roots.PutRoot(r.ctx, e.RootKey, data)
		return activation.RootPut{Ref: ref, Err: err}
	case activation.GetRoot:
		data, ref, err := m.roots.GetRoot(r.ctx, e.RootKey)
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
	case activation.Reserve:
		vers, err := r.reserve(e)
		ans := activation.WriteAnswered{Err: err, Now: m.clock.Now()}
		if err == nil {
			ans.Version = vers[0]
		}
		return ans
	case activation.CompareAndSet:
		ctx, cancel := r.storeCtx(e.Settle)
		defer cancel()
		var v location.StoreVersion
		vers, err := m.applyHolding(ctx, e.Key, e.Record, e.Replaced, 0, []location.Op{location.UpdateOp(e.Key, e.Expected, e.Record)})
		if err == nil {
			v = vers[0]
		}
		return activation.WriteAnswered{Version: v, Err: err, Now: m.clock.Now()}
	case activation.ReadRecord:
		ctx, cancel := r.storeCtx(e.Settle)
		defer cancel()
		v, err := m.store.Read(ctx, e.Key)
		return activation.RecordRead{Record: v, Err: err, Now: m.clock.Now()}
	case activation.AbortReservation:
		ctx, cancel := machine.WithTimeout(context.Background(), m.clock, m.cfg.DefaultTimeout)
		defer cancel()
		return activation.AbortAnswered{Err: m.deleteRecord(ctx, e.Key, e.Version, e.Record)}
	case activation.Delete:
		return activation.Deleted{Err: m.deleteRecord(r.ctx, e.Key, e.Version, e.Record), Now: m.clock.Now()}
	case activation.DeleteRoot:
		if e.RootKey == r.unstoredRoot {
			r.unstoredRoot = ""
			break
		}
		m.deleteRoot(e.RootKey)
	case activation.ReadOwner:
		_, alive, err := m.ownerAddress(r.ctx, e.Owner)
		return activation.OwnerRead{Alive: alive, Err: err}
	case activation.ClaimCheckpoint:
		state, restore, err := m.d.ClaimCheckpoint(r.ctx, e.Key, e.StableType, e.Generation, e.OwnerGeneration)
		return activation.CheckpointClaimed{State: state, Restore: restore, Err: err}
	case activation.Stage:
		r.stagedAt = m.clock.Now()
		staged, err := m.d.Stage(r.ctx, e.Key, e.StableType, e.Generation, e.OwnerGeneration)
		r.staged = staged
		if err == nil && e.Restore {
			if err = staged.Restore(r.ctx, e.State); err != nil {
				m.log.Error().Str("event", "checkpoint_restore_failed").Str("spot_id", e.Key.ID).Err(err).
					Msg("the kind's state adapter refused the Spot's last checkpoint; the Spot does not start without it")
				err = fmt.Errorf("%w: restore the Spot's last checkpoint: %w", roamerr.ErrUnavailable, err)
			}
		}
		return activation.Staged{Err: err}
	case activation.DiscardStaged:
		if r.staged != nil {
			r.staged.Discard()
			r.staged = nil
		}
	case activation.Open:
		key, op, rootKey, committed := e.Key, e.FirstOperation, e.RootKey, e.Committed
		var afterFirst func(settled func(pointerGone bool))
		if op != "" { // a recovery from a checkpoint has no first message, and no pointer
			afterFirst = func(settled func(pointerGone bool)) {
				go func() {
					// The incarnation dispatches again; a move may start unless
					// a close is releasing the record with its pointer.
					settled(m.clearRecovery(key, op, rootKey, committed) != activation.PointerLeftToRelease)
				}()
			}
		}
		err := r.staged.Open(r.ctx, e.Messages, op, afterFirst)
		return activation.Opened{Err: err}
	case activation.Forward:
		m.sys.Root.Send(relocation.ObjectPID(e.Address, e.Key, e.Record), r.first)
	case activation.PassOn:
		return activation.PassedOn{OK: m.passOn(r.ctx, r.env)}
	case activation.RespondFailure:
		if to := relocation.ReplyRoute(r.env.GetFirst()); to != nil {
			relocation.RespondFailure(m.sys, to, r.env.GetFirst(), r.env.GetSpotId(), e.Err)
		}
	case activation.CloseLocal:
		return activation.LocalClosed{Err: m.d.CloseLocal(r.ctx, e.Key, e.Generation)}
	case activation.DropRoute:
		m.cache.drop(e.SpotID)
	case activation.Measure:
		m.met.operation("activate", e.Outcome)
		if e.Activated {
			m.met.activated(machine.Since(m.clock, r.stagedAt))
		}
	case activation.Log:
		m.logEffect(e)
	case activation.StartTimer:
		d := e.After
		if !e.At.IsZero() {
			d = machine.Until(m.clock, e.At)
		}
		r.timers.start(e.Timer, d)
	case activation.StopTimer:
		r.timers.stop(e.Timer)
	case activation.Finish:
		r.done, r.err = true, e.Err
	default:
		panic(fmt.Sprintf("spot: no driver for effect %T", e))
	}
	return nil
}

// logEffect writes a machine's Log effect, leaving out empty fields.
func (m *Manager) logEffect(l activation.Log) {
	var ev *zerolog.Event
	switch l.Level {
	case activation.LevelInfo:
		ev = m.log.Info()
	case activation.LevelWarn:
		ev = m.log.Warn()
	default:
		ev = m.log.Error()
	}
	ev = ev.Str("event", l.Event)
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

// timerSet runs one machine's named timers. A restarted or stopped
// timer's fire that is already on its way is dropped, so the machine only
// sees fires of the timers it is waiting for.
type timerSet struct {
	armed *machine.Timers[activation.Timer]
	mu    sync.Mutex
	// live are the timers started and not yet fired or stopped, by the
	// arming's sequence number: a fire counts only for the arming it was
	// made for, and moves from live to fired under one lock, so next never
	// sees a timer in neither.
	live  map[activation.Timer]uint64
	seq   uint64
	fired []activation.Timer
	wake  chan struct{}
}

func newTimerSet(c machine.Clock) *timerSet {
	return &timerSet{armed: machine.NewTimers[activation.Timer](c), live: map[activation.Timer]uint64{}, wake: make(chan struct{}, 1)}
}

func (s *timerSet) start(t activation.Timer, d time.Duration) {
	s.mu.Lock()
	s.stopLocked(t)
	s.seq++
	n := s.seq
	s.live[t] = n
	s.mu.Unlock()
	s.armed.Arm(t, d, func() {
		s.mu.Lock()
		if s.live[t] != n {
			s.mu.Unlock()
			return
		}
		delete(s.live, t)
		s.fired = append(s.fired, t)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	})
}

func (s *timerSet) stop(t activation.Timer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(t)
}

// stopLocked cancels t, a fire of it not yet taken by next included.
func (s *timerSet) stopLocked(t activation.Timer) {
	s.armed.Cancel(t)
	delete(s.live, t)
	for i, f := range s.fired {
		if f == t {
			s.fired = append(s.fired[:i], s.fired[i+1:]...)
			break
		}
	}
}

func (s *timerSet) stopAll() {
	s.armed.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.live)
	s.fired = nil
}

// next waits for the next fire; false if no timer runs.
func (s *timerSet) next() (activation.Timer, bool) {
	for {
		s.mu.Lock()
		if len(s.fired) > 0 {
			t := s.fired[0]
			s.fired = s.fired[1:]
			s.mu.Unlock()
			return t, true
		}
		running := len(s.live) > 0
		s.mu.Unlock()
		if !running {
			return 0, false
		}
		<-s.wake
	}
}

// reserve writes a reservation in one transaction with its check that
// the ID is no User Spot, and with the recovery root the PutRoot before
// it left to this transaction (docs/PROTOCOL.md §7.5 step 9).
func (r *runner) reserve(e activation.Reserve) ([]location.StoreVersion, error) {
	m := r.m
	op := location.CreateOp(e.Key, e.Record)
	if e.Expected != 0 {
		op = location.UpdateOp(e.Key, e.Expected, e.Record)
	}
	ops := []location.Op{op, location.CheckOp(location.Key(e.Other, e.Key.ID), 0)}
	root := r.inlineRoot
	r.inlineRoot = nil
	if root == nil {
		return m.applyHolding(r.ctx, e.Key, e.Record, e.Replaced, e.OwnerCapacity, ops)
	}
	slot := e.Record.GetCapacitySlot()
	vers, err := m.applyHolding(r.ctx, e.Key, e.Record, e.Replaced, e.OwnerCapacity, append(slices.Clip(ops), location.CreateRootOp(root.key, root.data)))
	var c *location.ConflictError
	if !errors.As(err, &c) || !slices.Contains(c.FailedOps, len(ops)) {
		if c != nil {
			// Rolled back whole: the root was not stored, and the
			// machine's delete of it after a lost reservation has
			// nothing to do.
			r.unstoredRoot = root.key
		}
		return vers, err
	}
	// A root under the key already: an earlier attempt's, whose delete
	// failed. PutRoot takes identical bytes as stored; then the
	// reservation alone, as the conflict left it (nothing was applied).
	if _, err := m.roots.PutRoot(r.ctx, root.key, root.data); err != nil {
		return nil, err
	}
	e.Record.CapacitySlot = slot
	return m.applyHolding(r.ctx, e.Key, e.Record, e.Replaced, e.OwnerCapacity, ops)
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
