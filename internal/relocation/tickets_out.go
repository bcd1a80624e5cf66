package relocation

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/ask"
	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
)

// The source side of the capability query (PROTOCOL.md §5.2). Every move
// needs a target's supported answer and a single-use move ticket before
// its seal, and a query is a round trip through the target's driver. A
// drain sends many moves to a few targets at once, so the moves to one
// target that wait for an answer share one query, which asks for a ticket
// each and a few spare: the answer and its spare tickets serve the next
// moves to that target for spareFresh, without another round trip.
//
// What may change on the target meanwhile is still checked where it is
// decided: a draining or stopping target refuses the Restore request (an
// explicit failure before relay-ready, after which the source serves
// again), and a node with a capacity gives no spare tickets, so every
// move into it asks afresh.

// spareTickets is how many tickets a query asks for beyond its own move's.
const spareTickets = 15

// spareFresh is how long a target's supported answer and its spare
// tickets serve further moves (Driver.spareFresh; tests shorten it).
const spareFresh = time.Second

// capabilityKey names what a capability answer is about.
type capabilityKey struct {
	address    string
	kind       location.Kind
	stableType string
	appVersion string
}

// capabilityAnswer is a target's answer as the machine takes it, with the
// target's node generation and move tickets.
type capabilityAnswer struct {
	ev      handoff.CapabilityAnswered
	gen     uint64
	tickets [][]byte
	at      time.Time
	link    string // the target's chunk link, "" for none
}

// capabilityWaiter takes a capability answer and the move's own ticket
// (none when the answer refuses), on the driver goroutine; false when the
// move ended meanwhile, and its ticket goes back to the target.
type capabilityWaiter = func(ev handoff.CapabilityAnswered, gen uint64, ticket []byte) bool

// capabilityFor hands r the answer to its capability query: at once from
// a fresh answer's spare tickets (ok true), else when the query that r
// joins or starts is answered (done). A target that gives no spare
// tickets (it has a capacity) is asked by every move on its own, in
// parallel, as before any sharing.
func (d *Driver) capabilityFor(r *sourceRun, done capabilityWaiter) (handoff.CapabilityAnswered, uint64, []byte, bool) {
	key := capabilityKey{address: r.target.GetAddress(), kind: r.obj.key.Kind, stableType: r.obj.kind.StableType, appVersion: r.obj.kind.ApplicationVersion}
	now := d.clock.Now()
	if a := d.spares[key]; a != nil {
		if now.Sub(a.at) < d.spareFresh && len(a.tickets) > 0 {
			t := a.tickets[0]
			a.tickets = a.tickets[1:]
			if len(a.tickets) == 0 {
				delete(d.spares, key)
			}
			return a.ev, a.gen, t, true
		}
		d.giveBack(key.address, a.tickets)
		delete(d.spares, key)
	}
	if until, ok := d.oneByOne[key]; ok {
		if now.Before(until) {
			d.askCapability(key, r.targetPID, []capabilityWaiter{done})
			return handoff.CapabilityAnswered{}, 0, nil, false
		}
		delete(d.oneByOne, key)
	}
	waiting, asking := d.asking[key]
	d.asking[key] = append(waiting, done)
	if !asking {
		d.askCapability(key, r.targetPID, nil)
	}
	return handoff.CapabilityAnswered{}, 0, nil, false
}

// isCapabilityReply: a capability or load query is answered with a
// CapabilityReply.
func isCapabilityReply(msg any) bool { _, ok := msg.(*messages.CapabilityReply); return ok }

// askCapability sends one capability query for key. Its answer goes to
// alone, or, when alone is nil, to every move waiting in asking[key].
func (d *Driver) askCapability(key capabilityKey, to *actor.PID, alone []capabilityWaiter) {
	q := &messages.CapabilityQuery{Kind: key.kind, StableType: key.stableType, ApplicationVersion: key.appVersion,
		Source: d.selfRef(), WantTickets: 1 + spareTickets, ReturnedTickets: d.returning[key.address]}
	delete(d.returning, key.address)
	machine.Go(func() {
		ctx, cancel := d.untilStopped()
		defer cancel()
		res, err := ask.Ask(ctx, d.sys, to, q, d.cfg.CapabilityTimeout, ask.Question{Clock: d.clock, From: to.Address, What: "capability query", Accept: isCapabilityReply})
		a := capabilityAnswer{at: d.clock.Now()}
		if reply, ok := res.(*messages.CapabilityReply); ok && err == nil {
			a.ev = handoff.CapabilityAnswered{Supported: reply.GetSupported(), Reason: reply.GetReason(), ReceiveChunkLimit: reply.GetReceiveChunkLimit(), Code: reply.GetCode(),
				SourceCheck: reply.GetSourceCheck()}
			a.gen = reply.GetNode().GetNodeGeneration()
			a.link = reply.GetChunkLink()
			if t := reply.GetMoveTicket(); len(t) > 0 {
				a.tickets = append([][]byte{t}, reply.GetSpareMoveTickets()...)
			}
		} else {
			a.ev.Reason = fmt.Sprintf("capability query: %v", err)
		}
		d.loop.Post(func() {
			if err == nil {
				d.setChunkLink(key.address, a.link)
			}
			waiting := alone
			if waiting == nil {
				waiting = d.asking[key]
				delete(d.asking, key)
			}
			d.answered(key, to, a, waiting)
		})
	})
}

// answered gives each waiting move the answer and a ticket of its own;
// spare tickets wait for the next moves. Moves left without a ticket ask
// again together, or each on its own when the target gave no spares.
func (d *Driver) answered(key capabilityKey, to *actor.PID, a capabilityAnswer, waiting []capabilityWaiter) {
	if a.ev.Supported {
		if len(a.tickets) > 1 {
			delete(d.oneByOne, key)
		} else {
			d.oneByOne[key] = a.at.Add(d.spareFresh)
		}
	}
	spares := len(a.tickets) > 1
	for i, done := range waiting {
		if !a.ev.Supported || !spares && len(a.tickets) == 0 && i == 0 {
			// A refusal, or a yes without any ticket (its Restore
			// request will be refused): the same answer for every move.
			for _, w := range waiting[i:] {
				_ = w(a.ev, a.gen, nil)
			}
			return
		}
		if len(a.tickets) == 0 {
			rest := waiting[i:]
			if !spares {
				for _, w := range rest {
					d.askCapability(key, to, []capabilityWaiter{w})
				}
				return
			}
			more, asking := d.asking[key]
			d.asking[key] = append(more, rest...)
			if !asking {
				d.askCapability(key, to, nil)
			}
			return
		}
		t := a.tickets[0]
		a.tickets = a.tickets[1:]
		if !done(a.ev, a.gen, t) {
			d.giveBack(key.address, [][]byte{t})
		}
	}
	if a.ev.Supported && len(a.tickets) > 0 {
		if old := d.spares[key]; old != nil {
			if a.at.Sub(old.at) < d.spareFresh {
				a.tickets = append(a.tickets, old.tickets...)
			} else {
				d.giveBack(key.address, old.tickets)
			}
		}
		d.spares[key] = &a
	}
}

// maxReturning bounds the unused tickets kept to give back to one target
// (past it they simply expire there).
const maxReturning = 256

// giveBack keeps spare tickets this node will not use, to return them to
// their target with the next query there: the target then counts them no
// more against the spare tickets it gives this node.
func (d *Driver) giveBack(address string, tickets [][]byte) {
	room := maxReturning - len(d.returning[address])
	if len(tickets) > room {
		tickets = tickets[:max(room, 0)]
	}
	if len(tickets) > 0 {
		d.returning[address] = append(d.returning[address], tickets...)
	}
}

// forgetSpares drops the spare tickets of a target that refused a move or
// whose connection ended (its node may be draining, or have restarted:
// tickets belong to one lifecycle); they go back with the next query.
func (d *Driver) forgetSpares(address string) {
	for k, a := range d.spares {
		if k.address == address {
			d.giveBack(address, a.tickets)
			delete(d.spares, k)
		}
	}
	for k := range d.oneByOne {
		if k.address == address {
			delete(d.oneByOne, k)
		}
	}
}
