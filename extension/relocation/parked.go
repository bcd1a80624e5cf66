package relocation

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/extension/relocation/mailbox"
)

// parkedSink holds an object's messages while the outcome of its move is
// unknown (no reply by the restore deadline, spec 000 §9 last row):
// requests fail at once with Unavailable, sends wait in order until the
// outcome is known — forwarded if the target committed, put back if an
// explicit failure arrives. It is the mailbox's sink, called under the
// mailbox's lock; its own lock orders release and take against it.
type parkedSink struct {
	d   *Driver
	obj *object

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
	if _, _, sender := actor.UnwrapEnvelope(msg); sender != nil {
		respondFailure(p.d.sys, sender, "unavailable", p.obj.key.ID, "the object is moving and its outcome is being reconciled")
		return
	}
	p.sends = append(p.sends, msg)
}

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
