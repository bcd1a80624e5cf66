package machine

import (
	"context"
	"runtime/pprof"
	"slices"
	"sync"
	"time"
)

// Go runs f on a goroutine of a shared pool: an idle one that ran work
// before, else a new one. The drivers start a goroutine for every burst
// of a Loop's turns and for every wait they take off it (a store call, a
// staged incarnation); a new goroutine starts on a small stack and grows
// it, copying, through the turn's calls every time — the Proto.Actor
// send, the store's call, protobuf — which was a sixth of a cold
// activation's CPU on the embedded store (runtime.newstack). A pooled
// goroutine keeps the stack it grew.
//
// f runs at once, as with the go statement: Go never waits for a worker.
// A worker idle for workerIdle ends, and at most maxIdleWorkers wait, so
// a quiet process holds no goroutine for work long done. Unlike the go
// statement, f starts without its caller's profiler labels, and a worker
// outlives f: f must not leave its goroutine changed (an OS thread it
// locked, for one).
func Go(f func()) { workers.run(f) }

const (
	maxIdleWorkers = 256
	workerIdle     = time.Second
)

var workers workerPool

type workerPool struct {
	mu sync.Mutex
	// idle: the workers waiting for work, the most recently used last
	// (taken first: its stack and caches are the warmest).
	idle []*worker
}

type worker struct {
	// work: the next f, sent by run after it took the worker from idle
	// (buffered: run never waits).
	work chan func()
}

func (p *workerPool) run(f func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.work <- f
		return
	}
	p.mu.Unlock()
	go (&worker{work: make(chan func(), 1)}).loop(p, f)
}

func (w *worker) loop(p *workerPool, f func()) {
	var idle *time.Timer
	for {
		// Every work starts without profiler labels: a label one work set
		// would otherwise stay for the next, and a new goroutine would
		// inherit its creator's, which a pooled one cannot.
		pprof.SetGoroutineLabels(context.Background())
		f()
		f = nil
		p.mu.Lock()
		if len(p.idle) >= maxIdleWorkers {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case f = <-w.work:
		case <-idle.C:
			p.mu.Lock()
			if i := slices.Index(p.idle, w); i >= 0 {
				p.idle = slices.Delete(p.idle, i, i+1)
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			// Taken from idle just as the wait ended: its work is on
			// the way.
			f = <-w.work
		}
	}
}

// Dispatcher is a Proto.Actor dispatcher (actor.Dispatcher) that runs
// each run of a mailbox on a pooled goroutine (Go). Proto.Actor's default
// starts a goroutine for every run, whose stack grows through the turn
// every time; roam's objects and service actors are mostly idle and then
// handle a burst, so every burst paid that growth. An actor run on it
// must leave its goroutine as it found it: one that locks its OS thread
// (runtime.LockOSThread) unlocks it before its turn ends.
type Dispatcher struct {
	// Through is how many messages a run handles before it yields the
	// processor (runtime.Gosched) and goes on (Proto.Actor's throughput;
	// its default is 300).
	Through int
}

// DefaultThroughput is Proto.Actor's default dispatcher's throughput,
// which roam's dispatchers keep.
const DefaultThroughput = 300

// Schedule runs fn on a pooled goroutine.
func (d Dispatcher) Schedule(fn func()) { Go(fn) }

// Throughput is Through.
func (d Dispatcher) Throughput() int { return d.Through }
