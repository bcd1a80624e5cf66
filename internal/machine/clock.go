// Package machine is what roam's drivers share to run their pure protocol
// cores: the clock they read time from and arm timers on, the named
// timers a driver owns and cancels as one set, and the Loop that steps a
// machine's events one turn at a time.
//
// Time is an input. A core takes the time it decides with in its events;
// a driver reads it from a Clock and never from package time, so a test can
// run a node in logical time (Manual): a lease ends, a cutover times out or
// a follow window closes when the test advances the clock, not after the
// seconds a busy machine takes to get there (docs/ARCHITECTURE.md).
package machine

import (
	"context"
	"time"
)

// Clock is the time a driver reads and the timers it arms.
type Clock interface {
	// Now is the current time. With Real it carries a monotonic reading,
	// so durations between two Now values are immune to wall-clock steps.
	Now() time.Time
	// AfterFunc runs f on its own goroutine once d has passed (at once for
	// d ≤ 0 with Real; at the next Advance with Manual).
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is one armed AfterFunc.
type Timer interface {
	// Stop prevents the function from running and reports whether it did;
	// false means it has run or is running already.
	Stop() bool
}

// Real is the system clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Or returns c, or Real when c is nil: drivers' configurations leave the
// clock unset in production.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

// Since is the time passed since t on c.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Until is the time left until t on c.
func Until(c Clock, t time.Time) time.Duration { return t.Sub(c.Now()) }

// After is time.After on c: the channel receives c's time once d has
// passed. The timer stays armed until then; use Sleep where the wait may
// be abandoned early and d is long.
func After(c Clock, d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.AfterFunc(d, func() { ch <- c.Now() })
	return ch
}

// Sleep waits d on c, or until ctx ends (its error then). The timer is
// stopped when the wait is abandoned.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	done := make(chan struct{})
	t := c.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// WithTimeout is context.WithTimeout with the deadline on c: with Manual
// the context ends when the clock is advanced past it. Its Deadline is
// c's time, which is what roam compares deadlines with. Differences with
// Manual: a context derived from it reports Canceled, not
// DeadlineExceeded, when the deadline passes (context.Cause says
// DeadlineExceeded); and a parent's deadline counts for Deadline only if
// it is on a Manual clock too (a real-time deadline is of another time
// line: the parent still ends the context when it ends).
func WithTimeout(parent context.Context, c Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := c.(realClock); ok {
		return context.WithTimeout(parent, d)
	}
	return withManualDeadline(parent, c, c.Now().Add(d), d)
}

// DeadlineFor is the deadline WithTimeout(parent, c, d) would have: d
// from c's now, or the parent's deadline if that is earlier (with Manual,
// only a parent's deadline on a Manual clock counts, as there).
func DeadlineFor(parent context.Context, c Clock, d time.Duration) time.Time {
	at := c.Now().Add(d)
	if _, ok := c.(realClock); ok {
		if pd, ok := parent.Deadline(); ok && pd.Before(at) {
			return pd
		}
		return at
	}
	if pd, ok := parent.Value(manualDeadlineKey{}).(*manualDeadline); ok && pd.at.Before(at) {
		return pd.at
	}
	return at
}

// WithDeadline is context.WithDeadline with the deadline on c (see
// WithTimeout).
func WithDeadline(parent context.Context, c Clock, at time.Time) (context.Context, context.CancelFunc) {
	if _, ok := c.(realClock); ok {
		return context.WithDeadline(parent, at)
	}
	return withManualDeadline(parent, c, at, at.Sub(c.Now()))
}

func withManualDeadline(parent context.Context, c Clock, at time.Time, d time.Duration) (context.Context, context.CancelFunc) {
	// The nearest parent on a Manual clock (a derived context hides the
	// type; its Value finds it).
	if pd, ok := parent.Value(manualDeadlineKey{}).(*manualDeadline); ok && pd.at.Before(at) {
		at = pd.at // the parent ends first, as with context.WithTimeout
	}
	ctx, cancel := context.WithCancelCause(parent)
	if d <= 0 {
		cancel(context.DeadlineExceeded) // already past, as context.WithTimeout
		return &manualDeadline{Context: ctx, at: at}, func() {}
	}
	t := c.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return &manualDeadline{Context: ctx, at: at}, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

type manualDeadlineKey struct{}

// manualDeadline is a context ended by a Manual clock's timer: Err says
// DeadlineExceeded, as a context.WithTimeout would.
type manualDeadline struct {
	context.Context
	at time.Time
}

func (c *manualDeadline) Deadline() (time.Time, bool) { return c.at, true }

func (c *manualDeadline) Value(key any) any {
	if _, ok := key.(manualDeadlineKey); ok {
		return c
	}
	return c.Context.Value(key)
}

func (c *manualDeadline) Err() error {
	if c.Context.Err() == nil {
		return nil
	}
	if cause := context.Cause(c.Context); cause == context.DeadlineExceeded {
		return cause
	}
	return c.Context.Err()
}

// NewTimer is time.NewTimer on c: its channel receives c's time once d has
// passed, unless the Timer is stopped first.
func NewTimer(c Clock, d time.Duration) (<-chan time.Time, Timer) {
	ch := make(chan time.Time, 1)
	return ch, c.AfterFunc(d, func() { ch <- c.Now() })
}
