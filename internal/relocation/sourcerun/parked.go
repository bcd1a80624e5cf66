package sourcerun

import (
	"fmt"
	"sync"
)

// MaxParked bounds the messages one object's Parked hold keeps: past it a
// message fails loudly instead of growing the node's memory while the
// store cannot answer.
const MaxParked = 10000

// Parked holds an object's messages while the outcome of its move is
// unknown. Before relay-ready (no reply by the restore deadline,
// PROTOCOL.md §6.4) requests are refused at once and sends wait in order;
// after the cutover (holdRequests) requests wait too, in one order with
// the sends, since the commit normally shows within a store round trip.
// Either way they are forwarded if the target committed, put back if the
// move failed. Sink is the mailbox's sink, called under the mailbox's
// lock (on any goroutine); the hold's own lock orders Release and Take
// against it.
type Parked[M any] struct {
	holdRequests bool
	isRequest    func(M) bool
	refuse       func(M, Refusal)

	mu      sync.Mutex
	sends   []M
	forward func(M) // set once released
}

// Sink takes one message.
func (p *Parked[M]) Sink(m M) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.forward != nil {
		p.forward(m)
		return
	}
	if !p.holdRequests && p.isRequest(m) {
		p.refuse(m, RefuseReconciling)
		return
	}
	if len(p.sends) >= MaxParked {
		p.refuse(m, RefuseOverflow)
		return
	}
	p.sends = append(p.sends, m)
}

// Release sends the parked messages to to, in order, and every later
// message straight after them.
func (p *Parked[M]) Release(to func(M)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.sends {
		to(m)
	}
	p.sends, p.forward = nil, to
}

// Take returns the parked messages (for a reopen, which calls it under
// the mailbox's lock, after the sink's last call).
func (p *Parked[M]) Take() []M {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.sends
	p.sends = nil
	return out
}

// Waiting returns a copy of the parked messages (for reports).
func (p *Parked[M]) Waiting() []M {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]M(nil), p.sends...)
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }
