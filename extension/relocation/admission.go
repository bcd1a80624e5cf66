package relocation

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/cluster"
	"github.com/roamactors/roam/extension/location"
	"github.com/roamactors/roam/extension/relocation/handoff"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
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
// source seals and captures right after the capability answer, so this
// covers waiting for the in-flight budget and a slow capture.
const moveTicketTTL = time.Minute

// moveTicket is what a ticket admits.
type moveTicket struct {
	rid        string
	generation uint64
	address    string
	expires    time.Time
}

// onCapability answers a capability query once the asking node is known
// to be a live member at the address the query came from.
func (d *Driver) onCapability(c actor.Context, q *messages.CapabilityQuery) {
	to := c.Sender()
	if to == nil {
		d.refused("capability query", "", "no sender to answer")
		return
	}
	src := q.GetSource()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.CapabilityTimeout)
		defer cancel()
		err := d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), to.Address)
		d.sys.Root.Send(d.self, &localCall{fn: func() {
			if err != nil {
				reason := "the asking node is not a live member of this mesh at its address"
				if !errors.Is(err, cluster.ErrNotMember) {
					reason = "the target cannot check the asking node in the Location Store now"
				}
				d.refused("capability query", to.Address, err.Error())
				d.sys.Root.Send(to, &messages.CapabilityReply{Reason: reason})
				return
			}
			reply := d.capability(q)
			if reply.Supported {
				reply.MoveTicket = d.issueTicket(src.GetNodeRid(), src.GetNodeGeneration(), to.Address)
			}
			d.sys.Root.Send(to, reply)
		}})
	}()
}

func (d *Driver) issueTicket(rid string, generation uint64, address string) []byte {
	now := time.Now()
	for k, t := range d.tickets {
		if now.After(t.expires) {
			delete(d.tickets, k)
		}
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	d.tickets[string(b)] = moveTicket{rid: rid, generation: generation, address: address, expires: now.Add(moveTicketTTL)}
	return b
}

// takeTicket consumes the ticket of a Restore request that came from
// address; false when there is none for that source.
func (d *Driver) takeTicket(p *messages.RelocationPrepare, address string) bool {
	b := p.GetMoveTicket()
	t, ok := d.tickets[string(b)]
	if !ok || len(b) != 16 || time.Now().After(t.expires) {
		return false
	}
	src, fence := p.GetSource(), p.GetIdentity().GetCoordinatorFence()
	match := t.address == address && t.rid == src.GetNodeRid() && t.generation == src.GetNodeGeneration() &&
		fence.GetNodeRid() == t.rid && fence.GetNodeGeneration() == t.generation
	if match {
		delete(d.tickets, string(b))
	}
	return match
}

// verifySource runs VerifySource: the prepare's source must still be a
// live member, and the record must name it at the move's fence. Store
// errors are retried until the restore deadline.
func (d *Driver) verifySource(t *targetRun, id handoff.Identity) {
	ctx, cancel := context.WithDeadline(context.Background(), t.deadline)
	defer cancel()
	src := t.prepare.GetSource()
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		err := d.node.VerifyPeer(ctx, src.GetNodeRid(), src.GetNodeGeneration(), t.sourcePID.Address)
		if err == nil {
			var v location.Versioned
			v, err = d.store.Read(ctx, t.key)
			switch {
			case errors.Is(err, location.ErrNotFound):
				err = id.JudgeSource(handoff.RecordView{}, t.prepare.GetObject().GetObjectGeneration())
			case err == nil:
				err = id.JudgeSource(recordView(v), t.prepare.GetObject().GetObjectGeneration())
			}
			if err == nil || !errors.Is(err, location.ErrUnavailable) && !errors.Is(err, location.ErrIndeterminate) {
				d.laterTarget(id, handoff.SourceVerified{Err: err})
				return
			}
		} else if !errors.Is(err, roamerr.ErrUnavailable) {
			d.laterTarget(id, handoff.SourceVerified{Err: err})
			return
		}
		select {
		case <-ctx.Done():
			d.laterTarget(id, handoff.SourceVerified{Err: err})
			return
		case <-time.After(wait):
		}
	}
}

// refused logs a control message refused for its sender.
// At most one line per 100 ms: a peer can send refused messages at will.
func (d *Driver) refused(what, from, why string) {
	d.metrics.refused(what)
	if ok, left := d.refusedLog.Allow(); ok {
		d.log.Warn().Str("event", "control_message_refused").Str("message", what).Str("from", from).Str("reason", why).
			Int("not_logged_since", left).Msg("a control message from a peer that is not entitled to it was refused")
	}
}
