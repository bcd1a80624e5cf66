package relocation

import (
	"fmt"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/roamactors/roam/internal/machine"
	"github.com/roamactors/roam/internal/relocation/envelope"
	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/messages"
	"github.com/roamactors/roam/roamerr"
)

// Overrun says what a periodic timer does when its ticks fall behind.
type Overrun uint8

const (
	// OverrunSkip drops the missed slots and counts them (the default).
	OverrunSkip Overrun = iota
	// OverrunCatchUp delivers missed slots at once, up to a limit.
	OverrunCatchUp
)

// TimerOption configures Every.
type TimerOption func(*timerReg)

// CatchUp makes a periodic timer deliver up to limit missed slots at once.
func CatchUp(limit uint32) TimerOption {
	return func(r *timerReg) { r.overrun, r.catchUp = OverrunCatchUp, limit }
}

// TimerSet is the framework timers of one relocatable actor. Use it only
// from the actor's own Receive: it is not safe for other goroutines.
type TimerSet struct{ t *timers }

// Timers returns the timers of the relocatable actor whose context c is.
// A timer delivers *messages.TimerTick carrying its name, and moves with
// the actor: registrations, schedule cursors and pending ticks are captured
// and restored by the framework, so the application never re-registers
// them (docs/PROTOCOL.md §5.5: timer registrations and pending ticks).
func Timers(c actor.Context) (TimerSet, error) {
	obj, ok := c.Get(hostExtensionID).(*object)
	if !ok {
		return TimerSet{}, fmt.Errorf("%w: %T is not a relocatable actor", roamerr.ErrInvalidOperation, c.Actor())
	}
	t := obj.timers()
	t.sys, t.self = c.ActorSystem(), c.Self()
	return TimerSet{t: t}, nil
}

// Every delivers a TimerTick named name every period, from now.
func (s TimerSet) Every(name string, period time.Duration, opts ...TimerOption) error {
	if period <= 0 {
		return fmt.Errorf("%w: timer %q: period must be positive", roamerr.ErrInvalidOperation, name)
	}
	return s.t.register(&timerReg{name: name, period: period}, s.t.clock.Now().Add(period), opts)
}

// After delivers one TimerTick named name after delay.
func (s TimerSet) After(name string, delay time.Duration) error {
	return s.t.register(&timerReg{name: name}, s.t.clock.Now().Add(max(delay, 0)), nil)
}

// Cancel removes a timer; a tick already on its way is not delivered.
func (s TimerSet) Cancel(name string) {
	if r := s.t.regs[name]; r != nil {
		r.stop()
		delete(s.t.regs, name)
	}
}

// Names lists the registered timers.
func (s TimerSet) Names() []string {
	out := make([]string, 0, len(s.t.regs))
	for n := range s.t.regs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// timers belongs to one incarnation. Every method runs on the object's
// goroutine (turns, the seal capture, restore and Unseal Do items); the
// AfterFunc callbacks only post a tick fixed when the timer was armed.
type timers struct {
	sys   *actor.ActorSystem
	self  *actor.PID
	regs  map[string]*timerReg
	clock machine.Clock
}

// timerReg is one registration. A periodic timer has one slot armed at a
// time; the tick of that slot, once handled, arms the next, so a timer
// never piles ticks up in the mailbox.
type timerReg struct {
	name      string
	period    time.Duration // 0: a one-shot After timer
	overrun   Overrun
	catchUp   uint32
	delivered uint64 // completed delivery index
	scheduled uint64 // completed schedule index (slots posted or skipped)
	skipped   uint32
	armedAt   time.Time     // the slot of the armed tick
	armedIdx  uint64        // its schedule index
	handle    machine.Timer // the armed tick's timer; nil once it is handled
	paused    bool          // stopped by a capture before its tick fired
}

// dueWithin reports a timer whose armed tick is due before now+window
// (or overdue), by name; the object's goroutine only.
func (t *timers) dueWithin(now time.Time, window time.Duration) (string, bool) {
	for name, r := range t.regs {
		if r.handle != nil && !r.paused && r.armedAt.Before(now.Add(window)) {
			return name, true
		}
	}
	return "", false
}

func (o *object) timers() *timers {
	if o.tm == nil {
		o.tm = &timers{regs: map[string]*timerReg{}, clock: o.d.clock}
	}
	return o.tm
}

func (t *timers) register(r *timerReg, first time.Time, opts []TimerOption) error {
	if err := location.ValidateID("timer name", r.name); err != nil {
		return fmt.Errorf("%w: %w", roamerr.ErrInvalidOperation, err)
	}
	for _, o := range opts {
		o(r)
	}
	if old := t.regs[r.name]; old != nil {
		old.stop()
	}
	t.regs[r.name] = r
	t.arm(r, first, r.scheduled+1)
	return nil
}

// arm schedules the tick of slot index at at.
func (t *timers) arm(r *timerReg, at time.Time, index uint64) {
	tick := &messages.TimerTick{Name: r.name, ScheduleIndex: index, ScheduledUnixMillis: at.UnixMilli(), Skipped: r.skipped}
	sys, self := t.sys, t.self
	r.armedAt, r.armedIdx = at, index
	r.handle = t.clock.AfterFunc(max(machine.Until(t.clock, at), 0), func() { sys.Root.Send(self, tick) })
}

// stop cancels the armed slot; it reports false if the tick already fired.
func (r *timerReg) stop() bool {
	if r.handle == nil {
		return false
	}
	stopped := r.handle.Stop()
	r.handle = nil
	return stopped
}

// onTick handles a TimerTick before the application sees it: it reports
// whether the tick is live and arms the next slot.
func (t *timers) onTick(tick *messages.TimerTick) bool {
	r := t.regs[tick.GetName()]
	if r == nil || tick.GetScheduleIndex() <= r.scheduled {
		return false // cancelled (or re-registered) while on its way
	}
	r.delivered++
	r.scheduled = tick.GetScheduleIndex()
	tick.DeliveryIndex = r.delivered
	tick.Skipped = r.skipped
	if r.period == 0 {
		delete(t.regs, r.name)
		return true
	}
	if tick.GetScheduleIndex() != r.armedIdx {
		return true // a catch-up tick: the schedule is already armed
	}
	r.handle = nil
	// Slots whose time has passed are missed: caught up (delivered at
	// once, up to the limit, handled before the next armed slot) or skipped.
	next, index := time.UnixMilli(tick.GetScheduledUnixMillis()).Add(r.period), r.scheduled+1
	if now := t.clock.Now(); next.Before(now) {
		missed := uint64(now.Sub(next)/r.period) + 1
		burst := uint64(0)
		if r.overrun == OverrunCatchUp {
			burst = min(missed, uint64(r.catchUp))
		}
		for i := uint64(0); i < burst; i++ {
			t.sys.Root.Send(t.self, &messages.TimerTick{Name: r.name, ScheduleIndex: index + i,
				ScheduledUnixMillis: next.Add(time.Duration(i) * r.period).UnixMilli()})
		}
		r.skipped += uint32(missed - burst)
		next, index = next.Add(time.Duration(missed)*r.period), index+missed
	}
	t.arm(r, next, index)
	return true
}

// capture stops every timer and describes it for the payload. A timer
// whose tick already fired has a zero cursor: that tick — in the saved
// work, the relay or Message Follow — re-arms it where it is handled.
func (t *timers) capture() []envelope.TimerRegistration {
	out := make([]envelope.TimerRegistration, 0, len(t.regs))
	for _, r := range t.regs {
		var cursor uint64
		if r.stop() {
			cursor, r.paused = uint64(r.armedAt.UnixMilli()), true
		}
		// Every slot before the armed one is completed (handled or
		// skipped), so the armed slot is CompletedScheduleIndex+1 on the
		// target, whether it is re-armed there or its tick is on its way.
		out = append(out, envelope.TimerRegistration{
			ParticipantID: 1, Name: r.name, HandlerType: "roam.messages.TimerTick",
			PeriodMillis: uint64(r.period / time.Millisecond), OverrunPolicy: uint8(r.overrun), CatchUpLimit: r.catchUp,
			CompletedDeliveryIndex: r.delivered, CompletedScheduleIndex: max(r.scheduled, r.armedIdx-min(r.armedIdx, 1)),
			NextScheduleUnixMillis: cursor,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// stopAll cancels every armed slot (the incarnation is removed).
func (t *timers) stopAll() {
	for _, r := range t.regs {
		r.stop()
	}
}

// resume re-arms what capture paused: the move failed before relay-ready
// and the source runs on (PROTOCOL.md §6.2).
func (t *timers) resume() {
	for _, r := range t.regs {
		if r.paused {
			r.paused = false
			t.arm(r, r.armedAt, r.armedIdx)
		}
	}
}

// restore rebuilds the registrations of a payload and arms those whose
// tick was not on its way.
func (t *timers) restore(regs []envelope.TimerRegistration) {
	for _, e := range regs {
		r := &timerReg{
			name: e.Name, period: time.Duration(e.PeriodMillis) * time.Millisecond,
			overrun: Overrun(e.OverrunPolicy), catchUp: e.CatchUpLimit,
			delivered: e.CompletedDeliveryIndex, scheduled: e.CompletedScheduleIndex,
		}
		if old := t.regs[r.name]; old != nil {
			old.stop() // registered again by the new instance's Started
		}
		t.regs[r.name] = r
		if e.NextScheduleUnixMillis != 0 {
			t.arm(r, time.UnixMilli(int64(e.NextScheduleUnixMillis)), r.scheduled+1)
		} else {
			r.armedIdx = r.scheduled + 1 // its tick is on its way and re-arms here
		}
	}
}

// pendingTick turns a queued TimerTick into its payload form.
func pendingTick(order uint64, tick *messages.TimerTick) envelope.PendingTimerTick {
	return envelope.PendingTimerTick{
		ParticipantID: 1, Order: order, Name: tick.GetName(), DeliveryIndex: tick.GetDeliveryIndex(),
		ScheduledIndex: tick.GetScheduleIndex(), ScheduledUnixMillis: uint64(tick.GetScheduledUnixMillis()), SkippedTicks: tick.GetSkipped(),
	}
}

func tickOf(p envelope.PendingTimerTick) *messages.TimerTick {
	return &messages.TimerTick{Name: p.Name, DeliveryIndex: p.DeliveryIndex, ScheduleIndex: p.ScheduledIndex,
		ScheduledUnixMillis: int64(p.ScheduledUnixMillis), Skipped: p.SkippedTicks}
}
