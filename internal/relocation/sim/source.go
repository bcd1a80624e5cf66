package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/relocation/sourcerun"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Move is one relocation the sim started, with both sides' runs.
type Move struct {
	id       uint64
	obj      ObjID
	from, to *Node
	started  time.Duration
	src      *SourceRun
	tgt      *TargetRun
	// what happened, for the report and the known-defect classification
	relayReadySent, cutoverSent, committed, opened, fencedOut, reinstated bool
	targetRemoved                                                         bool
	// committedInStore: the store took this move's owner change.
	committedInStore bool
	relayedEver      []*Msg
}

func (mv *Move) String() string {
	return fmt.Sprintf("move #%d o%d %s→%s", mv.id, mv.obj, mv.from.name, mv.to.name)
}

// SourceRun is one move out of a node: the shared source interpreter
// (sourcerun) over this world's primitives (sourceEnv).
type SourceRun struct {
	w        *World
	node     *Node
	mv       *Move
	m        *handoff.Source
	run      *sourcerun.Run[*Msg, Record]
	inc      *Inc
	target   *Node
	newOwner uint64
	// incs and owners are every participant's incarnation and offered
	// owner generation (0: inc and newOwner; a SpotWide Spot's members
	// follow in ID order).
	incs     []*Inc
	owners   []uint64
	deadline time.Duration
	timers   map[handoff.Timer]uint64
	// unbound: the move dropped its object's Session binding (the Session
	// owner has none); it goes on unbound.
	unbound bool
	// join: the User Spot a Join moves the Actor into (join.go), or nil.
	join *messages.Membership

	dead      bool // its node went down
	releases  int
	completes int
}

// part is the move's participant i.
func (r *SourceRun) part(i int) *sourcerun.Part[*Msg] { return r.run.Parts[i] }

// partOf is the participant of the move that o is, or -1.
func (r *SourceRun) partOf(o ObjID) int {
	for i, inc := range r.incs {
		if inc.key.obj == o {
			return i
		}
	}
	return -1
}

// StartMove starts a move of o from the node serving it to dst; it
// reports false when handoff.RefuseStart refuses it on this world's facts
// (an incarnation whose mailbox is not open does not serve here).
func (w *World) StartMove(o ObjID, dst *Node) bool { return w.startMove(o, dst, nil) }

// startMove starts a move of o to dst that carries join (nil: none).
func (w *World) startMove(o ObjID, dst *Node, join *messages.Membership) bool {
	var src *Node
	for _, n := range w.nodes {
		if inc := n.objects[o]; inc != nil && n.alive {
			src = n
		}
	}
	if src == nil {
		return false
	}
	inc := src.objects[o]
	facts := handoff.StartFacts{Owned: true, Serving: inc.state == sServing && inc.mode == mOpen, Moving: inc.out != nil,
		TargetIsSelf: dst == src}
	if !src.valid() {
		facts.Lease = errLeaseNotValid
	}
	spot := w.objs[o].spot
	if spot >= 0 {
		facts.SpotWideSpot = fmt.Sprintf("o%d", spot)
	}
	if err := handoff.RefuseStart(facts, w.keyOf(o), dst.name); err != nil {
		if spot >= 0 && errors.Is(err, roamerr.ErrInvalidOperation) {
			w.stats.MemberMovesRefused++
			w.tracef("%s refuses to move o%d alone: a member of SpotWide Spot o%d", src.name, o, spot)
		}
		return false
	}
	members, err := w.unitOf(o, src)
	if err != nil {
		w.tracef("%s refuses to move o%d: %v", src.name, o, err)
		return false
	}
	w.nextRelocID++
	id := handoff.Identity{RelocationID: w.nextRelocID, TargetAttemptGeneration: 1,
		Fence: handoff.Fence{NodeRid: src.name, NodeGeneration: src.gen, OwnerGeneration: inc.key.ownerGen}}
	deadline := w.Now() + w.cfg.RestoreTimeout
	inc.offered = max(inc.key.ownerGen, inc.offered) + 1
	r := &SourceRun{w: w, node: src, inc: inc, target: dst, newOwner: inc.offered, deadline: deadline,
		m: handoff.NewSource(id, w.cfg.Handoff, w.wall(deadline)), timers: map[handoff.Timer]uint64{}, join: join}
	r.incs, r.owners = []*Inc{inc}, []uint64{r.newOwner}
	parts := []*sourcerun.Part[*Msg]{{}}
	for _, m := range members {
		m.offered = max(m.key.ownerGen, m.offered) + 1
		r.incs, r.owners = append(r.incs, m), append(r.owners, m.offered)
		parts = append(parts, &sourcerun.Part[*Msg]{})
	}
	r.run = sourcerun.New(r.m, sourcerun.Env[*Msg, Record](sourceEnv{r}), parts)
	mv := &Move{id: id.RelocationID, obj: o, from: src, to: dst, started: w.Now(), src: r}
	r.mv = mv
	w.moves = append(w.moves, mv)
	w.stats.Moves++
	src.sources = append(src.sources, r)
	for _, x := range r.incs {
		x.out = r
	}
	w.tracef("%s starts %s (fence og%d, deadline %s)", src.name, mv, inc.key.ownerGen, deadline)
	if len(members) > 0 {
		w.stats.Units++
		w.stats.UnitMembersMoved += len(members)
		if w.Tracing() {
			var names []string
			for i, m := range members {
				names = append(names, fmt.Sprintf("o%d (og%d→%d)", m.key.obj, m.key.ownerGen, r.owners[i+1]))
			}
			w.tracef("%s move #%d is SpotWide: members %s", src.name, mv.id, strings.Join(names, ", "))
		}
	}
	w.stepSource(r, handoff.Start{SessionBound: w.boundTo(o) >= 0, Participants: len(r.incs)})
	return true
}

// stepSource feeds ev to r's run.
func (w *World) stepSource(r *SourceRun, ev handoff.Event) { r.run.Step(ev) }

// payload encodes what a capture carries here: the move, then each
// participant's state (the history length) and saved work, in participant
// order, padded so that it spans chunks.
func payload(relocID uint64, versions []int, saved [][]*Msg) []byte {
	b := make([]byte, 0, 64+8*len(saved))
	b = binary.BigEndian.AppendUint64(b, relocID)
	for i, v := range versions {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
		b = binary.BigEndian.AppendUint32(b, uint32(len(saved[i])))
		for _, m := range saved[i] {
			b = binary.BigEndian.AppendUint64(b, m.id)
		}
	}
	return append(b, make([]byte, 40)...)
}

func msgRecord(m *Msg) []byte { return binary.BigEndian.AppendUint64(nil, m.id) }

var errSim = errors.New("sim")

var errLeaseNotValid = fmt.Errorf("%w: the node's owner lease is not in force", roamerr.ErrUnavailable)

// followSink forwards participant i's messages to its target incarnation
// (Message Follow); the sender's node drops its cached route
// (Config.OnFollow).
func (w *World) followSink(r *SourceRun, i int) func(*Msg) {
	next := incKey{obj: r.incs[i].key.obj, ownerGen: r.owners[i]}
	return func(m *Msg) {
		if w.Tracing() {
			w.tracef("%s follow m%d → %s", r.node.name, m.id, r.target.name)
		}
		r.node.send(r.target.idx, &packet{kind: pFollow, msg: m, inc: next})
		w.clients[m.client].stale(m.obj)
	}
}

// reopen is the mailbox's way back to Open (Unseal from Sealed, Reopen
// from Redirecting): front goes ahead of everything held.
func (w *World) reopen(inc *Inc, from incMode, front []*Msg) error {
	if inc.mode != from {
		return fmt.Errorf("%w: reopen from %s in mode %s", errSim, incModeNames[from], incModeNames[inc.mode])
	}
	for _, m := range front {
		w.place(m, inc.node)
	}
	inc.queue = append(append([]*Msg(nil), front...), inc.queue...)
	inc.sink = nil
	w.setMode(inc, mOpen)
	return nil
}

// redirect is mailbox.Redirect: from Sealed, hand every held message to
// sink in order, then every later one; in Redirecting, swap the sink.
func (w *World) redirect(inc *Inc, sink func(*Msg)) error {
	switch inc.mode {
	case mSealed:
		held := inc.queue
		inc.queue = nil
		for _, m := range held {
			sink(m)
		}
		inc.sink = sink
		w.setMode(inc, mRedirect)
		return nil
	case mRedirect:
		inc.sink = sink
		return nil
	}
	return fmt.Errorf("%w: redirect in mode %s", errSim, incModeNames[inc.mode])
}

// recordView is what the machines judge of a record.
func recordView(rec Record) handoff.RecordView {
	return handoff.RecordView{Present: true, Version: rec.Version, OwnerNodeRid: rec.OwnerNode, OwnerNodeGeneration: rec.OwnerNodeGen,
		OwnerGeneration: rec.OwnerGen, ObjectGeneration: rec.ObjectGen, RelocationID: rec.RelocID,
		State: messages.LifecycleState_LIFECYCLE_STATE_READY} // the sim models no Close
}
