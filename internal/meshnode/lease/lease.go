// Package lease decides, from a node's renewal answers and its monotonic
// clock, whether the node may act as an owner now. It is a pure state
// machine (events in, status and effects out; no goroutine, clock or
// network), driven by cluster.Node.
//
// The argument (docs/FAULTS.md, "Lease fencing"): a store ends an owner
// lease no earlier than TTL after the last renewal it applied (Consul may
// wait up to 2×TTL, never less than TTL), and it applied a renewal no
// earlier than the moment the node sent it. So a renewal sent at s that
// succeeded proves the lease stays in force until at least s+TTL, on any
// node's view of the store. The node treats itself as the owner only until
// s+TTL-Margin (the Margin covers clock-rate drift and the fence's own
// reaction time) and fences itself when that passes without a newer proof.
// No other node can see the lease as ended while the node still serves.
package lease

import (
	"fmt"
	"time"
)

// Status is what the node may do now.
type Status int

const (
	// Valid: the lease is provably in force; the node serves.
	Valid Status = iota + 1
	// Fenced: the lease is not provably in force. The node dispatches
	// nothing, fires no timer and writes nothing; a later successful
	// renewal (proof the lease never ended) returns it to Valid.
	Fenced
	// Ended: the store said the lease is gone, or the node stopped. This
	// lifecycle is over for good; nothing it held is its any more.
	Ended
)

func (s Status) String() string {
	switch s {
	case Valid:
		return "valid"
	case Fenced:
		return "fenced"
	case Ended:
		return "ended"
	}
	return fmt.Sprintf("status%d", int(s))
}

// Config holds the timings. Zero fields take the defaults.
type Config struct {
	// TTL of the lease as the store enforces it.
	TTL time.Duration
	// RenewEvery is the period of renewals while Valid. Default TTL/3.
	RenewEvery time.Duration
	// RetryEvery is the period of renewals after a failed one. Default
	// min(TTL/10, 1 s).
	RetryEvery time.Duration
	// Margin is how long before the earliest end of the lease the node
	// fences itself. Default max(TTL/5, 500 ms).
	Margin time.Duration
}

// WithDefaults fills zero fields and checks the result.
func (c Config) WithDefaults() (Config, error) {
	if c.TTL <= 0 {
		return c, fmt.Errorf("lease: TTL %s must be positive", c.TTL)
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.TTL / 3
	}
	if c.RetryEvery == 0 {
		c.RetryEvery = min(c.TTL/10, time.Second)
	}
	if c.Margin == 0 {
		c.Margin = max(c.TTL/5, 500*time.Millisecond)
	}
	if c.Margin >= c.TTL || c.RenewEvery <= 0 || c.RetryEvery <= 0 {
		return c, fmt.Errorf("lease: margin %s must be under the TTL %s, and the renew periods positive", c.Margin, c.TTL)
	}
	if c.RenewEvery >= c.TTL-c.Margin {
		return c, fmt.Errorf("lease: renewing every %s leaves no renewal before the fence at TTL-margin %s", c.RenewEvery, c.TTL-c.Margin)
	}
	return c, nil
}

// Answer is how a renewal ended.
type Answer int

const (
	// Renewed: the store extended the lease.
	Renewed Answer = iota + 1
	// Gone: the store says the lease no longer exists.
	Gone
	// NoAnswer: unreachable, timed out or failed; proves nothing.
	NoAnswer
)

// Event is an input to Step.
type Event interface{ isEvent() }

// Tick: the clock reached Now (the driver wakes at WakeAt, or earlier).
type Tick struct{ Now time.Time }

// RenewAnswered: the renewal sent at SentAt got Answer at Now.
type RenewAnswered struct {
	SentAt, Now time.Time
	Answer      Answer
}

// Stopped: the node is stopping; the lifecycle ends here.
type Stopped struct{ Now time.Time }

func (Tick) isEvent()          {}
func (RenewAnswered) isEvent() {}
func (Stopped) isEvent()       {}

// Effects is what one Step asks of the driver.
type Effects struct {
	// Renew: send one renewal now (the driver stamps its send time).
	Renew bool
	// Changed: Status changed to the machine's new Status; the driver
	// fences, unfences or ends the lifecycle and logs Reason.
	Changed bool
	Reason  string
	// WakeAt: deliver a Tick no later than this.
	WakeAt time.Time
}

// Keeper is one lifecycle's lease.
type Keeper struct {
	cfg    Config
	status Status
	// validUntil is the last proven renewal's send time + TTL - Margin:
	// the node may act as the owner strictly before it. Never moves back.
	validUntil time.Time
	// inFlight is true between a Renew effect and its RenewAnswered; at most
	// one renewal is outstanding.
	inFlight bool
	// nextRenew is when the next renewal is due.
	nextRenew time.Time
	// confirmFrom is set while Fenced after a renewal succeeded: only a
	// renewal sent at or after it may unfence (see Step).
	confirmFrom time.Time
}

// New starts the keeper of a lease whose claim request was sent at
// claimSentAt and succeeded (the claim is the first proof).
func New(cfg Config, claimSentAt time.Time) (*Keeper, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	return &Keeper{
		cfg:        cfg,
		status:     Valid,
		validUntil: claimSentAt.Add(cfg.TTL - cfg.Margin),
		nextRenew:  claimSentAt.Add(cfg.RenewEvery),
	}, nil
}

// Status is the current status.
func (k *Keeper) Status() Status { return k.status }

// ValidUntil is the instant from which the node must not act as owner
// (unless a later renewal moves it).
func (k *Keeper) ValidUntil() time.Time { return k.validUntil }

// Step applies one event.
func (k *Keeper) Step(ev Event) Effects {
	if k.status == Ended {
		return Effects{}
	}
	var now time.Time
	var out Effects
	switch e := ev.(type) {
	case Stopped:
		k.status = Ended
		return Effects{Changed: true, Reason: "node stopped"}
	case RenewAnswered:
		now = e.Now
		k.inFlight = false
		switch e.Answer {
		case Gone:
			k.status = Ended
			return Effects{Changed: true, Reason: "the store ended the lease"}
		case Renewed:
			k.nextRenew = e.SentAt.Add(k.cfg.RenewEvery)
			// A proof that has lapsed is a fence, whether or not the
			// Tick that fences the node has run yet: the answer may
			// come first (both wait on the driver), and it must not
			// pass for an ordinary renewal then.
			if k.status == Fenced || !now.Before(k.validUntil) {
				// A renewal that succeeds after the proof lapsed may be
				// the store's last act for this lease: Consul, resuming
				// from a stall longer than its session timer, can answer
				// a renewal that was queued meanwhile while the timer's
				// invalidation is already under way, and destroy the
				// session right after. Only a second renewal, sent a
				// confirm delay after the first one's answer, proves
				// the lease survived (the invalidation would have made
				// it fail with Gone).
				if k.confirmFrom.IsZero() {
					k.confirmFrom = now.Add(k.confirmDelay())
				}
				if e.SentAt.Before(k.confirmFrom) {
					k.nextRenew = k.confirmFrom
					break
				}
				k.confirmFrom = time.Time{}
			}
			if until := e.SentAt.Add(k.cfg.TTL - k.cfg.Margin); until.After(k.validUntil) {
				k.validUntil = until
			}
		case NoAnswer:
			k.nextRenew = now.Add(k.cfg.RetryEvery)
			// The confirmation needs two successes in a row: a later
			// success may itself race a new invalidation.
			k.confirmFrom = time.Time{}
		}
	case Tick:
		now = e.Now
	default:
		return Effects{}
	}
	switch {
	case k.status == Valid && !now.Before(k.validUntil):
		// confirmFrom is kept: a renewal answered in this very step,
		// after the lapse, has just started the confirmation (above).
		// While Valid it is otherwise always zero.
		k.status = Fenced
		out.Changed, out.Reason = true, "no renewal proved the lease within its TTL minus the margin"
	case k.status == Fenced && now.Before(k.validUntil):
		k.status = Valid
		out.Changed, out.Reason = true, "a renewal proved the lease never ended"
	}
	if !k.inFlight && !now.Before(k.nextRenew) {
		out.Renew = true
		k.inFlight = true
	}
	// Wake for the next due renewal, the fence, or (a renewal outstanding)
	// a re-check at the retry pace; never later than one renew period.
	wake := now.Add(k.cfg.RenewEvery)
	if k.status == Valid && k.validUntil.Before(wake) {
		wake = k.validUntil
	}
	if k.inFlight {
		wake = minTime(wake, now.Add(k.cfg.RetryEvery))
	} else {
		wake = minTime(wake, k.nextRenew)
	}
	out.WakeAt = wake
	return out
}

// confirmDelay is how long after a renewal that succeeded while fenced
// the confirming renewal is sent: longer than a store takes to apply an
// invalidation that was already under way (milliseconds on Consul).
func (k *Keeper) confirmDelay() time.Duration { return max(k.cfg.RetryEvery, 250*time.Millisecond) }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// RequestTimeout bounds one renewal request (only one is outstanding at a
// time): one renew period, so a store slowed down by load still proves the
// lease — each answer counts from its send time — while a store that does
// not answer is retried well before the fence.
func (k *Keeper) RequestTimeout() time.Duration { return k.cfg.RenewEvery }
