package relocation

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/relocation/mailbox"
	"github.com/roamactors/roam/roamerr"
)

// parkedSink holds an object's messages while the outcome of its move is
// unknown. Before relay-ready (no reply by the restore deadline,
// docs/PROTOCOL.md §6.4) requests fail at once with Unavailable and sends wait in
// order; after the cutover (holdRequests) requests wait too, in one order
// with the sends, since the commit normally shows within a store round
// trip. Either way they are forwarded if the target committed, put back if
// the move failed. It is the mailbox's sink, called under the mailbox's
// lock; its own lock orders release and take against it.
type parkedSink struct {
	d            *Driver
	obj          *object
	holdRequests bool

	mu      sync.Mutex
	sends   []any
	forward mailbox.Sink // set once released
}

func (p *parkedSink) sink(msg any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.forward != nil {
		p.forward(msg)
		return
	}
	_, m, sender := actor.UnwrapEnvelope(msg)
	if sender != nil && !p.holdRequests {
		respondFailure(p.d.sys, sender, m, roamerr.CodeUnavailable, p.obj.key.ID, "the object is moving and its outcome is being reconciled")
		return
	}
	if len(p.sends) >= maxParkedSends {
		// Bounded: past the bound a message fails loudly instead of
		// growing the node's memory while the store cannot answer.
		if sender != nil {
			respondFailure(p.d.sys, sender, m, roamerr.CodeUnavailable, p.obj.key.ID, "the object is moving and too many messages wait for its outcome")
			return
		}
		p.d.metrics.sendUndelivered("send_parked_overflow")
		p.d.log.Warn().Str("event", "send_parked_overflow").Str("object_id", p.obj.key.ID).Str("message_type", typeName(m)).
			Int("parked", len(p.sends)).Msg("a send to an object whose move is being reconciled was refused: too many sends wait already")
		return
	}
	p.sends = append(p.sends, msg)
}

// maxParkedSends bounds the sends one reconciling object keeps.
const maxParkedSends = 10000

// release sends the parked sends to to, in order, and every later message
// straight after them.
func (p *parkedSink) release(to mailbox.Sink) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.sends {
		to(m)
	}
	p.sends, p.forward = nil, to
}

// take returns the parked sends (for Reopen, which calls it under the
// mailbox's lock, after the sink's last call).
func (p *parkedSink) take() []any {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.sends
	p.sends = nil
	return out
}
