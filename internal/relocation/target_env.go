package relocation

import (
	"context"
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/targetrun"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// targetEnv is the driver's primitives for a move's target interpreter
// (targetrun.Env): Proto.Actor messages, roam's mailbox, the Location
// Store and the driver's named timers. Every call runs on the driver
// goroutine, but TakeVerified and a commit attempt's store calls, which
// run on the attempt's own.
type targetEnv struct {
	d *Driver
	t *targetRun
}

var _ targetrun.Env[any] = targetEnv{}

// obj is participant i's staged incarnation (nil before InstallStaging).
func (e targetEnv) obj(i int) *object {
	if i == 0 {
		return e.t.obj
	}
	return e.t.members[i-1].obj
}

func (e targetEnv) id() handoff.Identity { return e.t.m.Identity() }

func (e targetEnv) Gone() bool { return false }

func (e targetEnv) Stepped(ev handoff.Event, effects []handoff.Effect) {
	if l := e.d.log.Debug(); l.Enabled() { // the type name costs, even unlogged
		t := e.t
		l.Str("side", "target").Uint64("relocation_id", t.m.Identity().RelocationID).Str("event", fmt.Sprintf("%T", ev)).
			Str("phase", t.m.Phase().String()).Int("effects", len(effects)).Msg("step")
	}
}

func (e targetEnv) Before(handoff.Effect) {}

// Install incarnates participant i with a temporary queue. Once removed,
// the incarnation answers Unavailable for as long as messages may still
// follow to it (PROTOCOL.md §6.3, §5.14; object.Closed).
func (e targetEnv) Install(i int) error {
	d, t := e.d, e.t
	if i == 0 {
		obj := &object{
			key: t.key, kind: t.kind, state: staging,
			generation:      t.prepare.GetObject().GetObjectGeneration(),
			ownerGeneration: t.prepare.GetNewOwnerGeneration(),
			arrived:         true,
		}
		if s := t.prepare.GetSession(); s != nil {
			obj.x().session = s
		}
		if _, err := d.incarnate(obj, true, objectPIDName(t.key, obj.generation, obj.ownerGeneration)); err != nil {
			return fmt.Errorf("install temporary queue: %w", err)
		}
		t.obj = obj
		return nil
	}
	m := t.members[i-1]
	mo := &object{key: m.key, kind: m.kind, state: staging, generation: m.p.GetObject().GetObjectGeneration(), ownerGeneration: m.p.GetNewOwnerGeneration(),
		arrived: true}
	mo.x().member = &messages.Membership{SpotId: t.key.ID, SpotGeneration: t.obj.generation}
	if s := m.p.GetSession(); s != nil {
		mo.x().session = s
	}
	if _, err := d.incarnate(mo, true, objectPIDName(m.key, mo.generation, mo.ownerGeneration)); err != nil {
		return fmt.Errorf("install temporary queue of %s: %w", m.key, err)
	}
	m.obj = mo
	return nil
}

// verifyCall runs a blocking call of VerifySource on its own goroutine,
// bounded by the restore deadline, and answers on the driver's, if the
// run is still known.
func (e targetEnv) verifyCall(call func(ctx context.Context) func()) {
	d, t, id := e.d, e.t, e.id()
	machine.Go(func() {
		ctx, cancel := machine.WithDeadline(context.Background(), d.clock, t.deadline)
		defer cancel()
		answer := call(ctx)
		d.laterRun(id, func(*targetrun.Run[any]) { answer() })
	})
}

func (e targetEnv) VerifyPeer(answer func(error)) {
	src, addr := e.t.prepare.GetSource(), e.t.sourcePID.Address
	e.verifyCall(func(ctx context.Context) func() {
		err := e.d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), addr)
		return func() { answer(err) }
	})
}

func (e targetEnv) ReadSource(answer func(location.Versioned, error)) {
	e.verifyCall(func(ctx context.Context) func() {
		v, err := e.d.store.Read(ctx, e.t.key)
		return func() { answer(v, err) }
	})
}

func (e targetEnv) Prechecked(answer func(location.Versioned)) bool {
	d, t := e.d, e.t
	v, ok := d.prechecks.take(e.id(), t.prepare, t.sourcePID.Address, d.clock.Now())
	if ok {
		d.laterRun(e.id(), func(*targetrun.Run[any]) { answer(v) })
	}
	return ok
}

func (e targetEnv) ObjectGeneration() uint64 { return e.t.prepare.GetObject().GetObjectGeneration() }

func (e targetEnv) VerifyMembers(v location.Versioned, answer func(error)) {
	if len(e.t.members) == 0 {
		answer(nil)
		return
	}
	e.verifyCall(func(ctx context.Context) func() {
		err := e.d.verifyMembers(ctx, e.t, v.Record)
		return func() { answer(err) }
	})
}

func (e targetEnv) TakeSlots(answer func(error)) {
	if !e.d.slots.Bounded() {
		answer(nil) // nothing to take: no goroutine, no turn
		return
	}
	e.verifyCall(func(ctx context.Context) func() {
		err := e.d.takeArrivalSlots(ctx, e.t)
		return func() { answer(err) }
	})
}

func (e targetEnv) KeepVerified(v location.Versioned) { e.t.verified.Store(&v) }

// After paces VerifySource on the driver's clock (a named timer of the
// run, stopped with the others when it ends).
func (e targetEnv) After(wait time.Duration, fn func(expired bool)) {
	d, t := e.d, e.t
	pause, expired := handoff.VerifyPause(d.clock.Now(), t.deadline, wait)
	t.verifyNext = func() { fn(expired) }
	d.startTimer(timerKey{target: e.id(), isTarget: true, verify: true}, handoff.StartTimer{After: pause})
}

func (e targetEnv) SendCredit(n uint64) {
	e.d.send(e.t.sourcePID, &messages.RelocationStateCredit{Identity: e.t.wire.of(e.id()), ReceivedBytes: n})
}

func (e targetEnv) SendFailed(f handoff.SendFailed) {
	e.d.send(e.t.sourcePID, &messages.RelocationFailed{Identity: e.t.wire.of(e.id()), Reason: f.Reason, Detail: f.Detail})
}

func (e targetEnv) SendRelayReady() {
	ready := &messages.RelayReady{Identity: e.t.wire.of(e.id())}
	if v := e.t.verified.Load(); v != nil {
		ready.RecordVersionHint = uint64(v.Version)
	}
	e.d.send(e.t.sourcePID, ready)
}

func (e targetEnv) AckBoundary() {
	e.d.send(e.t.sourcePID, &messages.BoundaryAck{Identity: e.t.wire.of(e.id())})
}

func (e targetEnv) SendOwnerCommitted() {
	if !e.d.inProcess { // the source watches an in-process store for free
		e.d.send(e.t.sourcePID, &messages.OwnerCommitted{Identity: e.t.wire.of(e.id())})
	}
}

func (e targetEnv) UpdateSessionRoutes() { e.d.updateSessionRoutes(e.t) }

// Decode checks the payload describes this move and this node can host
// it, and keeps the states and timers for Restore.
func (e targetEnv) Decode(stream []byte) ([]targetrun.Work[any], error) {
	t := e.t
	env, err := envelope.DecodeOwned(stream)
	if err != nil {
		return nil, err
	}
	if env.Relocation.RelocationID != e.id().RelocationID || env.Object.ID != t.key.ID || env.Object.StableType != t.kind.StableType ||
		env.Object.ObjectGeneration != t.obj.generation {
		return nil, fmt.Errorf("%w: payload describes another move or object", roamerr.ErrConflict)
	}
	if env.ApplicationVersion != t.kind.ApplicationVersion {
		return nil, fmt.Errorf("%w: application version %q, hosting %q", roamerr.ErrTypeMismatch, env.ApplicationVersion, t.kind.ApplicationVersion)
	}
	parts := 1 + len(t.members)
	inRange := func(p uint32) bool { return p >= 1 && int(p) <= parts }
	for _, st := range env.ApplicationStates {
		if !inRange(st.ParticipantID) {
			return nil, fmt.Errorf("%w: state of participant %d, the move has %d", roamerr.ErrConflict, st.ParticipantID, parts)
		}
	}
	for _, r := range env.TimerRegistrations {
		if !inRange(r.ParticipantID) {
			return nil, fmt.Errorf("%w: a timer of participant %d, the move has %d", roamerr.ErrConflict, r.ParticipantID, parts)
		}
	}
	work := make([]targetrun.Work[any], 0, len(env.SavedWork)+len(env.PendingTimerTicks))
	for _, w := range env.SavedWork {
		msg, err := fromRecord(w.Record)
		if err != nil {
			return nil, err
		}
		work = append(work, targetrun.Work[any]{Participant: w.ParticipantID, Order: w.Order, Msg: msg, What: "saved work"})
	}
	for _, p := range env.PendingTimerTicks {
		work = append(work, targetrun.Work[any]{Participant: p.ParticipantID, Order: p.Order, Msg: tickOf(p), What: "a timer tick"})
	}
	t.payload = env
	return work, nil
}

// Restore restores participant i's timers and state on its own goroutine.
func (e targetEnv) Restore(i int) error {
	d, id := e.d, e.id()
	obj, participant := e.obj(i), uint32(i+1)
	kind := e.t.kind
	if i > 0 {
		kind = e.t.members[i-1].kind
	}
	var state []byte
	for _, st := range e.t.payload.ApplicationStates {
		if st.ParticipantID == participant {
			state = st.State
		}
	}
	var regs []envelope.TimerRegistration
	for _, r := range e.t.payload.TimerRegistrations {
		if r.ParticipantID == participant {
			regs = append(regs, r)
		}
	}
	adapter, preserve := kind.Policy.(preserveStateWith)
	return obj.mb.Do(func() {
		tm := obj.timers()
		tm.sys, tm.self = d.sys, obj.pid
		tm.restore(regs)
		var err error
		if preserve {
			if err = obj.restoreState(adapter, state); err != nil {
				err = fmt.Errorf("state adapter of %s: %w", obj.key, err)
			}
		}
		d.laterRun(id, func(r *targetrun.Run[any]) { r.Restored(i, err) })
	})
}

func (e targetEnv) PartOf(item any) (int, any) {
	if pi, ok := item.(partItem); ok {
		return int(pi.participant) - 1, pi.msg
	}
	return 0, item
}

func (e targetEnv) JoinCallback(c handoff.Committed) (any, bool) {
	if !c.Joined {
		return nil, false
	}
	j := e.t.prepare.GetJoin()
	return &messages.JoinedSpot{SpotId: j.GetSpotId(), SpotGeneration: j.GetSpotGeneration()}, true
}

func (e targetEnv) IsJoinCallback(m any) bool {
	_, ok := m.(*messages.JoinedSpot)
	return ok
}

func (e targetEnv) OpenMembers(backlogs [][]any) {
	t := e.t
	if len(t.members) > 0 || (t.key.Kind == location.KindUserSpot && t.kind.SpotWide) {
		e.d.openMembers(t, backlogs)
	}
}

func (e targetEnv) Open(backlog []any, _ int, c handoff.Committed) error {
	if c.Member != nil {
		e.t.obj.x().member = c.Member
	}
	return e.t.obj.mb.OpenWith(backlog)
}

func (e targetEnv) ReleaseJoin() {
	if t := e.t; t.joinHold != nil {
		t.joinHold.x().joining--
		t.joinHold = nil
	}
}

func (e targetEnv) Serving() {
	d, obj := e.d, e.t.obj
	d.putObject(obj)
	d.nowServing(obj)
	obj.checkpointsOnArrival(e.t.prepare.GetCheckpoint())
}

func (e targetEnv) Deliver(i int, m any) { e.d.sys.Root.Send(e.obj(i).pid, m) }

func (e targetEnv) Remove(i int, _ []any) { e.d.removeStaged(e.obj(i)) }

func (e targetEnv) StopIncarnation(i int) {
	if obj := e.obj(i); obj != nil && obj.mb != nil {
		e.d.stop(obj)
	}
}

func (e targetEnv) CommitPlan(settleOnly bool) *handoff.Commit {
	return e.d.commitPlan(e.t, settleOnly)
}

func (e targetEnv) TakeVerified() (location.Versioned, bool) {
	if v := e.t.verified.Swap(nil); v != nil {
		return *v, true
	}
	return location.Versioned{}, false
}

// Commit runs the attempt on its own goroutine against the blocking
// store; the answer comes back to the driver's.
func (e targetEnv) Commit(c *handoff.Commit, attempt func(targetrun.Store, func(handoff.Event, handoff.Committed))) {
	d, id := e.d, e.id()
	run := func() {
		ctx, cancel := machine.WithDeadline(context.Background(), d.clock, c.Deadline(d.clock.Now(), d.cfg.RestoreTimeout))
		defer cancel()
		attempt(blockingStore{ctx: ctx, d: d}, func(ev handoff.Event, got handoff.Committed) {
			d.laterRun(id, func(r *targetrun.Run[any]) { r.Answered(ev, got) })
		})
	}
	if d.immediate {
		// The commit is on the pause: an immediate store (memstore) is
		// called here, not from a goroutine whose start and answer would
		// cost two scheduler wake-ups. The answer still comes as a turn of
		// its own (laterRun), as every store answer does.
		run()
		return
	}
	machine.Go(run)
}

func (e targetEnv) JoinRefused(c *handoff.Commit) {
	e.d.log.Warn().Str("event", "join_not_admitted").Str("object_id", e.t.key.ID).Str("spot_id", c.Join.GetSpotId()).
		Uint64("relocation_id", c.ID.RelocationID).Msg("the User Spot no longer takes the joining Actor (closed, moved or recreated); the move commits without the Join")
}

func (e targetEnv) StartTimer(st handoff.StartTimer) {
	e.d.startTimer(timerKey{target: e.id(), isTarget: true, timer: st.Timer}, st)
}

func (e targetEnv) StopTimer(tm handoff.Timer) {
	e.d.stopTimer(timerKey{target: e.id(), isTarget: true, timer: tm})
}

func (e targetEnv) StopTimers() {
	id := e.id()
	e.d.stopTimers(func(k timerKey) bool { return k.isTarget && k.target == id })
}

func (e targetEnv) Log(l handoff.Log) { e.d.logEffect(l, e.t.key, e.id()) }

func (e targetEnv) Problem(i int, event string, err error, msg string) {
	key := e.t.key
	if i > 0 {
		key = e.t.members[i-1].key
	}
	e.d.log.Error().Str("event", event).Str("object_id", key.ID).Err(err).Msg(msg)
}

func (e targetEnv) Forgotten() {
	if id := e.id(); e.d.targets[id] == e.t {
		delete(e.d.targets, id)
	}
}

// Complete reports the move's end here, frees the capacity slots a move
// that did not commit took, and wakes the Relocate calls waiting for it.
// The machine keeps the run for the source's late resends, then forgets
// it (handoff.Forget).
func (e targetEnv) Complete(err error) {
	d, t := e.d, e.t
	d.forgetChunks(t)
	t.payload = nil
	t.slotMu.Lock()
	slots := t.slots.Complete(err == nil)
	t.slotMu.Unlock()
	d.freeSlots(t, slots)
	id := t.m.Identity()
	ev := Event{
		Key: t.key, RelocationID: id.RelocationID, From: id.Fence.NodeRid, To: d.desc.GetNodeRid(),
		Bytes: t.prepare.GetManifest().GetPayloadTotalLength(), Chunks: t.prepare.GetManifest().GetPayloadChunkCount(),
		Fallback: t.m.FellBack(), Err: err,
	}
	if err == nil {
		ev.Pause = machine.Since(d.clock, time.Unix(0, t.prepare.GetSealedAtUnixNanos()))
		d.log.Info().Str("event", "relocation_committed").Str("object_id", t.key.ID).Uint64("relocation_id", id.RelocationID).
			Str("from", ev.From).Dur("pause", ev.Pause).Uint64("bytes", ev.Bytes).Uint32("chunks", ev.Chunks).Bool("fallback", ev.Fallback).Msg("relocation committed; dispatch open")
	} else {
		d.log.Warn().Str("event", "relocation_target_removed").Str("object_id", t.key.ID).Uint64("relocation_id", id.RelocationID).Err(err).Msg("relocation ended on the target without a commit")
	}
	d.metrics.record(ev)
	if d.cfg.OnEvent != nil {
		d.cfg.OnEvent(ev)
	}
	if d.arrivals[t.key] == t {
		delete(d.arrivals, t.key)
	}
	for _, m := range t.members {
		if d.arrivals[m.key] == t {
			delete(d.arrivals, m.key)
		}
	}
	waiting := t.onDone
	t.onDone = nil
	for _, f := range waiting {
		f()
	}
}

// blockingStore is a commit attempt's store: each call blocks and answers
// on the attempt's goroutine.
type blockingStore struct {
	ctx context.Context
	d   *Driver
}

func (b blockingStore) Read(key location.AuthorityKey, answer func(location.Versioned, error)) {
	answer(b.d.store.Read(b.ctx, key))
}

func (b blockingStore) ReadAll(keys []location.AuthorityKey, answer func([]location.Versioned, error)) {
	answer(b.d.readAll(b.ctx, keys))
}

func (b blockingStore) CAS(op location.Op, answer func(error)) {
	_, err := b.d.store.CompareAndSet(b.ctx, op.Key, op.Version, op.Record)
	answer(err)
}

func (b blockingStore) Apply(ops []location.Op, answer func(error)) {
	_, err := b.d.store.Apply(b.ctx, ops)
	answer(err)
}
