package relocation

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/relocation/capslots"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/targetrun"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// targetRun is one move into this node.
type targetRun struct {
	m         *handoff.Target
	wire      wireIdentity // what the run's messages carry
	prepare   *messages.RelocationPrepare
	key       location.AuthorityKey
	kind      *Kind
	sourcePID *actor.PID // the source's relocation actor
	obj       *object
	run       *targetrun.Run[any]
	// payload is the restored payload, until every participant restored
	// its share.
	payload *envelope.Envelope
	// members are the other participants of a SpotWide move (PROTOCOL.md
	// §5.15), in participant order (participant i+2).
	members  []*targetMember
	deadline time.Time
	onDone   []func() // Relocate calls waiting for this arrival to end
	// verified is the record VerifySource read, for the first owner CAS
	// (taken once; later attempts read again).
	verified atomic.Pointer[location.Versioned]
	// verifyNext is VerifySource's next try, when its pause ends.
	verifyNext func()
	// joinHold is the SpotWide User Spot this Join holds in place until
	// the move ends (object.joining).
	joinHold *object
	// slots are the capacity slots of this node the move takes ahead of
	// the commit. slotMu guards them: VerifySource may still run when the
	// move is removed.
	slotMu sync.Mutex
	slots  handoff.ArrivalSlots
	// slotsSettle: a take of this move's slots had an unknown outcome; its
	// transaction may still apply until then (capslots.Free).
	slotsSettle time.Time
}

// targetMember is a member Actor arriving with its SpotWide User Spot.
type targetMember struct {
	key  location.AuthorityKey
	kind *Kind
	p    *messages.Participant
	obj  *object
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
		if handoff.Attribute(t.m.Identity(), t.sourcePID.Address, id, from.GetAddress()) == handoff.ThisRun {
			d.stepTarget(t, d.prepareEvent(p))
		}
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
	var joinSpot *object
	var members []*targetMember
	earlier := d.arriving(key)
	facts := handoff.PrepareFacts{
		LeaseValid: d.node.Valid(), Leaving: d.stopping || d.node.Draining(), IdentityValid: id.Valid(),
		FromSource: from != nil && from.Address == p.GetSource().GetAddress(),
		Ticket:     func() bool { return d.tickets.take(p, from.Address, d.clock.Now()) },
		Movable:    key.Validate() == nil && Movable(key.Kind), Registered: ok,
		Admit: func() (messages.FailureReason, error) {
			if p.GetJoin() != nil {
				if err := d.admitJoin(key, p.GetJoin()); err != nil {
					return messages.FailureReason_FAILURE_REASON_STALE, err
				}
				joinSpot = d.objects[location.Key(location.KindUserSpot, p.GetJoin().GetSpotId())]
			}
			var reason messages.FailureReason
			var err error
			members, reason, err = d.admitMembers(key, k, p)
			return reason, err
		},
	}
	if earlier != nil {
		facts.Earlier = earlier.m.Phase()
	}
	v := handoff.AdmitPrepare(facts)
	if v.NoTicket {
		// Not admitted by a capability answer to this source (admission.go).
		d.refused("Restore request", from.Address, "no valid move ticket for its source")
	}
	if v.Refuse {
		fail(v.Reason, v.Detail)
		return
	}
	if v.Supersede {
		d.stepTarget(earlier, handoff.Superseded{})
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
		joinSpot.x().joining++
		t.joinHold = joinSpot
	}
	m, effects := handoff.NewTarget(id, d.cfg.Handoff, d.prepareEvent(p))
	t.m = m
	t.run = targetrun.New[any](m, targetEnv{d: d, t: t}, 1+len(members))
	d.targets[id] = t
	d.arrivals[key] = t
	for _, m := range members {
		d.arrivals[m.key] = t
	}
	d.expectChunks(t)
	t.run.Run(effects)
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

// wireIdentity is a run's identity in the wire form its messages carry,
// made once for every message of the identity (a move sends several)
// instead of for each. The messages share it: nothing changes a sent
// message.
type wireIdentity struct {
	id handoff.Identity
	p  *messages.RelocationIdentity
}

func (w *wireIdentity) of(id handoff.Identity) *messages.RelocationIdentity {
	if w.p == nil || w.id != id {
		w.id, w.p = id, id.ToProto()
	}
	return w.p
}

// target finds the run of a control message's identity, only if it came
// from that run's source node.
func (d *Driver) target(pid *messages.RelocationIdentity, c actor.Context) *targetRun {
	id := handoff.IdentityFromProto(pid)
	t := d.targets[id]
	if t == nil || handoff.Attribute(t.m.Identity(), t.sourcePID.Address, id, c.Sender().GetAddress()) != handoff.ThisRun {
		return nil
	}
	return t
}

func (d *Driver) onChunk(c actor.Context, m *messages.RelocationState) {
	if t := d.target(m.GetIdentity(), c); t != nil {
		// The chunk is copied into the assembler's own buffer (PROTOCOL.md
		// §5.7), unless it is the whole stream: its bytes, unmarshalled
		// for this message alone, are then the buffer (Chunk.Backing).
		c := envelope.Chunk{Index: m.GetIndex(), Offset: m.GetOffset(), Data: m.GetData()}
		if c.Offset == 0 {
			c.Backing = c.Data
		}
		d.stepTarget(t, handoff.ChunkReceived{Chunk: c})
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

func (d *Driver) stepTarget(t *targetRun, ev handoff.Event) { t.run.Step(ev) }

func (d *Driver) laterTarget(id handoff.Identity, ev handoff.Event) {
	d.laterRun(id, func(r *targetrun.Run[any]) { r.Step(ev) })
}

// laterRun runs fn with the run of id on the driver goroutine, if the run
// is still known.
func (d *Driver) laterRun(id handoff.Identity, fn func(*targetrun.Run[any])) {
	d.loop.Post(func() {
		if t := d.targets[id]; t != nil {
			fn(t.run)
		}
	})
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
	d.setState(obj, ended)
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
	_, slots, err := d.slots.Take(ctx, holders, true, func(picked []uint32) []location.Op {
		// Claimed from now on (claimedBy): another move's free of the
		// same index must not free it once this take applies.
		t.slotMu.Lock()
		t.slots.Taking(picked)
		t.slotMu.Unlock()
		return nil
	})
	t.slotMu.Lock()
	if errors.Is(err, location.ErrIndeterminate) {
		// The store may still apply the take after this answer.
		t.slotsSettle = d.clock.Now().Add(capslots.SettleFor)
	}
	free, err := t.slots.Taken(slots, err)
	t.slotMu.Unlock()
	d.freeSlots(t, free)
	return err
}

// freeSlots frees, in the background, slots taken for the move t that did
// not commit. It tries until the node's lifecycle ends (its lease's end
// frees them too, and a stopped node's lease ends): a slot kept would
// hold capacity for nothing.
func (d *Driver) freeSlots(t *targetRun, slots []uint32) {
	if len(slots) == 0 {
		return
	}
	holders := []location.AuthorityKey{t.key}
	for _, m := range t.members {
		holders = append(holders, m.key)
	}
	t.slotMu.Lock()
	settle := t.slotsSettle
	t.slotMu.Unlock()
	go func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-d.node.LeaseLost():
			case <-d.node.Stopped():
			case <-ctx.Done():
			}
			cancel()
		}()
		_ = d.slots.Free(ctx, FreeRequest{Holders: holders, SettleUntil: settle, Claimed: d.claimedBy(ctx, t), TryFor: d.node.LeaseTTL(),
			Failing: func(tries int, err error) {
				d.log.Warn().Str("event", "capacity_slot_free_failed").Str("object_id", t.key.ID).Int("tries", tries).Err(err).
					Msg("capacity slots taken for a move that did not commit are still held; trying until the node's lease ends")
			}}, slots...)
	}()
}

// claimedBy says whether a move into this node other than t holds slot
// now: a later move of the same object may have taken an index t's take
// also named (t's take did not apply, and the later one read it free).
func (d *Driver) claimedBy(ctx context.Context, t *targetRun) func(slot uint32) bool {
	return func(slot uint32) bool {
		held, err := call(ctx, d, func() (bool, error) {
			for _, o := range d.targets {
				if o == t {
					continue
				}
				o.slotMu.Lock()
				has := slices.Contains(o.slots.Held(), slot)
				o.slotMu.Unlock()
				if has {
					return true, nil
				}
			}
			return false, nil
		})
		// Unanswered (the node stopped): claimed, so nothing is freed
		// on a guess.
		return err != nil || held
	}
}
