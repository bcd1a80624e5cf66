// Package redelivery is the pure redelivery policy of the relocation
// driver (docs/PROTOCOL.md, Message Follow's hop limit and dead letters):
// a message that Message Follow does not take further, or a one-way send
// that dead-lettered, is delivered again from the store's owner record —
// when, how often, and when it fails loudly instead. Time is an input (the
// node's clock); nothing here sleeps, sends or reads the store.
package redelivery

import (
	"errors"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// Policy is a node's redelivery policy.
type Policy struct {
	// FollowDuration is the follow period of a moved-away incarnation.
	FollowDuration time.Duration
	// Window bounds how long a redelivery looks for an owner, and how
	// long it waits for a hop to drain.
	Window time.Duration
	// Patience bounds how long one dead-lettered send is redelivered
	// before it fails loudly.
	Patience time.Duration
	// Backoff is the first pause before a send that dead-letters again is
	// redelivered; each further dead letter doubles it, up to BackoffMax.
	Backoff, BackoffMax time.Duration
}

// The policy's defaults (Config.RedeliveryWindow, DeadLetterPatience,
// DeadLetterBackoff, DeadLetterBackoffMax).
const (
	DefaultWindow     = 10 * time.Second
	DefaultPatience   = 30 * time.Second
	DefaultBackoff    = 50 * time.Millisecond
	DefaultBackoffMax = 2 * time.Second
)

// DrainWindow bounds how long a redelivery waits for a hop's route
// barrier: the follow period (an old incarnation answers Unavailable by
// then), at most Window.
func (p Policy) DrainWindow() time.Duration {
	if p.FollowDuration <= 0 || p.FollowDuration > p.Window {
		return p.Window
	}
	return p.FollowDuration
}

// Drains reports whether a queue still drains the incarnation it last
// delivered to at at before delivering elsewhere: not once the drain
// window has passed, when what went there has been handled or failed.
func (p Policy) Drains(at, now time.Time) bool { return now.Sub(at) <= p.DrainWindow() }

// Send is one dead-lettered send's redelivery so far: how often it
// dead-lettered, and when first.
type Send struct {
	N     int
	First time.Time
}

// Verdict is what becomes of a dead-lettered send.
type Verdict int

const (
	// Now: redeliver it at once, in arrival order.
	Now Verdict = iota
	// Hold: keep it, behind the object's other held sends, until the
	// object's pause ends.
	Hold
	// Fail: it failed loudly (patience exhausted).
	Fail
)

// Decision is the policy's answer to one dead letter.
type Decision struct {
	Verdict Verdict
	// Arm: start the object's pause of After (a hold, when none runs).
	Arm   bool
	After time.Duration
}

// DeadLettered decides for send s, counted with this dead letter, at
// now. held: the object already has sends held for a pause; paused: that
// pause runs. A send dead-lettered for the first time with nothing held
// is redelivered at once. One that dead-lettered again (the owner's node
// unreachable, or the route still leading to a gone incarnation) waits
// for a pause that grows with its count, and so do the object's later
// dead letters, in order. Past the patience it fails.
func (p Policy) DeadLettered(s Send, now time.Time, held, paused bool) Decision {
	switch {
	case now.Sub(s.First) > p.Patience:
		return Decision{Verdict: Fail}
	case !held && s.N == 1:
		return Decision{Verdict: Now}
	case paused:
		return Decision{Verdict: Hold}
	}
	return Decision{Verdict: Hold, Arm: true, After: min(p.Backoff<<min(s.N-1, 6), p.BackoffMax)}
}

// Forgotten reports whether a send's bookkeeping, first dead-lettered at
// first, is kept no longer: twice the patience, by which it has failed.
func (p Policy) Forgotten(first, now time.Time) bool { return now.Sub(first) > 2*p.Patience }

// SweepDue reports whether the bookkeeping, last swept at swept, is due
// for a sweep (at most once per patience).
func (p Policy) SweepDue(swept, now time.Time) bool { return now.Sub(swept) > p.Patience }

// LogDue reports whether a dead letter of an object last logged at
// logged (never: ok false) is logged again: once per follow period, so a
// stale route under steady traffic logs one line, not one per batch.
func (p Policy) LogDue(logged time.Time, ok bool, now time.Time) bool {
	return !ok || now.Sub(logged) > p.FollowDuration
}

// Resolve pacing: the first pause after a failed look-up of the owner,
// and the most it grows to.
const (
	FirstResolveWait = 50 * time.Millisecond
	MaxResolveWait   = time.Second
)

// ResolveAgain decides after a look-up of the owner failed with err
// (within the window): whether to look again, after how long (prev: the
// last pause, 0 for none). A missing object is final: the message fails
// NotFound.
func ResolveAgain(err error, prev time.Duration) (again bool, after time.Duration) {
	if err == nil || errors.Is(err, roamerr.ErrNotFound) {
		return false, 0
	}
	if prev <= 0 {
		return true, FirstResolveWait
	}
	return true, min(2*prev, MaxResolveWait)
}

// Outcome is what a redelivery worker does with one message of a batch.
type Outcome int

const (
	// Deliver it to the owner found, with a fresh hop budget.
	Deliver Outcome = iota
	// Abandon it: the node's lifecycle ended (it stopped, or its owner
	// lease ended) while the owner was looked up; it fails Unavailable.
	Abandon
	// FailNoOwner: no owner to deliver to (gone, or none reachable within
	// the window); it fails with the look-up's error.
	FailNoOwner
)

// Batch decides for a batch whose look-up ended with err, ended saying
// whether the lifecycle ended meanwhile.
func Batch(ended bool, err error) Outcome {
	switch {
	case ended:
		return Abandon
	case err != nil:
		return FailNoOwner
	}
	return Deliver
}
