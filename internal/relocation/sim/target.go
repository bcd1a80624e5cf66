package sim

import (
	"slices"
	"time"

	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/targetrun"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// TargetRun is one move into a node: the shared target interpreter
// (targetrun) over this world's primitives (targetEnv).
type TargetRun struct {
	w        *World
	node     *Node
	mv       *Move
	m        *handoff.Target
	run      *targetrun.Run[*Msg]
	source   *Node
	obj      ObjID
	newOwner uint64
	deadline time.Duration
	inc      *Inc
	version  int
	timers   map[handoff.Timer]uint64
	verified *location.Versioned // the record VerifySource read, until a commit takes it
	relayed  []*Msg              // relay records received (the machine's relay buffer, over-approximated)
	// Every participant's object, offered owner generation, staged
	// incarnation, restored state and saved work (0: obj, newOwner, inc,
	// version; a SpotWide Spot's members follow), and the members as the
	// prepare named them.
	objs     []ObjID
	owners   []uint64
	incs     []*Inc
	versions []int
	saved    [][]*Msg
	members  []prepMember
	// join: the User Spot the Actor joins (prepare.join); joinHold: that
	// Spot's incarnation here, held in place until this Actor serves or
	// the move ends (the driver's targetRun.joinHold).
	join     *messages.Membership
	joinHold *Inc
	// slots: the capacity slots this move took here (a bounded node).
	slots handoff.ArrivalSlots
	// slotsSettle: a take of them had an unknown outcome and may still
	// apply until then (the driver's targetRun.slotsSettle).
	slotsSettle time.Duration

	dead      bool
	completes int
}

func containsMsg(ms []*Msg, m *Msg) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

func (w *World) moveByID(id uint64) *Move {
	for _, mv := range w.moves {
		if mv.id == id {
			return mv
		}
	}
	return nil
}

// onPrepare takes a Restore request: a known identity steps its run (only
// from its source); a new one is judged by handoff.AdmitPrepare on this
// world's facts (a SpotWide Spot's members by admit.Members) and gets a
// Target machine. Tickets, kinds and Joins are not modelled: every
// prepare has its ticket and names a registered, movable kind.
func (w *World) onPrepare(n *Node, p *packet) {
	id := p.id
	if t := n.targetOf(id); t != nil {
		if handoff.Attribute(id, t.source.name, id, w.endpointName(p.from)) == handoff.ThisRun {
			w.stepTarget(t, w.prepareEvent(p))
		}
		return
	}
	earlier := n.arriving(p.prep.obj)
	facts := handoff.PrepareFacts{LeaseValid: n.valid(), Leaving: n.stopping, IdentityValid: id.Valid(),
		FromSource: p.prep.source == p.from, Movable: true, Registered: true,
		Admit: func() (messages.FailureReason, error) {
			if p.prep.join != nil {
				if err := admit.Join(w.keyOf(p.prep.obj), p.prep.join, n.spotFacts(p.prep.join), func(string) bool { return false }); err != nil {
					return messages.FailureReason_FAILURE_REASON_STALE, err
				}
			}
			_, reason, err := admit.Members(w.keyOf(p.prep.obj), w.isSpot(p.prep.obj), w.participants(p.prep.members), maxSpotWideMembers,
				func(string) admit.MemberKind { return admit.MemberKind{Registered: true} },
				func(k location.AuthorityKey) bool {
					o := w.objOfKey(k)
					return n.objects[o] != nil || n.arriving(o) != nil
				})
			return reason, err
		}}
	if earlier != nil {
		facts.Earlier = earlier.m.Phase()
	}
	v := handoff.AdmitPrepare(facts)
	if v.Refuse {
		w.tracef("%s refuses %s: %s", n.name, idString(id), v.Detail)
		n.send(p.from, &packet{kind: pFailed, id: id, reason: v.Reason, detail: v.Detail})
		return
	}
	if v.Supersede {
		w.tracef("%s supersedes tgt #%d", n.name, earlier.m.Identity().RelocationID)
		w.stepTarget(earlier, handoff.Superseded{})
	}
	mv := w.moveByID(id.RelocationID)
	t := &TargetRun{w: w, node: n, mv: mv, source: w.nodes[p.from], obj: p.prep.obj, newOwner: p.prep.newOwner,
		deadline: p.prep.deadline, timers: map[handoff.Timer]uint64{}, members: p.prep.members,
		objs: []ObjID{p.prep.obj}, owners: []uint64{p.prep.newOwner}, join: p.prep.join}
	if p.prep.join != nil {
		// A SpotWide Spot does not move while a member is on its way in.
		t.joinHold = n.objects[w.objOfKey(location.Key(location.KindUserSpot, p.prep.join.GetSpotId()))]
		t.joinHold.joining++
	}
	for _, pm := range p.prep.members {
		t.objs, t.owners = append(t.objs, pm.obj), append(t.owners, pm.newOwner)
	}
	t.incs, t.versions, t.saved = make([]*Inc, len(t.objs)), make([]int, len(t.objs)), make([][]*Msg, len(t.objs))
	m, effects := handoff.NewTarget(id, w.cfg.Handoff, w.prepareEvent(p))
	t.m = m
	t.run = targetrun.New[*Msg](m, targetEnv{t}, len(t.objs))
	if mv.tgt == nil {
		mv.tgt = t
	}
	n.targets = append(n.targets, t)
	if w.Tracing() {
		w.tracef("%s tgt #%d created → %s %s", n.name, id.RelocationID, m.Phase(), effectsString(effects))
	}
	t.run.Run(effects)
}

// targetOf is n's live target run of identity id, if any.
func (n *Node) targetOf(id handoff.Identity) *TargetRun {
	for _, t := range n.targets {
		if t.m.Identity() == id && !t.dead {
			return t
		}
	}
	return nil
}

// arriving is the unfinished move of o into n (o one of its
// participants), if any.
func (n *Node) arriving(o ObjID) *TargetRun {
	for _, t := range n.targets {
		if !t.dead && !t.m.Finished() && slices.Contains(t.objs, o) {
			return t
		}
	}
	return nil
}

func (w *World) prepareEvent(p *packet) handoff.PrepareReceived {
	return handoff.PrepareReceived{Manifest: p.prep.manifest, RestoreDeadline: w.wall(p.prep.deadline), MaxPayloadLength: 1 << 20,
		SessionBound: w.boundTo(p.prep.obj) >= 0}
}

// stepTarget feeds ev to the run.
func (w *World) stepTarget(t *TargetRun, ev handoff.Event) { t.run.Step(ev) }

// versionedOf is the sim's record as the Location Store holds it.
func versionedOf(key location.AuthorityKey, r Record) location.Versioned {
	v := location.Versioned{Key: key, Version: location.StoreVersion(r.Version), Record: &location.Record{
		Owner: &messages.Owner{NodeRid: r.OwnerNode, NodeGeneration: r.OwnerNodeGen}, AuthorityOwnerGeneration: r.OwnerGen,
		ObjectGeneration: r.ObjectGen, RelocationId: r.RelocID, MemberCount: r.MemberCount, CapacitySlot: r.Slot,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY, // the sim models no Close
	}}
	if r.Member != "" {
		v.Record.Membership = &messages.Membership{SpotId: r.Member, SpotGeneration: 1}
	}
	return v
}

// recordOf is a Location Store record as the sim holds it, at version.
func recordOf(r *location.Record, version uint64) Record {
	return Record{Version: version, OwnerNode: r.GetOwner().GetNodeRid(), OwnerNodeGen: r.GetOwner().GetNodeGeneration(),
		OwnerGen: r.GetAuthorityOwnerGeneration(), ObjectGen: r.GetObjectGeneration(), RelocID: r.GetRelocationId(),
		Member: r.GetMembership().GetSpotId(), MemberCount: r.GetMemberCount(), Slot: r.GetCapacitySlot()}
}
