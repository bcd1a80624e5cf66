package nodesim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/roamactors/roam/internal/extension"
	"github.com/roamactors/roam/internal/failure"
	"github.com/roamactors/roam/internal/relocation"
	"github.com/roamactors/roam/internal/testwait"
	"github.com/roamactors/roam/location"
)

// The crew: one SpotWide User Spot and its member Actors (docs/PROTOCOL.md
// §5.15). It moves as one unit with every member, takes Actors in by Joins
// (moved to its node first when they are elsewhere) and lets one leave;
// its events are drawn from a stream of their own, so that a seed's other
// draws are the ones it drew before the crew existed.

// crewID is the SpotWide User Spot's ID and stable type.
const crewID = "crew"

// memberType is the stable type of the crew's member Actors.
const memberType = "member"

// crewStream seeds the crew's draws.
const crewStream = 0x63726577

// crewKinds are the crew's kinds: the SpotWide Spot's and its members'.
func (w *World) crewKinds() []extension.Kind {
	producer := func() actor.Actor { return &counter{w: w} }
	return []extension.Kind{
		{StableType: crewID, SpotWide: true, Policy: extension.PreserveStateWith(counterState{}), Producer: producer},
		{StableType: memberType, Policy: extension.PreserveStateWith(counterState{}), Producer: producer},
	}
}

// startCrew creates the crew on the node placement picks and spawns its
// first members there (a SpotWide Spot's members live on its node).
func (w *World) startCrew() {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	res, err := w.Nodes[0].Ext().Spots().GetOrCreate(crewID, crewID).Do(ctx)
	if err != nil {
		w.t.Fatalf("seed %d: creating %s: %v", w.seed, crewID, err)
	}
	w.crewRef = res.Ref
	home := w.nodeOf(res.Ref.NodeRid)
	if home == nil {
		w.t.Fatalf("seed %d: %s placed on %s, no node of the world", w.seed, crewID, res.Ref.NodeRid)
	}
	members := 2 + w.crewRng.IntN(2)
	for i := 0; i < members; i++ {
		id := fmt.Sprintf("m%d", i)
		if _, err := home.Ext().Spots().SpawnMember(ctx, res.Ref, memberType, id); err != nil {
			w.t.Fatalf("seed %d: spawning member %s: %v", w.seed, id, err)
		}
		w.actors = append(w.actors, id)
	}
	w.logf("%s created on %s with members %v", crewID, home.Name, w.actors)
}

// nodeOf is the node whose lifecycle now has the RID rid, if any.
func (w *World) nodeOf(rid string) *Node {
	for _, n := range w.Nodes {
		if !n.stopped.Load() && n.Ext().NodeRid() == rid {
			return n
		}
	}
	return nil
}

// crewSchedule draws the crew's events: moves of the Spot with its
// members, Joins of fresh Actors and one leave.
func (w *World) crewSchedule() []event {
	var evs []event
	rng := w.crewRng
	for i := 0; i < w.cfg.CrewMoves; i++ {
		at := rng.Dur(0, w.cfg.Span)
		from, to := w.Nodes[rng.IntN(len(w.Nodes))], w.Nodes[rng.IntN(len(w.Nodes))]
		evs = append(evs, event{at, fmt.Sprintf("move %s with its members to %s (asked at %s)", crewID, to.Name, from.Name), func() {
			w.inflight.Add(1)
			go func() {
				defer w.inflight.Add(-1)
				w.relocate(from, extension.UserSpotRef(crewID), to)
			}()
		}})
	}
	for i := 0; i < w.cfg.Joins; i++ {
		at := rng.Dur(0, w.cfg.Span)
		on, via := w.Nodes[rng.IntN(len(w.Nodes))], w.Nodes[rng.IntN(len(w.Nodes))]
		id := fmt.Sprintf("j%d", i)
		evs = append(evs, event{at, fmt.Sprintf("spawn %s on %s and join it to %s (asked at %s)", id, on.Name, crewID, via.Name), func() {
			w.inflight.Add(1)
			go func() {
				defer w.inflight.Add(-1)
				w.join(on, via, id)
			}()
		}})
	}
	for i := 0; i < w.cfg.Leaves; i++ {
		at := rng.Dur(0, w.cfg.Span)
		via := w.Nodes[rng.IntN(len(w.Nodes))]
		id := fmt.Sprintf("m%d", rng.IntN(2)) // every crew starts with these two
		evs = append(evs, event{at, fmt.Sprintf("%s leaves %s (asked at %s)", id, crewID, via.Name), func() {
			w.inflight.Add(1)
			go func() {
				defer w.inflight.Add(-1)
				w.leave(via, id)
			}()
		}})
	}
	return evs
}

// join spawns the Actor id on on and asks via to join it to the crew: a
// cross-node Join when the crew lives elsewhere. A spawn or Join refused
// or failed is an outcome, typed; an Actor whose spawn failed is not
// called (its record, if the spawn's answer was lost, is checked as any).
func (w *World) join(on, via *Node, id string) {
	if on.stopped.Load() || via.stopped.Load() {
		w.logf("join %s: not asked, %s or %s is stopped", id, on.Name, via.Name)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	if _, err := on.Ext().SpawnActor(ctx, memberType, id); err != nil {
		w.noteErr("spawn "+id, err)
		w.logf("spawn %s on %s: %v", id, on.Name, err)
		return
	}
	w.mu.Lock()
	w.actors = append(w.actors, id)
	w.mu.Unlock()
	out, err := via.Ext().JoinSpot(ctx, extension.ActorRef(id), w.crewRef)
	w.noteErr("join "+id, err)
	how := ""
	if err == nil && out.From != out.To {
		how = " (moved to the crew's node)"
	}
	w.logf("join %s to %s: %v%s", id, crewID, err, how)
}

// leave asks via to take the Actor id out of the crew.
func (w *World) leave(via *Node, id string) {
	if via.stopped.Load() {
		w.logf("leave %s: not asked, %s is stopped", id, via.Name)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	err := via.Ext().LeaveSpot(ctx, extension.ActorRef(id))
	w.noteErr("leave "+id, err)
	w.logf("%s leaves %s: %v", id, crewID, err)
}

// noteErr records err if it falls in no roamerr class.
func (w *World) noteErr(what string, err error) {
	if err == nil || typed(err) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.untyped = append(w.untyped, fmt.Sprintf("%s: %v", what, err))
}

// callCrew asks the crew Spot, by its ID through n, to handle a new value.
func (w *World) callCrew(n *Node, value string) error {
	w.inflight.Add(1)
	defer w.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	_, err := n.Ext().Spots().Request(crewID, wrapperspb.String(value)).Timeout(3 * w.cfg.LeaseTTL).Do(ctx)
	w.answer(n, value, err)
	return err
}

// memberPatience is how long a request to an Actor waits for its reply:
// a plain Proto.Actor request, whose timeout is in real time. A request
// that outwaits it is unanswered, not failed (the timeout is Proto.Actor's,
// no error of roam's), and the caller asks again at the next step. It is
// short because a request to a PID of a lifecycle that ended is lost by
// the transport (docs/FAULTS.md, "What a crash loses"): a longer wait would
// only hold the next try back, and make a run slower, not stricter.
const memberPatience = 500 * time.Millisecond

// callActor asks the Actor id, resolved through n, to handle a new value:
// roam answers a request it cannot deliver with a typed failure.
func (w *World) callActor(n *Node, id, value string) error {
	w.inflight.Add(1)
	defer w.inflight.Add(-1)
	w.actorCalls.Add(1)
	defer w.actorCalls.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Patience(w.t))
	defer cancel()
	ext := n.Ext()
	pid, err := ext.Resolve(ctx, extension.ActorRef(id))
	if err != nil {
		w.answer(n, value, err)
		return err
	}
	reply, err := ext.System().Root.RequestFuture(pid, wrapperspb.String(value), memberPatience).Result()
	if errors.Is(err, actor.ErrTimeout) || errors.Is(err, actor.ErrDeadLetter) {
		return err
	}
	if err == nil {
		err = failure.Error(reply)
	}
	w.answer(n, value, err)
	return err
}

// answer records a call's outcome: a success, or a failure that must be
// typed.
func (w *World) answer(n *Node, value string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.answered[value] = true
	case !typed(err):
		w.untyped = append(w.untyped, fmt.Sprintf("%s via %s: %v", value, n.Name, err))
	}
}

// crewCall is the crew caller's k-th call: the Spot itself every third,
// else one of the Actors spawned for it (members, and one that left).
func (w *World) crewCall(n *Node, k int) error {
	if k%3 == 0 {
		return w.callCrew(n, fmt.Sprintf("cs-%d", k))
	}
	w.mu.Lock()
	id := w.actors[k%len(w.actors)]
	w.mu.Unlock()
	return w.callActor(n, id, fmt.Sprintf("ca-%s-%d", id, k))
}

// listAll is every record of kind k in the store.
func (w *World) listAll(k location.Kind) ([]location.Versioned, error) {
	var out []location.Versioned
	page := location.PageRequest{Size: location.MaxPageSize}
	for {
		p, err := w.Store.List(context.Background(), k, page)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Items...)
		if p.Next == "" {
			return out, nil
		}
		page.After = p.Next
	}
}

// crewWhole says what keeps the crew from being one unit on one node ("" when
// nothing does): every Actor the store names a member of the crew's
// incarnation is owned by the crew's owner, and the crew's member count
// is their number.
func (w *World) crewWhole() string {
	v, err := w.Store.Read(context.Background(), extension.UserSpotRef(crewID))
	if err != nil {
		return fmt.Sprintf("read %s: %v", crewID, err)
	}
	owner := v.Record.GetOwner().GetNodeRid()
	actors, err := w.listAll(location.KindActor)
	if err != nil {
		return fmt.Sprintf("list Actors: %v", err)
	}
	var members, away []string
	for _, a := range actors {
		ms := a.Record.GetMembership()
		if ms.GetSpotId() != crewID || ms.GetSpotGeneration() != v.Record.GetObjectGeneration() {
			continue
		}
		members = append(members, a.Key.ID)
		if o := a.Record.GetOwner().GetNodeRid(); o != owner {
			away = append(away, fmt.Sprintf("%s on %s", a.Key.ID, w.nameOf(o)))
		}
	}
	var why []string
	if c := v.Record.GetMemberCount(); int(c) != len(members) {
		why = append(why, fmt.Sprintf("member_count %d, but %d Actors name it: %v", c, len(members), members))
	}
	if len(away) > 0 {
		why = append(why, fmt.Sprintf("members not on its owner %s: %v", w.nameOf(owner), away))
	}
	return strings.Join(why, "; ")
}

// nameOf names the node whose lifecycle has the RID rid, for a report.
func (w *World) nameOf(rid string) string {
	if n := w.nodeOf(rid); n != nil {
		return n.Name + " (" + rid + ")"
	}
	return rid + " (no node's lifecycle now)"
}

// slotsAgree says where n's capacity slots disagree with the records ("" when
// they agree): every object n's lifecycle owns holds a slot of its own
// that its record names, every slot n holds is such an object's, and
// there are at most its capacity of them (docs/PROTOCOL.md §7.12).
func (w *World) slotsAgree(n *Node) string {
	desc := n.Ext().Node().Descriptor()
	node := location.NodeKey{Mesh: desc.GetMesh(), NodeRid: desc.GetNodeRid()}
	slots, err := w.Store.ListSlots(context.Background(), node)
	if err != nil {
		return fmt.Sprintf("list slots: %v", err)
	}
	capacity := uint32(w.cfg.Capacity)
	held := map[string]uint32{}
	for _, s := range slots {
		if s.Index >= capacity {
			return fmt.Sprintf("slot %d is past the capacity %d", s.Index, capacity)
		}
		if _, dup := held[s.Holder.String()]; dup {
			return fmt.Sprintf("%s holds two slots: %v", s.Holder, slots)
		}
		held[s.Holder.String()] = s.Index
	}
	owned := map[string]uint32{}
	for _, k := range []location.Kind{location.KindActor, location.KindInstanceSpot, location.KindUserSpot} {
		vs, err := w.listAll(k)
		if err != nil {
			return fmt.Sprintf("list %v: %v", k, err)
		}
		for _, v := range vs {
			if v.Record.GetOwner().GetNodeRid() != node.NodeRid {
				continue
			}
			slot, ok := relocation.RecordSlot(v.Record)
			if !ok {
				return fmt.Sprintf("%s is owned by a node of capacity %d but names no slot", v.Key, capacity)
			}
			owned[v.Key.String()] = slot
		}
	}
	if fmt.Sprint(owned) != fmt.Sprint(held) {
		return fmt.Sprintf("the records name slots %v, the store holds %v", sortedMap(owned), sortedMap(held))
	}
	return ""
}

func sortedMap(m map[string]uint32) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s:%d ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// actorIDs are the IDs of every Actor record of the world's member kind:
// each must answer once the faults stop, a member of the crew or not.
func (w *World) actorIDs() ([]string, error) {
	vs, err := w.listAll(location.KindActor)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, v := range vs {
		if v.Record.GetStableType() == memberType {
			ids = append(ids, v.Key.ID)
		}
	}
	return ids, nil
}
