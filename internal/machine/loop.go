package machine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// ErrClosed is what a post to a closed Loop, or a Do whose turn the Loop
// dropped when it closed, returns: the machine stopped with its node
// lifecycle, so the caller's operation is Unavailable there.
var ErrClosed = fmt.Errorf("%w: the machine has stopped", roamerr.ErrUnavailable)

// Loop is the one place a machine's events are stepped. Everything that
// feeds the machine — a caller's command, a timer's firing, a store's or a
// peer's answer — is posted to it as a turn, and the loop runs the turns
// one at a time in the order they were posted, so the machine and its
// host's bookkeeping need no lock of their own. A turn runs on a goroutine
// the loop takes (Go) when work arrives and gives back when the queue is empty
// (as a Proto.Actor mailbox schedules its actor): an idle machine costs no
// goroutine. A turn must not block on I/O: it starts the I/O and posts its
// answer back as another turn.
//
// The loop owns the machine's timers (Arm): a timer's firing is a turn
// too, and a timer cancelled or re-armed before its turn runs is dropped,
// so the core never sees the event of a timer it stopped. Close ends the
// loop with its lifecycle: queued turns are dropped, every timer is
// cancelled, later posts are refused with ErrClosed, and Done closes once
// the turn under way (if any) has returned.
type Loop[K comparable] struct {
	timers *Timers[K]
	// onTimer runs the timers armed with ArmEvent (OnTimer).
	onTimer func(K)
	// exec, when set, runs the turns instead of the loop's own goroutine
	// (NewLoopOn).
	exec func(turn func()) bool

	mu sync.Mutex
	// queue: turns posted and not yet run, in post order.
	queue []func()
	// running: a goroutine is running the queue; at most one is.
	running bool
	// closed: Close was called; nothing more is queued or run after the
	// turn under way.
	closed bool
	// done closes once closed and no turn runs (closed by Close when idle,
	// else by the goroutine when its turn returns).
	done chan struct{}
}

// NewLoop is an open loop whose timers run on c (Real when nil).
func NewLoop[K comparable](c Clock) *Loop[K] {
	return &Loop[K]{timers: NewTimers[K](c), done: make(chan struct{})}
}

// NewLoopOn is a loop whose turns run on exec, a serial executor its host
// already has: the mailbox of the Proto.Actor actor whose messages are the
// machine's inbound events (the hand-off driver, a network endpoint), so
// that posted turns, timer firings and those messages are one queue in one
// order, with no hop between them. exec queues a turn behind everything
// the executor holds and runs it after; it reports false when it will run
// nothing more. Turns the executor runs of its own (the actor's messages)
// are the host's: Close drops the loop's queued turns and cancels its
// timers, and Done waits for the loop's turn under way, not theirs; Idle
// and Pending do not see the turns waiting in the executor's queue, and
// Do must not be called from the host's own messages either (the turn
// would wait behind the message that waits for it).
func NewLoopOn[K comparable](c Clock, exec func(turn func()) bool) *Loop[K] {
	return &Loop[K]{timers: NewTimers[K](c), exec: exec, done: make(chan struct{})}
}

// Clock is the clock the loop's timers run on.
func (l *Loop[K]) Clock() Clock { return l.timers.Clock() }

// Post queues f as a turn and reports whether it was queued (false once
// the loop is closed: the caller then answers its own caller, typically
// with ErrClosed).
func (l *Loop[K]) Post(f func()) bool {
	if l.exec != nil {
		return l.postOn(f)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.queue = append(l.queue, f)
	if !l.running {
		l.running = true
		Go(l.run)
	}
	return true
}

// run runs the queued turns until the queue is empty or the loop closed.
func (l *Loop[K]) run() {
	for {
		l.mu.Lock()
		if l.closed || len(l.queue) == 0 {
			l.running = false
			if l.closed {
				close(l.done)
			}
			l.mu.Unlock()
			return
		}
		f := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		l.mu.Unlock()
		f()
	}
}

// postOn queues f on the host's executor; it runs unless the loop closed
// before its turn came.
func (l *Loop[K]) postOn(f func()) bool {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return false
	}
	return l.exec(func() {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return
		}
		l.running = true
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			l.running = false
			if l.closed {
				close(l.done)
			}
			l.mu.Unlock()
		}()
		f()
	})
}

// Do runs f as a turn and waits for it: nil once f has run, ErrClosed if
// the loop closed before f ran, ctx's error if ctx ended first (f may
// still run later). Never call Do from a turn: the turn would wait for
// itself.
func (l *Loop[K]) Do(ctx context.Context, f func()) error {
	ran := make(chan struct{})
	if !l.Post(func() { f(); close(ran) }) {
		return ErrClosed
	}
	select {
	case <-ran:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.done:
		select {
		case <-ran: // its turn was the last one
			return nil
		default:
			return ErrClosed
		}
	}
}

// Arm runs f as a turn once d has passed on the loop's clock, replacing
// any timer armed under k; a timer cancelled or re-armed before its turn
// runs does not run. It does nothing once the loop is closed.
func (l *Loop[K]) Arm(k K, d time.Duration, f func()) {
	l.timers.Post(k, d, func(fired Fired[K]) {
		l.Post(func() {
			if l.timers.Take(fired) {
				f()
			}
		})
	})
}

// OnTimer sets what the timers armed with ArmEvent run as their turn,
// given the timer's name: one function for them all, so that an arming
// allocates nothing. Set it before the first ArmEvent.
func (l *Loop[K]) OnTimer(f func(K)) {
	l.onTimer = f
	l.timers.OnFire(l.postTimer)
}

// ArmEvent is Arm with the loop's OnTimer function.
func (l *Loop[K]) ArmEvent(k K, d time.Duration) { l.timers.Post(k, d, nil) }

func (l *Loop[K]) postTimer(fired Fired[K]) {
	l.Post(func() {
		if l.timers.Take(fired) {
			l.onTimer(fired.Key)
		}
	})
}

// ArmAt is Arm with an absolute due time on the loop's clock.
func (l *Loop[K]) ArmAt(k K, at time.Time, f func()) { l.Arm(k, Until(l.Clock(), at), f) }

// Cancel stops the timer armed under k and reports whether one was armed
// (its turn, if already queued, is dropped).
func (l *Loop[K]) Cancel(k K) bool { return l.timers.Cancel(k) }

// CancelIf cancels every armed timer whose name matches.
func (l *Loop[K]) CancelIf(match func(K) bool) { l.timers.CancelIf(match) }

// Armed reports whether a timer is armed under k and has not run.
func (l *Loop[K]) Armed(k K) bool { return l.timers.Armed(k) }

// ArmedTimers is the number of timers armed and not yet run.
func (l *Loop[K]) ArmedTimers() int { return l.timers.Len() }

// Idle reports whether no turn is queued or running: what a logical-time
// test waits for before it moves the clock.
func (l *Loop[K]) Idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.running && len(l.queue) == 0
}

// Pending is the number of turns queued and not yet started.
func (l *Loop[K]) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// Close ends the loop: queued turns are dropped, timers cancelled, later
// posts refused. It does not wait for the turn under way (a turn may close
// its own loop); Done does.
func (l *Loop[K]) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	for i := range l.queue {
		l.queue[i] = nil
	}
	l.queue = nil
	if !l.running {
		close(l.done)
	}
	l.mu.Unlock()
	l.timers.Close()
}

// CloseTimers cancels every timer and makes later Arms do nothing, while
// turns still run: a machine whose lifecycle ended and whose host still
// answers what reaches it for a while.
func (l *Loop[K]) CloseTimers() { l.timers.Close() }

// Done closes once the loop is closed and its last turn has returned.
func (l *Loop[K]) Done() <-chan struct{} { return l.done }

// UntilClosed is a context that ends when done closes (a node's or a
// manager's stop): a question whose timeout runs on a node's clock must
// not outlive its node, whose clock may never move again. cancel ends it
// earlier.
func UntilClosed(done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
