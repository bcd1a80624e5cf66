// Package sessionrun interprets the effects of a node's Session owner
// (session.Owner): where each effect goes, which timer it arms or stops,
// what a timer's expiry steps and how a binding's store look is kept to
// one at a time. It talks to its host only through Env, the host's
// primitives, so the node's driver (internal/sessionhost) runs it on
// Proto.Actor, the node's clock and the Location Store, and the
// deterministic simulation runs the same code against its simulated
// network, store and clock.
//
// A Runner is not safe for concurrent use: its host calls it under one
// lock (the driver) or from one goroutine (the simulation's scheduler).
package sessionrun

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/handoff"
	"github.com/roamactors/roam/internal/session"
)

// Timer names one of the runner's timers: a seal timer (Look false: the
// seal of Move on the binding) or the pause before a binding's store look
// (Look true; Move is zero).
type Timer struct {
	Session session.ID
	Actor   string
	Move    handoff.Identity
	Look    bool
}

// Env is what the Session owner needs of its host. Calls that answer
// later do so by Runner.Fire or Runner.Looked, under the host's lock.
type Env interface {
	// Deliver sends a client message to the bound Actor's incarnation at
	// route.
	Deliver(actor string, route session.Route, item session.Item)
	// Refuse tells a client message's sender that it goes nowhere.
	Refuse(item session.Item, err error)
	// ReplySeal answers command 42 at its sender.
	ReplySeal(r session.ReplySeal)
	// Reject: a local call (OpenSession, Bind) failed.
	Reject(err error)
	// Arm arms t to call Runner.Fire(t) after d, replacing any timer armed
	// under t; Stop stops it. A timer stopped or re-armed never fires its
	// earlier arming (machine.Timers' rule).
	Arm(t Timer, d time.Duration)
	Stop(t Timer)
	// Look reads where the store says the bound Actor serves and answers
	// Runner.Looked.
	Look(s session.ID, actor string)
	// Recovered: tell the Session's client that the Actor serves again
	// after its owner ended.
	Recovered(s session.ID, actor string)
	// Closed: the Session is cleared; its client's connection ends with
	// err.
	Closed(s session.ID, err error)
	Log(l session.Log)
}

type binding struct {
	session session.ID
	actor   string
}

// look is a binding's store look in progress: paused (its timer armed)
// or reading the store.
type look struct {
	reading bool
	// again: a notice came while the store was read; what it announces
	// may be newer than that read, so another look follows at once.
	again bool
}

// Runner runs one node's Session owner.
type Runner struct {
	owner  *session.Owner
	env    Env
	looks  map[binding]*look
	closed bool
}

// New runs owner's effects on env.
func New(owner *session.Owner, env Env) *Runner {
	return &Runner{owner: owner, env: env, looks: map[binding]*look{}}
}

// Owner is the runner's Session owner (for reads: BindingOf).
func (r *Runner) Owner() *session.Owner { return r.owner }

// Step feeds ev to the owner, runs its effects in order and returns them
// (the caller may answer its own call from them: a Reject, a Refuse of
// the item it submitted).
func (r *Runner) Step(ev session.Event) []session.Effect {
	effects := r.owner.Step(ev)
	r.Run(effects)
	return effects
}

// Run executes effects in the order the owner returned them.
func (r *Runner) Run(effects []session.Effect) {
	env := r.env
	for _, e := range effects {
		switch e := e.(type) {
		case session.Deliver:
			env.Deliver(e.Actor, e.Route, e.Item)
		case session.Refuse:
			env.Refuse(e.Item, e.Err)
		case session.ReplySeal:
			env.ReplySeal(e)
		case session.Reject:
			env.Reject(e.Err)
		case session.StartSealTimer:
			env.Arm(Timer{Session: e.Session, Actor: e.Actor, Move: e.Move}, e.After)
		case session.StopSealTimer:
			env.Stop(Timer{Session: e.Session, Actor: e.Actor, Move: e.Move})
		case session.Resolve:
			r.resolve(e.Session, e.Actor, e.After)
		case session.Recovered:
			env.Recovered(e.Session, e.Actor)
		case session.Closed:
			env.Closed(e.Session, e.Err)
		case session.Log:
			env.Log(e)
		default:
			panic(fmt.Sprintf("sessionrun: unknown Session owner effect %T", e))
		}
	}
}

// Fire is timer t's expiry: a seal timer steps SealExpired (the owner
// ignores one of a seal released meanwhile), a look's pause reads the
// store.
func (r *Runner) Fire(t Timer) {
	if r.closed {
		return
	}
	if t.Look {
		if l := r.looks[binding{t.Session, t.Actor}]; l != nil && !l.reading {
			r.startRead(t.Session, t.Actor, l)
		}
		return
	}
	r.Step(session.SealExpired{Session: t.Session, Actor: t.Actor, Move: t.Move})
}

// Resolve looks the bound Actor up at once, on a recovering node's word
// that it serves again (the store says where, not the sender). An Actor
// not bound to the Session is not looked for.
func (r *Runner) Resolve(s session.ID, actor string) {
	if _, _, bound := r.owner.BindingOf(s, actor); bound {
		r.resolve(s, actor, 0)
	}
}

// resolve looks the bound Actor up in the store, after the pause, and
// steps Resolved. A Resolve while a look is under way is not lost: it
// cuts that look's pause short, or, if the store is being read, makes
// another look follow.
func (r *Runner) resolve(s session.ID, actor string, after time.Duration) {
	if r.closed {
		return
	}
	key := binding{s, actor}
	if l := r.looks[key]; l != nil {
		switch {
		case l.reading:
			l.again = true
		case after == 0:
			r.env.Stop(Timer{Session: s, Actor: actor, Look: true}) // the pause ends early
			r.startRead(s, actor, l)
		}
		return
	}
	l := &look{}
	r.looks[key] = l
	if after > 0 {
		r.env.Arm(Timer{Session: s, Actor: actor, Look: true}, after)
		return
	}
	r.startRead(s, actor, l)
}

func (r *Runner) startRead(s session.ID, actor string, l *look) {
	l.reading = true
	r.env.Look(s, actor)
}

// Looked answers Env.Look: where the store says the Actor serves and
// whether that owner is alive; err: the look failed (the owner steps it
// as not alive, and looks again).
func (r *Runner) Looked(s session.ID, actor string, route session.Route, alive bool, err error) {
	key := binding{s, actor}
	l := r.looks[key]
	if l == nil || !l.reading {
		return // not asked (or the runner closed meanwhile)
	}
	delete(r.looks, key)
	if r.closed {
		return
	}
	if err != nil {
		r.Step(session.Resolved{Session: s, Actor: actor})
	} else {
		r.Step(session.Resolved{Session: s, Actor: actor, Route: route, Alive: alive})
	}
	if l.again {
		r.resolve(s, actor, 0)
	}
}

// Close ends the runner with its node's lifecycle: no timer's fire
// reaches the owner any more and no look's answer is stepped. Closing the
// Sessions themselves (CloseSession) and the host's timers is the
// host's.
func (r *Runner) Close() { r.closed = true }
