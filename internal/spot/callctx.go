package spot

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roamactors/roam/internal/machine"
)

// callCtx is a call's context: its caller's, ended at the call's deadline
// (the earlier of its timeout and the caller's own). The deadline becomes a
// derived context (machine.WithDeadline) only when something waits on it
// through Done or Err: a store read, a drain, the slow paths. The common
// call, on a cached route, waits only for its reply (Call.await), on the
// caller's Done and one timer of its own. A derived context for every call
// cost three allocations and, under a cancellable caller's context (a
// server's, shared by the calls it makes), a registration under that
// context's lock, which concurrent calls contend for.
type callCtx struct {
	parent context.Context
	clock  machine.Clock
	at     time.Time

	mu      sync.Mutex
	ended   bool // under mu: the call is over (end)
	derived atomic.Pointer[derivedCtx]
}

type derivedCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

var _ context.Context = (*callCtx)(nil)

func newCallCtx(parent context.Context, clock machine.Clock, timeout time.Duration) *callCtx {
	return &callCtx{parent: parent, clock: clock, at: machine.DeadlineFor(parent, clock, timeout)}
}

// ctx is the derived context, made on first use.
func (c *callCtx) ctx() context.Context {
	if d := c.derived.Load(); d != nil {
		return d.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.derived.Load(); d != nil {
		return d.ctx
	}
	d := &derivedCtx{}
	d.ctx, d.cancel = machine.WithDeadline(c.parent, c.clock, c.at)
	if c.ended {
		d.cancel() // asked after the call: over, and nothing left armed
	}
	c.derived.Store(d)
	return d.ctx
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *callCtx) Done() <-chan struct{}       { return c.ctx().Done() }
func (c *callCtx) Err() error                  { return c.ctx().Err() }

// Value answers from the derived context once it exists: a context derived
// from a callCtx (context.WithCancel) calls Done first, which makes it, and
// then finds its cancellation here and registers with it, instead of
// watching it from a goroutine of its own.
func (c *callCtx) Value(key any) any {
	if d := c.derived.Load(); d != nil {
		return d.ctx.Value(key)
	}
	return c.parent.Value(key)
}

// end releases the derived context, if one was made; once the call is
// over.
func (c *callCtx) end() {
	c.mu.Lock()
	c.ended = true
	c.mu.Unlock()
	if d := c.derived.Load(); d != nil {
		d.cancel()
	}
}
