package relocation

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/meshnode"
	"github.com/roamactors/roam/internal/ratelog"
	"github.com/roamactors/roam/internal/relocation/admit"
	"github.com/roamactors/roam/messages"
)

// Who may move an object onto this node, and the tickets that admit a
// move: package admit decides; the driver checks the asking node in the
// store and sends the answers.

// tickets are the move tickets this node issued (admit.Tickets), under
// keys from crypto/rand; take is the Restore request's check.
type tickets struct{ *admit.Tickets }

func newTickets() *tickets {
	return &tickets{admit.NewTickets(func() string {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		return string(b)
	})}
}

// take consumes the ticket of a Restore request that came from address;
// false when there is none for that source node, address and fence.
func (ts *tickets) take(p *messages.RelocationPrepare, address string, now time.Time) bool {
	return ts.Take(p, address, now)
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
		reply := d.capability(q)
		reply.MoveTicket, reply.SpareMoveTickets = d.tickets.Answer(q, to.Address, reply.Supported, d.desc.GetCapacity(), d.clock.Now())
		d.sys.Root.Send(to, reply)
	})
}

// answerMember runs answer on the driver goroutine for a query sent as a
// request (its answer goes only to the request's own future) by src, once
// src is known to be a live member at the address the query came from;
// otherwise answer gets the refusal's reason, logged and counted as what.
func (d *Driver) answerMember(c actor.Context, what string, src *messages.NodeRef, answer func(to *actor.PID, refusal string)) {
	to := c.Sender()
	if to == nil || !admit.Requested(to.Id) {
		d.refused(what, "", "not sent as a request")
		return
	}
	machine.Go(func() {
		ctx, cancel := machine.WithTimeout(context.Background(), d.clock, d.cfg.CapabilityTimeout)
		defer cancel()
		err := d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), to.Address)
		d.loop.Post(func() {
			if err != nil {
				d.refused(what, to.Address, err.Error())
				answer(to, admit.PeerRefusal(errors.Is(err, meshnode.ErrNotMember)))
				return
			}
			answer(to, "")
		})
	})
}

// refused logs a control message refused for its sender.
// At most one line per 100 ms: a peer can send refused messages at will.
func (d *Driver) refused(what, from, why string) {
	d.metrics.refused(what)
	d.refusedLog.Warn(&d.log).Str("event", "control_message_refused").Str("message", what).Str("from", ratelog.Clip(from)).
		Str("reason", ratelog.Clip(why)).Msg("a control message from a peer that is not entitled to it was refused")
}
