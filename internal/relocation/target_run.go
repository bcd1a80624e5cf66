package relocation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// targetRun is one move into this node.
type targetRun struct {
	m         *handoff.Target
	prepare   *messages.RelocationPrepare
	key       location.AuthorityKey
	kind      *Kind
	sourcePID *actor.PID // the source's relocation actor
	obj       *object
	saved     []any // restored saved work, first in the backlog
	// members are the other participants of a SpotWide move (PROTOCOL.md
	// §5.15), in participant order (participant i+2).
	members  []*targetMember
	deadline time.Time
	onDone   []func() // Relocate calls waiting for this arrival to end
	// verified is the record VerifySource read, for the first owner CAS
	// (taken once; later attempts read again).
	verified atomic.Pointer[location.Versioned]
	// joined: the commit made the Actor a member of prepare.join (a
	// cross-node Join, PROTOCOL.md §7.10); its Join callback comes first
	// at the open.
	joined atomic.Bool
	// committedMember: the User Spot membership the commit wrote, for the
	// incarnation's own record of it (object.member).
	committedMember atomic.Pointer[messages.Membership]
	// joinHold is the SpotWide User Spot this Join holds in place until
	// the move ends (object.joining).
	joinHold *object
	// slots are the capacity slots of this node the move takes ahead of
	// the commit. slotMu guards them: VerifySource may still run when the
	// move is removed.
	slotMu sync.Mutex
	slots  handoff.ArrivalSlots
}

// targetMember is a member Actor arriving with its SpotWide User Spot.
type targetMember struct {
	key   location.AuthorityKey
	kind  *Kind
	p     *messages.Participant
	obj   *object
	saved []any
}

// partItem is a relayed message for a SpotWide member (participant > 1);
// the hand-off machine keeps it in the batch like any other.
type partItem struct {
	participant uint32
	msg         any
}

// arriving finds the unfinished move of key into this node.
func (d *Driver) arriving(key location.AuthorityKey) *targetRun {
	if t := d.arrivals[key]; t != nil && !t.m.Finished() {
		return t
	}
	return nil
}

func (d *Driver) onPrepare(c actor.Context, p *messages.RelocationPrepare) {
	id := handoff.IdentityFromProto(p.GetIdentity())
	from := c.Sender()
	if t := d.targets[id]; t != nil {
		if from == nil || from.Address != t.sourcePID.Address {
			return // attributed by identity and connection only (docs/PROTOCOL.md §5.7)
		}
		d.stepTarget(t, d.prepareEvent(p))
		return
	}
	fail := func(reason messages.FailureReason, detail string) {
		if from != nil {
			d.send(PID(from.Address), &messages.RelocationFailed{Identity: p.GetIdentity(), Reason: reason, Detail: detail})
			if d.link != nil {
				d.link.Refuse(from.Address, p.GetIdentity())
			}
		}
		// A peer can send refused prepares at will.
		d.prepareRefusedLog.Warn(&d.log).Str("event", "relocation_refused").Uint64("relocation_id", id.RelocationID).
			Str("detail", detail).Msg("Restore request refused")
	}
	key := location.Key(p.GetObject().GetKind(), p.GetObject().GetId())
	k, ok := d.kind(p.GetObject().GetStableType())
	switch {
	case !d.node.Valid():
		// Fenced: a new move here could never commit.
		fail(messages.FailureReason_FAILURE_REASON_STALE, "the target node's owner lease is not in force")
		return
	case d.stopping || d.node.Draining():
		// It would have to leave again at once. The source's capability
		// answer may predate the drain (PROTOCOL.md §5.2).
		fail(messages.FailureReason_FAILURE_REASON_NODE_DRAINING, "the target node is draining or stopping")
		return
	case !id.Valid():
		fail(messages.FailureReason_FAILURE_REASON_CONFLICT, "relocation identity has a zero id or attempt")
		return
	case from == nil || from.Address != p.GetSource().GetAddress():
		fail(messages.FailureReason_FAILURE_REASON_CONFLICT, "Restore request not sent by its source node")
		return
	case !d.tickets.take(p, from.Address, d.clock.Now()):
		// Not admitted by a capability answer to this source (admission.go).
		d.refused("Restore request", from.Address, "no valid move ticket for its source")
		fail(messages.FailureReason_FAILURE_REASON_STALE, "Restore request not admitted: no valid move ticket")
		return
	case key.Validate() != nil || !Movable(key.Kind):
		fail(messages.FailureReason_FAILURE_REASON_UNSUPPORTED, "object is not an Actor, Instance Spot or User Spot")
		return
	case !ok:
		fail(messages.FailureReason_FAILURE_REASON_UNSUPPORTED, "stable type not registered here")
		return
	}
	var joinSpot *object
	if p.GetJoin() != nil {
		if err := d.admitJoin(key, p.GetJoin()); err != nil {
			fail(messages.FailureReason_FAILURE_REASON_STALE, err.Error())
			return
		}
		joinSpot = d.objects[location.Key(location.KindUserSpot, p.GetJoin().GetSpotId())]
	}
	members, reason, err := d.admitMembers(key, k, p)
	if err != nil {
		fail(reason, err.Error())
		return
	}
	if old := d.arriving(key); old != nil {
		// Newest prepare wins (PROTOCOL.md §5.7): two prepares never share
		// the object's temporary queue. One still restoring is removed with
		// an explicit failure (its source serves again); one past
		// relay-ready is irreversible, so the newer is refused.
		if old.m.Phase() != handoff.TargetRestoring {
			fail(messages.FailureReason_FAILURE_REASON_STALE, "an earlier move of this object into this node is past relay-ready")
			return
		}
		d.stepTarget(old, handoff.Superseded{})
	}
	t := &targetRun{
		prepare:   p,
		key:       key,
		kind:      k,
		sourcePID: PID(from.Address),
		members:   members,
		deadline:  time.UnixMilli(p.GetRestoreDeadlineUnixMillis()),
	}
	if joinSpot != nil && joinSpot.kind.SpotWide {
		// A SpotWide Spot does not move while a member is on its way in.
		joinSpot.joining++
		t.joinHold = joinSpot
	}
	m, effects := handoff.NewTarget(id, d.cfg.Handoff, d.prepareEvent(p))
	t.m = m
	d.targets[id] = t
	d.arrivals[key] = t
	for _, m := range members {
		d.arrivals[m.key] = t
	}
	d.expectChunks(t)
	d.runTarget(t, effects)
	d.replayEarly(id)
}

func (d *Driver) prepareEvent(p *messages.RelocationPrepare) handoff.PrepareReceived {
	return handoff.PrepareReceived{
		Manifest: envelope.Manifest{
			TotalLength:    p.GetManifest().GetPayloadTotalLength(),
			ChunkCount:     p.GetManifest().GetPayloadChunkCount(),
			ChecksumCRC32C: p.GetManifest().GetPayloadChecksumCrc32C(),
		},
		RestoreDeadline:  time.UnixMilli(p.GetRestoreDeadlineUnixMillis()),
		MaxPayloadLength: d.cfg.MaxPayloadLength,
		SessionBound:     prepareBound(p),
	}
}

// target finds the run of a control message's identity, only if it came
// from that run's source node.
func (d *Driver) target(pid *messages.RelocationIdentity, c actor.Context) *targetRun {
	t := d.targets[handoff.IdentityFromProto(pid)]
	if t == nil {
		return nil
	}
	if s := c.Sender(); s == nil || s.Address != t.sourcePID.Address {
		return nil
	}
	return t
}

func (d *Driver) onChunk(c actor.Context, m *messages.RelocationState) {
	if t := d.target(m.GetIdentity(), c); t != nil {
		// The chunk is copied into the assembler's own buffer (PROTOCOL.md §5.7).
		d.stepTarget(t, handoff.ChunkReceived{Chunk: envelope.Chunk{Index: m.GetIndex(), Offset: m.GetOffset(), Data: m.GetData()}})
	}
}

func (d *Driver) onRelayed(c actor.Context, m *messages.RelayedRecord) {
	t := d.target(m.GetIdentity(), c)
	if t == nil {
		return
	}
	item, err := fromWire(m.GetEnvelope())
	if err != nil {
		d.log.Error().Str("event", "relay_type_mismatch").Str("object_id", t.key.ID).Err(err).Msg("relayed message cannot be decoded")
		return
	}
	if n := m.GetParticipant(); n > 1 {
		if int(n)-2 >= len(t.members) {
			d.refused("relayed record", c.Sender().GetAddress(), "names a participant the move does not have")
			return
		}
		item = partItem{participant: n, msg: item}
	}
	b, _ := deterministic.Marshal(m.GetEnvelope())
	d.stepTarget(t, handoff.RelayRecordReceived{Epoch: m.GetResendEpoch(), Index: int(m.GetIndex()), Record: b, Item: item})
}

func (d *Driver) onTargetEvent(pid *messages.RelocationIdentity, c actor.Context, ev handoff.Event) {
	if t := d.target(pid, c); t != nil {
		d.stepTarget(t, ev)
	}
}

func (d *Driver) stepTarget(t *targetRun, ev handoff.Event) {
	effects := t.m.Step(ev)
	if e := d.log.Debug(); e.Enabled() { // the type name costs, even unlogged
		e.Str("side", "target").Uint64("relocation_id", t.m.Identity().RelocationID).Str("event", fmt.Sprintf("%T", ev)).
			Str("phase", t.m.Phase().String()).Int("effects", len(effects)).Msg("step")
	}
	d.runTarget(t, effects)
}

// runTarget runs effects; events they produce at once are fed after them.
func (d *Driver) runTarget(t *targetRun, effects []handoff.Effect) {
	for len(effects) > 0 {
		var next []handoff.Event
		for _, e := range effects {
			if ev := d.targetEffect(t, e); ev != nil {
				next = append(next, ev)
			}
		}
		effects = nil
		for _, ev := range next {
			effects = append(effects, t.m.Step(ev)...)
		}
	}
}

func (d *Driver) laterTarget(id handoff.Identity, ev handoff.Event) {
	d.sys.Root.Send(d.self, &localCall{fn: func() {
		if t := d.targets[id]; t != nil {
			d.stepTarget(t, ev)
		}
	}})
}

func (d *Driver) targetEffect(t *targetRun, e handoff.Effect) handoff.Event {
	id := t.m.Identity()
	switch e := e.(type) {
	case handoff.InstallStaging:
		obj := &object{
			key: t.key, kind: t.kind, state: staging,
			generation:      t.prepare.GetObject().GetObjectGeneration(),
			ownerGeneration: t.prepare.GetNewOwnerGeneration(),
			arrived:         true,
			session:         t.prepare.GetSession(),
		}
		// Once removed, the incarnation answers Unavailable for as long as
		// messages may still follow to it (PROTOCOL.md §6.3, §5.14;
		// object.Closed).
		if _, err := d.incarnate(obj, true, objectPIDName(t.key, obj.generation, obj.ownerGeneration)); err != nil {
			return handoff.RestoreFailed{Err: fmt.Errorf("install temporary queue: %w", err)}
		}
		t.obj = obj
		for _, m := range t.members {
			mo := &object{key: m.key, kind: m.kind, state: staging, generation: m.p.GetObject().GetObjectGeneration(), ownerGeneration: m.p.GetNewOwnerGeneration(),
				member: &messages.Membership{SpotId: t.key.ID, SpotGeneration: obj.generation}, arrived: true, session: m.p.GetSession()}
			if _, err := d.incarnate(mo, true, objectPIDName(m.key, mo.generation, mo.ownerGeneration)); err != nil {
				return handoff.RestoreFailed{Err: fmt.Errorf("install temporary queue of %s: %w", m.key, err)}
			}
			m.obj = mo
		}

	case handoff.VerifySource:
		go d.verifySource(t, id)

	case handoff.SendCredit:
		d.send(t.sourcePID, &messages.RelocationStateCredit{Identity: id.ToProto(), ReceivedBytes: e.ReceivedBytes})

	case handoff.RestorePayload:
		return d.restore(t, e.Stream)

	case handoff.SendFailed:
		d.send(t.sourcePID, &messages.RelocationFailed{Identity: id.ToProto(), Reason: e.Reason, Detail: e.Detail})

	case handoff.SendRelayReady:
		ready := &messages.RelayReady{Identity: id.ToProto()}
		if v := t.verified.Load(); v != nil {
			ready.RecordVersionHint = uint64(v.Version)
		}
		d.send(t.sourcePID, ready)

	case handoff.CommitOwner:
		go func() { d.laterTarget(id, d.commitOwner(t, e.SettleOnly)) }()

	case handoff.OpenDispatch:
		relay := e.Relay
		if len(t.members) > 0 || (t.key.Kind == location.KindUserSpot && t.kind.SpotWide) {
			relay = d.openMembers(t, e.Relay)
		}
		saved := len(t.saved)
		backlog := append(t.saved, relay...)
		t.saved = nil
		if t.joined.Load() {
			// The Join callback runs after the commit, before what moved
			// with the Actor (PROTOCOL.md §7.10) — but after the callback
			// of an earlier Join that the Actor had not handled yet when
			// this move sealed it: callbacks keep their commits' order.
			at := 0
			for i, m := range backlog[:saved] {
				if _, ok := m.(*messages.JoinedSpot); ok {
					at = i + 1
				}
			}
			j := t.prepare.GetJoin()
			backlog = slices.Insert(backlog, at, any(&messages.JoinedSpot{SpotId: j.GetSpotId(), SpotGeneration: j.GetSpotGeneration()}))
		}
		if m := t.committedMember.Load(); m != nil {
			t.obj.member = m
		}
		if err := t.obj.mb.OpenWith(backlog); err != nil {
			d.log.Error().Str("event", "open_failed").Str("object_id", t.key.ID).Err(err).Msg("opening dispatch failed")
		}
		d.objects[t.key] = t.obj
		d.nowServing(t.obj)
		if t.obj.cp != nil {
			// The state it arrived with is in no checkpoint yet.
			_ = t.obj.mb.Do(t.obj.markDirty)
		}
		if !d.inProcess { // the source watches an in-process store for free
			d.send(t.sourcePID, &messages.OwnerCommitted{Identity: id.ToProto()})
		}
		return handoff.DispatchOpened{}

	case handoff.DeliverLate:
		if pi, ok := e.Item.(partItem); ok {
			d.sys.Root.Send(t.members[pi.participant-2].obj.pid, pi.msg)
			break
		}
		d.sys.Root.Send(t.obj.pid, e.Item)

	case handoff.UpdateSessionRoutes:
		d.updateSessionRoutes(t)

	case handoff.AckBoundary:
		d.send(t.sourcePID, &messages.BoundaryAck{Identity: id.ToProto()})

	case handoff.RemoveTarget:
		d.removeStaged(t.obj)
		for _, m := range t.members {
			d.removeStaged(m.obj)
		}

	case handoff.StopIncarnation:
		for _, obj := range t.incarnations() {
			d.stop(obj)
		}

	case handoff.Forget:
		d.stopTimers(func(k timerKey) bool { return k.isTarget && k.target == id })
		if d.targets[id] == t {
			delete(d.targets, id)
		}

	case handoff.StartTimer:
		d.startTimer(timerKey{target: id, isTarget: true, timer: e.Timer}, e)

	case handoff.StopTimer:
		d.stopTimer(timerKey{target: id, isTarget: true, timer: e.Timer})

	case handoff.Log:
		d.logEffect(e, t.key, id)

	case handoff.Complete:
		d.completeTarget(t, e.Err)
	}
	return nil
}

// incarnations are the run's staged incarnations, the object's first.
func (t *targetRun) incarnations() []*object {
	var out []*object
	if t.obj != nil && t.obj.mb != nil {
		out = append(out, t.obj)
	}
	for _, m := range t.members {
		if m.obj != nil && m.obj.mb != nil {
			out = append(out, m.obj)
		}
	}
	return out
}

// removeStaged ends one staged incarnation of a removed move: it answers
// Unavailable until the machine stops it (StopIncarnation).
func (d *Driver) removeStaged(obj *object) {
	if obj == nil || obj.mb == nil {
		return
	}
	_ = obj.mb.Do(func() {
		if obj.tm != nil {
			obj.tm.stopAll()
		}
	})
	held, _ := obj.mb.Discard()
	removed := d.unavailableSink(obj, "the relocation target was removed")
	for _, msg := range held {
		removed(msg) // a request fails typed, a send is counted and logged
	}
	obj.state = ended
}

// restore decodes the verified stream and restores state on the object's
// own goroutine, without dispatching anything (PROTOCOL.md §5.7).
func (d *Driver) restore(t *targetRun, stream []byte) handoff.Event {
	env, err := envelope.DecodeOwned(stream)
	if err != nil {
		return handoff.RestoreFailed{Err: err}
	}
	id := t.m.Identity()
	if env.Relocation.RelocationID != id.RelocationID || env.Object.ID != t.key.ID || env.Object.StableType != t.kind.StableType ||
		env.Object.ObjectGeneration != t.obj.generation {
		return handoff.RestoreFailed{Err: fmt.Errorf("%w: payload describes another move or object", roamerr.ErrConflict)}
	}
	if env.ApplicationVersion != t.kind.ApplicationVersion {
		return handoff.RestoreFailed{Err: fmt.Errorf("%w: application version %q, hosting %q", roamerr.ErrTypeMismatch, env.ApplicationVersion, t.kind.ApplicationVersion)}
	}
	type ordered struct {
		order uint64
		msg   any
	}
	parts := 1 + len(t.members)
	backlogs := make([][]ordered, parts)
	inRange := func(p uint32) bool { return p >= 1 && int(p) <= parts }
	for _, w := range env.SavedWork {
		if !inRange(w.ParticipantID) {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: saved work of participant %d, the move has %d", roamerr.ErrConflict, w.ParticipantID, parts)}
		}
		msg, err := fromRecord(w.Record)
		if err != nil {
			return handoff.RestoreFailed{Err: err}
		}
		backlogs[w.ParticipantID-1] = append(backlogs[w.ParticipantID-1], ordered{w.Order, msg})
	}
	for _, p := range env.PendingTimerTicks {
		if !inRange(p.ParticipantID) {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: a timer tick of participant %d, the move has %d", roamerr.ErrConflict, p.ParticipantID, parts)}
		}
		backlogs[p.ParticipantID-1] = append(backlogs[p.ParticipantID-1], ordered{p.Order, tickOf(p)})
	}
	states := make([][]byte, parts)
	for _, st := range env.ApplicationStates {
		if !inRange(st.ParticipantID) {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: state of participant %d, the move has %d", roamerr.ErrConflict, st.ParticipantID, parts)}
		}
		states[st.ParticipantID-1] = st.State
	}
	regs := make([][]envelope.TimerRegistration, parts)
	for _, r := range env.TimerRegistrations {
		if !inRange(r.ParticipantID) {
			return handoff.RestoreFailed{Err: fmt.Errorf("%w: a timer of participant %d, the move has %d", roamerr.ErrConflict, r.ParticipantID, parts)}
		}
		regs[r.ParticipantID-1] = append(regs[r.ParticipantID-1], r)
	}
	sorted := func(b []ordered) []any {
		sort.Slice(b, func(i, j int) bool { return b[i].order < b[j].order })
		out := make([]any, len(b))
		for i, o := range b {
			out[i] = o.msg
		}
		return out
	}
	t.saved = sorted(backlogs[0])
	for i, m := range t.members {
		m.saved = sorted(backlogs[i+1])
	}
	// Each participant restores on its own goroutine; the payload is
	// restored once all have.
	remaining := int32(parts)
	restoreOne := func(obj *object, kind *Kind, state []byte, regs []envelope.TimerRegistration) error {
		adapter, preserve := kind.Policy.(preserveStateWith)
		return obj.mb.Do(func() {
			tm := obj.timers()
			tm.sys, tm.self = d.sys, obj.pid
			tm.restore(regs)
			var err error
			if preserve {
				err = obj.restoreState(adapter, state)
			}
			if err != nil {
				d.laterTarget(id, handoff.RestoreFailed{Err: fmt.Errorf("state adapter of %s: %w", obj.key, err)})
				return
			}
			if atomic.AddInt32(&remaining, -1) == 0 {
				d.laterTarget(id, handoff.Restored{})
			}
		})
	}
	if err := restoreOne(t.obj, t.kind, states[0], regs[0]); err != nil {
		return handoff.RestoreFailed{Err: err}
	}
	for i, m := range t.members {
		if err := restoreOne(m.obj, m.kind, states[i+1], regs[i+1]); err != nil {
			return handoff.RestoreFailed{Err: err}
		}
	}
	return nil
}

// commitPlan is the move's owner commit as the core composes and judges
// it (handoff.Commit).
func (d *Driver) commitPlan(t *targetRun, settleOnly bool) *handoff.Commit {
	t.slotMu.Lock()
	slots := t.slots.Slots
	t.slotMu.Unlock()
	c := &handoff.Commit{
		ID: t.m.Identity(), Key: t.key, Owner: d.owner(),
		NewOwnerGeneration: t.prepare.GetNewOwnerGeneration(), ObjectGeneration: t.prepare.GetObject().GetObjectGeneration(),
		Session: t.prepare.GetSession(), SettleOnly: settleOnly, RestoreDeadline: t.deadline,
		Join: t.prepare.GetJoin(), EntrySpotID: d.desc.GetEntrySpotId(), IsEntrySpot: meshnode.IsEntrySpotID,
		SourceNodeRid: t.prepare.GetSource().GetNodeRid(), SourceNodeGeneration: t.prepare.GetSource().GetNodeGeneration(),
		Slots: slots, Node: d.slots.nodeKey(), Lease: d.slots.leaseID(),
	}
	for _, m := range t.members {
		c.Members = append(c.Members, handoff.CommitMember{
			Key: m.key, OwnerGeneration: m.p.GetOwnerGeneration(), NewOwnerGeneration: m.p.GetNewOwnerGeneration(),
			ObjectGeneration: m.p.GetObject().GetObjectGeneration(), Session: m.p.GetSession(),
		})
	}
	return c
}

// commitOwner runs one attempt of the target-only CAS (PROTOCOL.md
// §5.11; handoff.Commit decides): a consistent read, the fence check, and
// a CAS naming this target with the move's RelocationId — or, settling,
// the fence-out of the move.
func (d *Driver) commitOwner(t *targetRun, settleOnly bool) handoff.Event {
	c := d.commitPlan(t, settleOnly)
	ctx, cancel := machine.WithDeadline(context.Background(), d.clock, c.Deadline(d.clock.Now(), d.cfg.RestoreTimeout))
	defer cancel()
	var v location.Versioned
	if read := t.verified.Swap(nil); read != nil && c.ReusesVerified() {
		v = *read // one store round trip less per move
	} else {
		var err error
		v, err = d.store.Read(ctx, t.key)
		if err != nil {
			if errors.Is(err, location.ErrNotFound) {
				return c.ReadMissing()
			}
			return handoff.StoreRetryable{Err: err}
		}
	}
	if ev, got := c.Read(v); ev != nil {
		t.keep(ev, got)
		return ev
	}
	if settleOnly {
		op := c.FenceOut(v)
		_, err := d.store.CompareAndSet(ctx, op.Key, op.Version, op.Record)
		// A conflict may show the earlier CAS applied after the read.
		ev, got := c.Answer(err, handoff.StoreNotCommitted{}, handoff.Committed{})
		t.keep(ev, got)
		return ev
	}
	txn := c.Txn(v)
	for keys := txn.Needs(); len(keys) > 0; keys = txn.Needs() {
		vs, err := d.readAll(ctx, keys)
		if err != nil {
			return txn.ReadFailed(err)
		}
		if ev := txn.Read(vs); ev != nil {
			return ev
		}
	}
	if txn.JoinRefused() {
		d.log.Warn().Str("event", "join_not_admitted").Str("object_id", t.key.ID).Str("spot_id", c.Join.GetSpotId()).
			Uint64("relocation_id", c.ID.RelocationID).Msg("the User Spot no longer takes the joining Actor (closed, moved or recreated); the move commits without the Join")
	}
	ops, wrote := txn.Ops()
	var err error
	if len(ops) == 1 {
		_, err = d.store.CompareAndSet(ctx, ops[0].Key, ops[0].Version, ops[0].Record)
	} else {
		_, err = d.store.Apply(ctx, ops)
	}
	ev, got := c.Answer(err, handoff.StoreCommitted{}, wrote)
	t.keep(ev, got)
	return ev
}

// keep records, once ev says this move committed, what its commit wrote,
// for the open.
func (t *targetRun) keep(ev handoff.Event, c handoff.Committed) {
	if _, ok := ev.(handoff.StoreCommitted); !ok {
		return
	}
	t.joined.Store(c.Joined)
	if c.Member != nil {
		t.committedMember.Store(c.Member)
	}
}

// takeArrivalSlots takes, before relay-ready, a capacity slot of this node
// for every participant of the move (PROTOCOL.md §7.12): CapacityExceeded
// when they are held, which fails the move before anything commits.
func (d *Driver) takeArrivalSlots(ctx context.Context, t *targetRun) error {
	t.slotMu.Lock()
	wanted := t.slots.Wanted()
	t.slotMu.Unlock()
	if !d.slots.Bounded() || !wanted {
		return nil
	}
	holders := []location.AuthorityKey{t.key}
	for _, m := range t.members {
		holders = append(holders, m.key)
	}
	_, slots, err := d.slots.Take(ctx, holders, true, func([]uint32) []location.Op { return nil })
	t.slotMu.Lock()
	free, err := t.slots.Taken(slots, err)
	t.slotMu.Unlock()
	d.freeSlots(t, free)
	return err
}

// freeSlots frees, in the background, slots taken for the move t that did
// not commit.
func (d *Driver) freeSlots(t *targetRun, slots []uint32) {
	if len(slots) == 0 {
		return
	}
	go func() {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.node.LeaseTTL())
		defer cancel()
		if err := d.slots.Free(ctx, slots...); err != nil && !errors.Is(err, location.ErrLeaseEnded) {
			d.log.Warn().Str("event", "capacity_slot_free_failed").Str("object_id", t.key.ID).Err(err).
				Msg("capacity slots taken for a move that did not commit stay held until the node's lease ends")
		}
	}()
}

func (d *Driver) completeTarget(t *targetRun, err error) {
	d.forgetChunks(t)
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
	if t.joinHold != nil {
		t.joinHold.joining--
		t.joinHold = nil
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
	// The machine keeps the run for the source's late resends, then
	// forgets it (handoff.Forget).
}
