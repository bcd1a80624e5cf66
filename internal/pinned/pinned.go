// Package pinned is a Proto.Actor dispatcher that runs one busy actor's
// mailbox on a goroutine of its own for as long as the actor lives.
//
// Proto.Actor's default dispatcher starts a goroutine for every run of a
// mailbox. A new goroutine starts with a small stack and grows it, copying
// it each time, through the actor's turn; for roam's relocation actor,
// whose turns go deep (the hand-off machine, the store, Proto.Actor's
// remote), that growth was 7 % of a move's CPU, paid on every run. A
// pinned goroutine keeps the stack it grew (the collector may halve it
// while the actor is idle).
package pinned

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// Dispatcher runs each scheduled mailbox run on its goroutine, in order.
// After Close, and when a run is already waiting (a mailbox schedules its
// next run at the end of its current one), a run gets a goroutine of its
// own, as with Proto.Actor's default dispatcher: it is never dropped and
// Schedule never blocks.
type Dispatcher struct {
	throughput int
	runs       chan func()
	mu         sync.Mutex
	closed     bool
}

var _ actor.Dispatcher = (*Dispatcher)(nil)

// New starts a Dispatcher's goroutine; throughput is how many messages a
// run handles before it yields (Proto.Actor's Throughput).
func New(throughput int) *Dispatcher {
	d := &Dispatcher{throughput: throughput, runs: make(chan func(), 1)}
	go d.loop()
	return d
}

func (d *Dispatcher) loop() {
	for run := range d.runs {
		run()
	}
}

// Schedule runs fn on the Dispatcher's goroutine.
func (d *Dispatcher) Schedule(fn func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		select {
		case d.runs <- fn:
			return
		default:
		}
	}
	go fn()
}

// Throughput is the messages a run handles before it yields.
func (d *Dispatcher) Throughput() int { return d.throughput }

// Close ends the goroutine once the run under way and the one waiting, if
// any, are over; later runs get goroutines of their own. Idempotent.
func (d *Dispatcher) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.closed = true
		close(d.runs)
	}
}
