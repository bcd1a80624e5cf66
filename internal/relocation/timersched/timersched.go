// Package timersched is the pure schedule of an object's framework timers
// (docs/PROTOCOL.md §5.5, timer registrations and pending ticks): which
// tick of a timer is live, which slot is armed next, how missed slots are
// caught up or skipped, and what a move captures of a timer and restores
// from it. Time is an input; the driver arms a clock timer for each tick
// named here, posts the ticks and stops them — nothing here has a
// goroutine, a clock or a mailbox.
package timersched

import (
	"fmt"
	"time"

	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Overrun says what a periodic timer does when its ticks fall behind.
type Overrun uint8

const (
	// Skip drops the missed slots and counts them (the default).
	Skip Overrun = iota
	// CatchUp delivers missed slots at once, up to a limit.
	CatchUp
)

// Valid refuses a registration the application may not make: a name that
// is no valid ID, or a periodic timer (periodic) whose period is not
// positive.
func Valid(name string, periodic bool, period time.Duration) error {
	if periodic && period <= 0 {
		return fmt.Errorf("%w: timer %q: period must be positive", roamerr.ErrInvalidOperation, name)
	}
	if err := location.ValidateID("timer name", name); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	return nil
}

// Reg is one timer registration. A periodic timer has one slot armed at
// a time; the tick of that slot, once handled, arms the next, so a timer
// never piles ticks up in the mailbox.
type Reg struct {
	Name         string
	Period       time.Duration // 0: a one-shot timer
	Overrun      Overrun
	CatchUpLimit uint32

	delivered uint64 // completed delivery index
	scheduled uint64 // completed schedule index (slots posted or skipped)
	skipped   uint32
	armedAt   time.Time // the slot of the armed tick
	armedIdx  uint64    // its schedule index
	paused    bool      // stopped by a capture before its tick fired
}

// Start arms the registration's first slot at first: the tick to post
// then.
func (r *Reg) Start(first time.Time) *messages.TimerTick { return r.arm(first, r.scheduled+1) }

// arm makes slot index at at the armed one and returns its tick.
func (r *Reg) arm(at time.Time, index uint64) *messages.TimerTick {
	r.armedAt, r.armedIdx = at, index
	return &messages.TimerTick{Name: r.Name, ScheduleIndex: index, ScheduledUnixMillis: at.UnixMilli(), Skipped: r.skipped}
}

// ArmedAt is the time of the armed slot: when its clock timer fires.
func (r *Reg) ArmedAt() time.Time { return r.armedAt }

// Due reports whether the armed tick (armed: its clock timer runs) is
// due before now+window, or overdue.
func (r *Reg) Due(armed bool, now time.Time, window time.Duration) bool {
	return armed && !r.paused && r.armedAt.Before(now.Add(window))
}

// Handled is what a tick of the registration does.
type Handled struct {
	// Live: the application handles the tick (else it is one of a timer
	// cancelled or registered again while it was on its way).
	Live bool
	// Done: a one-shot timer fired; its registration ends.
	Done bool
	// CatchUp are missed slots delivered at once, before the next armed
	// slot's tick.
	CatchUp []*messages.TimerTick
	// Next is the tick of the slot to arm now (nil: none; a catch-up
	// tick's schedule is armed already).
	Next *messages.TimerTick
}

// Tick handles tick before the application sees it, at now: it stamps
// the tick's delivery index and skipped count, and says what to arm.
// Slots whose time has passed are missed: caught up (delivered at once,
// up to the limit, handled before the next armed slot) or skipped.
func (r *Reg) Tick(tick *messages.TimerTick, now time.Time) Handled {
	if tick.GetScheduleIndex() <= r.scheduled {
		return Handled{}
	}
	r.delivered++
	r.scheduled = tick.GetScheduleIndex()
	tick.DeliveryIndex = r.delivered
	tick.Skipped = r.skipped
	if r.Period == 0 {
		return Handled{Live: true, Done: true}
	}
	if tick.GetScheduleIndex() != r.armedIdx {
		return Handled{Live: true}
	}
	h := Handled{Live: true}
	next, index := time.UnixMilli(tick.GetScheduledUnixMillis()).Add(r.Period), r.scheduled+1
	if next.Before(now) {
		missed := uint64(now.Sub(next)/r.Period) + 1
		burst := uint64(0)
		if r.Overrun == CatchUp {
			burst = min(missed, uint64(r.CatchUpLimit))
		}
		for i := uint64(0); i < burst; i++ {
			h.CatchUp = append(h.CatchUp, &messages.TimerTick{Name: r.Name, ScheduleIndex: index + i,
				ScheduledUnixMillis: next.Add(time.Duration(i) * r.Period).UnixMilli()})
		}
		r.skipped += uint32(missed - burst)
		next, index = next.Add(time.Duration(missed)*r.Period), index+missed
	}
	h.Next = r.arm(next, index)
	return h
}

// Capture describes the registration for a move's payload; stopped: its
// armed tick was stopped before it fired (it is paused, and its slot is
// the cursor the target arms). A timer whose tick already fired has a
// zero cursor: that tick — in the saved work, the relay or Message
// Follow — re-arms it where it is handled.
func (r *Reg) Capture(stopped bool) envelope.TimerRegistration {
	var cursor uint64
	if stopped {
		cursor, r.paused = uint64(r.armedAt.UnixMilli()), true
	}
	// Every slot before the armed one is completed (handled or skipped),
	// so the armed slot is CompletedScheduleIndex+1 on the target, whether
	// it is re-armed there or its tick is on its way.
	return envelope.TimerRegistration{
		ParticipantID: 1, Name: r.Name, HandlerType: "roam.messages.TimerTick",
		PeriodMillis: uint64(r.Period / time.Millisecond), OverrunPolicy: uint8(r.Overrun), CatchUpLimit: r.CatchUpLimit,
		CompletedDeliveryIndex: r.delivered, CompletedScheduleIndex: max(r.scheduled, r.armedIdx-min(r.armedIdx, 1)),
		NextScheduleUnixMillis: cursor,
	}
}

// Resume re-arms what Capture paused (the move failed before relay-ready
// and the source runs on, PROTOCOL.md §6.2): the tick to post, or nil.
func (r *Reg) Resume() *messages.TimerTick {
	if !r.paused {
		return nil
	}
	r.paused = false
	return r.arm(r.armedAt, r.armedIdx)
}

// Restore rebuilds a registration of a payload, and the tick to arm: nil
// when the captured tick was on its way (it re-arms the timer where it
// is handled).
func Restore(e envelope.TimerRegistration) (*Reg, *messages.TimerTick) {
	r := &Reg{
		Name: e.Name, Period: time.Duration(e.PeriodMillis) * time.Millisecond,
		Overrun: Overrun(e.OverrunPolicy), CatchUpLimit: e.CatchUpLimit,
		delivered: e.CompletedDeliveryIndex, scheduled: e.CompletedScheduleIndex,
	}
	if e.NextScheduleUnixMillis != 0 {
		return r, r.arm(time.UnixMilli(int64(e.NextScheduleUnixMillis)), r.scheduled+1)
	}
	r.armedIdx = r.scheduled + 1
	return r, nil
}
