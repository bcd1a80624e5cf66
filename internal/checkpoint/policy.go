package checkpoint

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/roamerr"
)

// Policy says when an owner captures an object's state: after Every
// handled messages, at most Interval after the first handled message not
// yet captured, and once the object has been Idle that long after one.
// Zero fields are off; a Policy with every field zero never captures.
// The loss a crash can cause is bounded by these: what the object handled
// after its last capture (docs/FAULTS.md).
type Policy struct {
	Every    int
	Interval time.Duration
	Idle     time.Duration
}

// DefaultPolicy is what a PreserveState kind uses unless it says
// otherwise: a capture at most a second after the object changed.
var DefaultPolicy = Policy{Interval: time.Second}

// MinPeriod bounds Interval and Idle from below: shorter periods would
// only make the captures of a busy object queue behind each other (use
// Every for a capture per turn).
const MinPeriod = 10 * time.Millisecond

// Validate reports a policy roam cannot run.
func (p Policy) Validate() error {
	switch {
	case p.Every < 0:
		return fmt.Errorf("%w: checkpoint every %d messages", roamerr.ErrInvalidOperation, p.Every)
	case p.Interval < 0 || (p.Interval > 0 && p.Interval < MinPeriod):
		return fmt.Errorf("%w: checkpoint interval %v (0, or at least %v)", roamerr.ErrInvalidOperation, p.Interval, MinPeriod)
	case p.Idle < 0 || (p.Idle > 0 && p.Idle < MinPeriod):
		return fmt.Errorf("%w: checkpoint idle period %v (0, or at least %v)", roamerr.ErrInvalidOperation, p.Idle, MinPeriod)
	}
	return nil
}

// Off reports a policy that never captures.
func (p Policy) Off() bool { return p.Every == 0 && p.Interval == 0 && p.Idle == 0 }

// Timed reports whether captures may fall due with time (not only on a
// turn).
func (p Policy) Timed() bool { return p.Interval > 0 || p.Idle > 0 }

// Tick is how often the node's one checkpoint clock looks at the objects
// with uncaptured turns: a quarter of the shortest period, within
// [MinPeriod, 1 s].
func (p Policy) Tick() time.Duration {
	d := time.Second
	for _, q := range []time.Duration{p.Interval, p.Idle} {
		if q > 0 {
			d = min(d, q/4)
		}
	}
	return max(d, MinPeriod)
}

// Dirty is an object's handled messages since its last capture.
type Dirty struct {
	// Turns handled since the last capture.
	Turns int
	// first and last: when the first and the last of them ended, as
	// offsets from epoch (two time.Time values cost every idle object
	// that checkpoints 32 bytes more).
	first, last time.Duration
}

// epoch is what Dirty's times are offsets from: a fixed instant, so the
// offsets are of the clock's wall time (a step of the wall clock moves a
// pending capture's due time by as much; it decides only when a capture
// is taken, never what it holds).
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// AfterTurn counts a turn that ended at now and reports whether the
// object must be captured right away (Every).
func (p Policy) AfterTurn(d *Dirty, now time.Time) bool {
	at := now.Sub(epoch)
	if d.Turns == 0 {
		d.first = at
	}
	d.Turns++
	d.last = at
	return p.Every > 0 && d.Turns >= p.Every
}

// Due reports whether an object with d is to be captured at now by the
// clock (Interval or Idle).
func (p Policy) Due(d Dirty, now time.Time) bool {
	if d.Turns == 0 {
		return false
	}
	at := now.Sub(epoch)
	return (p.Interval > 0 && at >= d.first+p.Interval) ||
		(p.Idle > 0 && at >= d.last+p.Idle)
}
