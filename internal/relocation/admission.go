package relocation

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// Who may move an object onto this node. Anyone who reaches the node's
// port can send it a Restore request and declare any sender address (with
// mutual TLS only a certified host can; docs/SECURITY.md), and a request
// that names a real owner's fence would, if believed, rewrite the owner
// record. So a move is admitted in two steps:
//
//  1. The capability query names the asking node; it is answered only when
//     the store has that node, live, at the address the query came from,
//     and the answer, which carries a fresh single-use move ticket, goes to
//     that address. Whoever merely declares a member's address never sees
//     the ticket.
//  2. A Restore request must carry an unexpired ticket issued to its source
//     node and address, and before relay-ready the target reads the record:
//     the source must be the object's owner at the move's fence
//     (handoff.VerifySource). A refusal names nothing the sender did not
//     send.

// moveTicketTTL bounds how long a ticket waits for its Restore request: a
// source seals after the in-flight budget admits the move and after the
// object's current turn, which may be long.
const moveTicketTTL = 10 * time.Minute

// The tickets a node keeps: per source address at most ticketsPerSource
// (a source uses each within its move; a flood that claims a member's
// address only displaces that member's oldest), and at most maxTickets
// in all (the oldest go first).
const (
	ticketsPerSource = 256
	maxTickets       = 4096
)

// maxTicketsPerAnswer bounds the tickets one capability answer carries
// (a query asks for its move's and spares for the moves after it), and
// maxSparesPerSource the spare tickets one source address holds.
const (
	maxTicketsPerAnswer = 16
	maxSparesPerSource  = 128
)

// moveTicket is what a ticket admits.
type moveTicket struct {
	rid        string
	generation uint64
	address    string
	expires    time.Time
	spare      bool // a spare ticket (counted in spares, not in bySource)
}

// tickets are the move tickets a node issued and no Restore request has
// used yet, in issue order (their expiries are in the same order).
type tickets struct {
	byKey    map[string]moveTicket
	order    []string            // keys, oldest first; used or evicted keys stay until popped
	bySource map[string][]string // the keys of move tickets per source address, oldest first
	// spares counts the spare tickets per source address. They are never
	// displaced (a move under way may hold one): past maxSparesPerSource
	// a source gets no more until it uses or gives back some.
	spares map[string]int
}

func newTickets() *tickets {
	return &tickets{byKey: map[string]moveTicket{}, bySource: map[string][]string{}, spares: map[string]int{}}
}

// issue gives a move ticket to the source node rid at address; the oldest
// of that address's move tickets makes room past ticketsPerSource.
func (ts *tickets) issue(rid string, generation uint64, address string, now time.Time) []byte {
	if q := ts.bySource[address]; len(q) >= ticketsPerSource {
		ts.remove(q[0])
	}
	key := ts.add(moveTicket{rid: rid, generation: generation, address: address, expires: now.Add(moveTicketTTL)}, now)
	ts.bySource[address] = append(ts.bySource[address], key)
	return []byte(key)
}

// issueSpare gives a spare ticket, or nil when address holds
// maxSparesPerSource of them.
func (ts *tickets) issueSpare(rid string, generation uint64, address string, now time.Time) []byte {
	if ts.spares[address] >= maxSparesPerSource {
		return nil
	}
	key := ts.add(moveTicket{rid: rid, generation: generation, address: address, expires: now.Add(moveTicketTTL), spare: true}, now)
	ts.spares[address]++
	return []byte(key)
}

// giveBack forgets the tickets a source at address says it will not use
// (only its own).
func (ts *tickets) giveBack(address string, keys [][]byte) {
	for _, k := range keys {
		if t, ok := ts.byKey[string(k)]; ok && t.address == address {
			ts.remove(string(k))
		}
	}
}

// add keeps t under a fresh random key, after dropping expired tickets and
// (past maxTickets) the oldest.
func (ts *tickets) add(t moveTicket, now time.Time) string {
	for len(ts.order) > 0 {
		t, live := ts.byKey[ts.order[0]]
		if live && now.Before(t.expires) && len(ts.byKey) < maxTickets {
			break
		}
		ts.remove(ts.order[0])
		ts.order = ts.order[1:]
	}
	if len(ts.order) > 2*len(ts.byKey)+64 {
		// Keys removed out of order pile up behind a live head: compact
		// (amortized O(1) per issue).
		live := ts.order[:0]
		for _, k := range ts.order {
			if _, ok := ts.byKey[k]; ok {
				live = append(live, k)
			}
		}
		ts.order = live
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	key := string(b)
	ts.byKey[key] = t
	ts.order = append(ts.order, key)
	return key
}

// remove forgets a ticket (once: a removed key is ignored).
func (ts *tickets) remove(key string) {
	t, ok := ts.byKey[key]
	if !ok {
		return
	}
	delete(ts.byKey, key)
	if t.spare {
		if ts.spares[t.address]--; ts.spares[t.address] <= 0 {
			delete(ts.spares, t.address)
		}
		return
	}
	q := ts.bySource[t.address]
	for i, k := range q {
		if k == key {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(ts.bySource, t.address)
	} else {
		ts.bySource[t.address] = q
	}
}

// take consumes the ticket of a Restore request that came from address;
// false when there is none for that source node, address and fence.
func (ts *tickets) take(p *messages.RelocationPrepare, address string, now time.Time) bool {
	key := string(p.GetMoveTicket())
	t, ok := ts.byKey[key]
	if !ok || now.After(t.expires) {
		return false
	}
	src, fence := p.GetSource(), p.GetIdentity().GetCoordinatorFence()
	if t.address != address || t.rid != src.GetNodeRid() || t.generation != src.GetNodeGeneration() ||
		fence.GetNodeRid() != t.rid || fence.GetNodeGeneration() != t.generation {
		return false
	}
	ts.remove(key)
	return true
}

// onCapability answers a capability query once the asking node is known
// to be a live member at the address the query came from.
func (d *Driver) onCapability(c actor.Context, q *messages.CapabilityQuery) {
	// The answer carries a ticket: it goes only to a request's own
	// future, never to an actor the asker names (one that passed it on
	// would hand the ticket to whoever it passes messages to).
	src := q.GetSource()
	d.answerMember(c, "capability query", src, func(to *actor.PID, refusal string) {
		if refusal != "" {
			d.sys.Root.Send(to, &messages.CapabilityReply{Reason: refusal})
			return
		}
		if q.GetLeaving() {
			// A drained node about to stop: no route of this node
			// sends there from now on (peers.go); this answer comes
			// back behind everything sent there before.
			d.peers.leaving(to.Address, src.GetNodeRid())
			d.log.Info().Str("event", "peer_leaving").Str("address", to.Address).Str("peer_node_rid", src.GetNodeRid()).
				Msg("a drained node is stopping: routes to it read the store from now on")
		}
		// Spare tickets the source will not use (their answer grew
		// old, or the target refused a move) come back with its next
		// query, so that they count no more.
		d.tickets.giveBack(to.Address, q.GetReturnedTickets())
		reply := d.capability(q)
		// A drain asking for the load starts no move: no ticket, which
		// would displace the tickets of moves under way (at most
		// ticketsPerSource per source).
		if reply.Supported && !q.GetWantLoad() {
			now := d.clock.Now()
			reply.MoveTicket = d.tickets.issue(src.GetNodeRid(), src.GetNodeGeneration(), to.Address, now)
			// Spare tickets only where the answer holds for the next
			// moves too: a node with a capacity answers each move by
			// its load at the time (tickets_out.go).
			if d.desc.GetCapacity() == 0 {
				for n := min(int(q.GetWantTickets()), maxTicketsPerAnswer) - 1; n > 0; n-- {
					t := d.tickets.issueSpare(src.GetNodeRid(), src.GetNodeGeneration(), to.Address, now)
					if t == nil {
						break
					}
					reply.SpareMoveTickets = append(reply.SpareMoveTickets, t)
				}
			}
		}
		d.sys.Root.Send(to, reply)
	})
}

// answerMember runs answer on the driver goroutine for a query sent as a
// request (its answer goes only to the request's own future) by src, once
// src is known to be a live member at the address the query came from;
// otherwise answer gets the refusal's reason, logged and counted as what.
func (d *Driver) answerMember(c actor.Context, what string, src *messages.NodeRef, answer func(to *actor.PID, refusal string)) {
	to := c.Sender()
	if to == nil || !strings.HasPrefix(to.Id, "future") {
		d.refused(what, "", "not sent as a request")
		return
	}
	go func() {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.CapabilityTimeout)
		defer cancel()
		err := d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), to.Address)
		d.sys.Root.Send(d.self, &localCall{fn: func() {
			if err != nil {
				reason := "the asking node is not a live member of this mesh at its address"
				if !errors.Is(err, meshnode.ErrNotMember) {
					reason = "this node cannot check the asking node in the Location Store now"
				}
				d.refused(what, to.Address, err.Error())
				answer(to, reason)
				return
			}
			answer(to, "")
		}})
	}()
}

// verifySource runs VerifySource: the prepare's source must still be a
// live member, and the record must name it at the move's fence. Store
// errors are retried until the restore deadline.
func (d *Driver) verifySource(t *targetRun, id handoff.Identity) {
	ctx, cancel := machine.WithDeadline(context.Background(), d.clock, t.deadline)
	defer cancel()
	src := t.prepare.GetSource()
	for wait := time.Duration(0); ; {
		err := d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), t.sourcePID.Address)
		peer := err != nil
		if !peer {
			var v location.Versioned
			v, err = d.store.Read(ctx, t.key)
			switch {
			case errors.Is(err, location.ErrNotFound):
				err = id.JudgeSource(handoff.RecordView{}, t.prepare.GetObject().GetObjectGeneration())
			case err == nil:
				if err = id.JudgeSource(recordView(v), t.prepare.GetObject().GetObjectGeneration()); err == nil {
					if err = d.verifyMembers(ctx, t, v.Record); err == nil {
						if err = d.takeArrivalSlots(ctx, t); err == nil {
							t.verified.Store(&v)
						}
					}
				}
			}
		}
		again, after := handoff.VerifyAgain(err, peer, wait)
		if !again {
			d.laterTarget(id, handoff.SourceVerified{Err: err})
			return
		}
		wait = after
		select {
		case <-ctx.Done():
			d.laterTarget(id, handoff.SourceVerified{Err: err})
			return
		case <-machine.After(machine.Real, wait): // pacing a retry, not a protocol window
		}
	}
}

// refused logs a control message refused for its sender.
// At most one line per 100 ms: a peer can send refused messages at will.
func (d *Driver) refused(what, from, why string) {
	d.metrics.refused(what)
	d.refusedLog.Warn(&d.log).Str("event", "control_message_refused").Str("message", what).Str("from", ratelog.Clip(from)).
		Str("reason", ratelog.Clip(why)).Msg("a control message from a peer that is not entitled to it was refused")
}
